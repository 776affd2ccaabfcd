// Llama, Qwen2, Qwen3, Qwen3-MoE and Mixtral decoder-only language models in LibTorch, with
// Hugging Face's module structure and parameter names (`model.layers.3.self_attn.q_proj.weight`,
// ...), so their checkpoints load directly (hf_checkpoint.h). A CausalLM is a torch::nn::Module and
// a wrap::Wrappable: wrappers see its decoder layers as blocks.
//
//   PLAIT_ASSIGN_OR_RETURN(std::shared_ptr<CausalLM> model, CausalLM::Create(config, init));
//   at::Tensor loss = model->Loss(inputs, targets);  // inputs, targets: int64 [B, T]
//   loss.backward();
//
// Architecture (both types): embedding; num_hidden_layers blocks of
//   h = h + o_proj(attention(rope(q_proj(rms_norm(h))), rope(k_proj(.)), v_proj(.)))
//   h = h + down_proj(silu(gate_proj(rms_norm(h))) * up_proj(rms_norm(h)))
// with causal grouped-query attention (each group of num_attention_heads /
// num_key_value_heads query heads shares one key/value head); a final RMSNorm; the output
// projection lm_head, or the embedding matrix when tie_word_embeddings. Qwen2 adds biases to
// q_proj, k_proj and v_proj; Llama has biases on q/k/v/o only with attention_bias; Qwen3
// normalises each head's queries and keys; Qwen3-MoE replaces the MLP of its mixture-of-experts
// layers with a SparseMoe, and Mixtral (Llama's attention) that of every layer.
//
// Initialisation (InitConfig): every weight matrix and the embedding ~ N(0, std), o_proj
// and down_proj ~ N(0, std / sqrt(2 * num_hidden_layers)) with scaled_residual_init, biases
// zero, RMSNorm weights one. A parameter's values are drawn in tiles of its global shape
// (16 rows x 256 columns over its last two dimensions, 4,096 values of a vector), each from its own
// CPU generator seeded by splitmix64(splitmix64(seed ^ fnv1a64(name)) + tile), so they depend only
// on the seed, the name and the shape: never on the parameter order, the device, the threads, or
// how many ranks later shard it. A rank that holds a slice draws only the tiles its slice touches.
#ifndef PLAIT_MODELS_CAUSAL_LM_H_
#define PLAIT_MODELS_CAUSAL_LM_H_

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/model.pb.h"
#include "models/model_config.h"
#include "models/rotary.h"
#include "models/router_statistics.h"
#include "parallel/tensor_slice.h"
#include "torch/csrc/autograd/generated/variable_factories.h"
#include "torch/nn/module.h"
#include "torch/nn/modules/embedding.h"
#include "torch/nn/modules/linear.h"
#include "wrap/wrappable.h"

namespace plait::models {

class KvCache;  // models/kv_cache.h: decoding's keys and values (CausalLM::Decode)

// The options of the parameters of a model built for deferred initialisation
// (CausalLM::CreateDeferred), or none for modules built whole, with LibTorch's default
// initialisation.
using Deferred = std::optional<at::TensorOptions>;

// The index CrossEntropy skips by default (PyTorch's and HF's).
inline constexpr int64_t kIgnoreIndex = -100;

// How Megatron's layout splits the parameter `name` of a CausalLM (wrap::ParameterSplit):
// q/gate/up by output features, k/v by key/value heads, o/down by input features, the
// embedding and lm_head by vocabulary rows, the rest (a mixture of experts' router and experts
// among them) whole on every rank.
wrap::Wrappable::Split ParameterSplitOf(const std::string& name);

// x * rsqrt(mean(x^2) + eps) * weight over the last dimension; `generic_ops` as
// ForwardContext's. Each module below builds its parameters as `deferred` says.
class RmsNorm : public torch::nn::Module {
 public:
  RmsNorm(int64_t size, double eps, const Deferred& deferred = std::nullopt);
  at::Tensor forward(const at::Tensor& x, bool generic_ops = false);

  at::Tensor weight;

