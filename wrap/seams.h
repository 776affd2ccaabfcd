// The seams of a model's forward pass: the named points where a preparation step changes
// what the model computes (which part of each sequence a rank computes, the embedding, the
// input of the projections whose outputs split, a projection's weight, its product and its
// output, the attention, the experts of a mixture, a block, the per-token loss). A model calls
// its Seams at each of them with its own computation (`own`), and knows nothing of the steps.
// A step that changes some of them adds a SeamLayer, which overrides those methods and calls
// `next` for what lies below it. The layers of a seam form a stack in the plan's preparation
// order (which the rules fix): the layer added last runs outermost, and the model's own
// computation runs innermost.
//
//   // A projection's output, as a block computes it:
//   at::Tensor out = seams.Project({module, seams.Weight(module, w), bias, Split::kRow}, x);
//   // A layer that sums a row-split projection's partial products over its ranks:
//   at::Tensor Project(const ProjectionSite& site, const at::Tensor& x, ProjectNext next) {
//     if (site.split != Split::kRow) return next(site, x);
//     ProjectionSite partial = site;
//     partial.bias = at::Tensor();
//     const at::Tensor sum = SumOverGroup(next(partial, x));
//     return site.bias.defined() ? sum + site.bias : sum;
//   }
#ifndef PLAIT_WRAP_SEAMS_H_
#define PLAIT_WRAP_SEAMS_H_

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "c10/util/FunctionRef.h"

namespace torch::nn {
class Module;  // torch/nn/module.h, included by the sources that call a module
}  // namespace torch::nn

namespace plait::wrap {

// How a parameter splits over the ranks of a group that splits the model's layers (Megatron's
// layout), as the model declares it for each of its parameters:
//   kColumn: dim 0 (output features) into equal parts, one per rank (q_proj, gate/up);
//   kKeyValueColumn: dim 0 into the key/value heads (k_proj, v_proj), a rank holding
//     heads / ranks of them, or, when there are fewer heads than ranks, one head shared by
//     ranks / heads ranks;
//   kRow: dim 1 (input features) into equal parts (o_proj, down_proj weights);
//   kVocabulary: dim 0 (vocabulary rows) into equal parts (embedding, output projection);
//   kReplicated: whole on every rank (norms, the bias of a row-split projection, a mixture of
//     experts' router and experts: every rank computes the experts of its own tokens);
//   kReplicatedPartialGradient: whole on every rank, where each rank computes only part of
//     its gradient, which the group sums in backward (an adapter's matrix beside a split
//     projection: A of a column-split one, B of a row-split one).
enum class ParameterSplit {
  kReplicated,
  kColumn,
  kKeyValueColumn,
  kRow,
  kVocabulary,
  kReplicatedPartialGradient
};

// The seams, for SeamLayer::changes.
enum class Seam {
  kSequence,     // which tokens of each sequence a rank computes, their positions, and sums
                 // of per-sequence quantities over the ranks that compute parts of them
  kEmbedding,    // token ids to hidden states
  kColumnInput,  // the activations entering projections whose outputs split (kColumn)
  kWeight,       // the weight a projection computes with
  kProduct,      // a projection's product, x weight^T (+ bias)
  kProjection,   // a projection, from its input to the output its block continues with
  kAttention,    // the causal attention of rotated queries, keys and values
  kExperts,      // a mixture of experts' routed rows through the experts
  kBlock,        // one block's forward
  kTokenLoss,    // per-token -log p(target) from the logits
  kLogits,       // the whole vocabulary's logits, which a sampler reads
};
inline constexpr int kSeamCount = static_cast<int>(Seam::kLogits) + 1;

// One projection of a block, as the model hands it to the projection seam.
struct ProjectionSite {
  // The projection's module, as RootModule().named_modules() lists it.
  const torch::nn::Module& module;
  at::Tensor weight;  // [out, in]: what it computes with (Seams::Weight)
  at::Tensor bias;    // [out], or undefined
  ParameterSplit split = ParameterSplit::kReplicated;  // its weight's
};

// The computations below a layer of each seam (the layers added before it, then the model's
// own): what a layer calls for the part it leaves as it is.
using TensorNext = c10::function_ref<at::Tensor(const at::Tensor&)>;
using PositionsNext = c10::function_ref<at::Tensor(int64_t seq_len, const at::Device&)>;
using EmbedNext = c10::function_ref<at::Tensor(const at::Tensor& tokens, const at::Tensor& weight)>;
using WeightNext =
    c10::function_ref<at::Tensor(const torch::nn::Module& projection, const at::Tensor& weight)>;
using ProductNext = c10::function_ref<at::Tensor(const at::Tensor& x, const at::Tensor& weight,
                                                 const at::Tensor& bias)>;
using ProjectNext = c10::function_ref<at::Tensor(const ProjectionSite&, const at::Tensor& input)>;
using AttentionNext =
    c10::function_ref<at::Tensor(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v)>;
// The experts [first_expert, first_expert + expert_rows.size()) of a layer on `rows`, grouped
// by expert, expert_rows[i] of them expert first_expert + i's.
using ExpertsNext = c10::function_ref<at::Tensor(
    const at::Tensor& rows, const std::vector<int64_t>& expert_rows, int64_t first_expert)>;
// A block's forward from its input. Unlike the others it may be kept and called again later
// (activation checkpointing recomputes a block in the backward pass), so it owns what it reads.
using BlockForward = std::function<at::Tensor(const at::Tensor& input)>;
using TokenLossNext = c10::function_ref<at::Tensor(
    const at::Tensor& logits, const at::Tensor& targets, int64_t ignore_index)>;

// What a preparation step changes of a model's forward: it overrides the methods of the seams
// it names in `changes()` (the others are never called), each calling `next` for what it does
// not replace. A layer is added to a model's Seams when its step is applied and removed when
// the step ends; it must outlive its use, backward passes included.
class SeamLayer {
 public:
  virtual ~SeamLayer() = default;

