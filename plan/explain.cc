#include "plan/explain.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/dtype.h"
#include "base/human.h"
#include "base/status.h"
#include "models/causal_lm.h"
#include "models/estimates.h"
#include "models/model_config.h"
#include "models/parameter_shapes.h"
#include "objectives/objective_check.h"
#include "optim/param_groups.h"
#include "plan/memory_estimate.h"
#include "sched/schedule_builder.h"
#include "wrap/rules.h"
#include "wrap/strategies.h"

namespace plait::plan {
namespace {

// The dtype of the model's parameters, gradients and activations (plan.model.dtype).
at::ScalarType ParameterDtype(const models::ModelSpec& spec) {
  return base::ToScalarType(spec.dtype(), at::kFloat);
}

std::string ShortName(at::ScalarType dtype) {
  switch (dtype) {
    case at::kBFloat16:
      return "bf16";
    case at::kHalf:
      return "fp16";
    default:
      return "fp32";
  }
}

// "qwen2 (preset "qwen2-tiny"), 4 layers, ...: 1.4M parameters", and for a mixture of experts
// ", 8 experts (2 a token): 12.9B of them active".
std::string DescribeModel(const models::ModelSpec& spec, const models::ModelConfig& config) {
  const int64_t parameters = models::NumParameters(config);
  const int64_t active = models::NumActiveParameters(config);
  return absl::StrFormat(
      "%s%s, %d layers, hidden %d, vocab %d, %s: %s parameters%s", config.model_type(),
      spec.has_preset() ? absl::StrCat(" (preset \"", spec.preset(), "\")") : "",
      config.num_hidden_layers(), config.hidden_size(), config.vocab_size(),
      spec.dtype() == base::DTYPE_AUTO
          ? "auto (bf16 where the device computes it natively, else fp32)"
          : ShortName(ParameterDtype(spec)),
      base::HumanCount(static_cast<double>(parameters)),
      active == parameters ? ""
                           : absl::StrFormat(", %d experts (%d a token): %s of them active",
                                             config.num_experts(), config.num_experts_per_tok(),
                                             base::HumanCount(static_cast<double>(active))));
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
    std::vector<std::string> terms;
    for (const wrap::MemoryTerm& term : estimate.steps[i].memory) {
      terms.push_back(DescribeTerm(term));
    }
    if (!terms.empty()) {
      lines.push_back(absl::StrCat(indent, "  memory on a rank: ", absl::StrJoin(terms, "; ")));
    }
  }
  return lines;
}

// The samples a run draws, and what generating them holds on a rank: "samples: 2 prompts x 1
// sample of up to 8 new tokens after every 20 steps and the last, into …; each of 2
// data-parallel ranks decodes its share with a 1.0 MiB KV cache, the weights gathered once
// for the phase (4.2 MiB)".
std::string DescribeSamples(const ResolvedPlan& resolved, const MemoryEstimate& memory) {
  const generation::SamplesConfig& samples = resolved.training().samples();
  const int num_samples = std::max(1, samples.sampling().num_samples());
  std::string text = absl::StrFormat(
      "samples: %d prompt%s x %d sample%s of up to %d new tokens after %s, into %s; ",
      samples.prompts_size(), samples.prompts_size() == 1 ? "" : "s", num_samples,
      num_samples == 1 ? "" : "s", samples.sampling().max_new_tokens(),
      samples.every_steps() > 0
          ? absl::StrFormat("every %d steps and the last", samples.every_steps())
          : "the last step",
      resolved.samples_path);
  if (!memory.generation.has_value()) return text;
  const MemoryEstimate::Generation& generation = *memory.generation;
  absl::StrAppend(&text,
                  resolved.data_parallel_size > 1
                      ? absl::StrFormat("each of %d data-parallel ranks decodes its share",
                                        resolved.data_parallel_size)
                      : "decoded",
                  " with a ", base::HumanBytes(generation.kv_cache_bytes), " KV cache");
  if (generation.gathered_bytes > 0) {
    absl::StrAppend(
        &text,
        generation.keep_gathered ? ", the weights gathered once for the phase ("
                                 : ", the weights gathered a block at a time, as in a step (",
        base::HumanBytes(generation.gathered_bytes),
        generation.keep_gathered ? ")" : "; all at once would not fit in a step's peak)");
  }
  return text;
}

// A frozen model's memory on a rank: "12.0 MiB parameters, 3.0 MiB gathered units; about
// 15.0 MiB".
std::string DescribeFrozenMemory(const FrozenEstimate& frozen) {
  return absl::StrFormat("%s parameters%s; about %s", base::HumanBytes(frozen.parameter_bytes),
                         DescribeTerms(frozen.preparation, wrap::MemoryTerm::Part::kGathered),
                         base::HumanBytes(frozen.total_bytes()));
}

// "lr at step 0: 1e-05, step 25: 0.003, ..." at the quarters of `steps`, each step once.
std::string DescribeLearningRates(const sched::Schedule& schedule, int64_t steps) {
  std::set<int64_t> shown = {0, steps / 4, steps / 2, steps - 1};
  std::vector<std::string> rates;
  for (const int64_t step : shown) {
    rates.push_back(absl::StrFormat("step %d: %g", step, schedule.LearningRate(step)));
  }
  return absl::StrCat("lr at ", absl::StrJoin(rates, ", "));
}

}  // namespace

