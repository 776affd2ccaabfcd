#include "models/rotary.h"

#include <cmath>

#include "ATen/core/Tensor.h"
#include "ATen/ops/cat.h"
#include "ATen/ops/outer.h"
#include "ATen/ops/pow.h"
#include "ATen/ops/where.h"
#include "models/model_config.h"
#include "torch/csrc/autograd/generated/variable_factories.h"

namespace plait::models {

at::Tensor RotaryInverseFrequencies(const ModelConfig& config) {
  const int64_t head_dim = HeadDim(config);
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  // Computed in float64 and rounded once, so the scaled bands match HF's float32 values.
  at::Tensor inv_freq =
      1.0 / at::pow(config.rope_theta(), torch::arange(0, head_dim, 2, f64) / head_dim);
  if (config.has_rope_scaling()) {
    // Llama 3.1's scaling (HF's _compute_llama3_parameters): long wavelengths are slowed by
    // `factor`, short ones kept, and the band between interpolated smoothly.
    const RopeScaling& scaling = config.rope_scaling();
    const double factor = scaling.factor();
    const double low = scaling.low_freq_factor();
    const double high = scaling.high_freq_factor();
    const double old_context = static_cast<double>(scaling.original_max_position_embeddings());
    const double low_freq_wavelen = old_context / low;
    const double high_freq_wavelen = old_context / high;
    const at::Tensor wavelen = 2.0 * M_PI / inv_freq;
    at::Tensor scaled = at::where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq);
    const at::Tensor smooth = (old_context / wavelen - low) / (high - low);
    const at::Tensor smoothed = (1.0 - smooth) * scaled / factor + smooth * scaled;
    const at::Tensor medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen);
    inv_freq = at::where(medium, smoothed, scaled);
  }
  return inv_freq.to(at::kFloat);
}

RotaryTables MakeRotaryTables(const at::Tensor& inv_freq, const at::Tensor& positions) {
  const at::Tensor angles = at::outer(positions.to(at::kFloat), inv_freq.to(at::kFloat));
  const at::Tensor both = at::cat({angles, angles}, /*dim=*/-1);
  return {both.cos(), both.sin()};
}

at::Tensor ApplyRotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  const at::Tensor x1 = x.narrow(-1, 0, half);
  const at::Tensor x2 = x.narrow(-1, half, half);
  const at::Tensor rotated = at::cat({-x2, x1}, /*dim=*/-1);
  // [T, D] -> [T, 1, D]: broadcast over the heads.
  return x * cos.unsqueeze(-2) + rotated * sin.unsqueeze(-2);
}

}  // namespace plait::models