 private:
  double eps_;
};

// What every layer shares for one sequence length, computed once per forward.
struct ForwardContext {
  // cos, sin [T, head_dim]; for packed rows (`positions`), each row's [B, T, head_dim].
  RotaryTables rope;
  // Additive causal mask (0 on and below the diagonal, -inf above), [groups * T, T] with
  // groups = local heads / local kv heads: row g * T + t belongs to query position t. Read
  // by the composite attention only, and undefined where it does not run
  // (models/internal/ops.h's CausalAttentionReadsMask): at 8192 tokens it would take 512 MiB.
  at::Tensor mask;
  // Packed rows' per-token positions, int64 [B, T] (CausalLM::Forward), or undefined. Held
  // here, per forward, so that a block computed again (its recomputation in the backward
  // pass) sees them too.
  at::Tensor positions;
  // Whether the ops take their generic forms (models/internal/ops.h) even where the fused CPU
  // kernels serve the tensors: what a GPU runs, chosen on the CPU by tests of that path.
  bool generic_ops = false;
  // The model's seams (wrap/seams.h), which the layers call at each; `rope` is for the
  // tokens the sequence seam gives this rank.
  const wrap::Seams* seams = &wrap::Seams::None();
  // A mixture-of-experts model's: where this forward's layers record their routing.
  c10::intrusive_ptr<RouterStatistics> router;
  // In decoding (CausalLM::Decode): the cache the attention layers append their keys and
  // values to and attend, and its mask for this forward's tokens (KvCache::Mask); null
  // otherwise.
  KvCache* cache = nullptr;
  at::Tensor cache_mask;
};

// Causal self-attention with rotary embeddings and grouped-query attention, of the model's
// layer `layer` (the KvCache's index of its keys and values).
class Attention : public torch::nn::Module {
 public:
  explicit Attention(const ModelConfig& config, int64_t layer = 0,
                     const Deferred& deferred = std::nullopt);

  // x [B, T, hidden] -> [B, T, hidden] (the part of the sequence the seams give this rank in
  // and out).
  at::Tensor forward(const at::Tensor& x, const ForwardContext& context);

  // The head counts q_proj and k_proj/v_proj hold (after tensor-parallel sharding).
  absl::Status SetLocalHeads(int64_t num_heads, int64_t num_kv_heads);
  int64_t local_heads() const { return num_heads_; }
  int64_t local_kv_heads() const { return num_kv_heads_; }
  int64_t head_dim() const { return head_dim_; }

  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  std::shared_ptr<RmsNorm> q_norm, k_norm;  // Qwen3's, over each head; null for the others

 private:
  int64_t layer_;
  int64_t num_heads_;
  int64_t num_kv_heads_;
  int64_t head_dim_;
};

// The SwiGLU feed-forward: down_proj(silu(gate_proj(x)) * up_proj(x)), `width` wide inside,
// its projections registered as `names` say (gate, up, down: a Mixtral expert's w1, w3, w2).
// A block's MLP splits as Megatron's layout says (gate/up by output features, down by input
// features); an `expert`'s stays whole on every rank.
class Mlp : public torch::nn::Module {
 public:
  Mlp(int64_t hidden, int64_t width, const Deferred& deferred = std::nullopt,
      const std::array<std::string, 3>& names = kMlpProjectionNames, bool expert = false);
  // As Attention::forward.
  at::Tensor forward(const at::Tensor& x, const ForwardContext& context);

  torch::nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};

 private:
  bool expert_;
};

// A mixture of experts (Qwen3-MoE's sparse MLP, Mixtral's block_sparse_moe, their experts'
// projections named as MoeModuleNamesOf says): a router `gate` [num_experts, hidden] whose
// softmax (in fp32) picks num_experts_per_tok experts for each token, the lower expert on a
// tie, so that every layout routes alike; their probabilities, renormalised over the chosen
// where norm_topk_prob, weigh the outputs of the experts, SwiGLU MLPs of
// moe_intermediate_size, each computing the rows routed to it in one GEMM per projection,
// through the experts seam. Its routing is recorded in the context's RouterStatistics as that
// of layer `layer`. The router and the experts stay whole on every rank (ParameterSplitOf).
class SparseMoe : public torch::nn::Module {
 public:
  SparseMoe(const ModelConfig& config, int64_t layer, const Deferred& deferred = std::nullopt);
  // x [B, T, hidden] -> [B, T, hidden].
  at::Tensor forward(const at::Tensor& x, const ForwardContext& context);

  // Keeps experts [first, first + count) (under their names) and drops the others.
  void KeepExperts(int64_t first, int64_t count);

  torch::nn::Linear gate{nullptr};
  // Registered as "experts.0", "experts.1", ...; null where KeepExperts dropped one.
  std::vector<std::shared_ptr<Mlp>> experts;

 private:
  // The outputs of experts [first, first + expert_rows.size()) on `rows`, expert_rows[i] of
  // them (in order) expert first + i's.
  at::Tensor RunExperts(const at::Tensor& rows, const std::vector<int64_t>& expert_rows,
                        int64_t first, const ForwardContext& context);

  int64_t layer_;
  int64_t per_token_;
  bool normalise_;
};

