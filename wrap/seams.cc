#include "wrap/seams.h"

#include <algorithm>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "ATen/ops/empty.h"
#include "ATen/ops/mv.h"
#include "models/internal/gemm.h"
#include "torch/csrc/autograd/grad_mode.h"
#include "torch/nn/functional/linear.h"

namespace plait::wrap {
namespace {

// Runs the stack of `layers` (the first `count`; the last of them outermost) around `own`:
// `call(layer, next, args...)` calls one layer's method of the seam with `next`, the layers
// below it and then `own`.
template <typename Signature>
struct Stack;

template <typename Result, typename... Args>
struct Stack<Result(Args...)> {
  using Next = c10::function_ref<Result(Args...)>;

  template <typename Call>
  static Result Run(const std::vector<SeamLayer*>& layers, size_t count, const Call& call, Next own,
                    Args... args) {
    if (count == 0) return own(args...);
    const auto below = [&](Args... inner) -> Result {
      return Run(layers, count - 1, call, own, inner...);
    };
    return call(*layers[count - 1], Next(below), args...);
  }

  template <typename Call>
  static Result Run(const std::vector<SeamLayer*>& layers, const Call& call, Next own,
                    Args... args) {
    return Run(layers, layers.size(), call, own, args...);
  }
};

at::Tensor Identity(const at::Tensor& x) { return x; }

thread_local bool decoding_products = false;

// The rows of the weight a BLAS call of LinearProduct's decoding form multiplies at a time, for
// `rows` rows of `width`: a multiple of 16 up to 64 within kSmallProduct, or 0 where none fits.
constexpr int64_t kSmallProduct = 1'000'000;  // M x N x K of the BLAS's direct kernels
int64_t SliceRows(int64_t rows, int64_t width) {
  return std::min<int64_t>(64, kSmallProduct / (rows * width) / 16 * 16);
}

}  // namespace

DecodingProducts::DecodingProducts() : was_active_(decoding_products) { decoding_products = true; }

DecodingProducts::~DecodingProducts() { decoding_products = was_active_; }

bool DecodingProducts::active() { return decoding_products; }

at::Tensor LinearProduct(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  const int64_t width = x.size(-1);
  const int64_t rows = width == 0 ? 0 : x.numel() / width;  // none: an expert no row chose
  const bool decoding =
      DecodingProducts::active() && x.device().is_cpu() && x.scalar_type() == at::kFloat &&
      weight.scalar_type() == at::kFloat &&
      !(at::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad()));
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = weight.size(0);
  if (decoding && rows == 1) {
    at::Tensor out = at::mv(weight, x.reshape({-1}));
    if (bias.defined()) out = out + bias;
    return out.view(shape);
  }
  const int64_t slice = decoding && rows > 1 && rows <= 16 ? SliceRows(rows, width) : 0;
  if (slice == 0) return torch::nn::functional::linear(x, weight, bias);
  const at::Tensor a = x.reshape({rows, width}).contiguous();
  const at::Tensor b = weight.contiguous();
  const int64_t outputs = b.size(0);
  at::Tensor out = at::empty({rows, outputs}, a.options());
  for (int64_t first = 0; first < outputs; first += slice) {
    models::internal::Gemm<float>(/*trans_a=*/false, /*trans_b=*/true, rows,
                                  std::min(slice, outputs - first), width, 1.0f,
                                  a.data_ptr<float>(), width, b.data_ptr<float>() + first * width,
                                  width, 0.0f, out.data_ptr<float>() + first, outputs);
  }
  if (bias.defined()) out.add_(bias);
  return out.view(shape);
}

const Seams& Seams::None() {
  static const Seams* const none = new Seams();
  return *none;
}

void Seams::Add(SeamLayer* layer) {
  for (const Seam seam : layer->changes()) layers_[static_cast<int>(seam)].push_back(layer);
  LayersChanged();
}

