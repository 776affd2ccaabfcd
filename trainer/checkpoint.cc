#include "trainer/checkpoint.h"

#include <map>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "base/dtype.pb.h"
#include "base/status.h"
#include "models/model_config.h"
#include "trainer/plan.h"

namespace plait::trainer {
namespace {

constexpr char kParamPrefix[] = "param/";
constexpr char kOptimPrefix[] = "optim/";
constexpr char kOptimizerStep[] = "optimizer_step";

// What a resume must not change, by plan field. The rest of the plan (steps, schedule,
// evaluation, logging) may change between a run and its resume.
absl::StatusOr<std::map<std::string, std::string>> Fingerprint(const Plan& plan) {
  PLAIT_ASSIGN_OR_RETURN(models::ModelConfig config,
                         models::ResolveModelSpec(plan.model(), "plan.model"));
  std::vector<std::string> steps;
  for (const wrap::PrepareStep& step : plan.prepare()) steps.push_back(step.ShortDebugString());
  // Frozen models are not saved: each is rebuilt from its seed or its (fixed) Hugging Face
  // folder, which the manifest records so that a resume rebuilds the same one.
  std::vector<std::string> frozen;
  for (const FrozenModel& model : plan.frozen()) {
    frozen.push_back(
        absl::StrCat(model.name(), ": ", model.model().ShortDebugString(), " from ",
                     model.hf_weights_dir().empty() ? "its seed" : model.hf_weights_dir()));
  }
  const optim::OptimizerConfig& optimizer = plan.optimizer();
  const auto* algorithm = optimizer.GetReflection()->GetOneofFieldDescriptor(
      optimizer, optim::OptimizerConfig::descriptor()->FindOneofByName("algorithm"));
  const TrainingConfig& training = plan.training();
  return std::map<std::string, std::string>{
      {"plan.model", config.ShortDebugString()},
      {"plan.model.dtype", base::Dtype_Name(plan.model().dtype())},
      {"plan.prepare", absl::StrJoin(steps, "; ")},
      {"plan.optimizer", algorithm == nullptr ? "" : algorithm->name()},
      {"plan.training.micro_batch", absl::StrCat(training.micro_batch())},
      {"plan.training.grad_accumulation", absl::StrCat(GradAccumulation(training))},
      {"plan.training.seq_len", absl::StrCat(training.seq_len())},
      {"plan.data", ResolvedData(plan).ShortDebugString()},
      {"plan.objective", plan.objective().ShortDebugString()},
      {"plan.frozen", absl::StrJoin(frozen, "; ")},
  };
}

// The tensors of one rank's file: its trainable parameters and its optimizer state `state`,
// in host memory (a GPU run's are copied there once, here).
std::map<std::string, torch::Tensor> RankTensors(const optim::Optimizer& optimizer,
                                                 const optim::OptimizerState& state) {
  std::map<std::string, torch::Tensor> tensors;
  for (const parallel::TrainableParameter& parameter : optimizer.parameters()) {
    tensors[kParamPrefix + parameter.name] = parameter.tensor.detach().cpu();
  }
  for (const auto& [key, tensor] : state.tensors) tensors[kOptimPrefix + key] = tensor.cpu();
  return tensors;
}

// Loads a rank's saved state, whose tensors are the ones RankTensors names, into `optimizer`.
absl::Status LoadInto(const checkpoint::RankState& saved, optim::Optimizer& optimizer) {
  optim::OptimizerState state;
  const auto optimizer_step = saved.metadata.find(kOptimizerStep);
  if (optimizer_step == saved.metadata.end() ||
      !absl::SimpleAtoi(optimizer_step->second, &state.step)) {
    return absl::DataLossError(
        absl::StrCat("__metadata__.", kOptimizerStep, ": missing or not an integer"));
  }
  {
    torch::NoGradGuard no_grad;
    for (const parallel::TrainableParameter& parameter : optimizer.parameters()) {
      parameter.tensor.copy_(saved.tensors.at(kParamPrefix + parameter.name));
    }
  }
  for (const auto& [name, tensor] : saved.tensors) {
    absl::string_view key = name;
    if (absl::ConsumePrefix(&key, kOptimPrefix)) state.tensors[std::string(key)] = tensor;
  }
  return optimizer.LoadState(state);
}

}  // namespace

absl::StatusOr<Checkpointer> Checkpointer::Open(const Plan& plan, const std::string& dir,
                                                const parallel::DeviceMesh& mesh) {
  checkpoint::RunInfo run;
  run.config_field = "plan.training.checkpoint";
  run.steps = plan.training().steps();
  run.steps_field = "plan.training.steps";
  run.position_per_step = GradAccumulation(plan.training());  // micro-batches each rank reads
  if (!dir.empty()) {  // only checkpoints use it: a run without them need not resolve the model
    PLAIT_ASSIGN_OR_RETURN(run.fingerprint, Fingerprint(plan));
  }
  run.contents = "model and optimizer";
  run.kind_by_prefix = {{"", "optimizer state"}, {kParamPrefix, "trainable parameter"}};
  PLAIT_ASSIGN_OR_RETURN(
      checkpoint::Checkpointer checkpointer,
      checkpoint::Checkpointer::Open(plan.training().checkpoint(), dir, std::move(run), mesh));
  return Checkpointer(std::move(checkpointer), GradAccumulation(plan.training()));
}

absl::Status Checkpointer::Restore(optim::Optimizer& optimizer, data::DataLoader& train) const {
  if (checkpointer_.resume_step() == 0) return absl::OkStatus();
  // What this rank would save: the names, shapes and dtypes the file must have.
  PLAIT_RETURN_IF_ERROR(checkpointer_.Restore(
      RankTensors(optimizer, optimizer.SaveState()),
      [&](checkpoint::RankState saved) { return LoadInto(saved, optimizer); }));
  train.Seek(checkpointer_.resume_position());
  return absl::OkStatus();
}

absl::Status Checkpointer::SaveIfDue(int64_t step, const optim::Optimizer& optimizer) const {
  return checkpointer_.IsDue(step) ? Save(step, optimizer) : absl::OkStatus();
}

absl::Status Checkpointer::Save(int64_t step, const optim::Optimizer& optimizer) const {
  const optim::OptimizerState state = optimizer.SaveState();
  return checkpointer_.Save(
      step, step * accumulation_,
      {RankTensors(optimizer, state), {{kOptimizerStep, absl::StrCat(state.step)}}});
}

}  // namespace plait::trainer
