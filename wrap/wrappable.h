// Wrappable is what a parallelism wrapper (FSDP, tensor parallel, DDP) sees of a model: its
// ordered repeated blocks, which are the natural FSDP units; the parameters outside those
// blocks (embeddings, final norm, output head), which form the root unit; every parameter's
// fully qualified name; and what tensor parallelism needs of a model: how each parameter is
// split (Megatron's layout), telling attention how many heads its sharded projections now
// hold, and the TensorParallelOps the model's forward calls where Megatron communicates; and
// the CheckpointingOps its forward calls to run each block and each of a block's projections;
// the ContextParallelOps through which each rank computes a slice of every sequence; and the
// ProjectionOps through which a wrapper adds to those projections' outputs (adapters),
// which WithoutAdapters switches off for a scope, and may supply the weights they compute
// with (QLoRA's NF4 base).
// Wrappers depend on this interface only, never on a concrete model.
//
//   Wrappable& model = ...;  // e.g. a plait::models::CausalLM
//   for (const Wrappable::Unit& block : model.Blocks()) {
//     // block.name is "model.layers.3"; block.module->named_parameters() are relative to it.
//   }
//   // Tensor parallel over 4 ranks: shard q/k/v column-wise, then
//   model.SetLocalHeads(model.NumHeads() / 4, model.NumKeyValueHeads() / 4);
//   model.SetTensorParallelOps(&ops);  // the forward now calls ops at Megatron's points
//
// Names are the ones checkpoints use (Hugging Face names for plait's models), so wrapper
// plans keyed by name patterns and checkpoint files agree.
#ifndef PLAIT_WRAP_WRAPPABLE_H_
#define PLAIT_WRAP_WRAPPABLE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"

namespace torch::nn {
class Module;  // torch/nn/module.h, included by the sources that call a module
}  // namespace torch::nn

namespace plait::wrap {

// The communication tensor parallelism adds to a model's forward pass, called by the model
// at the points of Megatron's layout (each an autograd function with its conjugate in the
// backward). Activations between the blocks' matmuls are [B, T, hidden], or, with sequence
// parallelism, this rank's slice of the sequence [B, T / tp, hidden]. Implemented by
// wrap/tp; a model without it set runs as one process.
class TensorParallelOps {
 public:
  virtual ~TensorParallelOps() = default;

  // The input of column-parallel projections (q/k/v, gate/up, the output projection): the
  // full activations [B, T, hidden] (all-gathered along the sequence with sequence
  // parallelism); backward sums the gradient over the group (or reduce-scatters it).
  virtual at::Tensor EnterColumnParallel(const at::Tensor& x) = 0;

  // The output of a row-parallel projection (o/down, before any bias): this rank's partial
  // products [B, T, hidden], summed over the group (reduce-scattered along the sequence with
  // sequence parallelism); backward passes the gradient on (all-gathers it).
  virtual at::Tensor ExitRowParallel(const at::Tensor& partial) = 0;

  // The embedding of int64 `tokens` [B, T] with this rank's vocabulary rows `weight`:
  // tokens outside them give zeros, and the ranks' lookups are summed (reduce-scattered
  // along the sequence with sequence parallelism).
  virtual at::Tensor Embed(const at::Tensor& tokens, const at::Tensor& weight) = 0;

  // Per position, -log p(targets[i]) from this rank's vocabulary slice of `logits`
  // [N, vocab / tp] (any floating dtype, kept as it is; scored in fp32 for 16-bit logits)
  // and global `targets` [N], without gathering the logits; 0 where the target is
  // `ignore_index`. Differentiable in `logits`. A vocabulary padded to a multiple of tp has
  // padding columns at its end, which get no probability and a zero gradient.
  virtual at::Tensor TokenCrossEntropy(const at::Tensor& logits, const at::Tensor& targets,
                                       int64_t ignore_index) = 0;
};

// How a model's blocks run, for activation checkpointing (wrap/checkpointing): the model
// calls RunBlock for each block and Linear for each projection inside a block. Implemented by
// wrap/checkpointing; a model without it set calls the block's forward and
// torch::nn::functional::linear directly.
class CheckpointingOps {
 public:
  virtual ~CheckpointingOps() = default;

