#include "objectives/router_loss.h"

#include "ATen/core/Tensor.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace plait::objectives {

std::vector<std::string> RouterMetricNames(const models::ModelConfig& config) {
  if (config.num_experts() == 0) return {};
  return {"aux_loss", "expert_load_max", "expert_load_min"};
}

absl::Status AddRouterLoss(models::CausalLM& model, const parallel::DeviceMesh& mesh,
                           const std::vector<std::string>& routing_dims, const StepItems* step,
                           int micro, ObjectiveOutput& output) {
  models::RouterStatistics* const routing = model.LastRouting().get();
  if (routing == nullptr) return absl::OkStatus();
  const int64_t experts = routing->num_experts();
  at::Tensor total = routing->Load();
  for (const std::string& dim : routing_dims) {
    PLAIT_ASSIGN_OR_RETURN(parallel::Communicator* const group, mesh.communicator(dim));
    if (group->size() == 1) continue;
    PLAIT_RETURN_IF_ERROR(
        base::Annotate(group->AllReduce(total, parallel::ReduceOp::kSum)->Wait(),
                       absl::StrCat("summing the experts' routing over \"", dim, "\"")));
  }
  // The wrappers average the gradients over the D data-parallel ranks (and sum those of the
  // tokens' slices under sequence parallelism), and the micro-batch weighs n_i / N in the
  // step: each rank's share of aux's gradient is D n_i / N of it.
  const double gradient_scale = step == nullptr
                                    ? 0.0
                                    : step->data_parallel_size() *
                                          static_cast<double>(step->global_items(micro)) /
                                          static_cast<double>(step->total());
  const at::Tensor aux = routing->Loss(total, gradient_scale).to(output.loss.device());
  output.loss = output.loss + routing->coefficient() * aux;
  const at::Tensor routed = total.narrow(0, 0, experts);
  const at::Tensor share =
      (routed * static_cast<double>(experts) / routed.sum().clamp_min(1.0)).to(at::kFloat);
  output.metrics.emplace_back("aux_loss", aux);
  output.metrics.emplace_back("expert_load_max", share.max().to(output.loss.device()));
  output.metrics.emplace_back("expert_load_min", share.min().to(output.loss.device()));
  return absl::OkStatus();
}

}  // namespace plait::objectives
