// The losses a model's own layers add to any objective's: a mixture-of-experts model's
// load-balancing loss (models/router_statistics.h), added to what the objective computed for
// one micro-batch. The routing of the model's last forward is summed
// over the ranks that routed other tokens of the same micro-batch (the routing dimensions:
// data, context and sequence parallelism; ResolvedPlan::routing_dims), so that every layout
// trains the loss one process trains on the whole micro-batch, and it is weighed in the step as the
// micro-batch's loss is, by its share of the step's items (step_items.h): the step trains
//   sum over micro-batches i of (n_i / N) * (loss_i + router_aux_loss_coef * aux_i).
// It reports aux_loss (aux, without the coefficient, as transformers' aux_loss) and the busiest
// and idlest expert's share of the routed tokens against an even share (expert_load_max,
// expert_load_min: 1 and 1 when balanced), over every mixture-of-experts layer.
//
//   objective = WithModelLosses(std::move(objective), resolved.model, mesh, routing_dims);
//   PLAIT_ASSIGN_OR_RETURN(ObjectiveOutput out,
//                          objective->Compute(model, batch, host, frozen_read, &step, micro));
//   step.ScaledForBackward(out.loss, micro).backward();
#ifndef PLAIT_OBJECTIVES_MODEL_LOSSES_H_
#define PLAIT_OBJECTIVES_MODEL_LOSSES_H_

#include <memory>
#include <string>
#include <vector>

#include "models/model.pb.h"
#include "objectives/objective.h"
#include "parallel/device_mesh.h"

namespace plait::objectives {

// `objective` with the losses the layers of a model of `config` add (its Compute adds them to
// the loss and their metrics after its own, in MetricNames' order: aux_loss,
// expert_load_max, expert_load_min); `objective` itself for a dense model. Every rank of
// `mesh`, which must outlive it, computes together (the routing is summed over
// `routing_dims`); an error names the failed collective.
std::unique_ptr<Objective> WithModelLosses(std::unique_ptr<Objective> objective,
                                           const models::ModelConfig& config,
                                           const parallel::DeviceMesh& mesh,
                                           std::vector<std::string> routing_dims);

}  // namespace plait::objectives

#endif  // PLAIT_OBJECTIVES_MODEL_LOSSES_H_
