#include "trainer/explain.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/dtype.h"
#include "base/human.h"
#include "base/status.h"
#include "c10/util/accumulate.h"
#include "models/causal_lm.h"
#include "models/model_config.h"
#include "models/parameter_shapes.h"
#include "optim/param_groups.h"
#include "parallel/device_mesh.h"
#include "sched/schedule_builder.h"
#include "trainer/memory_estimate.h"
#include "trainer/plan.h"
#include "wrap/rules.h"
#include "wrap/strategies.h"

namespace plait::trainer {
namespace {

// The dtype of the model's parameters, gradients and activations (plan.model.dtype).
torch::ScalarType ParameterDtype(const models::ModelSpec& spec) {
  return base::ToScalarType(spec.dtype(), torch::kFloat32);
}

std::string ShortName(torch::ScalarType dtype) {
  switch (dtype) {
    case torch::kBFloat16:
      return "bf16";
    case torch::kFloat16:
      return "fp16";
    default:
      return "fp32";
  }
}

// Under tensor parallelism over `tp` ranks, the shape on a rank of each kind of parameter,
// shown for the first block's and the root's parameters, then what a rank holds of all of
// them in `element_bytes`-byte elements.
std::vector<std::string> TensorParallelShapes(const models::ModelConfig& config, int64_t tp,
                                              size_t element_bytes) {
  using Split = wrap::Wrappable::Split;
  std::vector<std::string> lines;
  int64_t total = 0;
  int64_t per_rank = 0;
  for (const models::ParameterShape& parameter : models::ParameterShapes(config)) {
    const bool shown = !absl::StartsWith(parameter.name, "model.layers.") ||
                       absl::StartsWith(parameter.name, "model.layers.0.");
    std::vector<int64_t> local = parameter.shape;
    const Split split = models::TensorParallelSplitOf(parameter.name);
    const char* kind = "replicated";
    switch (split) {
      case Split::kReplicated:
        break;
      case Split::kColumn:
        local[0] /= tp;
        kind = "column-parallel";
        break;
      case Split::kKeyValueColumn:
        local[0] /= std::min(config.num_key_value_heads(), tp);
        kind = config.num_key_value_heads() < tp ? "key/value heads, shared" : "key/value heads";
        break;
      case Split::kRow:
        local[1] /= tp;
        kind = "row-parallel";
        break;
      case Split::kVocabulary:
        local[0] = (local[0] + tp - 1) / tp;
        kind = local[0] * tp == parameter.shape[0] ? "vocabulary-parallel"
                                                   : "vocabulary-parallel, padded";
        break;
    }
    total += parameter.numel();
    per_rank += c10::multiply_integers(local);
    if (!shown) continue;
    lines.push_back(absl::StrFormat("  %s [%s] -> [%s] per rank (%s)", parameter.name,
                                    absl::StrJoin(parameter.shape, ", "),
                                    absl::StrJoin(local, ", "), kind));
  }
  lines.push_back(absl::StrFormat(
      "  tensor parallelism leaves each rank %s of the %s parameters (%.3f of them), %s",
      base::HumanCount(per_rank), base::HumanCount(total), static_cast<double>(per_rank) / total,
      base::HumanBytes(static_cast<double>(per_rank * element_bytes))));
  return lines;
}

// "qwen2 (preset "qwen2-tiny"), 4 layers, ...: 1.4M parameters".
std::string DescribeModel(const models::ModelSpec& spec, const models::ModelConfig& config) {
  return absl::StrFormat("%s%s, %d layers, hidden %d, vocab %d, %s: %s parameters",
                         config.model_type(),
                         spec.has_preset() ? absl::StrCat(" (preset \"", spec.preset(), "\")") : "",
                         config.num_hidden_layers(), config.hidden_size(), config.vocab_size(),
                         spec.dtype() == base::DTYPE_AUTO
                             ? "auto (bf16 where the device computes it natively, else fp32)"
                             : ShortName(ParameterDtype(spec)),
                         base::HumanCount(static_cast<double>(models::NumParameters(config))));
}

std::string DescribeWeights(const models::ModelSpec& spec, const std::string& hf_weights_dir) {
  return hf_weights_dir.empty()
             ? absl::StrCat("seeded initialisation (seed ", spec.init().seed(), ")")
             : absl::StrCat("loaded from ", hf_weights_dir,
                            " after the preparation, each rank reading only its slices");
}

// A line per preparation step, "<indent>prepare[i]: <what it does> [<effect>]"; the index of
// the last step that replaces or re-shards parameters (-1: none) in `last_changing` unless
// it is null.
std::vector<std::string> DescribeSteps(
    const google::protobuf::RepeatedPtrField<wrap::PrepareStep>& steps,
    const PreparationEstimate& estimate, const wrap::PreparationRules& rules,
    absl::string_view indent, int* last_changing) {
  std::vector<std::string> lines;
  for (int i = 0; i < steps.size(); ++i) {
    const wrap::StrategyRule* rule = wrap::FindStrategy(rules, wrap::StrategyName(steps[i]));
    if (last_changing != nullptr && rule != nullptr && rule->effect() != wrap::KEEPS) {
      *last_changing = i;
    }
    lines.push_back(absl::StrCat(indent, "prepare[", i, "]: ", estimate.steps[i].description, " [",
                                 rule == nullptr ? "" : wrap::ParameterEffect_Name(rule->effect()),
                                 "]"));
    for (const std::string& detail : estimate.steps[i].details) {
      lines.push_back(absl::StrCat(indent, "  ", detail));
    }
  }
  return lines;
}

}  // namespace

absl::StatusOr<std::string> ExplainPlan(const Plan& plan, int world_size) {
  PLAIT_ASSIGN_OR_RETURN(models::ModelConfig config,
                         models::ResolveModelSpec(plan.model(), "plan.model"));
  PLAIT_ASSIGN_OR_RETURN(const wrap::PreparationRules* rules, wrap::BuiltinRules());
  const TrainingConfig& training = plan.training();
  std::vector<std::string> lines;

  lines.push_back(absl::StrCat("model: ", DescribeModel(plan.model(), config)));
  lines.push_back(absl::StrCat("weights: ", DescribeWeights(plan.model(), plan.hf_weights_dir())));
  std::vector<std::string> dims;
  for (const auto& dim : plan.mesh().dims())
    dims.push_back(absl::StrCat(dim.name(), "=", dim.size()));
  lines.push_back(absl::StrCat("mesh: ", dims.empty() ? "none" : absl::StrJoin(dims, " x "), " (",
                               world_size, world_size == 1 ? " rank)" : " ranks)"));

  // What each step does, and the per-rank share of the parameters after it.
  PLAIT_ASSIGN_OR_RETURN(const MemoryEstimate memory, EstimateMemory(plan, world_size));
  double bytes_sent_per_step = 0.0;
  double bytes_sent_per_micro_batch = 0.0;
  int last_changing = -1;
  for (const wrap::StepEstimate& estimate : memory.preparation.steps) {
    bytes_sent_per_step += estimate.bytes_sent_per_step;
    bytes_sent_per_micro_batch += estimate.bytes_sent_per_micro_batch;
  }
  const std::vector<std::string> step_lines =
      DescribeSteps(plan.prepare(), memory.preparation, *rules, "", &last_changing);
  lines.insert(lines.end(), step_lines.begin(), step_lines.end());
  for (int i = 0; i < plan.prepare_size(); ++i) {
    if (!plan.prepare(i).has_tensor_parallel()) continue;
    for (const auto& dim : plan.mesh().dims()) {
      if (dim.name() != plan.prepare(i).tensor_parallel().mesh_dim()) continue;
      lines.push_back(absl::StrCat("prepare[", i, "]'s parameter shapes per rank (",
                                   ShortName(ParameterDtype(plan.model())), "):"));
      for (std::string& line : TensorParallelShapes(
               config, dim.size(), c10::elementSize(ParameterDtype(plan.model())))) {
        lines.push_back(std::move(line));
      }
    }
  }
  lines.push_back(absl::StrCat(
      "optimizer: built after ",
      last_changing < 0 ? "the preparation (no step replaces or re-shards parameters)"
                        : absl::StrCat("prepare[", last_changing,
                                       "], the last step that replaces or re-shards parameters"),
      ", from the prepared model's trainable parameters: ",
      plan.optimizer()
          .GetDescriptor()
          ->FindFieldByNumber(plan.optimizer().algorithm_case())
          ->name(),
      ", weight decay ", plan.optimizer().weight_decay(),
      plan.optimizer().has_clipping()
          ? absl::StrCat(", clipping at global norm ", plan.optimizer().clipping().max_norm())
          : ""));

  std::vector<std::string> names;
  std::vector<int64_t> sizes;
  for (const models::ParameterShape& shape : models::ParameterShapes(config)) {
    names.push_back(shape.name);
    sizes.push_back(shape.numel());
  }
  PLAIT_ASSIGN_OR_RETURN(std::vector<optim::ParamGroup> groups,
                         optim::AssignParamGroups(names, plan.optimizer()));
  for (const optim::ParamGroup& group : groups) {
    int64_t count = 0;
    for (int member : group.members) count += sizes[member];
    lines.push_back(absl::StrFormat(
        "  group %s: %d tensors, %s parameters (%s per rank), lr x %g, weight decay %g", group.name,
        group.members.size(), base::HumanCount(count),
        base::HumanCount(count * memory.preparation.parameter_fraction), group.lr_scale,
        group.weight_decay));
  }

  const sched::ScheduleConfig schedule_config = ResolvedSchedule(plan);
  PLAIT_ASSIGN_OR_RETURN(sched::Schedule schedule,
                         sched::BuildSchedule(schedule_config, "plan.schedule"));
  const int64_t steps = training.steps();
  lines.push_back(absl::StrFormat(
      "schedule: %s over %d steps; lr at step 0: %g, step %d: %g, step %d: %g, step %d: %g",
      schedule_config.ShortDebugString(), steps, schedule.LearningRate(0), steps / 4,
      schedule.LearningRate(steps / 4), steps / 2, schedule.LearningRate(steps / 2), steps - 1,
      schedule.LearningRate(steps - 1)));

  const data::DataConfig data = ResolvedData(plan);
  lines.push_back(absl::StrCat(
      "data: ", data.has_synthetic()
                    ? absl::StrCat("synthetic Markov source, ", data.synthetic().ShortDebugString())
                    : data.ShortDebugString()));
  lines.push_back(absl::StrCat(
      "objective: ", plan.has_objective() ? plan.objective().ShortDebugString() : "causal_lm {}"));
  const int64_t accumulation = GradAccumulation(training);
  const int64_t data_parallel_ranks =
      parallel::SubmeshRanks(plan.mesh(), wrap::DataParallelDimsOf(plan.prepare()));
  lines.push_back(absl::StrFormat(
      "training: %d steps of %d sequences x %d tokens (micro-batch %d x %d ranks x %d "
      "accumulation), %d tokens per step",
      steps, training.micro_batch() * data_parallel_ranks * accumulation, training.seq_len(),
      training.micro_batch(), data_parallel_ranks, accumulation,
      training.micro_batch() * data_parallel_ranks * accumulation * training.seq_len()));

  lines.push_back(absl::StrCat("memory per rank (estimate): ", DescribeMemory(memory)));
  if (bytes_sent_per_step + bytes_sent_per_micro_batch > 0) {
    lines.push_back(absl::StrFormat(
        "communication per rank (estimate, ring collectives): %s sent per step",
        base::HumanBytes(bytes_sent_per_step + accumulation * bytes_sent_per_micro_batch)));
  }
  for (int i = 0; i < plan.frozen_size(); ++i) {
    const FrozenModel& frozen = plan.frozen(i);
    PLAIT_ASSIGN_OR_RETURN(
        const models::ModelConfig frozen_config,
        models::ResolveModelSpec(frozen.model(), absl::StrCat("plan.frozen[", i, "].model")));
    const FrozenEstimate& estimate = memory.frozen[i];
    std::string role = "not read by the objective";
    if (plan.objective().has_dpo() && plan.objective().dpo().reference() == frozen.name()) {
      role = plan.objective().dpo().precompute_reference()
                 ? "the DPO reference: before the first step it scores every batch the run "
                   "will read (under no-grad, in eval mode), then it is released and the run "
                   "holds only its log-probabilities, 4 bytes per sequence"
                 : "the DPO reference: it scores the 2 x micro-batch chosen and rejected "
                   "sequences of every micro-batch in one forward, under no-grad, in eval mode";
    }
    lines.push_back(absl::StrCat("frozen[", i, "] \"", frozen.name(),
                                 "\": ", DescribeModel(frozen.model(), frozen_config)));
    lines.push_back(
        absl::StrCat("  weights: ", DescribeWeights(frozen.model(), frozen.hf_weights_dir())));
    lines.push_back(
        "  prepared after the trained model, by its own steps below; no optimizer, no "
        "gradients");
    for (std::string& line :
         DescribeSteps(frozen.prepare(), estimate.preparation, *rules, "  ", nullptr)) {
      lines.push_back(std::move(line));
    }
    lines.push_back(absl::StrFormat(
        "  memory per rank (estimate): %s parameters%s; about %s",
        base::HumanBytes(estimate.parameter_bytes),
        estimate.preparation.gathered_bytes > 0
            ? absl::StrCat(", ", base::HumanBytes(estimate.preparation.gathered_bytes),
                           " gathered units")
            : "",
        base::HumanBytes(estimate.total_bytes())));
    lines.push_back(absl::StrCat("  role: ", role));
  }
  return absl::StrJoin(lines, "\n");
}

}  // namespace plait::trainer
