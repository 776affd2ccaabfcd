// The global L2 norm of the gradients of a model whose parameters may be sharded (FSDP,
// tensor parallel) or whole, computed so that every element counts exactly once: each
// parameter's squared norm is summed over the groups it is split across (its
// parallel::TrainableParameter::sharded_over) and over nothing else, so a part replicated on
// several ranks counts once (a part that several ranks of those groups share is divided by
// its `replicas`). Every rank of the world calls it with its own parameters, listed in
// the same order of names, except over a pipeline's group: the groups that split every
// parameter of the rank (a pipeline's, whose ranks hold different parameters) take part in
// one all-reduce per call, after the others.
//
//   PLAIT_ASSIGN_OR_RETURN(double norm, GlobalGradNorm(parameters));
//   if (norm > max_norm) ScaleGradients(parameters, max_norm / (norm + 1e-6));
#ifndef PLAIT_OPTIM_GRAD_NORM_H_
#define PLAIT_OPTIM_GRAD_NORM_H_

#include <vector>

#include "absl/status/statusor.h"
#include "parallel/trainable_parameter.h"

namespace plait::optim {

// The norm (may be NaN or infinite when a gradient is). Parameters without a gradient
// count as zero. Errors are those of the all-reduces.
absl::StatusOr<double> GlobalGradNorm(const std::vector<parallel::TrainableParameter>& parameters);

// Multiplies every gradient by `factor`, in place.
void ScaleGradients(const std::vector<parallel::TrainableParameter>& parameters, double factor);

}  // namespace plait::optim

#endif  // PLAIT_OPTIM_GRAD_NORM_H_
