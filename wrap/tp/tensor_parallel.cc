#include "wrap/tp/tensor_parallel.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "ATen/ops/embedding.h"
#include "ATen/ops/where.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/human.h"
#include "base/status.h"
#include "torch/csrc/autograd/generated/variable_factories.h"
#include "wrap/gradient_reduce.h"

namespace plait::wrap::tp {
namespace {

// Whether each rank computes only part of the gradient of a parameter split as `split`, which
// the group then sums: the model says so (Qwen3's per-head norms, an adapter beside a split
// projection), or under sequence parallelism the parameter is whole on every rank, each
// computing its gradient from its slice of the sequence.
bool GradientIsPartial(Wrappable::Split split, bool sequence_parallel) {
  return split == Wrappable::Split::kReplicatedPartialGradient ||
         (sequence_parallel && split == Wrappable::Split::kReplicated);
}

// A parameter's shape on a rank of `tp`, and what kind of split leaves it so.
struct LocalParameter {
  std::vector<int64_t> shape;
  const char* kind;
};

LocalParameter LocalParameterOf(const ModelShape::Parameter& parameter, const ModelShape& shape,
                                int64_t tp) {
  LocalParameter local{parameter.shape, "replicated"};
  switch (parameter.split) {
    case Wrappable::Split::kReplicated:
      break;
    case Wrappable::Split::kReplicatedPartialGradient:
      local.kind = "replicated, gradient summed";
      break;
    case Wrappable::Split::kColumn:
      local.shape[0] /= tp;
      local.kind = "column-parallel";
      break;
    case Wrappable::Split::kKeyValueColumn:
      local.shape[0] /= std::min(shape.num_key_value_heads, tp);
      local.kind = shape.num_key_value_heads < tp ? "key/value heads, shared" : "key/value heads";
      break;
    case Wrappable::Split::kRow:
      local.shape[1] /= tp;
      local.kind = "row-parallel";
      break;
    case Wrappable::Split::kVocabulary:
      local.shape[0] = (local.shape[0] + tp - 1) / tp;
      local.kind = local.shape[0] * tp == parameter.shape[0] ? "vocabulary-parallel"
                                                             : "vocabulary-parallel, padded";
      break;
  }
  return local;
}

// Of the parameters of `shape`'s list, those a rank of `tp` holds (its slices and the whole
// replicated ones), and all of them.
struct ParameterShare {
  double per_rank = 0;
  double total = 0;
};

ParameterShare ParameterShareOf(const ModelShape& shape, int64_t tp) {
  ParameterShare share;
  for (const ModelShape::Parameter& parameter : shape.parameter_list) {
    double local = 1;
    for (int64_t size : LocalParameterOf(parameter, shape, tp).shape) local *= size;
    share.per_rank += local;
    share.total += parameter.numel();
  }
  return share;
}

// The shape on a rank of each kind of parameter of `shape` split over `tp` ranks, shown for
// the first block's and the root's parameters (of a mixture of experts, its first expert's),
// then what a rank holds of all of them.
std::vector<std::string> ShapesPerRank(const ModelShape& shape, int64_t tp) {
  if (shape.parameter_list.empty()) return {};
  std::vector<std::string> lines = {"parameter shapes on a rank:"};
  for (const ModelShape::Parameter& parameter : shape.parameter_list) {
    const bool shown = (!absl::StartsWith(parameter.name, "model.layers.") ||
                        absl::StartsWith(parameter.name, "model.layers.0.")) &&
                       (!IsExpertParameter(parameter.name) ||
                        absl::StrContains(parameter.name, absl::StrCat(kExpertsInName, "0.")));
    if (!shown) continue;
    const LocalParameter local = LocalParameterOf(parameter, shape, tp);
    lines.push_back(absl::StrFormat("  %s [%s] -> [%s] (%s)", parameter.name,
                                    absl::StrJoin(parameter.shape, ", "),
                                    absl::StrJoin(local.shape, ", "), local.kind));
  }
  const ParameterShare share = ParameterShareOf(shape, tp);
  lines.push_back(absl::StrFormat(
      "tensor parallelism leaves each rank %s of the %s parameters (%.3f of them), %s",
      base::HumanCount(share.per_rank), base::HumanCount(share.total), share.per_rank / share.total,
      base::HumanBytes(share.per_rank * shape.parameter_bytes)));
  return lines;
}

}  // namespace

std::vector<std::string> HeadSplitProblems(int64_t num_heads, int64_t num_kv_heads, int tp) {
  std::vector<std::string> problems;
  if (num_heads % tp != 0) {
    problems.push_back(absl::StrCat("num_attention_heads (", num_heads,
                                    ") does not divide by the tensor-parallel size ", tp));
  }
  if (num_kv_heads % tp != 0 && tp % num_kv_heads != 0) {
    problems.push_back(absl::StrCat("num_key_value_heads (", num_kv_heads,
                                    ") neither divides by nor divides the tensor-parallel size ",
                                    tp));
  }
  return problems;
}

absl::StatusOr<std::unique_ptr<TensorParallel>> TensorParallel::Create(
    Wrappable& model, parallel::Communicator& communicator, const TensorParallelConfig& config) {
  const int n = communicator.size();
  const int rank = communicator.rank();
  const std::vector<std::string> head_problems =
      HeadSplitProblems(model.NumHeads(), model.NumKeyValueHeads(), n);
  if (!head_problems.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor_parallel: ", head_problems.front()));
  }
  // Key/value heads: one slice per head group when they divide, else one head per
  // n / kv ranks.
  const int64_t kv_parts = std::min<int64_t>(model.NumKeyValueHeads(), n);
  auto tp = std::unique_ptr<TensorParallel>(
      new TensorParallel(model, communicator, config.sequence_parallel()));
  std::vector<Slice> slices;
  for (const Wrappable::NamedParameter& named : model.NamedParameters()) {
    const Wrappable::Split split = model.SplitOf(named.name);
    Slice slice{named.name, named.parameter, 0, n, rank, 1, 0};
    switch (split) {
      case Wrappable::Split::kReplicated:
      case Wrappable::Split::kReplicatedPartialGradient:
        continue;
      case Wrappable::Split::kColumn:
      case Wrappable::Split::kVocabulary:
        break;
      case Wrappable::Split::kRow:
        slice.dim = 1;
        break;
      case Wrappable::Split::kKeyValueColumn:
        slice.parts = kv_parts;
        slice.replicas = n / kv_parts;
        slice.part = rank / slice.replicas;
        break;
    }
    const at::Tensor& full = named.parameter;
    const bool padded = split == Wrappable::Split::kVocabulary && config.pad_vocab_to_multiple();
    if (full.dim() <= slice.dim || (full.size(slice.dim) % slice.parts != 0 && !padded)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor_parallel: ", named.name, " of shape ", c10::str(full.sizes()),
          " does not split into ", slice.parts, " equal parts along dim ", slice.dim,
          " over the tensor-parallel size ", n,
          split == Wrappable::Split::kVocabulary ? " (pad_vocab_to_multiple pads it)" : ""));
    }
    slice.length = full.size(slice.dim);
    if (padded && slice.length % n != 0) tp->vocab_size_ = slice.length;
    slices.push_back(std::move(slice));
  }
  PLAIT_RETURN_IF_ERROR(
      model.SetLocalHeads(model.NumHeads() / n, model.NumKeyValueHeads() / kv_parts));
  {
    at::NoGradGuard no_grad;
    for (Slice& slice : slices) {
      const int64_t length = (slice.length + slice.parts - 1) / slice.parts;
      const int64_t start = std::min(slice.part * length, slice.length);
      const int64_t kept = std::min(length, slice.length - start);
      // A fresh tensor, so that the full one's memory goes with its last reference; a
      // padded vocabulary's last slices end in zero rows.
      std::vector<int64_t> sizes = slice.parameter.sizes().vec();
      sizes[slice.dim] = length;
      at::Tensor part = torch::zeros(sizes, slice.parameter.options());
      part.narrow(slice.dim, 0, kept).copy_(slice.parameter.narrow(slice.dim, start, kept));
      slice.parameter.set_data(part);
    }
  }
  TensorParallel* self = tp.get();
  for (const Slice& slice : slices) {
    if (slice.replicas == 1 || !slice.parameter.requires_grad()) continue;
    // The ranks sharing this slice each hold part of its gradient: each puts its own at its
    // slice's place in a buffer of every slice, and the group sums the buffers.
    tp->AddGradientHook(slice.parameter, [self, parts = slice.parts,
                                          part = slice.part](at::Tensor grad) {
      std::vector<int64_t> sizes = grad.sizes().vec();
      sizes.insert(sizes.begin(), parts);
      at::Tensor buffer = torch::zeros(sizes, grad.options());
      buffer[part].copy_(grad);
      self->group_.Wait(self->group_.communicator().AllReduce(buffer, parallel::ReduceOp::kSum));
      return buffer[part];
    });
  }
  tp->slices_ = std::move(slices);
  model.seams().Add(tp.get());
  return tp;
}