absl::StatusOr<std::string> ExplainPlan(const ResolvedPlan& resolved,
                                        const models::LibTorchKernels& kernels) {
  const Plan& plan = resolved.plan;
  const models::ModelConfig& config = resolved.model;
  PLAIT_ASSIGN_OR_RETURN(const wrap::PreparationRules* rules, wrap::BuiltinRules());
  const TrainingConfig& training = plan.training();
  std::vector<std::string> lines;

  lines.push_back(absl::StrCat("model: ", DescribeModel(plan.model(), config)));
  lines.push_back(absl::StrCat("weights: ", DescribeWeights(plan.model(), plan.hf_weights_dir())));
  std::vector<std::string> dims;
  for (const auto& dim : plan.mesh().dims())
    dims.push_back(absl::StrCat(dim.name(), "=", dim.size()));
  lines.push_back(absl::StrCat("mesh: ", dims.empty() ? "none" : absl::StrJoin(dims, " x "), " (",
                               resolved.world_size,
                               resolved.world_size == 1 ? " rank)" : " ranks)"));

  // What each step does (as the strategy describes itself), and the per-rank share of the
  // parameters after it, on the rank that needs the most where ranks differ (pipeline stages).
  PLAIT_ASSIGN_OR_RETURN(const std::vector<MemoryEstimate> shares,
                         EstimateMemoryOfEachShare(resolved, kernels));
  const MemoryEstimate& memory = LargestOf(shares);
  double bytes_sent = 0.0;
  int last_changing = -1;
  for (const wrap::StepEstimate& estimate : memory.preparation.steps) {
    for (const wrap::Transfer& transfer : estimate.transfers) {
      bytes_sent += transfer.BytesPerStep(resolved.grad_accumulation);
    }
  }
  const std::vector<std::string> step_lines =
      DescribeSteps(plan.prepare(), memory.preparation, *rules, "", &last_changing);
  lines.insert(lines.end(), step_lines.begin(), step_lines.end());
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

  // The optimizer's parameters: the model's, or those a step made the only trainable ones.
  std::vector<std::string> names;
  std::vector<double> sizes;
  if (memory.preparation.trainable_parameters.has_value()) {
    for (const wrap::ModelShape::Parameter& parameter : *memory.preparation.trainable_parameters) {
      names.push_back(parameter.name);
      sizes.push_back(parameter.numel());
    }
  } else {
    for (const models::ParameterShape& shape : models::ParameterShapes(config)) {
      names.push_back(shape.name);
      sizes.push_back(static_cast<double>(shape.numel()));
    }
  }
  PLAIT_ASSIGN_OR_RETURN(std::vector<optim::ParamGroup> groups,
                         optim::AssignParamGroups(names, plan.optimizer()));
  for (const optim::ParamGroup& group : groups) {
    double count = 0;
    for (int member : group.members) count += sizes[member];
    lines.push_back(absl::StrFormat(
        "  group %s: %d tensors, %s parameters (%s per rank), lr x %g, weight decay %g", group.name,
        group.members.size(), base::HumanCount(count),
        base::HumanCount(count * memory.preparation.parameter_fraction), group.lr_scale,
        group.weight_decay));
  }

  PLAIT_ASSIGN_OR_RETURN(sched::Schedule schedule,
                         sched::BuildSchedule(resolved.schedule, "plan.schedule"));
  const int64_t steps = training.steps();
  lines.push_back(absl::StrFormat("schedule: %s over %d steps; %s",
                                  resolved.schedule.ShortDebugString(), steps,
                                  DescribeLearningRates(schedule, steps)));

  const data::DataConfig& data = resolved.data;
  lines.push_back(absl::StrCat(
      "data: ", data.has_synthetic()
                    ? absl::StrCat("synthetic Markov source, ", data.synthetic().ShortDebugString())
                    : data.ShortDebugString()));
  lines.push_back(absl::StrCat(
      "objective: ", plan.has_objective() ? plan.objective().ShortDebugString() : "causal_lm {}"));
  if (const std::string role = objectives::DescribeTrainedModelRole(plan.objective());
      !role.empty()) {
    lines.push_back(absl::StrCat("  ", role));
  }
  // The objective may run several rows an example (DPO: chosen and rejected).
  const double rows = objectives::WorkOf(plan.objective()).trained_rows;
  // Rows packed by best fit take the place of examples (data.proto's PACKING_BFD).
  const bool packed_rows = data.has_sft_files() && data.sft_files().packing() == data::PACKING_BFD;
  lines.push_back(
      absl::StrFormat("training: %d steps of %d %s x %d tokens (micro-batch %d x %d ranks x %d "
                      "accumulation), %d tokens per step%s",
                      steps, resolved.global_batch, packed_rows ? "packed rows" : "examples",
                      training.seq_len(), training.micro_batch(), resolved.data_parallel_size,
                      resolved.grad_accumulation, static_cast<int64_t>(resolved.tokens_per_step),
                      rows > 1 ? absl::StrFormat(" (%g rows an example)", rows) : ""));

  if (training.has_samples()) lines.push_back(DescribeSamples(resolved, memory));
  if (shares.size() == 1) {
    lines.push_back(absl::StrCat("memory per rank (estimate): ", DescribeMemory(memory)));
  } else {
    lines.push_back("memory per rank (estimate), as their shares differ:");
    for (const MemoryEstimate& share : shares) {
      lines.push_back(absl::StrCat("  ", DescribeShare(share), ": ", DescribeMemory(share)));
    }
  }
  if (bytes_sent > 0) {
    lines.push_back(
        absl::StrFormat("communication per rank (estimate, ring collectives): %s sent per step",
                        base::HumanBytes(bytes_sent)));
  }
  const std::map<std::string, std::string> roles =
      objectives::DescribeFrozenRoles(plan.objective());
  for (int i = 0; i < plan.frozen_size(); ++i) {
    const FrozenModel& frozen = plan.frozen(i);
    const FrozenEstimate& estimate = memory.frozen[i];
    const auto role = roles.find(frozen.name());
    lines.push_back(absl::StrCat("frozen[", i, "] \"", frozen.name(),
                                 "\": ", DescribeModel(frozen.model(), resolved.frozen[i])));
    lines.push_back(
        absl::StrCat("  weights: ", DescribeWeights(frozen.model(), frozen.hf_weights_dir())));
    lines.push_back(
        "  prepared after the trained model, by its own steps below; no optimizer, no "
        "gradients");
    for (std::string& line :
         DescribeSteps(frozen.prepare(), estimate.preparation, *rules, "  ", nullptr)) {
      lines.push_back(std::move(line));
    }
    if (estimate.preparation.share_dim.empty()) {
      lines.push_back(
          absl::StrCat("  memory per rank (estimate): ", DescribeFrozenMemory(estimate)));
    } else {
      lines.push_back("  memory per rank (estimate), as their shares differ:");
      for (const MemoryEstimate& share : shares) {
        lines.push_back(absl::StrCat("    ", DescribeShare(share), ": ",
                                     DescribeFrozenMemory(share.frozen[i])));
      }
    }
    lines.push_back(
        absl::StrCat("  role: ", role == roles.end() ? "not read by the objective" : role->second));
  }
  return absl::StrJoin(lines, "\n");
}

}  // namespace plait::plan