void Seams::Remove(SeamLayer* layer) {
  for (std::vector<SeamLayer*>& layers : layers_) {
    layers.erase(std::remove(layers.begin(), layers.end(), layer), layers.end());
  }
  LayersChanged();
}

void Seams::LayersChanged() {
  const std::vector<SeamLayer*>& projections = layers_[static_cast<int>(Seam::kProjection)];
  projections_without_adapters_.clear();
  std::copy_if(projections.begin(), projections.end(),
               std::back_inserter(projections_without_adapters_),
               [](const SeamLayer* layer) { return !layer->is_adapter(); });
  ++version_;
}

bool Seams::HasAdapters() const {
  return std::any_of(layers_.begin(), layers_.end(), [](const std::vector<SeamLayer*>& layers) {
    return std::any_of(layers.begin(), layers.end(),
                       [](const SeamLayer* layer) { return layer->is_adapter(); });
  });
}

std::string Seams::DecodeRefusal() const {
  for (const std::vector<SeamLayer*>& layers : layers_) {
    for (const SeamLayer* layer : layers) {
      if (std::string refusal = layer->DecodeRefusal(); !refusal.empty()) return refusal;
    }
  }
  return "";
}

const std::vector<SeamLayer*>& Seams::LayersOf(Seam seam) const {
  // An adapter layer's projections are what WithoutAdapters switches off; its weights stay.
  if (adapters_off_ && seam == Seam::kProjection) return projections_without_adapters_;
  return layers_[static_cast<int>(seam)];
}

at::Tensor Seams::OwnPart(const at::Tensor& x) const {
  return Stack<at::Tensor(const at::Tensor&)>::Run(
      LayersOf(Seam::kSequence),
      [](SeamLayer& layer, TensorNext next, const at::Tensor& x) { return layer.OwnPart(x, next); },
      Identity, x);
}

at::Tensor Seams::Positions(int64_t seq_len, const at::Device& device, PositionsNext own) const {
  return Stack<at::Tensor(int64_t, const at::Device&)>::Run(
      LayersOf(Seam::kSequence),
      [](SeamLayer& layer, PositionsNext next, int64_t seq_len, const at::Device& device) {
        return layer.Positions(seq_len, device, next);
      },
      own, seq_len, device);
}

at::Tensor Seams::SumOverParts(const at::Tensor& partial) const {
  return Stack<at::Tensor(const at::Tensor&)>::Run(
      LayersOf(Seam::kSequence),
      [](SeamLayer& layer, TensorNext next, const at::Tensor& partial) {
        return layer.SumOverParts(partial, next);
      },
      Identity, partial);
}

at::Tensor Seams::Embed(const at::Tensor& tokens, const at::Tensor& weight, EmbedNext own) const {
  return Stack<at::Tensor(const at::Tensor&, const at::Tensor&)>::Run(
      LayersOf(Seam::kEmbedding),
      [](SeamLayer& layer, EmbedNext next, const at::Tensor& tokens, const at::Tensor& weight) {
        return layer.Embed(tokens, weight, next);
      },
      own, tokens, weight);
}

at::Tensor Seams::ColumnInput(const at::Tensor& x) const {
  return Stack<at::Tensor(const at::Tensor&)>::Run(
      LayersOf(Seam::kColumnInput),
      [](SeamLayer& layer, TensorNext next, const at::Tensor& x) {
        return layer.ColumnInput(x, next);
      },
      Identity, x);
}

at::Tensor Seams::Weight(const torch::nn::Module& projection, const at::Tensor& weight) const {
  return Stack<at::Tensor(const torch::nn::Module&, const at::Tensor&)>::Run(
      LayersOf(Seam::kWeight),
      [](SeamLayer& layer, WeightNext next, const torch::nn::Module& projection,
         const at::Tensor& weight) { return layer.Weight(projection, weight, next); },
      [](const torch::nn::Module&, const at::Tensor& weight) { return weight; }, projection,
      weight);
}

