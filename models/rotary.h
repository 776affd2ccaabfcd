// Rotary position embeddings (RoPE) as Hugging Face's Llama and Qwen2 apply them: the
// "rotate half" layout, frequencies theta^(-2i/d), and optionally Llama 3.1's "llama3"
// frequency scaling. The tables for a sequence are computed once and shared by every layer:
//
//   at::Tensor inv_freq = RotaryInverseFrequencies(config);          // [head_dim / 2]
//   RotaryTables tables = MakeRotaryTables(inv_freq, torch::arange(T));  // cos, sin [T, head_dim]
//   at::Tensor q_rotated = ApplyRotary(q, tables.cos, tables.sin);    // q [B, T, H, head_dim]
#ifndef PLAIT_MODELS_ROTARY_H_
#define PLAIT_MODELS_ROTARY_H_

#include "ATen/core/Tensor.h"
#include "models/model.pb.h"
#include "torch/csrc/autograd/generated/variable_factories.h"

namespace plait::models {

// The inverse frequencies of one head's rotary pairs (float32, [head_dim / 2]), with the
// config's rope_scaling applied. `config` must pass ValidateModelConfig.
at::Tensor RotaryInverseFrequencies(const ModelConfig& config);

struct RotaryTables {
  at::Tensor cos;  // [positions, head_dim]
  at::Tensor sin;  // [positions, head_dim]
};

// cos and sin of position * inv_freq for each position (a 1-D integer or float tensor), each
// frequency repeated for both halves of the head, as HF lays them out.
RotaryTables MakeRotaryTables(const at::Tensor& inv_freq, const at::Tensor& positions);

// x * cos + rotate_half(x) * sin for x [..., T, H, head_dim] with tables [T, head_dim]
// (broadcast over the heads), where rotate_half(x) = cat(-x2, x1) of x's halves. For x
// [B, T, H, head_dim] the tables may also be [B, T, head_dim], each row's own: packed rows,
// whose positions restart at each sequence, gather their rows of a [T, head_dim] table
// (cos.index_select(0, positions.flatten()).view({B, T, head_dim})).
at::Tensor ApplyRotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

}  // namespace plait::models

#endif  // PLAIT_MODELS_ROTARY_H_