TensorParallel::TensorParallel(Wrappable& model, parallel::Communicator& communicator,
                               bool sequence_parallel)
    : model_(model), group_(communicator), sequence_parallel_(sequence_parallel) {}

TensorParallel::~TensorParallel() {
  model_.seams().Remove(this);
  for (auto& [parameter, position] : hooks_) parameter.remove_hook(position);
}

absl::Status TensorParallel::SumPartialGradients(
    const std::vector<parallel::TrainableParameter>& trainable) {
  if (group_.size() == 1) return absl::OkStatus();
  const parallel::ScopedPlace place =
      group_.Place(parallel::Pass::kNone, "tensor-parallel partial gradients");
  for (const parallel::TrainableParameter& part : trainable) {
    const bool partial = GradientIsPartial(model_.SplitOf(part.name), sequence_parallel_);
    // No gradient: no backward reached the part, on any rank of the group (they run the same
    // graph), which leaves it without one as one process would.
    if (!partial || !part.tensor.grad().defined()) continue;
    PLAIT_RETURN_IF_ERROR(ReduceGradient(part, group_.communicator(), parallel::ReduceOp::kSum));
  }
  return absl::OkStatus();
}

void TensorParallel::AddGradientHook(at::Tensor parameter,
                                     std::function<at::Tensor(at::Tensor)> hook) {
  const unsigned position = parameter.register_hook(std::move(hook));
  hooks_.emplace_back(std::move(parameter), position);
}