  // Block `unit`'s output for `input`, which `forward` computes (the block's forward on its
  // current parameters). `forward` may be called again later, in the backward pass, and must
  // then give the same values: it holds what it reads by value, not state a later forward
  // changes. Units are numbered as Blocks().
  using BlockForward = std::function<at::Tensor(const at::Tensor& input)>;
  virtual at::Tensor RunBlock(int unit, const at::Tensor& input, BlockForward forward) = 0;

  // x weight^T (+ bias, when defined), as torch::nn::functional::linear: a block's projection,
  // whose output selective checkpointing keeps rather than recomputes.
  virtual at::Tensor Linear(const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias) = 0;
};

// What context parallelism (wrap/cp) does in a model's forward: each rank of its group
// computes a slice of every sequence (its tokens, at their positions in the sequence) and
// attends over the whole sequence through the group. The model is given whole sequences
// (tokens, targets) and computes its slice of them. A model without it set runs as one process.
class ContextParallelOps {
 public:
  virtual ~ContextParallelOps() = default;

  // This rank's tokens of `x` [B, T, ...], whose dimension 1 is the whole sequence, in the
  // order the rank computes them.
  virtual at::Tensor Slice(const at::Tensor& x) = 0;

  // Their positions in a sequence of `seq_len` tokens: int64 [T / n], on `device`.
  virtual at::Tensor Positions(int64_t seq_len, const at::Device& device) = 0;

  // Causal attention (scale 1 / sqrt(d)) of this rank's queries q [B, T / n, H, d] over the
  // whole sequence's keys and values, of which this rank holds k and v [B, T / n, KV, d]
  // (KV dividing H), each rotated at its positions: [B, T / n, H, d]. `generic`: computed by
  // the generic ops a GPU runs even on the CPU, as the model's own ops are.
  virtual at::Tensor Attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               bool generic) = 0;

  // The sum over the group's ranks of `partial`, each rank's share of a quantity of whole
  // sequences (its tokens' log-probabilities summed per sequence), on every rank.
  // Differentiable: each rank computes its own loss from the sum, so each rank's partial
  // receives the sum of the ranks' gradients of it.
  virtual at::Tensor SumOverRanks(const at::Tensor& partial) = 0;
};

// A mixture-of-experts layer's experts are named "<layer's block>.experts.<index>.<rest>"
// ("model.layers.3.mlp.experts.5.up_proj.weight", their adapters' too).
inline constexpr char kExpertsInName[] = ".experts.";

// Whether `name` is a parameter of one of a mixture-of-experts layer's experts.
inline bool IsExpertParameter(const std::string& name) {
  return name.find(kExpertsInName) != std::string::npos;
}

// The index in its layer of the expert whose parameter `name` is; -1 for a parameter that is
// not an expert's.
inline int64_t ExpertIndexOf(const std::string& name) {
  const size_t experts = name.find(kExpertsInName);
  if (experts == std::string::npos) return -1;
  const size_t at = experts + sizeof(kExpertsInName) - 1;
  int64_t index = -1;
  return absl::SimpleAtoi(name.substr(at, name.find('.', at) - at), &index) ? index : -1;
}

// What expert parallelism (wrap/ep) does in a mixture-of-experts layer: the n ranks of its
// group each hold a contiguous share of the layer's experts, and the rows a rank routes to
// another rank's experts are computed there and come back. A model without it set computes
// every expert itself.
class ExpertParallelOps {
 public:
  virtual ~ExpertParallelOps() = default;

  // The rows a rank's experts compute (Dispatch), and what Combine needs to send their outputs
  // back.
  struct Dispatched {
    at::Tensor rows;                     // grouped by this rank's expert, in order
    std::vector<int64_t> expert_rows;    // how many of `rows` each of this rank's experts computes
    std::vector<int64_t> sent_rows;      // this rank's rows to each rank
    std::vector<int64_t> received_rows;  // each rank's rows to this rank
    at::Tensor order;  // row j of `rows` is row order[j] of those received, by sender
  };