  // The seams whose methods it overrides.
  virtual std::vector<Seam> changes() const = 0;

  // Whether what it changes of the projections are adapters, added to what they compute
  // (LoRA's), which WithoutAdapters switches off; its weights stay. Default: no.
  virtual bool is_adapter() const { return false; }

  // kSequence: this rank's part of `x` [B, T, ...], whose dimension 1 is the whole sequence,
  // in the order it computes it; those tokens' positions in a sequence of `seq_len` tokens
  // (int64 [T'], on `device`); and the sum over the ranks that compute parts of the same
  // sequences of `partial`, each rank's share of a per-sequence quantity (differentiable: each
  // rank's share receives the sum of the ranks' gradients of the total).
  virtual at::Tensor OwnPart(const at::Tensor& x, TensorNext next) { return next(x); }
  virtual at::Tensor Positions(int64_t seq_len, const at::Device& device, PositionsNext next) {
    return next(seq_len, device);
  }
  virtual at::Tensor SumOverParts(const at::Tensor& partial, TensorNext next) {
    return next(partial);
  }

  // kEmbedding: hidden states [B, T, hidden] of int64 `tokens` [B, T] from `weight`.
  virtual at::Tensor Embed(const at::Tensor& tokens, const at::Tensor& weight, EmbedNext next) {
    return next(tokens, weight);
  }

  // kColumnInput: the activations [B, T, hidden] a group of projections whose outputs split
  // reads (a block's q/k/v, its gate/up, the output projection).
  virtual at::Tensor ColumnInput(const at::Tensor& x, TensorNext next) { return next(x); }

  // kWeight: the weight [out, in] `projection` computes with, from its `weight` parameter (which
  // may be undefined where a layer took it out of the model); HeldTensors: the tensors it
  // holds that weight in instead (a data-parallel step applied later shards and gathers them
  // with the projection's block, as the block's parameters), none where it holds none.
  virtual at::Tensor Weight(const torch::nn::Module& projection, const at::Tensor& weight,
                            WeightNext next) {
    return next(projection, weight);
  }
  virtual std::vector<at::Tensor> HeldTensors(const torch::nn::Module& projection) const {
    return {};
  }

  // kProduct: x weight^T (+ bias, when defined), a projection's product.
  virtual at::Tensor Product(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                             ProductNext next) {
    return next(x, weight, bias);
  }