at::Tensor TensorParallel::ColumnInput(const at::Tensor& x, TensorNext next) {
  const at::Tensor input = next(x);
  return sequence_parallel_ ? GatherSequence(input, group_) : CopyToRegion(input, group_);
}

at::Tensor TensorParallel::Project(const ProjectionSite& site, const at::Tensor& input,
                                   ProjectNext next) {
  if (site.split != ParameterSplit::kRow) return next(site, input);
  ProjectionSite partial = site;
  partial.bias = at::Tensor();
  const at::Tensor sum = ExitRowParallel(next(partial, input));
  return site.bias.defined() ? sum + site.bias : sum;
}

at::Tensor TensorParallel::ExitRowParallel(const at::Tensor& partial) {
  return sequence_parallel_ ? ReduceScatterSequence(partial, group_)
                            : ReduceFromRegion(partial, group_);
}

at::Tensor TensorParallel::Embed(const at::Tensor& tokens, const at::Tensor& weight,
                                 EmbedNext /*next: the lookup of the whole vocabulary*/) {
  const int64_t rows = weight.size(0);
  const at::Tensor local = tokens - group_.rank() * rows;
  const at::Tensor mine = (local >= 0) & (local < rows);
  const at::Tensor looked_up =
      at::embedding(weight, at::where(mine, local, torch::zeros_like(local)));
  return ExitRowParallel(looked_up.masked_fill(~mine.unsqueeze(-1), 0));
}

int64_t TensorParallel::PaddedColumns(int64_t columns) const {
  if (vocab_size_ == 0) return 0;
  return std::clamp<int64_t>((group_.rank() + 1) * columns - vocab_size_, 0, columns);
}

at::Tensor TensorParallel::TokenLosses(const at::Tensor& logits, const at::Tensor& targets,
                                       int64_t ignore_index,
                                       TokenLossNext /*next: over the whole vocabulary*/) {
  const int64_t columns = logits.size(1);
  // The padding rows get no probability, and so no gradient.
  return VocabParallelCrossEntropy(logits, targets, group_.rank() * columns,
                                   columns - PaddedColumns(columns), ignore_index, group_);
}