  // The experts this rank holds of a layer of `num_experts`: [first, first + count).
  virtual std::pair<int64_t, int64_t> LocalExperts(int64_t num_experts) const = 0;

  // Sends `rows` [R, hidden] (a layer's routed rows, grouped by expert, expert_rows[e] of them
  // for expert e) to the ranks holding their experts. Differentiable: the gradients of the rows
  // received go back to their senders.
  virtual Dispatched Dispatch(const at::Tensor& rows, const std::vector<int64_t>& expert_rows) = 0;

  // The outputs [M, hidden] of `dispatched.rows` back to the ranks that sent them: [R, hidden],
  // in the order Dispatch's `rows` had. Differentiable likewise.
  virtual at::Tensor Combine(const at::Tensor& outputs, const Dispatched& dispatched) = 0;
};

class ProjectionOps;

class Wrappable {
 public:
  // One repeated block: its module and the fully qualified name of that module, so the
  // block's parameter `p` has the full name `name + "." + p`.
  struct Unit {
    std::string name;
    std::shared_ptr<torch::nn::Module> module;
    // Which of the stages the model keeps (KeepStages) runs it: 0 unless a pipeline rank
    // keeps several, whose forwards each run one stage's units (SelectStage).
    int stage = 0;
  };

  // A parameter with its fully qualified name.
  struct NamedParameter {
    std::string name;
    at::Tensor parameter;
  };

  // Callbacks a wrapper has the model run around its units' forward passes (FSDP gathers a
  // unit's parameters just before it computes and frees them after). `before_forward(u)` runs
  // just before unit u computes; `after_forward(u, output)` receives the unit's output and
  // returns the tensor the model continues with (the same values; a wrapper may attach an
  // autograd hook to it). Units are the blocks, 0 .. Blocks().size() - 1 in order, and
  // kRootUnit for the whole forward pass: its before_forward runs first and its
  // after_forward receives the model's final output. An empty function is not called.
  // FSDP frees the root's parameters while the blocks run, forward and backward, so a model
  // may use them before the first block only in ops whose backward reads no more than their
  // shape (an embedding lookup: LibTorch 1.13's EmbeddingBackward0 keeps the weight but reads
  // only its size), and after the last block only in ops computed from its output.
  static constexpr int kRootUnit = -1;
  struct UnitHooks {
    std::function<void(int unit)> before_forward;
    std::function<at::Tensor(int unit, at::Tensor output)> after_forward;
  };

  virtual ~Wrappable() = default;

  // The module owning every parameter, blocks included.
  virtual torch::nn::Module& RootModule() = 0;

  // The repeated blocks in execution order (first block runs first in the forward pass).
  virtual std::vector<Unit> Blocks() = 0;

  // The parameters that belong to no block, in a fixed order.
  virtual std::vector<NamedParameter> RootParameters() = 0;

  // Every parameter (blocks and root), each once, with its fully qualified name.
  virtual std::vector<NamedParameter> NamedParameters() = 0;

  // The global attention head counts of the model's config.
  virtual int64_t NumHeads() const = 0;
  virtual int64_t NumKeyValueHeads() const = 0;

  // Tells every block's attention the head counts its (sharded) projections hold after
  // tensor-parallel sharding over s = NumHeads() / num_heads ranks: num_kv_heads is
  // NumKeyValueHeads() / s, or 1 when s is a multiple of NumKeyValueHeads() (replicated
  // key/value heads). InvalidArgument for any other counts.
  virtual absl::Status SetLocalHeads(int64_t num_heads, int64_t num_kv_heads) = 0;

  // Installs `hooks`, replacing any installed before.
  virtual void SetUnitHooks(UnitHooks hooks) = 0;