// One pre-norm transformer block (HF's LlamaDecoderLayer / Qwen2DecoderLayer /
// Qwen3MoeDecoderLayer / MixtralDecoderLayer), layer `index` of the model: its feed-forward is
// a dense Mlp registered as "mlp" or, in the layers IsMoeLayer names, a SparseMoe registered
// as MoeModuleNamesOf says.
class DecoderLayer : public torch::nn::Module {
 public:
  DecoderLayer(const ModelConfig& config, int64_t index, const Deferred& deferred = std::nullopt);
  at::Tensor forward(const at::Tensor& x, const ForwardContext& context);

  std::shared_ptr<RmsNorm> input_layernorm;
  std::shared_ptr<Attention> self_attn;
  std::shared_ptr<RmsNorm> post_attention_layernorm;
  std::shared_ptr<Mlp> mlp;        // null in a mixture-of-experts layer
  std::shared_ptr<SparseMoe> moe;  // null in a dense layer
};

// The decoder stack without the output projection (HF's LlamaModel / Qwen2Model), or, in a
// pipeline stage, the part of it the stage holds.
class Decoder : public torch::nn::Module {
 public:
  explicit Decoder(const ModelConfig& config, const Deferred& deferred = std::nullopt);

  // Drops the layers outside the [begin, end) ranges of `stages`, and the embedding and the
  // final norm unless kept; the rest keep their names ("layers.7.mlp.up_proj.weight").
  void KeepStages(const std::vector<std::pair<int64_t, int64_t>>& stages, bool keep_embedding,
                  bool keep_norm);

  torch::nn::Embedding embed_tokens{nullptr};         // null in a stage that does not hold it
  std::vector<std::shared_ptr<DecoderLayer>> layers;  // the layers held, in order
  std::vector<int64_t> layer_indices;                 // the model's index of each of layers
  std::shared_ptr<RmsNorm> norm;                      // null in a stage that does not hold it

 private:
  // Registered as "layers", holding each layer under its index in the model.
  std::shared_ptr<torch::nn::Module> layer_list_;
};

class CausalLM;

namespace internal {
// The seam through which tests run `model`'s ops in their generic forms (ForwardContext's
// generic_ops) on the CPU, the path a GPU takes; models/causal_lm_test.cc.
void UseGenericOps(CausalLM& model, bool generic);

// How many values CausalLM::InitialValues has drawn from seeded generators in this process,
// on any thread: how tests see that a model whose values are read from a checkpoint draws
// none, and that a slice costs its tiles.
int64_t SeededDraws();
}  // namespace internal

class CausalLM : public torch::nn::Module, public wrap::Wrappable {
 public:
  // A model for `config` (checked with ValidateModelConfig, errors name `model_config.*`),
  // initialised as the header describes; InvalidArgument for an invalid init config.
  static absl::StatusOr<std::shared_ptr<CausalLM>> Create(const ModelConfig& config,
                                                          const InitConfig& init);

  // Deferred initialisation: a model for `config` whose parameters have their names, shapes
  // and `options` (dtype, device) but no memory, each a view of one zero element of its own.
  // Parallelism wrappers shard or slice them (wrap's strategies give each rank's part memory of
  // its own), so that no rank ever holds the whole model; InitialValues or a checkpoint then
  // gives the parts their values. A parameter no wrapper replaced needs memory first
  // (MaterializeParameters). Building it allocates no parameter's memory and draws no value
  // (not even LibTorch's default initialisation).
  static absl::StatusOr<std::shared_ptr<CausalLM>> CreateDeferred(const ModelConfig& config,
                                                                  const at::TensorOptions& options);

  // The values Create gives the part `slice.box` of parameter `name` of `config`'s model
  // (whose global shape is `slice.global_shape`), for a valid `init` (ValidateInitConfig):
  // fp32, on the host, shaped as the box. Only the tiles the box touches are drawn, on this
  // thread's LibTorch pool, so a rank writing its slice of a parameter holds and draws little
  // more than the slice.
  static at::Tensor InitialValues(const ModelConfig& config, const InitConfig& init,
                                  const std::string& name, const parallel::TensorSlice& slice);

