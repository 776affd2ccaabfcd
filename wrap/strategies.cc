#include "wrap/strategies.h"

#include <functional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"
#include "google/protobuf/descriptor.h"
#include "wrap/checkpointing/activation_checkpointing.h"
#include "wrap/cp/context_parallel.h"
#include "wrap/ddp/ddp.h"
#include "wrap/ep/expert_parallel.h"
#include "wrap/fsdp/fsdp.h"
#include "wrap/lora/lora.h"
#include "wrap/pp/pipeline.h"
#include "wrap/tp/tensor_parallel.h"

namespace plait::wrap {

absl::StatusOr<std::unique_ptr<Strategy>> MakeStrategy(const PrepareStep& step) {
  switch (step.strategy_case()) {
    case PrepareStep::kFsdp:
      return std::make_unique<fsdp::FsdpStrategy>(step.fsdp());
    case PrepareStep::kDdp:
      PLAIT_RETURN_IF_ERROR(ddp::ValidateDdpConfig(step.ddp()));
      return std::make_unique<ddp::DdpStrategy>(step.ddp());
    case PrepareStep::kTensorParallel:
      return std::make_unique<tp::TensorParallelStrategy>(step.tensor_parallel());
    case PrepareStep::kActivationCheckpointing:
      PLAIT_RETURN_IF_ERROR(
          checkpointing::ValidateActivationCheckpointingConfig(step.activation_checkpointing()));
      return std::make_unique<checkpointing::ActivationCheckpointingStrategy>(
          step.activation_checkpointing());
    case PrepareStep::kLora:
      PLAIT_RETURN_IF_ERROR(lora::ValidateLoraConfig(step.lora()));
      return std::make_unique<lora::LoraStrategy>(step.lora());
    case PrepareStep::kPipeline:
      return std::make_unique<pp::PipelineStrategy>(step.pipeline());
    case PrepareStep::kContextParallel:
      return std::make_unique<cp::ContextParallelStrategy>(step.context_parallel());
    case PrepareStep::kExpertParallel:
      return std::make_unique<ep::ExpertParallelStrategy>(step.expert_parallel());
    case PrepareStep::STRATEGY_NOT_SET:
      break;
  }
  std::vector<std::string> names;  // every strategy PrepareStep offers
  const google::protobuf::OneofDescriptor* oneof = PrepareStep::descriptor()->oneof_decl(0);
  for (int i = 0; i < oneof->field_count(); ++i) names.push_back(oneof->field(i)->name());
  return absl::InvalidArgumentError(
      absl::StrCat("names no strategy; set one of ", absl::StrJoin(names, ", ")));
}

void HandOver(const std::vector<std::unique_ptr<Strategy>>& earlier, Strategy& later) {
  ParameterLayout* const borrower = FacetOf<ParameterLayout>(later);
  if (later.borrowed_dim().empty() || borrower == nullptr) return;
  for (const std::unique_ptr<Strategy>& strategy : earlier) {
    ParameterLayout* const lender = FacetOf<ParameterLayout>(*strategy);
    if (lender != nullptr && strategy->uses_mesh_dim() &&
        strategy->mesh_dim() == later.borrowed_dim()) {
      lender->HandOverReplicated();
      borrower->Borrow(*lender);
    }
  }
}

std::vector<PrepareStep> StepsThatSave(SmallerVersions::Saves saves) {
  std::vector<PrepareStep> steps;
  if (saves == SmallerVersions::Saves::kActivations) {
    for (const auto policy :
         {ActivationCheckpointingConfig::SELECTIVE, ActivationCheckpointingConfig::FULL}) {
      steps.emplace_back().mutable_activation_checkpointing()->set_policy(policy);
    }
  } else {
    steps.emplace_back().mutable_fsdp()->set_mesh_dim("dp");
  }
  return steps;
}

namespace {

// The dimensions, of `mesh_dims` in their order, of the steps whose strategy `splits` (and
// their replicate dimensions); a strategy without the DataSplit facet splits nothing.
std::vector<std::string> DimsOf(const google::protobuf::RepeatedPtrField<PrepareStep>& steps,
                                const std::vector<std::string>& mesh_dims,
                                const std::function<bool(const DataSplit&)>& splits) {
  std::set<std::string> splitting;
  for (const StepWith<DataSplit>& step : StepsWith<DataSplit>(steps)) {
    if (!splits(*step.facet)) continue;
    splitting.insert(step.strategy->mesh_dim());
    if (!step.strategy->replicate_dim().empty()) splitting.insert(step.strategy->replicate_dim());
  }
  std::vector<std::string> dims;
  for (const std::string& name : mesh_dims) {
    if (splitting.count(name) > 0) dims.push_back(name);
  }
  return dims;
}

}  // namespace

std::vector<std::string> DataParallelDimsOf(
    const google::protobuf::RepeatedPtrField<PrepareStep>& steps,
    const std::vector<std::string>& mesh_dims) {
  return DimsOf(steps, mesh_dims, [](const DataSplit& split) { return split.splits_batch(); });
}

std::vector<std::string> ScoringDimsOf(const google::protobuf::RepeatedPtrField<PrepareStep>& steps,
                                       const std::vector<std::string>& mesh_dims) {
  return DimsOf(steps, mesh_dims, [](const DataSplit& split) {
    return split.splits_batch() || split.splits_sequence();
  });
}

std::vector<std::string> RoutingDimsOf(const google::protobuf::RepeatedPtrField<PrepareStep>& steps,
                                       const std::vector<std::string>& mesh_dims) {
  return DimsOf(steps, mesh_dims, [](const DataSplit& split) { return split.splits_tokens(); });
}

}  // namespace plait::wrap
