#include "plan/memory_estimate.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/strings/match.h"
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
#include "optim/optimizer.h"
#include "parallel/device_mesh.h"
#include "plan/plan.pb.h"
#include "wrap/strategies.h"

namespace plait::plan {
namespace {

constexpr double kBytesPerFloat = 4.0;  // optimizer state, and fp32 parameters

at::ScalarType DtypeOf(const models::ModelSpec& spec) {
  return base::ToScalarType(spec.dtype(), at::kFloat);
}

// Where the activations are computed, whose kernels decide what they keep.
at::DeviceType DeviceTypeOf(parallel::Device device) {
  return device == parallel::DEVICE_CUDA ? at::kCUDA : at::kCPU;
}

// The values of `parameters`, counted whole.
double CountOf(const std::vector<wrap::ModelShape::Parameter>& parameters) {
  double count = 0;
  for (const wrap::ModelShape::Parameter& parameter : parameters) count += parameter.numel();
  return count;
}

// How `steps` split a micro-batch's activations over `mesh`, as the strategies say
// (tensor parallelism's heads, context parallelism's sequence slices).
wrap::ActivationSplit ActivationSplitOf(
    const google::protobuf::RepeatedPtrField<wrap::PrepareStep>& steps,
    const parallel::MeshConfig& mesh) {
  wrap::ActivationSplit split;
  for (const wrap::StepWith<wrap::DataSplit>& step : wrap::StepsWith<wrap::DataSplit>(steps)) {
    const wrap::ActivationSplit own = step.facet->SplitsActivations(mesh);
    if (own.ranks > 1) {
      split.ranks = own.ranks;
      split.sequence = own.sequence;
    }
    if (own.context_ranks > 1) split.context_ranks = own.context_ranks;
  }
  return split;
}

// What `steps` leave a rank of the share `share` (PreparationEstimate::share), or of the
// largest where that step gives none of that index.
absl::StatusOr<PreparationEstimate> EstimatePreparation(
    const google::protobuf::RepeatedPtrField<wrap::PrepareStep>& steps,
    const wrap::ModelShape& shape, const parallel::MeshConfig& mesh, int share) {
  PreparationEstimate estimate;
  // Each step sees the parameters as the steps before it left them on a rank: FSDP after
  // tensor parallelism shards, and gathers, the tensor-parallel slices; FSDP after LoRA
  // shards the adapters too and reduces only their gradients; tensor parallelism after expert
  // parallelism sees the rank's experts only.
  // A step that hands what it keeps whole over to a later one leaves it out of its estimate.
  std::vector<std::unique_ptr<wrap::Strategy>> strategies;
  for (const wrap::PrepareStep& step : steps) {
    PLAIT_ASSIGN_OR_RETURN(std::unique_ptr<wrap::Strategy> strategy, wrap::MakeStrategy(step));
    wrap::HandOver(strategies, *strategy);
    strategies.push_back(std::move(strategy));
  }
  wrap::ModelShape seen = shape;
  for (const std::unique_ptr<wrap::Strategy>& strategy : strategies) {
    wrap::StepEstimate& step_estimate = estimate.steps.emplace_back(strategy->Estimate(seen, mesh));
    const std::vector<wrap::StepEstimate::RankShare>& shares = step_estimate.rank_shares;
    if (!shares.empty()) {
      estimate.share_dim = strategy->mesh_dim();
      estimate.shares = static_cast<int>(shares.size());
    }
    if (share < static_cast<int>(shares.size())) {
      estimate.share = share;
      estimate.share_description = shares[share].description;
      step_estimate.parameter_fraction = shares[share].parameter_fraction;
      step_estimate.kept_activations = shares[share].kept_activations;
    }
    if (step_estimate.kept_activations.has_value()) {
      // The steps after it see the blocks a rank holds (FSDP's units, tensor parallelism's
      // collectives per block) and the block activations it keeps (activation checkpointing).
      estimate.kept_activations = step_estimate.kept_activations;
      seen.num_blocks = step_estimate.kept_activations->held_blocks;
      seen.kept_block_activations = step_estimate.kept_activations->blocks;
    }
    // A step counts what it adds whole (from the model's parameter list); on a rank it is
    // the share the steps before it leave, and the steps after it split it further.
    estimate.added_parameters += step_estimate.added_parameters;
    const double added_here = step_estimate.added_parameters * estimate.parameter_fraction;
    seen.parameters += added_here;
    if (seen.num_blocks > 0) seen.block_parameters += added_here / seen.num_blocks;
    if (step_estimate.kept_parameter_list.has_value()) {
      seen.parameter_list = *step_estimate.kept_parameter_list;
    }
    if (step_estimate.trainable_parameters.has_value()) {
      estimate.trainable_parameters = step_estimate.trainable_parameters;
      seen.trainable_parameters =
          CountOf(*step_estimate.trainable_parameters) * estimate.parameter_fraction;
    }
    estimate.parameter_fraction *= step_estimate.parameter_fraction;
    for (double* parameters : {&seen.parameters, &seen.block_parameters, &seen.root_parameters}) {
      *parameters *= step_estimate.parameter_fraction;
    }
    if (seen.trainable_parameters.has_value()) {
      *seen.trainable_parameters *= step_estimate.parameter_fraction;
    }
  }
  return estimate;
}

}  // namespace

wrap::ModelShape ShapeOf(const models::ModelConfig& config, const models::ModelSpec& spec,
                         parallel::Device device, const TrainingConfig& training,
                         const wrap::ActivationSplit& split,
                         const models::LibTorchKernels& kernels) {
  const at::ScalarType dtype = DtypeOf(spec);
  const at::DeviceType device_type = DeviceTypeOf(device);
  const models::LayerSplit tp{split.ranks, split.sequence};
  const double element_bytes = static_cast<double>(c10::elementSize(dtype));
  // The tokens of each sequence a rank computes: its slice under context parallelism.
  const int64_t seq_len = training.seq_len() / std::max<int64_t>(1, split.context_ranks);
  wrap::ModelShape shape;
  shape.hidden_size = static_cast<double>(config.hidden_size());
  shape.micro_batch_tokens = static_cast<double>(training.micro_batch()) * seq_len;
  shape.parameters = static_cast<double>(models::NumParameters(config));
  shape.num_blocks = config.num_hidden_layers();
  shape.tied_embeddings = config.tie_word_embeddings();
  shape.micro_batches_per_step = std::max<int64_t>(1, training.grad_accumulation());
  shape.parameter_bytes = element_bytes;
  shape.block_activation_bytes = models::BlockActivationBytes(
      config, training.micro_batch(), seq_len, dtype, device_type, tp, kernels);
  shape.output_activation_bytes =
      models::ActivationBytes(config, training.micro_batch(), seq_len, dtype, device_type, tp,
                              kernels) -
      shape.block_activation_bytes * static_cast<double>(config.num_hidden_layers());
  // A block's input is [tokens, hidden], this rank's slice of the sequence under sequence
  // parallelism.
  shape.block_input_bytes = shape.micro_batch_tokens / (tp.sequence_parallel ? tp.size : 1) *
                            shape.hidden_size * element_bytes;
  shape.block_projection_output_bytes = models::BlockProjectionOutputBytes(
      config, training.micro_batch(), seq_len, element_bytes, tp);
  shape.num_key_value_heads = config.num_key_value_heads();
  shape.head_ranks = tp.size;
  shape.num_attention_heads = config.num_attention_heads();
  shape.head_dim = models::HeadDim(config);
  shape.intermediate_size = config.intermediate_size();
  shape.num_experts = config.num_experts();
  shape.experts_per_token = config.num_experts_per_tok();
  for (int64_t layer = 0; layer < config.num_hidden_layers(); ++layer) {
    if (models::IsMoeLayer(config, layer)) ++shape.num_moe_blocks;
  }
  shape.vocab_size = config.vocab_size();
  shape.seq_len = training.seq_len();
  shape.on_cpu = device_type == at::kCPU;
  shape.compute_threads = std::max(1, training.compute_threads_per_rank());
  for (const models::ParameterShape& parameter : models::ParameterShapes(config)) {
    const wrap::Wrappable::Split split_of = models::ParameterSplitOf(parameter.name);
    shape.parameter_list.push_back({parameter.name, parameter.shape, split_of});
    const bool in_blocks = absl::StartsWith(parameter.name, "model.layers.");
    // A block's counts are their average over the blocks: a mixture of experts' hold more.
    const double count = static_cast<double>(parameter.numel()) /
                         (in_blocks ? static_cast<double>(shape.num_blocks) : 1.0);
    if (in_blocks) shape.block_parameters += count;
    if (split_of == wrap::Wrappable::Split::kKeyValueColumn) {
      shape.block_key_value_parameters += count;
    }
  }
  shape.root_parameters = shape.parameters - shape.block_parameters * shape.num_blocks;
  return shape;
}

namespace {

// Adds to each step's memory its terms that scale with what a rank holds after every step.
void AddTermsOnRank(PreparationEstimate& preparation, const wrap::RankHolding& holding) {
  for (wrap::StepEstimate& step : preparation.steps) {
    if (!step.memory_on_rank) continue;
    for (wrap::MemoryTerm& term : step.memory_on_rank(holding)) {
      step.memory.push_back(std::move(term));
    }
  }
}

// The estimate for the ranks of share `share` (PreparationEstimate::share) of `resolved`.
// Leaves out of `preparation` its steps' terms of `part`: those of a phase the plan does not
// run.
void DropTerms(wrap::MemoryTerm::Part part, PreparationEstimate& preparation) {
  for (wrap::StepEstimate& step : preparation.steps) {
    step.memory.erase(
        std::remove_if(step.memory.begin(), step.memory.end(),
                       [part](const wrap::MemoryTerm& term) { return term.part == part; }),
        step.memory.end());
  }
}

// The samples' generation on a rank of `estimate`'s: the KV cache of its rows, of
// ceil(prompts / data-parallel ranks) x num_samples rows of up to the longest prompt's bytes
// plus two special tokens (a tokenizer makes no more tokens of a text than its bytes) and
// max_new_tokens, in the model's dtype, each layer's key/value heads split as tensor
// parallelism splits them; and the weights the steps gather meanwhile.
MemoryEstimate::Generation EstimateGeneration(const ResolvedPlan& resolved,
                                              const wrap::ModelShape& shape,
                                              const MemoryEstimate& estimate) {
  const generation::SamplesConfig& samples = resolved.training().samples();
  size_t longest = 0;
  for (const std::string& prompt : samples.prompts()) longest = std::max(longest, prompt.size());
  const double rows = std::ceil(static_cast<double>(samples.prompts_size()) /
                                static_cast<double>(resolved.data_parallel_size)) *
                      std::max(1, samples.sampling().num_samples());
  const double tokens = static_cast<double>(longest + 2 + samples.sampling().max_new_tokens());
  const double kv_heads =
      std::max<double>(1.0, static_cast<double>(shape.num_key_value_heads) /
                                static_cast<double>(std::max<int64_t>(1, shape.head_ranks)));
  MemoryEstimate::Generation generation;
  generation.kv_cache_bytes = 2.0 * static_cast<double>(shape.num_blocks) * rows * tokens *
                              kv_heads * static_cast<double>(shape.head_dim) *
                              shape.parameter_bytes;
  const double kept = estimate.preparation.Sum(wrap::MemoryTerm::Part::kKeptGathered);
  generation.keep_gathered = kept > 0 && generation.kv_cache_bytes + kept <= estimate.step_bytes();
  generation.gathered_bytes =
      generation.keep_gathered ? kept : estimate.preparation.Sum(wrap::MemoryTerm::Part::kGathered);
  return generation;
}

absl::StatusOr<MemoryEstimate> EstimateMemoryOfShare(const ResolvedPlan& resolved,
                                                     const models::LibTorchKernels& kernels,
                                                     int share) {
  const Plan& plan = resolved.plan;
  const wrap::ActivationSplit split = ActivationSplitOf(plan.prepare(), plan.mesh());
  const wrap::ModelShape shape =
      ShapeOf(resolved.model, plan.model(), plan.device(), plan.training(), split, kernels);
  MemoryEstimate estimate;
  PLAIT_ASSIGN_OR_RETURN(estimate.preparation,
                         EstimatePreparation(plan.prepare(), shape, plan.mesh(), share));
  // The parameters and gradients a rank keeps: in the model's dtype unless a step stores
  // them in its own (FSDP's fp32 shards).
  double parameter_element = shape.parameter_bytes;
  double gradient_element = shape.parameter_bytes;
  for (const wrap::StepEstimate& step : estimate.preparation.steps) {
    if (step.kept_parameter_bytes > 0) parameter_element = step.kept_parameter_bytes;
    if (step.kept_gradient_bytes > 0) gradient_element = step.kept_gradient_bytes;
  }
  estimate.optimizer_slots = optim::StateBuffersPerElement(plan.optimizer());
  estimate.fp32_masters = parameter_element < kBytesPerFloat;
  // A step that freezes the model's own parameters (LoRA) leaves the optimizer state and the
  // gradients to the parameters that train.
  const double all = shape.parameters + estimate.preparation.added_parameters;
  const double fraction = estimate.preparation.parameter_fraction;
  const auto& trainable = estimate.preparation.trainable_parameters;
  const double trained = (trainable.has_value() ? CountOf(*trainable) : all) * fraction;
  estimate.optimizer_state_bytes =
      trained * kBytesPerFloat * (estimate.optimizer_slots + (estimate.fp32_masters ? 1 : 0));
  estimate.gradient_bytes = trained * gradient_element;
  AddTermsOnRank(estimate.preparation, {.parameter_fraction = fraction,
                                        .parameter_element_bytes = parameter_element,
                                        .gradient_bytes = estimate.gradient_bytes});
  const PreparationEstimate& preparation = estimate.preparation;
  estimate.parameter_bytes =
      all * parameter_element * fraction + preparation.Sum(wrap::MemoryTerm::Part::kParameters);
  estimate.buffer_bytes = preparation.Sum(wrap::MemoryTerm::Part::kBuffers);
  const std::optional<wrap::StepEstimate::KeptActivations>& kept =
      estimate.preparation.kept_activations;
  estimate.gradients_beside_activations =
      kept.has_value() ? kept->after_a_backward : resolved.grad_accumulation > 1;
  // The blocks' activations, and at the peak either the output layers' (the loss's
  // backward) or a step's working bytes (inside the last block's backward), with what the
  // steps add to them or save.
  const double output_bytes =
      (kept.has_value() ? static_cast<double>(kept->outputs) : 1.0) * shape.output_activation_bytes;
  estimate.activation_bytes =
      (kept.has_value() ? static_cast<double>(kept->blocks)
                        : static_cast<double>(shape.num_blocks)) *
          shape.block_activation_bytes +
      std::max(output_bytes, preparation.Largest(wrap::MemoryTerm::Part::kWorking)) +
      preparation.Sum(wrap::MemoryTerm::Part::kActivations);
  estimate.block_activation_bytes = shape.block_activation_bytes;
  if (resolved.model.tie_word_embeddings()) {
    const double vocab_rows = std::ceil(static_cast<double>(resolved.model.vocab_size()) /
                                        static_cast<double>(split.ranks));
    estimate.tied_embedding_gradient_bytes =
        2.0 * vocab_rows * shape.hidden_size * shape.parameter_bytes;
  }
  for (int i = 0; i < plan.frozen_size(); ++i) {
    const FrozenModel& frozen = plan.frozen(i);
    const wrap::ActivationSplit frozen_split = ActivationSplitOf(frozen.prepare(), plan.mesh());
    wrap::ModelShape frozen_shape = ShapeOf(resolved.frozen[i], frozen.model(), plan.device(),
                                            plan.training(), frozen_split, kernels);
    frozen_shape.trainable_parameters = 0.0;  // it only runs forward
    FrozenEstimate& frozen_estimate = estimate.frozen.emplace_back();
    PLAIT_ASSIGN_OR_RETURN(frozen_estimate.preparation,
                           EstimatePreparation(frozen.prepare(), frozen_shape, plan.mesh(), share));
    // A frozen model generates nothing.
    DropTerms(wrap::MemoryTerm::Part::kKeptGathered, frozen_estimate.preparation);
    const double frozen_fraction = frozen_estimate.preparation.parameter_fraction;
    AddTermsOnRank(frozen_estimate.preparation,
                   {.parameter_fraction = frozen_fraction,
                    .parameter_element_bytes = frozen_shape.parameter_bytes});
    frozen_estimate.parameter_bytes =
        frozen_shape.parameters * frozen_fraction * frozen_shape.parameter_bytes +
        frozen_estimate.preparation.Sum(wrap::MemoryTerm::Part::kParameters);
    estimate.frozen_bytes += frozen_estimate.total_bytes();
  }
  if (plan.training().has_samples()) {
    estimate.generation = EstimateGeneration(resolved, shape, estimate);
  } else {
    DropTerms(wrap::MemoryTerm::Part::kKeptGathered, estimate.preparation);  // no such phase
  }
  return estimate;
}

}  // namespace

absl::StatusOr<std::vector<MemoryEstimate>> EstimateMemoryOfEachShare(
    const ResolvedPlan& resolved, const models::LibTorchKernels& kernels) {
  std::vector<MemoryEstimate> estimates;
  PLAIT_ASSIGN_OR_RETURN(estimates.emplace_back(), EstimateMemoryOfShare(resolved, kernels, 0));
  for (int share = 1; share < estimates.front().preparation.shares; ++share) {
    PLAIT_ASSIGN_OR_RETURN(estimates.emplace_back(),
                           EstimateMemoryOfShare(resolved, kernels, share));
  }
  return estimates;
}

absl::StatusOr<MemoryEstimate> EstimateMemory(const ResolvedPlan& resolved,
                                              const models::LibTorchKernels& kernels) {
  PLAIT_ASSIGN_OR_RETURN(const std::vector<MemoryEstimate> estimates,
                         EstimateMemoryOfEachShare(resolved, kernels));
  return LargestOf(estimates);
}

const MemoryEstimate& LargestOf(const std::vector<MemoryEstimate>& estimates) {
  return *std::max_element(estimates.begin(), estimates.end(),
                           [](const MemoryEstimate& a, const MemoryEstimate& b) {
                             return a.total_bytes() < b.total_bytes();
                           });
}

absl::StatusOr<std::vector<MemoryEstimate>> EstimateMemoryOfEachRank(
    const ResolvedPlan& resolved, const models::LibTorchKernels& kernels) {
  PLAIT_ASSIGN_OR_RETURN(const std::vector<MemoryEstimate> shares,
                         EstimateMemoryOfEachShare(resolved, kernels));
  const std::string& dim = shares.front().preparation.share_dim;
  if (dim.empty()) return std::vector<MemoryEstimate>(resolved.world_size, shares.front());
  PLAIT_ASSIGN_OR_RETURN(const parallel::MeshLayout layout,
                         parallel::MeshLayout::Create(resolved.plan.mesh(), resolved.world_size));
  PLAIT_ASSIGN_OR_RETURN(const int dim_index, layout.DimIndex(dim));
  std::vector<MemoryEstimate> estimates;
  for (int rank = 0; rank < resolved.world_size; ++rank) {
    estimates.push_back(shares[layout.Coordinate(rank, dim_index)]);
  }
  return estimates;
}

std::string DescribeShare(const MemoryEstimate& estimate) {
  const PreparationEstimate& preparation = estimate.preparation;
  if (preparation.share_dim.empty()) return "every rank";
  return absl::StrFormat("the ranks at %s=%d, %s", preparation.share_dim, preparation.share,
                         preparation.share_description);
}

std::vector<double> PreparationEstimate::Bytes(wrap::MemoryTerm::Part part) const {
  std::vector<double> bytes;
  for (const wrap::StepEstimate& step : steps) {
    for (const wrap::MemoryTerm& term : step.memory) {
      if (term.part == part) bytes.push_back(term.bytes);
    }
  }
  return bytes;
}

double PreparationEstimate::Sum(wrap::MemoryTerm::Part part) const {
  const std::vector<double> bytes = Bytes(part);
  return std::accumulate(bytes.begin(), bytes.end(), 0.0);
}

double PreparationEstimate::Largest(wrap::MemoryTerm::Part part) const {
  const std::vector<double> bytes = Bytes(part);
  return std::accumulate(bytes.begin(), bytes.end(), 0.0,
                         [](double a, double b) { return std::max(a, b); });
}

std::string DescribeTerms(const PreparationEstimate& preparation, wrap::MemoryTerm::Part part) {
  std::string text;
  for (const wrap::StepEstimate& step : preparation.steps) {
    for (const wrap::MemoryTerm& term : step.memory) {
      if (term.part != part || term.bytes <= 0) continue;
      absl::StrAppend(&text, ", ", base::HumanBytes(term.bytes), " ", term.name);
    }
  }
  return text;
}

std::string DescribeTerm(const wrap::MemoryTerm& term) {
  const char* where = "";
  switch (term.part) {
    case wrap::MemoryTerm::Part::kParameters:
      where = "with the parameters, between steps";
      break;
    case wrap::MemoryTerm::Part::kBuffers:
      where = "between steps";
      break;
    case wrap::MemoryTerm::Part::kGathered:
      where = "at the peak of each step";
      break;
    case wrap::MemoryTerm::Part::kActivations:
      where = "when a micro-batch's backward starts";
      break;
    case wrap::MemoryTerm::Part::kWorking:
      where = "inside one op of a block's backward";
      break;
    case wrap::MemoryTerm::Part::kKeptGathered:
      where = "while a generation phase keeps them";
      break;
  }
  return absl::StrCat(term.bytes < 0 ? "saves " : "", base::HumanBytes(std::abs(term.bytes)), " ",
                      term.name, ", ", where);
}

std::string DescribeMemory(const MemoryEstimate& estimate) {
  return absl::StrFormat(
      "%s parameters, %s optimizer state (%d slots%s)%s, %s gradients%s, %s activations%s%s%s; "
      "about %s",
      base::HumanBytes(estimate.parameter_bytes), base::HumanBytes(estimate.optimizer_state_bytes),
      static_cast<int>(estimate.optimizer_slots), estimate.fp32_masters ? " and fp32 masters" : "",
      DescribeTerms(estimate.preparation, wrap::MemoryTerm::Part::kBuffers),
      base::HumanBytes(estimate.gradient_bytes),
      estimate.tied_embedding_gradient_bytes > 0
          ? absl::StrCat(" (and ", base::HumanBytes(estimate.tied_embedding_gradient_bytes),
                         " as a tied embedding's two are summed)")
          : "",
      base::HumanBytes(estimate.activation_bytes),
      DescribeTerms(estimate.preparation, wrap::MemoryTerm::Part::kGathered),
      estimate.frozen_bytes > 0
          ? absl::StrCat(", ", base::HumanBytes(estimate.frozen_bytes), " frozen models")
          : "",
      estimate.generation.has_value()
          ? absl::StrCat(", generating samples ", base::HumanBytes(estimate.generation->bytes()),
                         " (in place of a step's peak, when larger)")
          : "",
      base::HumanBytes(estimate.total_bytes()));
}

std::optional<std::string> CompareWithMeasured(const std::vector<MemoryEstimate>& estimates,
                                               const std::vector<int64_t>& measured,
                                               double tolerance) {
  std::vector<std::string> ranks;
  int first_off = -1;
  for (size_t rank = 0; rank < measured.size() && rank < estimates.size(); ++rank) {
    const double off = static_cast<double>(measured[rank]) / estimates[rank].total_bytes() - 1.0;
    if (std::abs(off) <= tolerance) continue;
    if (first_off < 0) first_off = static_cast<int>(rank);
    ranks.push_back(absl::StrFormat("rank %d %s (%+.0f%%)", rank,
                                    base::HumanBytes(static_cast<double>(measured[rank])),
                                    100.0 * off));
  }
  if (first_off < 0) return std::nullopt;
  const MemoryEstimate& estimate = estimates[first_off];
  std::vector<std::pair<std::string, double>> terms = {
      {"parameters", estimate.parameter_bytes},
      {"optimizer state", estimate.optimizer_state_bytes},
      {"gradients", estimate.gradient_bytes},
      {"a tied embedding's gradients", estimate.tied_embedding_gradient_bytes},
      {"activations", estimate.activation_bytes},
      {"frozen models", estimate.frozen_bytes},
  };
  for (const wrap::StepEstimate& step : estimate.preparation.steps) {
    for (const wrap::MemoryTerm& term : step.memory) {
      if (term.part == wrap::MemoryTerm::Part::kBuffers ||
          term.part == wrap::MemoryTerm::Part::kGathered) {
        terms.emplace_back(term.name, term.bytes);
      }
    }
  }
  const auto largest = std::max_element(
      terms.begin(), terms.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  return absl::StrFormat(
      "memory: more than %.0f%% off the estimate at the peak: %s; the estimate for rank %d "
      "(%s): %s; its largest term: %s, %s",
      100.0 * tolerance, absl::StrJoin(ranks, ", "), first_off, DescribeShare(estimate),
      DescribeMemory(estimate), largest->first, base::HumanBytes(largest->second));
}

absl::Status CheckMemoryFits(const MemoryEstimate& estimate, int local_ranks,
                             int64_t available_bytes) {
  const double needed = estimate.total_bytes() * local_ranks;
  if (needed <= static_cast<double>(available_bytes)) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "the plan needs about ", base::HumanBytes(needed), local_ranks > 1 ? " for the " : "",
      local_ranks > 1 ? absl::StrCat(local_ranks, " ranks on this machine") : "",
      " but this machine has ", base::HumanBytes(static_cast<double>(available_bytes)),
      " available. Per rank: ", DescribeMemory(estimate),
      ". Use a smaller model, micro_batch or seq_len, shard over more ranks or machines, or "
      "give --skip_memory_check to run anyway (the estimate may be high for your machine)"));
}

}  // namespace plait::plan
