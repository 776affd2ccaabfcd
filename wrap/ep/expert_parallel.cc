#include "wrap/ep/expert_parallel.h"

#include <algorithm>
#include <utility>

#include "ATen/core/Tensor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/human.h"
#include "base/status.h"
#include "parallel/device_mesh.h"
#include "torch/csrc/autograd/generated/variable_factories.h"
#include "wrap/gradient_reduce.h"

namespace plait::wrap::ep {

std::vector<base::Violation> ExpertParallelStrategy::Check(const std::optional<ModelShape>& shape,
                                                           const parallel::MeshConfig& mesh,
                                                           const std::string& field) const {
  if (!shape.has_value()) return {};
  // 1 for an unknown dimension, which the rules report.
  const int64_t ranks = parallel::SubmeshRanks(mesh, {config_.mesh_dim()});
  const std::string where = field + ".expert_parallel.mesh_dim";
  const std::string dim = absl::StrCat("\"", config_.mesh_dim(), "\" (", ranks, " ranks)");
  if (shape->num_experts == 0) {
    return {{where,
             absl::StrCat(dim,
                          ": the model is dense; expert parallelism splits a mixture of "
                          "experts' experts over the ranks"),
             ""}};
  }
  if (shape->num_experts % ranks != 0) {
    return {{where,
             absl::StrCat(dim, ": the model's ", shape->num_experts,
                          " experts do not divide by the ranks; each rank keeps an equal share"),
             ""}};
  }
  return {};
}

StepEstimate ExpertParallelStrategy::Estimate(const ModelShape& shape,
                                              const parallel::MeshConfig& mesh) const {
  const int64_t ranks = parallel::SubmeshRanks(mesh, {config_.mesh_dim()});
  StepEstimate estimate;
  double expert_parameters = 0;
  const int64_t experts_per_rank = shape.num_experts / std::max<int64_t>(1, ranks);
  estimate.kept_parameter_list.emplace();
  for (const ModelShape::Parameter& parameter : shape.parameter_list) {
    if (!IsExpertParameter(parameter.name)) {
      estimate.kept_parameter_list->push_back(parameter);
      continue;
    }
    expert_parameters += parameter.numel();
    if (ExpertIndexOf(parameter.name) < experts_per_rank) {
      estimate.kept_parameter_list->push_back(parameter);
    }
  }
  const double others = shape.parameters - expert_parameters;
  if (shape.parameters > 0) {
    estimate.parameter_fraction = (others + expert_parameters / ranks) / shape.parameters;
  }
  estimate.description = absl::StrFormat(
      "expert_parallel over %s (%d ranks): each rank keeps %d of the %d experts of each "
      "mixture-of-experts layer and the other %s parameters whole%s; routed rows go to their "
      "experts' ranks and back by all-to-alls; %s averaged over %s after each step",
      config_.mesh_dim(), ranks, shape.num_experts / ranks, shape.num_experts,
      base::HumanCount(others),
      others_handed_over_ ? " (a later step shards them over this dimension too)" : "",
      others_handed_over_ ? "the experts' gradients" : "gradients", config_.mesh_dim());
  if (ranks > 1) {
    // Each token's choices land on another rank's experts (n - 1) / n of the time where the
    // routing is even: its row goes there and its output back, and in backward their gradients.
    const double rows = shape.micro_batch_tokens * static_cast<double>(shape.experts_per_token) *
                        (ranks - 1) / ranks;
    const double row_bytes = shape.hidden_size * shape.parameter_bytes;
    Transfer transfer;
    transfer.mesh_dim = config_.mesh_dim();
    transfer.bytes_per_micro_batch =
        static_cast<double>(shape.num_moe_blocks) * 4.0 * rows * row_bytes;
    transfer.overlaps_compute = false;
    estimate.transfers.push_back(transfer);
    estimate.details.push_back(absl::StrFormat(
        "per mixture-of-experts block: about %s of routed rows to other ranks' experts and as "
        "much back, forward and again backward (routing spread evenly)",
        base::HumanBytesAnySize(rows * row_bytes)));
    if (!others_handed_over_) {
      Transfer gradients;
      gradients.mesh_dim = config_.mesh_dim();
      gradients.bytes_per_step = 2.0 * (ranks - 1) / ranks * others * 4.0;
      gradients.overlaps_compute = false;
      estimate.transfers.push_back(gradients);
    }
  }
  return estimate;
}

ExpertParallelStrategy::~ExpertParallelStrategy() {
  if (model_ != nullptr) model_->seams().Remove(dispatch_.get());
}

absl::Status ExpertParallelStrategy::Apply(Wrappable& model, const parallel::DeviceMesh& mesh) {
  PLAIT_ASSIGN_OR_RETURN(parallel::Communicator* const communicator,
                         mesh.communicator(config_.mesh_dim()));
  group_ = std::make_unique<parallel::GraphGroup>(*communicator);
  dispatch_ = std::make_unique<ExpertDispatch>(*group_);
  // Every expert's parameters, listed before the others leave the model.
  int64_t num_experts = 0;
  for (const Wrappable::NamedParameter& named : model.NamedParameters()) {
    if (!IsExpertParameter(named.name)) continue;
    const int64_t index = ExpertIndexOf(named.name);
    num_experts = std::max(num_experts, index + 1);
    experts_.push_back({named.name, named.parameter.sizes().vec(), index});
  }
  if (num_experts % group_->size() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("expert_parallel over \"", config_.mesh_dim(), "\": the model's ", num_experts,
                     " experts do not divide by its ", group_->size(), " ranks"));
  }
  experts_per_rank_ = num_experts / group_->size();
  const auto [first, count] = dispatch_->LocalExperts(num_experts);
  model.KeepExperts(first, count);
  model.seams().Add(dispatch_.get());
  model_ = &model;
  return absl::OkStatus();
}