at::Tensor TensorParallel::WholeLogits(const at::Tensor& logits,
                                       TensorNext /*next: the whole vocabulary's already*/) {
  const int n = group_.size();
  const int64_t columns = logits.size(-1);
  const at::Tensor mine = logits.contiguous();
  at::Tensor gathered = torch::empty({n * mine.numel()}, mine.options());
  const parallel::ScopedPlace place = group_.Place(parallel::Pass::kForward, "whole logits");
  group_.Wait(group_.communicator().AllGather(mine.view({-1}), gathered));
  std::vector<int64_t> by_rank = mine.sizes().vec();
  by_rank.insert(by_rank.begin(), n);
  // [n, ..., columns] -> [..., n * columns]: rank r's columns at r * columns.
  const at::Tensor whole = gathered.view(by_rank).movedim(0, -2).flatten(-2);
  return whole.narrow(-1, 0, vocab_size_ == 0 ? n * columns : vocab_size_).contiguous();
}

std::string TensorParallel::DecodeRefusal() const {
  if (!sequence_parallel_) return "";
  return "tensor_parallel.sequence_parallel splits every forward's tokens over the ranks";
}

void TensorParallel::MarkSharded(std::vector<parallel::TrainableParameter>& parameters) const {
  const int64_t n = group_.size();
  for (parallel::TrainableParameter& parameter : parameters) {
    parallel::TensorSlice& held = parameter.slice;
    const auto slice = std::find_if(slices_.begin(), slices_.end(),
                                    [&](const Slice& s) { return s.name == parameter.name; });
    if (slice == slices_.end()) {
      // Whole on every rank of the group.
      held.replica = held.replica * n + group_.rank();
      continue;
    }
    parameter.sharded_over.push_back(&group_.communicator());
    parameter.replicas *= slice->replicas;
    // The parameter is this rank's part already (Create replaced it), and tensor
    // parallelism comes first: the whole tensor is `parts` such parts along `dim`, less
    // any padding at its end.
    const int64_t length = held.box.lengths[slice->dim];
    const int64_t start = std::min(slice->part * length, slice->length);
    held.global_shape[slice->dim] = slice->length;
    held.box.offsets[slice->dim] = start;
    held.box.lengths[slice->dim] = std::min(length, slice->length - start);
    held.replica = held.replica * slice->replicas + group_.rank() % slice->replicas;
  }
}

absl::Status TensorParallel::GatherFull(std::map<std::string, at::Tensor>& parameters) {
  const int n = group_.size();
  at::NoGradGuard no_grad;
  for (const Slice& slice : slices_) {
    auto it = parameters.find(slice.name);
    if (it == parameters.end()) continue;
    const at::Tensor mine = it->second.detach().contiguous();
    at::Tensor gathered = torch::empty({n * mine.numel()}, mine.options());
    PLAIT_RETURN_IF_ERROR(group_.communicator().AllGather(mine.view({-1}), gathered)->Wait());
    std::vector<int64_t> sizes = mine.sizes().vec();
    sizes.insert(sizes.begin(), n);
    // [n, slice...]: one slice per rank; ranks that share a slice hold it once.
    at::Tensor by_rank = gathered.view(sizes).slice(0, 0, n, slice.replicas);
    // The parts next to each other along the split dimension, without padding.
    it->second = by_rank.movedim(0, slice.dim)
                     .flatten(slice.dim, slice.dim + 1)
                     .narrow(slice.dim, 0, slice.length)
                     .contiguous();
  }
  return absl::OkStatus();
}

