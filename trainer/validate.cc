#include "trainer/validate.h"

#include <sys/stat.h>

#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/memory.h"
#include "base/status.h"
#include "checkpoint/checkpoint_config.h"
#include "data/data_config.h"
#include "models/hf_checkpoint.h"
#include "models/model_config.h"
#include "models/parameter_shapes.h"
#include "objectives/objective_check.h"
#include "optim/optimizer.h"
#include "parallel/device.h"
#include "parallel/device_mesh.h"
#include "sched/schedule_builder.h"
#include "trainer/compute_dtype.h"
#include "trainer/memory_estimate.h"
#include "trainer/plan.h"
#include "wrap/rules.h"
#include "wrap/strategies.h"
#include "wrap/tp/tensor_parallel.h"

namespace plait::trainer {
namespace {

// LibTorch's CPU kernels (1.13) have no fp16 matmul; the trainer runs on CPU.
constexpr char kNoCpuFp16[] =
    "DTYPE_FLOAT16 has no CPU matmul; use DTYPE_BFLOAT16 or DTYPE_FLOAT32";

// DTYPE_AUTO chooses a model's dtype for its device; FSDP's dtypes follow the model's.
constexpr char kAutoIsForModels[] =
    "DTYPE_AUTO is for model.dtype only; leave this unset to follow the model's dtype";

bool DirectoryExists(const std::string& path) {
  struct stat info;
  return stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode);
}

class Checker {
 public:
  Checker(const Plan& plan, int world_size, const wrap::PreparationRules& rules)
      : plan_(plan), world_size_(world_size), rules_(rules) {}

  std::vector<Violation> Run() {
    std::optional<models::ModelConfig> config = CheckModel(plan_.model(), "plan.model");
    CheckWeights(plan_.hf_weights_dir(), "plan.hf_weights_dir");
    CheckMesh();
    CheckSteps(plan_.prepare(), "plan.prepare");
    CheckTensorParallel(plan_.prepare(), "plan.prepare", config);
    CollectDimUse();
    CheckMeshUse();
    CheckOptimizer(config);
    CheckTraining(config);
    CheckCheckpoint();
    CheckExport();
    CheckSchedule();
    CheckData(config);
    CheckFrozen();
    AddAll(objectives::CheckObjective(plan_.objective(), config, frozen_configs_, plan_.data(),
                                      "plan.objective"));
    return std::move(violations_);
  }

 private:
  void Add(std::string field, std::string message, std::string rule = "") {
    violations_.push_back({std::move(field), std::move(message), std::move(rule)});
  }

  // Violations a library found.
  void AddAll(std::vector<Violation> violations) {
    for (Violation& violation : violations) violations_.push_back(std::move(violation));
  }

  // A library's error for the subtree at `field`, whose message starts with the full field
  // path ("plan.model.preset: ...", as every plait library names its fields): recorded under
  // that path.
  void AddError(const std::string& field, absl::string_view error) {
    std::string message(error);
    std::string where = field;
    const size_t colon = message.find(": ");
    if (absl::StartsWith(message, field) && colon != std::string::npos) {
      where = message.substr(0, colon);
      message = message.substr(colon + 2);
    }
    Add(where, message);
  }

  std::optional<models::ModelConfig> CheckModel(const models::ModelSpec& spec,
                                                const std::string& field) {
    if (spec.dtype() == base::DTYPE_FLOAT16) {
      Add(field + ".dtype", kNoCpuFp16);
    }
    absl::StatusOr<models::ModelConfig> config = models::ResolveModelSpec(spec, field);
    if (config.ok()) return *config;
    AddError(field, config.status().message());
    return std::nullopt;
  }

  void CheckWeights(const std::string& dir, const std::string& field) {
    if (!dir.empty() && !DirectoryExists(dir)) {
      Add(field, absl::StrCat("\"", dir, "\" is not a folder"));
    }
  }

  void CheckMesh() {
    AddAll(parallel::CheckMeshConfig(plan_.mesh(), world_size_, "plan.mesh"));
    for (const auto& dim : plan_.mesh().dims()) dims_.insert(dim.name());
  }

