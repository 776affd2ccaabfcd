#include "models/rotary.h"

#include <cmath>

#include "models/model_config.h"

namespace plait::models {

torch::Tensor RotaryInverseFrequencies(const ModelConfig& config) {
  const int64_t head_dim = HeadDim(config);
  const auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
  // Computed in float64 and rounded once, so the scaled bands match HF's float32 values.
  torch::Tensor inv_freq =
      1.0 / torch::pow(config.rope_theta(), torch::arange(0, head_dim, 2, f64) / head_dim);
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
    const torch::Tensor wavelen = 2.0 * M_PI / inv_freq;
    torch::Tensor scaled = torch::where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq);
    const torch::Tensor smooth = (old_context / wavelen - low) / (high - low);
    const torch::Tensor smoothed = (1.0 - smooth) * scaled / factor + smooth * scaled;
    const torch::Tensor medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen);
    inv_freq = torch::where(medium, smoothed, scaled);
  }
  return inv_freq.to(torch::kFloat32);
}

RotaryTables MakeRotaryTables(const torch::Tensor& inv_freq, const torch::Tensor& positions) {
  const torch::Tensor angles =
      torch::outer(positions.to(torch::kFloat32), inv_freq.to(torch::kFloat32));
  const torch::Tensor both = torch::cat({angles, angles}, /*dim=*/-1);
  return {both.cos(), both.sin()};
}

torch::Tensor ApplyRotary(const torch::Tensor& x, const torch::Tensor& cos,
                          const torch::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  const torch::Tensor x1 = x.narrow(-1, 0, half);
  const torch::Tensor x2 = x.narrow(-1, half, half);
  const torch::Tensor rotated = torch::cat({-x2, x1}, /*dim=*/-1);
  // [T, D] -> [T, 1, D]: broadcast over the heads.
  return x * cos.unsqueeze(-2) + rotated * sin.unsqueeze(-2);
}

}  // namespace plait::models