  // Pipeline parallelism: keeps the blocks of `stages`, each [begin, end) of Blocks(), ascending
  // and disjoint (a rank of an interleaved pipeline holds several stages), and drops the others;
  // with block 0 the input layers (the embedding), with the last block the output layers (the
  // final norm and the output projection; and the embedding too where the output projection is
  // the embedding matrix, tied). What is kept keeps its name, so NamedParameters, Blocks and
  // RootParameters list the stages' parameters under the whole model's names, and checkpoints
  // stay layout-free. For a model built deferred, before any wrapper and before any value
  // (dropping is then free); once. InvalidArgument naming the stages when one is empty,
  // outside the blocks or not after the one before, FailedPrecondition when the model was cut
  // before.
  virtual absl::Status KeepStages(const std::vector<std::pair<int64_t, int64_t>>& stages) = 0;
  // Which of the kept stages the next forwards run (the first until changed): its blocks, from
  // the embedding where it starts at block 0 (else from the hidden state the stage before
  // produced), to the output layers where it ends at the last block. InvalidArgument naming
  // the index when the model holds no such stage.
  virtual absl::Status SelectStage(int index) = 0;
  // Whether the selected stage starts with the input layers (the whole model, or the first
  // stage), and whether it ends with the output layers (the whole model, or the last stage).
  virtual bool HoldsInputLayers() const = 0;
  virtual bool HoldsOutputLayers() const = 0;

  // How tensor parallelism splits a parameter, Megatron's layout:
  //   kColumn: dim 0 (output features) into equal parts, one per rank (q_proj, gate/up);
  //   kKeyValueColumn: dim 0 into the key/value heads (k_proj, v_proj), a rank holding
  //     NumKeyValueHeads() / tp of them, or, when there are fewer heads than ranks, one
  //     head shared by tp / NumKeyValueHeads() ranks;
  //   kRow: dim 1 (input features) into equal parts (o_proj, down_proj weights);
  //   kVocabulary: dim 0 (vocabulary rows) into equal parts (embedding, output projection);
  //   kReplicated: whole on every rank (norms, the bias of a row-parallel projection, a
  //     mixture of experts' router and experts: tensor parallelism splits attention and
  //     dense feed-forwards, and every rank computes the experts of its own tokens);
  //   kReplicatedPartialGradient: whole on every rank, where each rank computes only part of
  //     its gradient, which the group sums in backward (an adapter's matrix beside a split
  //     projection: A of a column-parallel one, B of a row-parallel one).
  // The model's forward must then call TensorParallelOps where the layout communicates. A
  // parameter a wrapper added through ProjectionOps splits as those ops say.
  enum class Split {
    kReplicated,
    kColumn,
    kKeyValueColumn,
    kRow,
    kVocabulary,
    kReplicatedPartialGradient
  };
  virtual Split TensorParallelSplit(const std::string& name) const = 0;

  // Makes the forward pass call `ops` (nullptr: none; it must outlive its use).
  virtual void SetTensorParallelOps(TensorParallelOps* ops) = 0;

  // Makes the forward pass run its blocks and their projections through `ops` (nullptr:
  // directly; it must outlive its use, backward passes included).
  virtual void SetCheckpointingOps(CheckpointingOps* ops) = 0;

  // Makes the forward pass hand each block projection's output to `ops` (nullptr: none; it
  // must outlive its use, backward passes included).
  virtual void SetProjectionOps(ProjectionOps* ops) = 0;

  // Makes the forward pass compute this rank's slice of each sequence through `ops` (nullptr:
  // the whole sequence; it must outlive its use, backward passes included).
  virtual void SetContextParallelOps(ContextParallelOps* ops) = 0;

  // Keeps only this rank's experts of each mixture-of-experts layer (ops->LocalExperts; the
  // others' parameters leave the model) and makes the forward pass send the rows routed to
  // others' through `ops` (which must outlive its use, backward passes included).
  virtual void SetExpertParallelOps(ExpertParallelOps* ops) = 0;

  // The ops SetProjectionOps installed, or nullptr.
  virtual ProjectionOps* projection_ops() const = 0;
};