  void CheckSteps(const google::protobuf::RepeatedPtrField<wrap::PrepareStep>& steps,
                  const std::string& field) {
    AddAll(wrap::CheckSteps(rules_, steps, field, dims_, "plan.mesh"));
    for (int i = 0; i < steps.size(); ++i) {
      if (!steps[i].has_fsdp()) continue;
      const std::string fsdp = absl::StrCat(field, "[", i, "].fsdp");
      if (steps[i].fsdp().param_dtype() == base::DTYPE_FLOAT16) {
        Add(fsdp + ".param_dtype", kNoCpuFp16);
      }
      if (steps[i].fsdp().param_dtype() == base::DTYPE_AUTO) {
        Add(fsdp + ".param_dtype", kAutoIsForModels);
      }
      if (steps[i].fsdp().reduce_dtype() == base::DTYPE_AUTO) {
        Add(fsdp + ".reduce_dtype", kAutoIsForModels);
      }
    }
  }

  // A tensor-parallel step splits the model's heads, MLP columns and vocabulary (and, with
  // sequence parallelism, the sequence) into as many equal parts as its dimension has ranks.
  void CheckTensorParallel(const google::protobuf::RepeatedPtrField<wrap::PrepareStep>& steps,
                           const std::string& field,
                           const std::optional<models::ModelConfig>& config) {
    for (int i = 0; i < steps.size(); ++i) {
      if (!steps[i].has_tensor_parallel()) continue;
      const wrap::TensorParallelConfig& tp = steps[i].tensor_parallel();
      int64_t size = 0;
      for (const auto& dim : plan_.mesh().dims()) {
        if (dim.name() == tp.mesh_dim()) size = dim.size();
      }
      if (size <= 0) continue;  // an unknown dimension is reported by the rules
      const std::string where = absl::StrCat(field, "[", i, "].tensor_parallel.mesh_dim");
      const std::string what = absl::StrCat("\"", tp.mesh_dim(), "\" (", size, " ranks): ");
      std::vector<std::string> problems;
      if (config.has_value()) {
        problems = wrap::tp::HeadSplitProblems(config->num_attention_heads(),
                                               config->num_key_value_heads(), size);
        if (config->intermediate_size() % size != 0) {
          problems.push_back(absl::StrCat("intermediate_size (", config->intermediate_size(),
                                          ") does not divide by the tensor-parallel size ", size));
        }
        if (config->vocab_size() % size != 0 && !tp.pad_vocab_to_multiple()) {
          problems.push_back(absl::StrCat(
              "vocab_size (", config->vocab_size(),
              ") does not divide by the tensor-parallel size ", size, "; set ", field, "[", i,
              "].tensor_parallel.pad_vocab_to_multiple to pad it with rows never predicted"));
        }
      }
      if (tp.sequence_parallel() && plan_.training().seq_len() % size != 0) {
        problems.push_back(absl::StrCat("sequence_parallel needs plan.training.seq_len (",
                                        plan_.training().seq_len(),
                                        ") to divide by the tensor-parallel size ", size));
      }
      for (const std::string& problem : problems) Add(where, what + problem);
    }
  }

  // The dimensions the plan's own steps use, and the data-parallel width: the ranks of the
  // dimensions whose strategies split the batch.
  void CollectDimUse() {
    for (const wrap::PrepareStep& step : plan_.prepare()) {
      absl::StatusOr<std::unique_ptr<wrap::Strategy>> strategy = wrap::MakeStrategy(step);
      if (!strategy.ok()) continue;  // CheckSteps says why
      if ((*strategy)->uses_mesh_dim()) used_dims_.insert((*strategy)->mesh_dim());
      used_dims_.insert((*strategy)->replicate_dim());
    }
    data_parallel_size_ =
        parallel::SubmeshRanks(plan_.mesh(), wrap::DataParallelDimsOf(plan_.prepare()));
  }

  // A mesh dimension of several ranks that no step uses would give its ranks the same data
  // and let their models drift apart.
  void CheckMeshUse() {
    for (int i = 0; i < plan_.mesh().dims_size(); ++i) {
      const auto& dim = plan_.mesh().dims(i);
      if (dim.size() > 1 && used_dims_.count(dim.name()) == 0) {
        Add(absl::StrCat("plan.mesh.dims[", i, "]"),
            absl::StrCat("\"", dim.name(), "\" has ", dim.size(),
                         " ranks but no preparation step in plan.prepare uses it"));
      }
    }
  }

