#include "objectives/model_losses.h"

#include <iterator>
#include <optional>
#include <utility>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "models/causal_lm.h"
#include "objectives/step_items.h"

namespace plait::objectives {

namespace {

// The metrics AddRouterLoss adds, in its order.
constexpr const char* kRouterMetrics[] = {"aux_loss", "expert_load_max", "expert_load_min"};

// Adds the load-balancing loss of `model`'s last forward, micro-batch `micro` of `step` (null
// in an evaluation), to `output`'s loss, and its metrics; nothing for a forward that routed
// nothing.
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
  const at::Tensor values[std::size(kRouterMetrics)] = {aux, share.max().to(output.loss.device()),
                                                        share.min().to(output.loss.device())};
  for (size_t i = 0; i < std::size(kRouterMetrics); ++i) {
    output.metrics.emplace_back(kRouterMetrics[i], values[i]);
  }
  return absl::OkStatus();
}

// An objective and the load-balancing loss of the model it trains.
class WithRouterLoss final : public Objective {
 public:
  WithRouterLoss(std::unique_ptr<Objective> objective, const parallel::DeviceMesh& mesh,
                 std::vector<std::string> routing_dims)
      : objective_(std::move(objective)), mesh_(mesh), routing_dims_(std::move(routing_dims)) {}

  absl::Status Start(RunStart& run) override { return objective_->Start(run); }
  std::optional<std::string> FrozenRead() const override { return objective_->FrozenRead(); }
  absl::StatusOr<at::Tensor> ReadFrozen(models::CausalLM& frozen,
                                        const data::Batch& batch) const override {
    return objective_->ReadFrozen(frozen, batch);
  }
  absl::StatusOr<ObjectiveOutput> Compute(models::CausalLM& policy, const data::Batch& batch,
                                          const data::Batch& host, const at::Tensor& frozen_read,
                                          const StepItems* step, int micro) override {
    PLAIT_ASSIGN_OR_RETURN(ObjectiveOutput output,
                           objective_->Compute(policy, batch, host, frozen_read, step, micro));
    PLAIT_RETURN_IF_ERROR(AddRouterLoss(policy, mesh_, routing_dims_, step, micro, output));
    return output;
  }
  std::vector<std::string> MetricNames() const override {
    std::vector<std::string> names = objective_->MetricNames();
    names.insert(names.end(), std::begin(kRouterMetrics), std::end(kRouterMetrics));
    return names;
  }
  int64_t ScoredItems(const data::Batch& batch) const override {
    return objective_->ScoredItems(batch);
  }

 private:
  std::unique_ptr<Objective> objective_;
  const parallel::DeviceMesh& mesh_;
  std::vector<std::string> routing_dims_;
};

}  // namespace

std::unique_ptr<Objective> WithModelLosses(std::unique_ptr<Objective> objective,
                                           const models::ModelConfig& config,
                                           const parallel::DeviceMesh& mesh,
                                           std::vector<std::string> routing_dims) {
  if (config.num_experts() == 0) return objective;
  return std::make_unique<WithRouterLoss>(std::move(objective), mesh, std::move(routing_dims));
}

}  // namespace plait::objectives