  // Logits [B, T, vocab_size] for int64 tokens [B, T] (positions 0 .. T-1); where a step
  // split the output projection's vocabulary rows over ranks, this rank's slice of them,
  // [B, T, vocab_size / n] (the vocabulary rounded up to a multiple of n where the step pads
  // it; the padding columns are not logits of any token); where the sequence seam gives this
  // rank part of each sequence, those of its part, [B, T', ...], and so for Loss and
  // TokenLogProbs, whose targets it takes the same part of (SequenceLogProbs sums the ranks'
  // parts into the whole sequences').
  //
  // `positions` (int64 [B, T], or undefined) packs several sequences (documents, SFT
  // examples) into each row, padding-free, with Hugging Face's position_ids convention:
  // positions[b, t] is token t's position in its own sequence, 0 where a sequence starts and
  // one more at each following token, each in [0, t]. Token t then attends only the tokens
  // t - positions[b, t] .. t of its row (its own sequence, causally), and its rotary angle is
  // that of positions[b, t]: each sequence's logits are those it gets alone. The generic ops
  // (a GPU) build a [B, T, T] mask for it (models/internal/ops.h).
  //
  //   // Sequences of 3 and 2 tokens in one row:
  //   model->Forward(tokens, torch::tensor({{0, 1, 2, 0, 1}}));
  at::Tensor Forward(const at::Tensor& tokens, const at::Tensor& positions = {});

  // Decoding: logits [B, T, vocab_size] of `tokens` [B, T], the next T tokens of the rows of
  // `cache`, whose keys and values it appends to the cache; each token attends its row's
  // tokens so far (KvCache's padding left out) and itself, at the positions KvCache gives.
  // The first call gives the (left-padded) prompts, each later one the tokens sampled next:
  // the logits are those Forward gives each row alone (unpadded) at those positions. With
  // `logits_to_keep` > 0, those of the last logits_to_keep positions only, [B, keep, V] (a
  // prompt's next token needs its last position's: the output projection of the others is
  // most of a long prompt's forward at a large vocabulary). The logits are the whole
  // vocabulary's where a step split it over ranks (wrap::Seams::WholeLogits), every rank of
  // the split calling it with the same tokens. Call it under no-grad. Not for a model cut
  // into stages, nor one whose steps refuse it (wrap::Seams::DecodeRefusal: context and
  // sequence parallelism); DecodeRefusal says why.
  at::Tensor Decode(const at::Tensor& tokens, KvCache& cache, int64_t logits_to_keep = 0);
  // Why this model cannot Decode, one sentence, or "" where it can.
  std::string DecodeRefusal() const;

  // Mean cross-entropy of targets[b, t] (the token that follows tokens[b, t]) over the
  // positions whose target is not `ignore_index`. 0, with a zero gradient, when every target
  // is ignored (PyTorch's mean is NaN there): a micro-batch that scores nothing still runs
  // its backward, which data-parallel wrappers need on every rank, and adds nothing. fp32
  // whatever the model's dtype (16-bit logits are scored in fp32). `positions` as Forward's
  // (a packed row's last token of each sequence should then have its target ignored).
  at::Tensor Loss(const at::Tensor& tokens, const at::Tensor& targets,
                  int64_t ignore_index = kIgnoreIndex, const at::Tensor& positions = {});

  // log p(targets[b, t] | the tokens of its sequence up to t) per position, 0 where the
  // target is `ignore_index`: [B, T], fp32, differentiable (preference training's per-token
  // values, per sequence of packed rows). `positions` as Forward's.
  at::Tensor TokenLogProbs(const at::Tensor& tokens, const at::Tensor& targets,
                           int64_t ignore_index = kIgnoreIndex, const at::Tensor& positions = {});

  // A model cut into stages (wrap::Wrappable::KeepStages): a stage without the output layers
  // computes its blocks' output, [B, T, hidden], instead of logits; a stage without the
  // embedding starts from the hidden state SetStageInput gave it (the previous stage's
  // StageOutput, received), which its next Forward, StageOutput, Loss or TokenLogProbs
  // consumes. `tokens` still gives the batch's shape (and the targets' positions).
  //
  //   first->StageOutput(tokens) -> send ... receive -> last->SetStageInput(hidden);
  //   at::Tensor loss = last->Loss(tokens, targets);
  at::Tensor StageOutput(const at::Tensor& tokens, const at::Tensor& positions = {});
  void SetStageInput(at::Tensor hidden) { stage_input_ = std::move(hidden); }

  // Micro-batch `tokens`' forward as a pipeline's executor runs it (wrap::MicroBatchForward):
  // from `stage_input`, the previous stage's output received, where it is defined; this
  // stage's output where it does not hold the output layers, else what `with_output_layers`
  // computes with them (a loss).
  absl::StatusOr<at::Tensor> StageForward(
      const at::Tensor& stage_input, const at::Tensor& tokens, const at::Tensor& positions,
      const std::function<absl::StatusOr<at::Tensor>()>& with_output_layers);