void ExpertParallelStrategy::UpdateParameters(
    std::vector<parallel::TrainableParameter>& parameters) {
  for (parallel::TrainableParameter& parameter : parameters) {
    if (IsExpertParameter(parameter.name)) {
      parameter.sharded_over.push_back(&group_->communicator());
    } else if (!others_handed_over_) {
      parameter.slice.replica = parameter.slice.replica * group_->size() + group_->rank();
    }
  }
}

absl::Status ExpertParallelStrategy::FinishGradients(
    const std::vector<parallel::TrainableParameter>& trainable) {
  if (group_->size() == 1) return absl::OkStatus();
  const parallel::ScopedPlace place =
      group_->Place(parallel::Pass::kNone, "expert-parallel gradients");
  for (const parallel::TrainableParameter& parameter : trainable) {
    if (!IsExpertParameter(parameter.name)) {
      if (!others_handed_over_) {
        PLAIT_RETURN_IF_ERROR(
            ReduceGradient(parameter, group_->communicator(), parallel::ReduceOp::kAverage));
      }
      continue;
    }
    // Already summed over every rank's rows: the average is the sum over the ranks.
    const at::NoGradGuard no_grad;
    at::Tensor& gradient = parameter.tensor.mutable_grad();
    if (!gradient.defined()) gradient = torch::zeros_like(parameter.tensor);
    gradient.div_(group_->size());
  }
  return absl::OkStatus();
}

absl::Status ExpertParallelStrategy::BackwardStatus() const {
  return group_ == nullptr ? absl::OkStatus() : group_->status();
}

absl::Status ExpertParallelStrategy::GatherFullParameters(
    std::map<std::string, at::Tensor>& parameters) {
  // Every rank keeps experts of every layer: one of its own gives the others' dtype and device.
  at::TensorOptions options;
  for (const Expert& expert : experts_) {
    if (HolderOf(expert) != group_->rank()) continue;
    const auto it = parameters.find(expert.name);
    if (it == parameters.end()) {
      return absl::InternalError(absl::StrCat("expert_parallel: no gathered ", expert.name));
    }
    options = it->second.options();
    break;
  }
  for (const Expert& expert : experts_) {
    const int holder = HolderOf(expert);
    at::Tensor tensor = holder == group_->rank() ? parameters.at(expert.name).detach().contiguous()
                                                 : torch::empty(expert.shape, options);
    PLAIT_RETURN_IF_ERROR(group_->communicator().Broadcast(tensor, holder)->Wait());
    parameters[expert.name] = tensor;
  }
  return absl::OkStatus();
}

}  // namespace plait::wrap::ep