StepEstimate TensorParallelStrategy::Estimate(const ModelShape& shape,
                                              const parallel::MeshConfig& mesh) const {
  const int dim_size = static_cast<int>(parallel::SubmeshRanks(mesh, {config_.mesh_dim()}));
  const bool sp = config_.sequence_parallel();
  // Ring collectives: an all-gather or a reduce-scatter sends (n-1)/n of the whole buffer,
  // an all-reduce twice that.
  const double ring = static_cast<double>(dim_size - 1) / dim_size;
  const auto all_reduce = [ring](double bytes) { return 2.0 * ring * bytes; };
  // The [tokens, hidden] activations in the parameters' dtype: per block two all-reduces
  // forward (after o_proj and down_proj) and two backward (into the q/k/v and gate/up
  // inputs), one each way in a mixture-of-experts block (its experts are whole on every
  // rank), plus the embedding's forward and the output projection's input backward; with
  // sequence parallelism each is an all-gather and a reduce-scatter, the same bytes.
  const double activation_bytes =
      shape.micro_batch_tokens * shape.hidden_size * shape.parameter_bytes;
  const double per_collective = all_reduce(activation_bytes);
  const int64_t dense_blocks = shape.num_blocks - shape.num_moe_blocks;
  const double collectives = 4.0 * static_cast<double>(dense_blocks) +
                             2.0 * static_cast<double>(shape.num_moe_blocks) + 2.0;
  // Key/value heads shared by several ranks (fewer heads than ranks): each rank puts its
  // head's gradient in a buffer of every head's, and the group sums the buffers.
  const bool shared_kv = shape.num_key_value_heads > 0 && shape.num_key_value_heads < dim_size;
  const double kv_bytes =
      shared_kv ? all_reduce(shape.block_key_value_parameters * shape.parameter_bytes) : 0.0;
  // The gradients of whole parameters that each rank computes only part of are summed once a
  // step, in the blocks and outside them.
  double block_summed = 0;
  double root_summed = 0;
  for (const ModelShape::Parameter& parameter : shape.parameter_list) {
    if (GradientIsPartial(parameter.split, sp)) {
      (absl::StartsWith(parameter.name, "model.layers.") ? block_summed : root_summed) +=
          parameter.numel() * shape.parameter_bytes;
    }
  }
  // The loss: each token's maximum logit, then its sum of exponentials and target logit.
  const double loss_bytes = all_reduce(3.0 * shape.micro_batch_tokens * sizeof(float));
  StepEstimate estimate;
  estimate.description = absl::StrFormat(
      "tensor_parallel over %s (%d ranks%s): heads, MLP columns and the vocabulary split, each "
      "rank keeps about 1/%d of %s parameters; per block 2 %s of %s activations forward and 2 "
      "backward (%s sent each), 1 more each way for the embedding and output projection, and "
      "the loss on vocabulary-sharded logits",
      config_.mesh_dim(), dim_size, sp ? ", sequence parallel" : "", dim_size,
      base::HumanCount(shape.parameters), sp ? "all-gather + reduce-scatter pairs" : "all-reduces",
      base::HumanBytes(activation_bytes), base::HumanBytes(per_collective));
  if (shape.num_moe_blocks > 0) {
    absl::StrAppend(
        &estimate.description, "; the ", shape.num_moe_blocks,
        " mixture-of-experts blocks split only their attention (1 collective each way): the "
        "router and experts stay whole on every rank, ",
        sp ? "each computing those of its slice of the sequence, their gradients summed"
           : "each computing those of every token, as the whole group does (sequence_parallel "
             "splits that work)");
  }
  const std::string activations = base::HumanBytesAnySize(activation_bytes);
  if (sp) {
    const std::string half = base::HumanBytesAnySize(ring * activation_bytes);
    estimate.details.push_back(absl::StrFormat(
        "per block, forward: all-gathers of the %s activations along the sequence into q/k/v "
        "and into gate/up, reduce-scatters of the partial outputs of o_proj and of down_proj "
        "(%s sent each)",
        activations, half));
    estimate.details.push_back(absl::StrFormat(
        "per block, backward: their conjugates, reduce-scatters of the input gradients of "
        "q/k/v and of gate/up, all-gathers of the output gradients of o_proj and of down_proj "
        "(%s sent each)",
        half));
  } else {
    estimate.details.push_back(absl::StrFormat(
        "per block, forward: all-reduces of the %s partial outputs of o_proj and of down_proj "
        "(%s sent each)",
        activations, base::HumanBytesAnySize(per_collective)));
    estimate.details.push_back(absl::StrFormat(
        "per block, backward: all-reduces of the %s input gradients of q/k/v and of gate/up "
        "(%s sent each)",
        activations, base::HumanBytesAnySize(per_collective)));
  }
  if (shared_kv) {
    estimate.details.push_back(absl::StrFormat(
        "per block, backward: the k_proj and v_proj gradients of the %d key/value heads, each "
        "held by %d ranks, summed: an all-reduce of %s (%s sent)",
        shape.num_key_value_heads, dim_size / shape.num_key_value_heads,
        base::HumanBytesAnySize(shape.block_key_value_parameters * shape.parameter_bytes),
        base::HumanBytesAnySize(kv_bytes)));
  }
  if (block_summed > 0) {
    const double per_block =
        block_summed / static_cast<double>(std::max<int64_t>(1, shape.num_blocks));
    estimate.details.push_back(absl::StrFormat(
        "per step, per block: the gradients of the parameters every rank holds whole (%s), %s, "
        "summed once the step's backward passes are over: an all-reduce of %s (%s sent)",
        sp ? (shape.num_moe_blocks > 0 ? "norm weights, the router and experts" : "norm weights")
           : "q and k's per-head norm weights",
        sp ? "computed from each rank's slice of the sequence" : "each rank's part from its heads",
        base::HumanBytesAnySize(per_block), base::HumanBytesAnySize(all_reduce(per_block))));
  }
  estimate.details.push_back(absl::StrFormat(
      "outside the blocks: the embedding's output forward and the output projection's input "
      "gradient backward (%s sent each)%s; the loss's all-reduces of each token's maximum "
      "logit, sum of exponentials and target logit (%s sent)",
      base::HumanBytesAnySize(per_collective),
      root_summed > 0 ? absl::StrCat(", and per step the final norm's weight gradient summed (",
                                     base::HumanBytesAnySize(all_reduce(root_summed)), " sent)")
                      : "",
      base::HumanBytesAnySize(loss_bytes)));
  const ParameterShare share = ParameterShareOf(shape, dim_size);
  estimate.parameter_fraction = share.total > 0 ? share.per_rank / share.total : 1.0 / dim_size;
  const Transfer& transfer = estimate.transfers.emplace_back(Transfer{
      .mesh_dim = config_.mesh_dim(),
      .bytes_per_step = all_reduce(block_summed + root_summed),
      .bytes_per_micro_batch = collectives * per_collective +
                               static_cast<double>(shape.num_blocks) * kv_bytes + loss_bytes,
      .overlaps_compute = false});
  estimate.details.push_back(absl::StrFormat(
      "per micro-batch: %s sent%s", base::HumanBytesAnySize(transfer.bytes_per_micro_batch),
      transfer.bytes_per_step > 0
          ? absl::StrCat("; per step: ", base::HumanBytesAnySize(transfer.bytes_per_step), " more")
          : ""));
  for (std::string& line : ShapesPerRank(shape, dim_size)) {
    estimate.details.push_back(std::move(line));
  }
  return estimate;
}

