#include "models/estimates.h"

#include <algorithm>

#include "ATen/core/Tensor.h"
#include "base/torch_compat.h"
#include "models/internal/ops.h"
#include "models/model_config.h"
#include "models/parameter_shapes.h"

namespace plait::models {
namespace {

// Bytes the composite RmsNorm of `tokens` rows of `width` in `dtype` keeps, without its output
// (which the projections after it keep): its input in the arithmetic dtype (a float copy of a
// bf16 input), the square of that where mean keeps its input (base/torch_compat.h), rstd
// [tokens] in the arithmetic dtype, and the normalised input before the weight.
double CompositeRmsNormBytes(double tokens, double width, at::ScalarType dtype,
                             const LibTorchKernels& kernels) {
  const double element = static_cast<double>(c10::elementSize(dtype));
  const double arithmetic = static_cast<double>(c10::elementSize(internal::ArithmeticDtype(dtype)));
  return tokens * (arithmetic * width * (kernels.mean_keeps_its_input ? 2.0 : 1.0) +
                   element * width + arithmetic);
}

// One rank's share of a micro-batch's activations under `tp`, in tokens and widths (elements).
struct LocalActivations {
  // Tokens of the micro-batch, on which attention, the MLP and the loss compute; and of the
  // [tokens, hidden] tensors between the matmuls (the norms' inputs, the residual sums): this
  // rank's slice of the sequence under sequence parallelism.
  double tokens;
  double between_matmuls;
  double heads;
  double kv_heads;  // one, shared by tp / kv ranks, where there are fewer than ranks
  double q_width;
  double kv_width;
  double inner;
  int64_t vocab;  // logit columns
};

LocalActivations LocalActivationsOf(const ModelConfig& config, int64_t batch, int64_t seq_len,
                                    const LayerSplit& tp) {
  const double size = static_cast<double>(tp.size);
  const double head_dim = static_cast<double>(HeadDim(config));
  const int64_t kv_heads = config.num_key_value_heads();
  LocalActivations local;
  local.tokens = static_cast<double>(batch) * static_cast<double>(seq_len);
  local.between_matmuls = tp.sequence_parallel ? local.tokens / size : local.tokens;
  local.heads = static_cast<double>(config.num_attention_heads()) / size;
  local.kv_heads = static_cast<double>(kv_heads / std::min<int64_t>(kv_heads, tp.size));
  local.q_width = local.heads * head_dim;
  local.kv_width = local.kv_heads * head_dim;
  local.inner = static_cast<double>(config.intermediate_size()) / size;
  local.vocab = (config.vocab_size() + tp.size - 1) / tp.size;
  return local;
}

}  // namespace

double TrainingFlopsPerToken(const ModelConfig& config, int64_t seq_len) {
  const double hidden = static_cast<double>(config.hidden_size());
  const double q_width = static_cast<double>(config.num_attention_heads() * HeadDim(config));
  const double kv_width = static_cast<double>(config.num_key_value_heads() * HeadDim(config));
  // The matmul parameters a token meets: in a mixture-of-experts layer the router's and its
  // num_experts_per_tok experts' only.
  double matmul_params = hidden * static_cast<double>(config.vocab_size());
  for (int64_t layer = 0; layer < config.num_hidden_layers(); ++layer) {
    matmul_params += 2.0 * hidden * q_width + 2.0 * hidden * kv_width;
    matmul_params += IsMoeLayer(config, layer)
                         ? hidden * static_cast<double>(config.num_experts()) +
                               3.0 * hidden * static_cast<double>(config.moe_intermediate_size()) *
                                   static_cast<double>(config.num_experts_per_tok())
                         : 3.0 * hidden * static_cast<double>(config.intermediate_size());
  }
  const double layers = static_cast<double>(config.num_hidden_layers());
  return 6.0 * matmul_params + 6.0 * layers * static_cast<double>(seq_len) * q_width;
}

double ForwardFlopsPerToken(const ModelConfig& config, int64_t seq_len) {
  return TrainingFlopsPerToken(config, seq_len) / 3.0;
}

double BlockActivationBytes(const ModelConfig& config, int64_t batch, int64_t seq_len,
                            at::ScalarType dtype, at::DeviceType device_type, const LayerSplit& tp,
                            const LibTorchKernels& kernels) {
  const LocalActivations local = LocalActivationsOf(config, batch, seq_len, tp);
  const double tokens = local.tokens;
  const double h = static_cast<double>(config.hidden_size());
  const double element = static_cast<double>(c10::elementSize(dtype));
  // The [tokens, hidden] inputs of the column-parallel projections, attention's and the
  // MLP's: the norms' outputs, or under sequence parallelism the sequence all-gathered (the
  // norms' own outputs then go).
  const double column_inputs = 2.0 * tokens * h * element;
  const bool fused = internal::FusedFormsServe(dtype, device_type);
  // Qwen3's per-head norms of q and k, each its input (the projection's output) and rstd.
  double qk_norms = 0.0;
  if (HasQkNorm(config)) {
    const double d = static_cast<double>(HeadDim(config));
    const double arithmetic =
        static_cast<double>(c10::elementSize(internal::ArithmeticDtype(dtype)));
    qk_norms =
        fused ? tokens * (element * (local.q_width + local.kv_width) +
                          arithmetic * (local.heads + local.kv_heads))
              : CompositeRmsNormBytes(tokens * (local.heads + local.kv_heads), d, dtype, kernels);
  }
  // The feed-forward's, with `kept` of its [rows, width] SwiGLU tensors saved (gate, up and
  // down_proj's input; the composite adds silu(gate)): a dense MLP's over every token; in a
  // mixture of experts (the larger block where the layers mix) each token's
  // num_experts_per_tok routed rows, their copies and weighted outputs ([rows, hidden]), and the
  // router's probabilities and their sorted order ([tokens, experts], fp32 and int64) with
  // the routed pairs' indices and weights. Tensor parallelism leaves the experts whole: a rank
  // routes every token, or its slice of the sequence under sequence parallelism.
  const auto feed_forward = [&](double kept) {
    const double dense = tokens * element * kept * local.inner;
    if (config.num_experts() <= 0) return dense;
    const double per_token = static_cast<double>(config.num_experts_per_tok());
    const double routed = local.between_matmuls * per_token;
    const double moe =
        routed * element * (2.0 * h + kept * static_cast<double>(config.moe_intermediate_size())) +
        local.between_matmuls * static_cast<double>(config.num_experts()) *
            (sizeof(float) + sizeof(int64_t)) +
        routed * (2.0 * sizeof(int64_t) + sizeof(float));
    return config.mlp_only_layers_size() > 0 ? std::max(dense, moe) : moe;
  };
  if (fused) {
    // Each RmsNorm its input and rstd (the input is the block's, then the attention's residual
    // sum), and the projections after it their inputs; the rotated q and k, v; the attention's
    // output (o_proj's input) and its log-sum-exp [tokens, heads]; SwiGLU its gate and up,
    // down_proj its output. rstd and the log-sum-exp are in the kernels' arithmetic dtype
    // (float for bf16).
    const double arithmetic =
        static_cast<double>(c10::elementSize(internal::ArithmeticDtype(dtype)));
    return qk_norms + 2.0 * local.between_matmuls * (h * element + arithmetic) + column_inputs +
           tokens * element * (2.0 * local.q_width + 2.0 * local.kv_width) + feed_forward(3.0) +
           tokens * arithmetic * local.heads;
  }
  // The composite SwiGLU keeps gate, up and silu(gate), down_proj their product.
  const double norms_and_mlp =
      qk_norms + 2.0 * CompositeRmsNormBytes(local.between_matmuls, h, dtype, kernels) +
      column_inputs + feed_forward(4.0);
  if (kernels.has_causal_sdpa) {
    // The fused attention keeps the rotated q and k, v, its output and its fp32 log-sum-exp
    // [batch, heads, seq_len]; o_proj reads the output where the kernel wrote it, [tokens,
    // heads * d] already. Wider than 16 bits, k and v reach it repeated to every query head
    // (internal::CausalAttention): copies, but for a single key/value head views of it.
    const double kv_kept = element > 2.0 && local.kv_heads > 1.0 ? local.q_width : local.kv_width;
    return norms_and_mlp + tokens * element * (2.0 * local.q_width + 2.0 * kv_kept) +
           tokens * local.heads * sizeof(float);
  }
  // The composite attention keeps its copies of q, k and v in its matmuls' layouts, the
  // softmax's probabilities [batch, heads, seq_len, seq_len], and o_proj the output's copy.
  return norms_and_mlp + tokens * element * (2.0 * local.q_width + 2.0 * local.kv_width) +
         tokens * local.heads * static_cast<double>(seq_len) * element;
}

double ActivationBytes(const ModelConfig& config, int64_t batch, int64_t seq_len,
                       at::ScalarType dtype, at::DeviceType device_type, const LayerSplit& tp,
                       const LibTorchKernels& kernels) {
  const LocalActivations local = LocalActivationsOf(config, batch, seq_len, tp);
  const double tokens = local.tokens;
  const double h = static_cast<double>(config.hidden_size());
  const double element = static_cast<double>(c10::elementSize(dtype));
  const double arithmetic = static_cast<double>(c10::elementSize(internal::ArithmeticDtype(dtype)));
  // The final norm as a block's: its input and rstd, and the output projection's input (one
  // copy, gathered or not). Left out, as one process's token ids are: the vocabulary-parallel
  // embedding's local ids and mask, 9 bytes a token.
  const double final_norm =
      (internal::FusedFormsServe(dtype, device_type)
           ? local.between_matmuls * (h * element + arithmetic)
           : CompositeRmsNormBytes(local.between_matmuls, h, dtype, kernels)) +
      tokens * h * element;
  // The loss keeps the logits [tokens, vocab] in `dtype` and a log-sum-exp per token in
  // CrossEntropyDtype, and its backward makes the logits' gradient, in `dtype`, before it frees
  // them. The chunked cross-entropy (internal::TokenCrossEntropy: every case but the fused
  // kernel's; under tensor parallelism the vocabulary-parallel one, on this rank's columns, of
  // which the first rank's are all real) computes 16-bit logits' softmax a chunk of rows at a
  // time in fp32 beside that gradient; it writes wider logits' softmax into the gradient itself.
  const double vocab = static_cast<double>(local.vocab);
  const at::ScalarType wide = internal::CrossEntropyDtype(dtype);
  const double wide_element = static_cast<double>(c10::elementSize(wide));
  double loss = 2.0 * tokens * vocab * element + tokens * wide_element;
  if (!internal::FusedCrossEntropyServes(dtype, device_type) && wide != dtype) {
    const double chunk_rows =
        static_cast<double>(internal::CrossEntropyChunkRows(local.vocab, dtype));
    loss += std::min(tokens, chunk_rows) * vocab * wide_element;
  }
  return BlockActivationBytes(config, batch, seq_len, dtype, device_type, tp, kernels) *
             static_cast<double>(config.num_hidden_layers()) +
         final_norm + loss;
}

double BlockProjectionOutputBytes(const ModelConfig& config, int64_t batch, int64_t seq_len,
                                  double element_bytes, const LayerSplit& tp) {
  const LocalActivations local = LocalActivationsOf(config, batch, seq_len, tp);
  const double hidden = static_cast<double>(config.hidden_size());
  // q, k, v and o; gate, up and down.
  const double width = local.q_width + 2.0 * local.kv_width + hidden + 2.0 * local.inner + hidden;
  return local.tokens * width * element_bytes;
}

int64_t NumParameters(const ModelConfig& config) {
  int64_t count = 0;
  for (const ParameterShape& shape : ParameterShapes(config)) count += shape.numel();
  return count;
}

int64_t NumActiveParameters(const ModelConfig& config) {
  const int64_t idle_experts = config.num_experts() - config.num_experts_per_tok();
  const int64_t expert = 3 * config.hidden_size() * config.moe_intermediate_size();
  int64_t idle = 0;
  for (int64_t layer = 0; layer < config.num_hidden_layers(); ++layer) {
    if (IsMoeLayer(config, layer)) idle += idle_experts * expert;
  }
  return NumParameters(config) - idle;
}

}  // namespace plait::models
