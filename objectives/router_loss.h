// A mixture-of-experts model's load-balancing loss (models/router_statistics.h) added to what
// an objective computed for one micro-batch. The routing of the model's last forward is summed
// over the ranks that routed other tokens of the same micro-batch (the routing dimensions:
// data, context and sequence parallelism; ResolvedPlan::routing_dims), so that every layout
// trains the loss one process trains on the whole micro-batch, and it is weighed in the step as the
// micro-batch's loss is, by its share of the step's items (step_items.h): the step trains
//   sum over micro-batches i of (n_i / N) * (loss_i + router_aux_loss_coef * aux_i).
// It reports aux_loss (aux, without the coefficient, as transformers' aux_loss) and the busiest
// and idlest expert's share of the routed tokens against an even share (expert_load_max,
// expert_load_min: 1 and 1 when balanced), over every mixture-of-experts layer.
//
//   PLAIT_ASSIGN_OR_RETURN(ObjectiveOutput out, objective->Compute(model, batch));
//   PLAIT_RETURN_IF_ERROR(AddRouterLoss(model, mesh, routing_dims, &step, micro, out));
//   step.ScaledForBackward(out.loss, micro).backward();
#ifndef PLAIT_OBJECTIVES_ROUTER_LOSS_H_
#define PLAIT_OBJECTIVES_ROUTER_LOSS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "models/causal_lm.h"
#include "objectives/objective.h"
#include "objectives/step_items.h"
#include "parallel/device_mesh.h"

namespace plait::objectives {

// The metrics AddRouterLoss adds for a model of `config`, in its order; none for a dense model.
std::vector<std::string> RouterMetricNames(const models::ModelConfig& config);

// Adds the load-balancing loss of `model`'s last forward, micro-batch `micro` of `step` (null
// in an evaluation, which trains nothing), to `output`'s loss, and its metrics; nothing for a
// dense model. Every rank of `mesh` must call it (it sums over `routing_dims`); an error names
// the failed collective.
absl::Status AddRouterLoss(models::CausalLM& model, const parallel::DeviceMesh& mesh,
                           const std::vector<std::string>& routing_dims, const StepItems* step,
                           int micro, ObjectiveOutput& output);

}  // namespace plait::objectives

#endif  // PLAIT_OBJECTIVES_ROUTER_LOSS_H_