  // kProjection: `site`'s output for `input`. The innermost computes
  // Product(input, site.weight, site.bias).
  virtual at::Tensor Project(const ProjectionSite& site, const at::Tensor& input,
                             ProjectNext next) {
    return next(site, input);
  }

  // kAttention: causal attention (scale 1 / sqrt(d)) of q [B, T, H, d] over k and v
  // [B, T, KV, d] (KV dividing H), each rotated at its positions: [B, T, H, d]. `generic`:
  // computed by the generic ops a GPU runs, even on the CPU, as the model's own ops are.
  virtual at::Tensor Attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               bool generic, AttentionNext next) {
    return next(q, k, v);
  }

  // kExperts: the outputs [R, hidden] of experts [first_expert, first_expert +
  // expert_rows.size()) of a layer on its routed `rows` [R, hidden], grouped by expert
  // (expert_rows[i] of them expert first_expert + i's). The model's call names all of the
  // layer's experts, from 0.
  virtual at::Tensor Experts(const at::Tensor& rows, const std::vector<int64_t>& expert_rows,
                             int64_t first_expert, ExpertsNext next) {
    return next(rows, expert_rows, first_expert);
  }

  // kBlock: block `unit`'s output (units numbered as Wrappable::Blocks) for `input`, which
  // `forward` computes on the block's current parameters; `forward` may be kept and called
  // again later, and then gives the same values.
  virtual at::Tensor Block(int unit, const at::Tensor& input, BlockForward forward) {
    return forward(input);
  }

  // kTokenLoss: per row, -log p(targets[i]) from `logits` [N, V] and `targets` [N], fp32, 0
  // where the target is `ignore_index`; differentiable in the logits.
  virtual at::Tensor TokenLosses(const at::Tensor& logits, const at::Tensor& targets,
                                 int64_t ignore_index, TokenLossNext next) {
    return next(logits, targets, ignore_index);
  }

  // kLogits: the logits [..., V] of the whole vocabulary from those this rank computed,
  // `logits` [..., V'] (its part of them where a layer splits the vocabulary): what a sampler
  // reads. Under no-grad.
  virtual at::Tensor WholeLogits(const at::Tensor& logits, TensorNext next) { return next(logits); }

  // Why a model with this layer cannot decode a token at a time (models::KvCache), one
  // sentence naming the step ("context parallelism computes a slice of every sequence on
  // each rank"), or "" where it can. Default: it can.
  virtual std::string DecodeRefusal() const { return ""; }

  // How a data-parallel or layer-splitting step splits the parameter `name` when this layer
  // added it to the model (its adapters); nullopt for any other.
  virtual std::optional<ParameterSplit> AddedParameterSplit(const std::string& name) const {
    return std::nullopt;
  }
};

// While one lives on a thread, the products LinearProduct computes there are decoding's (a
// model's Decode holds one), which may take the forms below. Elsewhere a product is the matrix
// product whatever the grad mode, so that a forward under no-grad (activation checkpointing's
// first, a frozen reference's) computes what the same forward with gradients does, bit for
// bit.
class DecodingProducts final {
 public:
  DecodingProducts();
  ~DecodingProducts();
  DecodingProducts(const DecodingProducts&) = delete;
  DecodingProducts& operator=(const DecodingProducts&) = delete;

  // Whether one lives on this thread.
  static bool active();

 private:
  bool was_active_;
};

// x weight^T (+ bias, where defined): a projection's product where no layer of the product
// seam changes it, and the output projection's. Decoding's few fp32 rows on the CPU (no
// gradient, a DecodingProducts alive) take faster forms than a matrix product, whose BLAS copies
// all of the weight into its blocked layout first: a single row is a matrix-vector product (the
// matmul took twice as long on Qwen2.5's [151936, 896] output projection), and up to 16 rows go
// through the BLAS a slice of the weight's rows at a time, each slice small enough (M x N x K
// within about 10^6) for its kernels that read the operands where they are: at 16 rows, one
// thread, 1.6x faster on that projection and 1.7-1.8x on the medium model's, with Debian's OpenBLAS
// and the wheel's MKL alike. Slices only help while they can be at least 16 rows wide; beyond that,
// the matrix product.
at::Tensor LinearProduct(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);