ActivationSplit TensorParallelStrategy::SplitsActivations(const parallel::MeshConfig& mesh) const {
  return {parallel::SubmeshRanks(mesh, {config_.mesh_dim()}), config_.sequence_parallel()};
}

std::vector<base::Violation> TensorParallelStrategy::Check(const std::optional<ModelShape>& shape,
                                                           const parallel::MeshConfig& mesh,
                                                           const std::string& field) const {
  // 1 for an unknown dimension, which the rules report.
  const int size = static_cast<int>(parallel::SubmeshRanks(mesh, {config_.mesh_dim()}));
  if (!shape.has_value()) return {};
  std::vector<std::string> problems =
      HeadSplitProblems(shape->num_attention_heads, shape->num_key_value_heads, size);
  // Dense feed-forwards split their columns; a mixture of experts' experts stay whole.
  if (shape->num_moe_blocks < shape->num_blocks && shape->intermediate_size % size != 0) {
    problems.push_back(absl::StrCat("intermediate_size (", shape->intermediate_size,
                                    ") does not divide by the tensor-parallel size ", size));
  }
  if (shape->vocab_size % size != 0 && !config_.pad_vocab_to_multiple()) {
    problems.push_back(
        absl::StrCat("vocab_size (", shape->vocab_size,
                     ") does not divide by the tensor-parallel size ", size, "; set ", field,
                     ".tensor_parallel.pad_vocab_to_multiple to pad it with rows never "
                     "predicted"));
  }
  if (config_.sequence_parallel() && shape->seq_len % size != 0) {
    problems.push_back(absl::StrCat("sequence_parallel needs plan.training.seq_len (",
                                    shape->seq_len, ") to divide by the tensor-parallel size ",
                                    size));
  }
  std::vector<base::Violation> violations;
  const std::string what = absl::StrCat("\"", config_.mesh_dim(), "\" (", size, " ranks): ");
  for (const std::string& problem : problems) {
    violations.push_back({field + ".tensor_parallel.mesh_dim", what + problem, ""});
  }
  return violations;
}

absl::Status TensorParallelStrategy::Apply(Wrappable& model, const parallel::DeviceMesh& mesh) {
  PLAIT_ASSIGN_OR_RETURN(parallel::Communicator * communicator,
                         mesh.communicator(config_.mesh_dim()));
  PLAIT_ASSIGN_OR_RETURN(tp_, TensorParallel::Create(model, *communicator, config_));
  return absl::OkStatus();
}

}  // namespace plait::wrap::tp