std::vector<at::Tensor> Seams::HeldTensors(const torch::nn::Module& projection) const {
  std::vector<at::Tensor> held;
  for (const SeamLayer* layer : layers_[static_cast<int>(Seam::kWeight)]) {
    for (at::Tensor& tensor : layer->HeldTensors(projection)) held.push_back(std::move(tensor));
  }
  return held;
}

at::Tensor Seams::Product(const at::Tensor& x, const at::Tensor& weight,
                          const at::Tensor& bias) const {
  return Stack<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&)>::Run(
      LayersOf(Seam::kProduct),
      [](SeamLayer& layer, ProductNext next, const at::Tensor& x, const at::Tensor& weight,
         const at::Tensor& bias) { return layer.Product(x, weight, bias, next); },
      LinearProduct, x, weight, bias);
}

at::Tensor Seams::Project(const ProjectionSite& site, const at::Tensor& input) const {
  return Stack<at::Tensor(const ProjectionSite&, const at::Tensor&)>::Run(
      LayersOf(Seam::kProjection),
      [](SeamLayer& layer, ProjectNext next, const ProjectionSite& site, const at::Tensor& input) {
        return layer.Project(site, input, next);
      },
      [this](const ProjectionSite& site, const at::Tensor& input) {
        return Product(input, site.weight, site.bias);
      },
      site, input);
}

at::Tensor Seams::Attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            bool generic, AttentionNext own) const {
  return Stack<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&)>::Run(
      LayersOf(Seam::kAttention),
      [generic](SeamLayer& layer, AttentionNext next, const at::Tensor& q, const at::Tensor& k,
                const at::Tensor& v) { return layer.Attention(q, k, v, generic, next); },
      own, q, k, v);
}

at::Tensor Seams::Experts(const at::Tensor& rows, const std::vector<int64_t>& expert_rows,
                          ExpertsNext own) const {
  return Stack<at::Tensor(const at::Tensor&, const std::vector<int64_t>&, int64_t)>::Run(
      LayersOf(Seam::kExperts),
      [](SeamLayer& layer, ExpertsNext next, const at::Tensor& rows,
         const std::vector<int64_t>& expert_rows,
         int64_t first_expert) { return layer.Experts(rows, expert_rows, first_expert, next); },
      own, rows, expert_rows, int64_t{0});
}

at::Tensor Seams::Block(int unit, const at::Tensor& input, BlockForward own) const {
  BlockForward forward = std::move(own);
  for (SeamLayer* layer : LayersOf(Seam::kBlock)) {
    forward = [layer, unit, below = std::move(forward)](const at::Tensor& x) {
      return layer->Block(unit, x, below);
    };
  }
  return forward(input);
}

at::Tensor Seams::TokenLosses(const at::Tensor& logits, const at::Tensor& targets,
                              int64_t ignore_index, TokenLossNext own) const {
  return Stack<at::Tensor(const at::Tensor&, const at::Tensor&, int64_t)>::Run(
      LayersOf(Seam::kTokenLoss),
      [](SeamLayer& layer, TokenLossNext next, const at::Tensor& logits, const at::Tensor& targets,
         int64_t ignore_index) { return layer.TokenLosses(logits, targets, ignore_index, next); },
      own, logits, targets, ignore_index);
}

at::Tensor Seams::WholeLogits(const at::Tensor& logits) const {
  return Stack<at::Tensor(const at::Tensor&)>::Run(
      LayersOf(Seam::kLogits),
      [](SeamLayer& layer, TensorNext next, const at::Tensor& logits) {
        return layer.WholeLogits(logits, next);
      },
      Identity, logits);
}

std::optional<ParameterSplit> Seams::AddedParameterSplit(const std::string& name) const {
  for (const std::vector<SeamLayer*>& layers : layers_) {
    for (const SeamLayer* layer : layers) {
      if (const auto split = layer->AddedParameterSplit(name)) return split;
    }
  }
  return std::nullopt;
}

}  // namespace plait::wrap