// A model's seams: the layers of each, and the calls the model makes, which run the layers
// that change that seam, last added outermost, and then the model's `own` computation.
class Seams {
 public:
  // Seams without layers: the model's own computation at every one.
  static const Seams& None();

  // Adds `layer` on top of the layers added before (it must not be added twice);
  // Remove takes it out again.
  void Add(SeamLayer* layer);
  void Remove(SeamLayer* layer);

  // Whether some layer changes `seam`; how many times the layers changed.
  bool Changed(Seam seam) const { return !layers_[static_cast<int>(seam)].empty(); }
  int64_t version() const { return version_; }

  // Whether some layer adds adapters (SeamLayer::is_adapter).
  bool HasAdapters() const;
  // The first layer's SeamLayer::DecodeRefusal that is not empty, or "".
  std::string DecodeRefusal() const;

  at::Tensor OwnPart(const at::Tensor& x) const;
  at::Tensor Positions(int64_t seq_len, const at::Device& device, PositionsNext own) const;
  at::Tensor SumOverParts(const at::Tensor& partial) const;
  at::Tensor Embed(const at::Tensor& tokens, const at::Tensor& weight, EmbedNext own) const;
  at::Tensor ColumnInput(const at::Tensor& x) const;
  at::Tensor Weight(const torch::nn::Module& projection, const at::Tensor& weight) const;
  std::vector<at::Tensor> HeldTensors(const torch::nn::Module& projection) const;
  // Product's own computation is x weight^T + bias (torch::nn::functional::linear).
  at::Tensor Product(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) const;
  // The projection's innermost computation is Product(input, site.weight, site.bias).
  at::Tensor Project(const ProjectionSite& site, const at::Tensor& input) const;
  at::Tensor Attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool generic,
                       AttentionNext own) const;
  // `expert_rows` has one count for each of the layer's experts.
  at::Tensor Experts(const at::Tensor& rows, const std::vector<int64_t>& expert_rows,
                     ExpertsNext own) const;
  at::Tensor Block(int unit, const at::Tensor& input, BlockForward own) const;
  at::Tensor TokenLosses(const at::Tensor& logits, const at::Tensor& targets, int64_t ignore_index,
                         TokenLossNext own) const;
  // The model's own logits are the whole vocabulary's.
  at::Tensor WholeLogits(const at::Tensor& logits) const;
  std::optional<ParameterSplit> AddedParameterSplit(const std::string& name) const;

 private:
  friend class WithoutAdapters;

  // The layers that change `seam`, in the order they were added; of the projection's, those
  // that add adapters left out while adapters are off. A reference: the forward asks for every
  // projection.
  const std::vector<SeamLayer*>& LayersOf(Seam seam) const;
  // After Add or Remove: projections_without_adapters_ again, and the next version.
  void LayersChanged();

  std::array<std::vector<SeamLayer*>, kSeamCount> layers_;
  // The projection's layers that are not adapters, kept by Add and Remove for LayersOf.
  std::vector<SeamLayer*> projections_without_adapters_;
  int64_t version_ = 0;
  bool adapters_off_ = false;
};

// While it lives, `seams` run without the adapters of their layers (SeamLayer::is_adapter),
// so that a model whose preparation added adapters (LoRA) computes as its base model, as PEFT's
// disable_adapter() does; the adapters' layers still give the weights the projections compute
// with (a QLoRA base's dequantized ones). For forward passes under no-grad (DPO's reference
// when it is the policy without its adapters): activation checkpointing recomputes a block in
// the backward, which would run after the scope ended, with the adapters.
//
//   { const WithoutAdapters base(model.seams()); at::NoGradGuard no_grad; ... }
class WithoutAdapters final {
 public:
  explicit WithoutAdapters(Seams& seams) : seams_(seams), were_off_(seams.adapters_off_) {
    seams_.adapters_off_ = true;
  }
  ~WithoutAdapters() { seams_.adapters_off_ = were_off_; }
  WithoutAdapters(const WithoutAdapters&) = delete;
  WithoutAdapters& operator=(const WithoutAdapters&) = delete;

 private:
  Seams& seams_;
  const bool were_off_;
};

}  // namespace plait::wrap

#endif  // PLAIT_WRAP_SEAMS_H_
