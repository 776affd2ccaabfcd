// A trainable part's gradient reduced over the ranks of a group after a step's backward: what
// a strategy does whose ranks compute the same parameters on different tokens, averaged
// (context parallelism; expert parallelism for the parts outside the experts) or summed
// (tensor parallelism's whole parameters, each rank's gradient from its part of the work),
// once the step's backward passes have finished.
//
//   for (const parallel::TrainableParameter& part : trainable) {
//     PLAIT_RETURN_IF_ERROR(ReduceGradient(part, group, parallel::ReduceOp::kAverage));
//   }
#ifndef PLAIT_WRAP_GRADIENT_REDUCE_H_
#define PLAIT_WRAP_GRADIENT_REDUCE_H_

#include "absl/status/status.h"
#include "parallel/communicator.h"
#include "parallel/trainable_parameter.h"

namespace plait::wrap {

// Replaces `part`'s gradient by its reduction `op` over `group`'s ranks: one all-reduce of this
// one gradient, so that the collective's buffers are one parameter's, not a copy of every
// gradient beside them; a 16-bit gradient is reduced in fp32 and rounded once. An undefined
// gradient (the rank's tokens did not reach the part) counts as zeros, and is set. Every rank
// of the group must call it for the same parts in the same order; the error is the
// all-reduce's.
absl::Status ReduceGradient(const parallel::TrainableParameter& part, parallel::Communicator& group,
                            parallel::ReduceOp op);

}  // namespace plait::wrap

#endif  // PLAIT_WRAP_GRADIENT_REDUCE_H_