  // The optimizer's own checks (hyperparameters, clipping, parameter-group rules against the
  // model's parameter names), made now rather than when the prepared model exists.
  void CheckOptimizer(const std::optional<models::ModelConfig>& config) {
    if (plan_.optimizer().algorithm_case() == optim::OptimizerConfig::ALGORITHM_NOT_SET) {
      Add("plan.optimizer", "names no algorithm; set one of adamw, adam, sgd, lion");
      return;
    }
    if (!config.has_value()) return;  // the model's error is reported; no names to match
    std::vector<std::string> names;
    for (const models::ParameterShape& shape : models::ParameterShapes(*config)) {
      names.push_back(shape.name);
    }
    const absl::Status status = optim::ValidateOptimizerConfig(plan_.optimizer(), names);
    if (!status.ok()) {
      // The optimizer names its fields from "optimizer".
      AddError("plan.optimizer", absl::StrCat("plan.", status.message()));
    }
  }

  void CheckTraining(const std::optional<models::ModelConfig>& config) {
    const TrainingConfig& t = plan_.training();
    auto positive = [&](const char* name, int64_t value) {
      if (value <= 0)
        Add(absl::StrCat("plan.training.", name), absl::StrCat(value, "; must be > 0"));
    };
    auto non_negative = [&](const char* name, int64_t value) {
      if (value < 0) {
        Add(absl::StrCat("plan.training.", name), absl::StrCat(value, "; must be >= 0"));
      }
    };
    positive("steps", t.steps());
    positive("micro_batch", t.micro_batch());
    positive("seq_len", t.seq_len());
    positive("eval_batches", t.eval_batches());
    non_negative("grad_accumulation", t.grad_accumulation());
    non_negative("global_batch", t.global_batch());
    non_negative("eval_every", t.eval_every());
    non_negative("log_every", t.log_every());
    non_negative("max_skipped_steps", t.max_skipped_steps());
    for (const auto& [name, peak] :
         {std::pair{"peak_flops_per_rank", t.peak_flops_per_rank()},
          std::pair{"peak_bf16_flops_per_rank", t.peak_bf16_flops_per_rank()}}) {
      if (!(peak >= 0.0 && std::isfinite(peak))) {
        Add(absl::StrCat("plan.training.", name), absl::StrCat(peak, "; must be >= 0 and finite"));
      }
    }
    if (config.has_value() && t.seq_len() > config->max_position_embeddings()) {
      Add("plan.training.seq_len",
          absl::StrCat(t.seq_len(), " exceeds the model's ", "max_position_embeddings (",
                       config->max_position_embeddings(), ")"));
    }
    if (t.global_batch() > 0 && t.micro_batch() > 0 && t.grad_accumulation() >= 0) {
      // Checked products: a huge micro_batch could wrap them to any value, 0 included.
      int64_t across_ranks = 0, per_step = 0;
      const bool ranks_overflow =
          __builtin_mul_overflow(t.micro_batch(), data_parallel_size_, &across_ranks);
      const bool overflow =
          ranks_overflow || __builtin_mul_overflow(across_ranks, GradAccumulation(t), &per_step);
      if (overflow || per_step != t.global_batch()) {
        Add("plan.training.global_batch",
            absl::StrCat(t.global_batch(), " is not micro_batch (", t.micro_batch(),
                         ") x data-parallel ranks (", data_parallel_size_,
                         ") x grad_accumulation (", GradAccumulation(t),
                         ") = ", overflow ? "more than 2^63 - 1" : absl::StrCat(per_step),
                         !ranks_overflow && t.global_batch() % across_ranks == 0
                             ? ""
                             : "; micro_batch x ranks does not divide it"));
      }
    }
  }

  // The trained model's folder, checked now so that it is never lost at the end of a run.
  void CheckExport() {
    std::vector<std::string> inputs = {plan_.hf_weights_dir()};
    for (const FrozenModel& frozen : plan_.frozen()) inputs.push_back(frozen.hf_weights_dir());
    AddAll(models::CheckHfExportFolder(plan_.training().save_hf_dir(), inputs,
                                       "plan.training.save_hf_dir"));
  }