  // Per row of one sequence, the sum of TokenLogProbs: [B], fp32, differentiable (a packed
  // row's sequences are summed by data::SequenceSums instead). Where ranks compute parts of
  // each sequence, the whole sequence's: the ranks' parts summed (wrap::Seams::SumOverParts).
  at::Tensor SequenceLogProbs(const at::Tensor& tokens, const at::Tensor& targets,
                              int64_t ignore_index = kIgnoreIndex);

  // A mixture-of-experts model's routing in its last forward (its load-balancing loss), or
  // null for a dense model and before the first forward.
  const c10::intrusive_ptr<RouterStatistics>& LastRouting() const { return last_routing_; }

  // Re-draws every parameter as the header describes.
  absl::Status ResetParameters(const InitConfig& init);

  // Gives every parameter that still has no memory of its own (CreateDeferred's, where no
  // wrapper replaced it) memory of its own, zero; leaves the others as they are.
  void MaterializeParameters();

  const ModelConfig& config() const { return config_; }
  Decoder& decoder() { return *model_; }
  // The output projection: lm_head.weight, or the embedding when tied.
  at::Tensor OutputWeight();

  // wrap::Wrappable.
  torch::nn::Module& RootModule() override { return *this; }
  std::vector<Unit> Blocks() override;
  std::vector<NamedParameter> RootParameters() override;
  std::vector<NamedParameter> NamedParameters() override;
  int64_t NumHeads() const override { return config_.num_attention_heads(); }
  int64_t NumKeyValueHeads() const override { return config_.num_key_value_heads(); }
  absl::Status SetLocalHeads(int64_t num_heads, int64_t num_kv_heads) override;
  absl::Status KeepStages(const std::vector<std::pair<int64_t, int64_t>>& stages) override;
  absl::Status SelectStage(int index) override;
  bool HoldsInputLayers() const override { return StageBegin() == 0; }
  bool HoldsOutputLayers() const override { return StageEnd() == config_.num_hidden_layers(); }
  void SetUnitHooks(UnitHooks hooks) override { hooks_ = std::move(hooks); }
  Split SplitOf(const std::string& name) const override;
  void KeepExperts(int64_t first, int64_t count) override;
  wrap::Seams& seams() override { return seams_; }
  const wrap::Seams& seams() const { return seams_; }

 private:
  // Its parameters built deferred, with `options`.
  CausalLM(const ModelConfig& config, const at::TensorOptions& options);
  friend void internal::UseGenericOps(CausalLM& model, bool generic);

  // The rotary tables and mask for sequence length `seq_len` on `device` in `dtype` (the
  // parameters'), built once and reused while the length, device, dtype, head grouping,
  // choice of ops and the seams' layers stay the same.
  const ForwardContext& Context(int64_t seq_len, const at::Device& device, at::ScalarType dtype);

  // The blocks [StageBegin(), StageEnd()) of the selected stage (all, unless KeepStages cut
  // the model).
  int64_t StageBegin() const { return stages_[selected_stage_].first; }
  int64_t StageEnd() const { return stages_[selected_stage_].second; }

  // The stage's blocks over its input (the embedded tokens, or the stage input), then, when
  // `to_logits`, the final norm and the output projection (of the last `logits_to_keep`
  // positions, when positive); decoding the next tokens of `cache`'s rows where it is given
  // (Decode).
  at::Tensor Run(const at::Tensor& tokens, const at::Tensor& positions, bool to_logits,
                 KvCache* cache = nullptr, int64_t logits_to_keep = 0);

  // The targets this rank scores: its part of them (the sequence seam's).
  at::Tensor OwnTargets(const at::Tensor& targets);

  // Per position -log p(targets[b, t] | its sequence up to t), 0 where the target is
  // `ignore_index`: [B, T], fp32; through the token-loss seam.
  at::Tensor TokenLosses(const at::Tensor& tokens, const at::Tensor& targets, int64_t ignore_index,
                         const at::Tensor& positions);

  ModelConfig config_;
  std::shared_ptr<Decoder> model_;
  torch::nn::Linear lm_head_{nullptr};
  at::Tensor inv_freq_;
  wrap::Seams seams_;
  ForwardContext context_;
  int64_t context_version_ = -1;  // the seams' version context_ was built for
  int64_t context_seq_len_ = -1;
  int64_t context_groups_ = -1;
  bool generic_ops_ = false;
  UnitHooks hooks_;
  std::vector<std::pair<int64_t, int64_t>> stages_;  // the blocks of each stage held
  int selected_stage_ = 0;
  at::Tensor stage_input_;
  c10::intrusive_ptr<RouterStatistics> last_routing_;
};

}  // namespace plait::models

#endif  // PLAIT_MODELS_CAUSAL_LM_H_