// How a wrapper adds to a block's projections (LoRA's adapters, wrap/lora): the model calls
// Adapt for each projection of a block (q/k/v/o, gate/up/down) once it has its output, with
// the projection's module (the one RootModule().named_modules() lists, whose `weight` and
// `bias` it computes with), and continues with what Adapt returns. Under tensor parallelism
// `input` is what this rank multiplies (a row-parallel projection's slice of the features)
// and `output` what it computed of the projection: a column-parallel projection's slice of
// the output features, a row-parallel one's partial product before tensor parallelism sums
// it over the group (and before its bias), so that what Adapt adds to it is summed too.
// With activation checkpointing the model calls it inside the checkpointed block, so it runs
// again when the block is recomputed; `output` is then the kept one under SELECTIVE. A model
// without it set continues with the projection's output.
//
// Before it computes, the model asks Weight for the weight a projection computes with: a
// wrapper may hold a projection's weight in a form of its own (QLoRA's NF4 base, dequantized
// here) and take it out of the module's parameters. The tensors it holds it in (HeldTensors)
// are what a data-parallel wrapper applied later shards and gathers with the projection's
// block, as it does the block's parameters (FSDP: their bytes as they are).
class ProjectionOps {
 public:
  virtual ~ProjectionOps() = default;
  // The weight [out, in] `projection` computes with: its `weight` parameter as given, or the
  // one the ops hold for it (requiring no gradient; `weight` may then be undefined).
  virtual at::Tensor Weight(const torch::nn::Module& projection, const at::Tensor& weight) = 0;
  // The tensors the ops hold `projection`'s weight in, which Weight reads, in place of its
  // `weight` parameter (named `<projection>.weight` in the model's parameters); none for a
  // projection that computes with its own.
  virtual std::vector<at::Tensor> HeldTensors(const torch::nn::Module& projection) const = 0;
  virtual at::Tensor Adapt(const torch::nn::Module& projection, const at::Tensor& input,
                           at::Tensor output) = 0;
  // How tensor parallelism splits the parameter `name` when these ops added it to a
  // projection (Wrappable::TensorParallelSplit asks them first); nullopt for any other.
  virtual std::optional<Wrappable::Split> AddedParameterSplit(const std::string& name) const = 0;
};

// While it lives, `model`'s forward runs without what its ProjectionOps add to the
// projections' outputs, so that a model whose preparation added adapters (LoRA) computes as
// its base model, as PEFT's disable_adapter() does; the ops still give the weights the
// projections compute with (a QLoRA base's dequantized ones), and are whole again when it
// ends. For forward passes under no-grad (DPO's reference when it is the policy without its
// adapters): activation checkpointing recomputes a block in the backward, which would run
// after the scope ended, with the adapters.
//
//   { const WithoutAdapters base(model); at::NoGradGuard no_grad; ... }
class WithoutAdapters final : private ProjectionOps {
 public:
  explicit WithoutAdapters(Wrappable& model) : model_(model), ops_(model.projection_ops()) {
    model_.SetProjectionOps(ops_ == nullptr ? nullptr : this);
  }
  ~WithoutAdapters() override { model_.SetProjectionOps(ops_); }
  WithoutAdapters(const WithoutAdapters&) = delete;
  WithoutAdapters& operator=(const WithoutAdapters&) = delete;

 private:
  at::Tensor Weight(const torch::nn::Module& projection, const at::Tensor& weight) override {
    return ops_->Weight(projection, weight);
  }
  std::vector<at::Tensor> HeldTensors(const torch::nn::Module& projection) const override {
    return ops_->HeldTensors(projection);
  }
  at::Tensor Adapt(const torch::nn::Module& /*projection*/, const at::Tensor& /*input*/,
                   at::Tensor output) override {
    return output;
  }
  std::optional<Wrappable::Split> AddedParameterSplit(const std::string& name) const override {
    return ops_->AddedParameterSplit(name);
  }

  Wrappable& model_;
  ProjectionOps* const ops_;
};

}  // namespace plait::wrap

#endif  // PLAIT_WRAP_WRAPPABLE_H_