  void CheckCheckpoint() {
    AddAll(checkpoint::CheckConfig(plan_.training().checkpoint(), "plan.training.checkpoint"));
  }

  void CheckSchedule() {
    const int64_t total = plan_.schedule().total_steps();
    if (total != 0 && total != plan_.training().steps()) {
      Add("plan.schedule.total_steps",
          absl::StrCat(total, " differs from plan.training.steps (", plan_.training().steps(),
                       "); leave it unset, it is taken from training.steps"));
      return;
    }
    if (plan_.training().steps() <= 0) return;  // reported above
    absl::StatusOr<sched::Schedule> schedule =
        sched::BuildSchedule(ResolvedSchedule(plan_), "plan.schedule");
    if (!schedule.ok()) AddError("plan.schedule", schedule.status().message());
  }

  void CheckData(const std::optional<models::ModelConfig>& config) {
    const std::optional<int64_t> vocab_size =
        config.has_value() ? std::optional<int64_t>(config->vocab_size()) : std::nullopt;
    AddAll(data::ValidateDataConfig(ResolvedData(plan_), vocab_size, "plan.data"));
  }

  void CheckFrozen() {
    std::set<std::string> names;
    for (int i = 0; i < plan_.frozen_size(); ++i) {
      const FrozenModel& frozen = plan_.frozen(i);
      const std::string field = absl::StrCat("plan.frozen[", i, "]");
      if (frozen.name().empty()) Add(field + ".name", "is empty; name every frozen model");
      if (!names.insert(frozen.name()).second) {
        Add(field + ".name", absl::StrCat("\"", frozen.name(), "\" appears twice"));
      }
      frozen_configs_[frozen.name()] = CheckModel(frozen.model(), field + ".model");
      CheckWeights(frozen.hf_weights_dir(), field + ".hf_weights_dir");
      CheckSteps(frozen.prepare(), field + ".prepare");
      CheckTensorParallel(frozen.prepare(), field + ".prepare", frozen_configs_[frozen.name()]);
    }
  }

  const Plan& plan_;
  const int world_size_;
  const wrap::PreparationRules& rules_;
  std::set<std::string> dims_;
  std::set<std::string> used_dims_;
  int64_t data_parallel_size_ = 1;
  std::map<std::string, std::optional<models::ModelConfig>> frozen_configs_;  // by name
  std::vector<Violation> violations_;
};

}  // namespace

std::vector<Violation> CheckPlan(const Plan& plan, int world_size,
                                 const wrap::PreparationRules& rules) {
  return Checker(plan, world_size, rules).Run();
}

absl::Status ValidatePlan(const Plan& plan, int world_size) {
  PLAIT_ASSIGN_OR_RETURN(const wrap::PreparationRules* rules, wrap::BuiltinRules());
  return base::ViolationsToStatus(CheckPlan(plan, world_size, *rules));
}

absl::Status ValidatePlanForMachine(const Plan& plan, int world_size, int local_ranks,
                                    bool skip_memory_check) {
  PLAIT_RETURN_IF_ERROR(ValidatePlan(plan, world_size));
  PLAIT_ASSIGN_OR_RETURN(
      const torch::Device device,
      parallel::ResolveDevice(plan.device(), /*local_rank=*/0, local_ranks, "plan.device"));
  if (skip_memory_check) return absl::OkStatus();
  // For the dtypes the run computes in (DTYPE_AUTO resolved as the run resolves it).
  PLAIT_ASSIGN_OR_RETURN(const MemoryEstimate estimate,
                         EstimateMemory(ResolveAutoDtypes(plan, device), world_size));
  // On CUDA each rank computes in a GPU of its own.
  if (const std::optional<int64_t> device_bytes = parallel::DeviceMemoryBytes(device)) {
    return CheckMemoryFits(estimate, /*local_ranks=*/1, *device_bytes);
  }
  PLAIT_ASSIGN_OR_RETURN(const int64_t available, base::AvailableMemoryBytes());
  return CheckMemoryFits(estimate, local_ranks, available);
}

}  // namespace plait::trainer
