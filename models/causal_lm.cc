#include "models/causal_lm.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ATen/Parallel.h"
#include "ATen/core/Tensor.h"
#include "ATen/ops/bincount.h"
#include "ATen/ops/cat.h"
#include "ATen/ops/embedding.h"
#include "ATen/ops/softmax.h"
#include "ATen/ops/where.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/hash.h"
#include "base/status.h"
#include "base/torch_compat.h"
#include "models/internal/ops.h"
#include "models/kv_cache.h"
#include "models/model_config.h"
#include "models/rotary.h"
#include "torch/csrc/autograd/generated/variable_factories.h"
#include "torch/nn/modules/container/modulelist.h"

namespace plait::models {
namespace {

// `parameter` becomes a view, of `shape`, of one zero element of its own with the options
// `deferred`.
void Defer(at::Tensor& parameter, c10::IntArrayRef shape, const at::TensorOptions& deferred) {
  at::NoGradGuard no_grad;
  parameter.set_data(torch::zeros({}, deferred).expand(shape));
}

// LibTorch's Linear and Embedding draw their default initialisation over their whole shape as
// they are built. Deferred, they are built with one element a dimension and only then given
// their shape, with parameters that hold no memory: building a model fills no parameter and
// draws one value a module, not one a parameter element.
torch::nn::Linear MakeLinear(int64_t in, int64_t out, bool bias, const Deferred& deferred) {
  if (!deferred.has_value()) return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
  torch::nn::Linear linear(torch::nn::LinearOptions(1, 1).bias(bias));
  linear->options.in_features(in).out_features(out);
  Defer(linear->weight, {out, in}, *deferred);
  if (bias) Defer(linear->bias, {out}, *deferred);
  return linear;
}

torch::nn::Embedding MakeEmbedding(int64_t count, int64_t dim, const Deferred& deferred) {
  if (!deferred.has_value()) return torch::nn::Embedding(count, dim);
  torch::nn::Embedding embedding(1, 1);
  embedding->options.num_embeddings(count).embedding_dim(dim);
  Defer(embedding->weight, {count, dim}, *deferred);
  return embedding;
}

bool IsResidualProjection(const std::string& name) {
  return absl::EndsWith(name, "o_proj.weight") || absl::EndsWith(name, "down_proj.weight");
}

// `linear` applied to `x` through the projection seam, with the weight the weight seam gives;
// its weight splits as `split` says (ParameterSplitOf).
at::Tensor Project(const torch::nn::Linear& linear, wrap::ParameterSplit split, const at::Tensor& x,
                   const ForwardContext& context) {
  const wrap::Seams& seams = *context.seams;
  return seams.Project({*linear, seams.Weight(*linear, linear->weight), linear->bias, split}, x);
}

// The additive causal mask of the composite attention for `seq_len` queries in `groups` of
// query heads per key/value head (ops.h's CausalAttention), in `dtype` on `device`.
at::Tensor CausalMask(int64_t seq_len, int64_t groups, at::ScalarType dtype,
                      const at::Device& device) {
  const at::Tensor mask = torch::full({seq_len, seq_len}, -std::numeric_limits<float>::infinity(),
                                      at::TensorOptions().dtype(at::kFloat).device(device))
                              .triu(/*diagonal=*/1);
  return mask.repeat({groups, 1}).to(dtype);
}

// The values CausalLM::InitialValues has drawn (internal::SeededDraws).
std::atomic<int64_t> seeded_draws{0};

// The tiles a seeded parameter is drawn in (the header's Initialisation): 16 rows of 256
// columns over its last two dimensions, one along the others, 4,096 of a vector's values.
// Rows are what FSDP shards finely (dim 0, across up to hundreds of ranks), columns what
// row-parallel tensor parallelism splits across a few; a tile of 4,096 values keeps a
// generator's seeding about a tenth of the cost of its draw.
std::vector<int64_t> TileExtents(const std::vector<int64_t>& shape) {
  std::vector<int64_t> extents(shape.size(), 1);
  if (shape.size() == 1) extents[0] = 4096;
  if (shape.size() >= 2) {
    extents[shape.size() - 2] = 16;
    extents[shape.size() - 1] = 256;
  }
  return extents;
}

// N(0, std) values of `slice.box`, drawn tile by tile: tile t of the global shape (row-major
// among the tiles) from a generator seeded by splitmix64(parameter_seed + t), over the tile's
// whole extent, so a value depends only on the seed and its place in the global shape. The
// tiles the box touches are drawn in parallel on LibTorch's pool.
at::Tensor SeededNormal(uint64_t parameter_seed, const parallel::TensorSlice& slice, double std) {
  const std::vector<int64_t>& shape = slice.global_shape;
  const parallel::Box& box = slice.box;
  at::Tensor values = torch::empty(box.lengths, at::kFloat);
  if (values.numel() == 0) return values;
  const std::vector<int64_t> extents = TileExtents(shape);
  // Per dimension: the tiles along it (for the tile index), and the first and the number of
  // tiles the box touches.
  std::vector<int64_t> tiles_along(shape.size()), first(shape.size()), touched(shape.size());
  int64_t touched_tiles = 1;
  for (size_t d = 0; d < shape.size(); ++d) {
    tiles_along[d] = (shape[d] + extents[d] - 1) / extents[d];
    first[d] = box.offsets[d] / extents[d];
    touched[d] = (box.offsets[d] + box.lengths[d] - 1) / extents[d] - first[d] + 1;
    touched_tiles *= touched[d];
  }
  at::parallel_for(0, touched_tiles, 1, [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      // The k-th touched tile's position, its index among all tiles, and its box.
      parallel::Box tile;
      int64_t index = 0;
      int64_t rest = k;
      std::vector<int64_t> position(shape.size());
      for (size_t d = shape.size(); d-- > 0;) {
        position[d] = first[d] + rest % touched[d];
        rest /= touched[d];
      }
      for (size_t d = 0; d < shape.size(); ++d) {
        index = index * tiles_along[d] + position[d];
        tile.offsets.push_back(position[d] * extents[d]);
        tile.lengths.push_back(std::min(extents[d], shape[d] - tile.offsets.back()));
      }
      at::Generator generator =
          base::MakeCpuGenerator(base::SplitMix64(parameter_seed + static_cast<uint64_t>(index)));
      at::Tensor drawn = torch::empty(tile.lengths, at::kFloat);
      drawn.normal_(0.0, std, generator);
      seeded_draws.fetch_add(drawn.numel(), std::memory_order_relaxed);
      const parallel::Box common = *parallel::Intersect(tile, box);
      parallel::NarrowTo(values, box, common).copy_(parallel::NarrowTo(drawn, tile, common));
    }
  });
  return values;
}

}  // namespace

wrap::Wrappable::Split ParameterSplitOf(const std::string& name) {
  using Split = wrap::Wrappable::Split;
  if (wrap::IsExpertParameter(name)) return Split::kReplicated;
  for (const char* column :
       {"q_proj.weight", "q_proj.bias", "gate_proj.weight", "up_proj.weight"}) {
    if (absl::EndsWith(name, column)) return Split::kColumn;
  }
  for (const char* kv : {"k_proj.weight", "k_proj.bias", "v_proj.weight", "v_proj.bias"}) {
    if (absl::EndsWith(name, kv)) return Split::kKeyValueColumn;
  }
  if (absl::EndsWith(name, "o_proj.weight") || absl::EndsWith(name, "down_proj.weight")) {
    return Split::kRow;
  }
  if (name == "model.embed_tokens.weight" || name == "lm_head.weight") return Split::kVocabulary;
  // Qwen3's norms over each head: every rank's gradient is of its own heads.
  if (absl::EndsWith(name, "q_norm.weight") || absl::EndsWith(name, "k_norm.weight")) {
    return Split::kReplicatedPartialGradient;
  }
  return Split::kReplicated;
}

RmsNorm::RmsNorm(int64_t size, double eps, const Deferred& deferred) : eps_(eps) {
  weight = register_parameter("weight", torch::ones({deferred.has_value() ? 1 : size}));
  if (deferred.has_value()) Defer(weight, {size}, *deferred);
}

at::Tensor RmsNorm::forward(const at::Tensor& x, bool generic_ops) {
  return internal::RmsNorm(x, weight, eps_, generic_ops);
}

Attention::Attention(const ModelConfig& config, int64_t layer, const Deferred& deferred)
    : layer_(layer),
      num_heads_(config.num_attention_heads()),
      num_kv_heads_(config.num_key_value_heads()),
      head_dim_(HeadDim(config)) {
  const int64_t hidden = config.hidden_size();
  const bool qkv_bias = HasQkvBias(config);
  q_proj =
      register_module("q_proj", MakeLinear(hidden, num_heads_ * head_dim_, qkv_bias, deferred));
  k_proj =
      register_module("k_proj", MakeLinear(hidden, num_kv_heads_ * head_dim_, qkv_bias, deferred));
  v_proj =
      register_module("v_proj", MakeLinear(hidden, num_kv_heads_ * head_dim_, qkv_bias, deferred));
  o_proj = register_module(
      "o_proj", MakeLinear(num_heads_ * head_dim_, hidden, config.attention_bias(), deferred));
  if (HasQkNorm(config)) {
    q_norm = register_module("q_norm",
                             std::make_shared<RmsNorm>(head_dim_, config.rms_norm_eps(), deferred));
    k_norm = register_module("k_norm",
                             std::make_shared<RmsNorm>(head_dim_, config.rms_norm_eps(), deferred));
  }
}

absl::Status Attention::SetLocalHeads(int64_t num_heads, int64_t num_kv_heads) {
  if (num_heads <= 0 || num_kv_heads <= 0 || num_heads % num_kv_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("local heads ", num_heads, " and kv heads ", num_kv_heads,
                     ": both must be positive and kv heads must divide heads"));
  }
  num_heads_ = num_heads;
  num_kv_heads_ = num_kv_heads;
  return absl::OkStatus();
}

at::Tensor Attention::forward(const at::Tensor& x, const ForwardContext& context) {
  using Split = wrap::ParameterSplit;
  const at::Tensor input = context.seams->ColumnInput(x);
  const int64_t batch = input.size(0);
  const int64_t seq = input.size(1);
  const int64_t d = head_dim_;
  const at::Tensor flat = input.reshape({batch * seq, input.size(2)});
  // [B, T, heads, D], rotated in place of HF's [B, heads, T, D] (the same values).
  const bool generic = context.generic_ops;
  // Qwen3 normalises each head's queries and keys before rotating them.
  const auto heads = [&](const at::Tensor& projected, int64_t count,
                         const std::shared_ptr<RmsNorm>& norm) {
    const at::Tensor split = projected.view({batch, seq, count, d});
    return internal::Rotary(norm == nullptr ? split : norm->forward(split, generic),
                            context.rope.cos, context.rope.sin, generic);
  };
  const at::Tensor q = heads(Project(q_proj, Split::kColumn, flat, context), num_heads_, q_norm);
  const at::Tensor k =
      heads(Project(k_proj, Split::kKeyValueColumn, flat, context), num_kv_heads_, k_norm);
  const at::Tensor v =
      Project(v_proj, Split::kKeyValueColumn, flat, context).view({batch, seq, num_kv_heads_, d});
  const auto own = [&](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
    if (context.cache != nullptr) {
      // Decoding: over the keys and values of the row's tokens so far, these included.
      const auto [keys, values] = context.cache->Append(layer_, k, v);
      return internal::CachedAttention(q, keys, values, context.cache_mask);
    }
    // The cached mask is for the whole sequence; a layer that changes the attention and
    // calls this one gets a mask for what it hands over.
    const bool cached = context.mask.defined() && context.mask.size(1) == q.size(1);
    const at::Tensor mask =
        cached || !internal::CausalAttentionReadsMask(q.scalar_type(), q.device().type(), generic)
            ? context.mask
            : CausalMask(q.size(1), q.size(2) / k.size(2), q.scalar_type(), q.device());
    return internal::CausalAttention(q, k, v, mask, generic, context.positions);
  };
  const at::Tensor out =
      context.seams->Attention(q, k, v, generic, own).reshape({batch, seq, num_heads_ * d});
  return Project(o_proj, Split::kRow, out, context);
}

Mlp::Mlp(int64_t hidden, int64_t width, const Deferred& deferred,
         const std::array<std::string, 3>& names, bool expert)
    : expert_(expert) {
  gate_proj = register_module(names[0], MakeLinear(hidden, width, false, deferred));
  up_proj = register_module(names[1], MakeLinear(hidden, width, false, deferred));
  down_proj = register_module(names[2], MakeLinear(width, hidden, false, deferred));
}

at::Tensor Mlp::forward(const at::Tensor& x, const ForwardContext& context) {
  using Split = wrap::ParameterSplit;
  const Split column = expert_ ? Split::kReplicated : Split::kColumn;
  const Split row = expert_ ? Split::kReplicated : Split::kRow;
  const at::Tensor input = expert_ ? x : context.seams->ColumnInput(x);
  return Project(down_proj, row,
                 internal::SwiGlu(Project(gate_proj, column, input, context),
                                  Project(up_proj, column, input, context), context.generic_ops),
                 context);
}

SparseMoe::SparseMoe(const ModelConfig& config, int64_t layer, const Deferred& deferred)
    : layer_(layer), per_token_(config.num_experts_per_tok()), normalise_(config.norm_topk_prob()) {
  const int64_t hidden = config.hidden_size();
  gate = register_module("gate", MakeLinear(hidden, config.num_experts(), false, deferred));
  const auto list = register_module("experts", std::make_shared<torch::nn::Module>());
  for (int64_t e = 0; e < config.num_experts(); ++e) {
    experts.push_back(list->register_module(
        std::to_string(e), std::make_shared<Mlp>(hidden, config.moe_intermediate_size(), deferred,
                                                 MoeModuleNamesOf(config).projections,
                                                 /*expert=*/true)));
  }
}

at::Tensor SparseMoe::forward(const at::Tensor& x, const ForwardContext& context) {
  const at::Tensor flat = x.reshape({-1, x.size(-1)});
  const at::Tensor probabilities = at::softmax(gate->forward(flat).to(at::kFloat), -1);
  // A stable descending sort: of equal probabilities, the lower expert first.
  const auto [sorted, order] = probabilities.sort(/*stable=*/true, /*dim=*/-1, /*descending=*/true);
  at::Tensor weights = sorted.narrow(-1, 0, per_token_);
  if (normalise_) weights = weights / weights.sum(-1, /*keepdim=*/true);
  // The (token, choice) pairs grouped by expert, in token order within each, and their rows.
  const at::Tensor chosen = order.narrow(-1, 0, per_token_).reshape(-1);
  const at::Tensor pairs =
      std::get<1>(chosen.sort(/*stable=*/true, /*dim=*/0, /*descending=*/false));
  const at::Tensor tokens = pairs.div(per_token_, "floor");
  const at::Tensor pair_weights = weights.reshape(-1).index_select(0, pairs).to(x.scalar_type());
  const at::Tensor routed = at::bincount(chosen, {}, static_cast<int64_t>(experts.size()));
  const at::Tensor counts = routed.to(at::kCPU);
  const std::vector<int64_t> expert_rows(counts.data_ptr<int64_t>(),
                                         counts.data_ptr<int64_t>() + counts.numel());
  const at::Tensor rows = flat.index_select(0, tokens);
  const at::Tensor outputs = context.seams->Experts(
      rows, expert_rows,
      [&](const at::Tensor& rows, const std::vector<int64_t>& expert_rows, int64_t first) {
        return RunExperts(rows, expert_rows, first, context);
      });
  at::Tensor out =
      torch::zeros_like(flat).index_add_(0, tokens, outputs * pair_weights.unsqueeze(1));
  out = out.view(x.sizes());
  return context.router ? context.router->Record(layer_, probabilities, routed, out) : out;
}

void SparseMoe::KeepExperts(int64_t first, int64_t count) {
  const auto kept = std::make_shared<torch::nn::Module>();
  for (int64_t e = 0; e < static_cast<int64_t>(experts.size()); ++e) {
    if (e >= first && e < first + count) {
      kept->register_module(std::to_string(e), experts[e]);
    } else {
      experts[e] = nullptr;
    }
  }
  replace_module("experts", kept);
}

at::Tensor SparseMoe::RunExperts(const at::Tensor& rows, const std::vector<int64_t>& expert_rows,
                                 int64_t first, const ForwardContext& context) {
  std::vector<at::Tensor> outputs;
  int64_t row = 0;
  for (size_t i = 0; i < expert_rows.size(); ++i) {
    // An expert no token chose still runs, on no rows, so that its parameters get a (zero)
    // gradient on every rank, as data-parallel wrappers expect of every parameter.
    outputs.push_back(experts[first + static_cast<int64_t>(i)]->forward(
        rows.narrow(0, row, expert_rows[i]), context));
    row += expert_rows[i];
  }
  return at::cat(outputs);
}

DecoderLayer::DecoderLayer(const ModelConfig& config, int64_t index, const Deferred& deferred) {
  input_layernorm = register_module(
      "input_layernorm",
      std::make_shared<RmsNorm>(config.hidden_size(), config.rms_norm_eps(), deferred));
  self_attn = register_module("self_attn", std::make_shared<Attention>(config, index, deferred));
  post_attention_layernorm = register_module(
      "post_attention_layernorm",
      std::make_shared<RmsNorm>(config.hidden_size(), config.rms_norm_eps(), deferred));
  if (IsMoeLayer(config, index)) {
    moe = register_module(MoeModuleNamesOf(config).block,
                          std::make_shared<SparseMoe>(config, index, deferred));
  } else {
    mlp = register_module(
        "mlp", std::make_shared<Mlp>(config.hidden_size(), config.intermediate_size(), deferred));
  }
}

at::Tensor DecoderLayer::forward(const at::Tensor& x, const ForwardContext& context) {
  const at::Tensor h =
      x + self_attn->forward(input_layernorm->forward(x, context.generic_ops), context);
  const at::Tensor normed = post_attention_layernorm->forward(h, context.generic_ops);
  return h + (moe != nullptr ? moe->forward(normed, context) : mlp->forward(normed, context));
}

Decoder::Decoder(const ModelConfig& config, const Deferred& deferred) {
  embed_tokens = register_module(
      "embed_tokens", MakeEmbedding(config.vocab_size(), config.hidden_size(), deferred));
  // A plain module rather than a ModuleList, so that a pipeline stage can drop layers and
  // keep the others' names.
  layer_list_ = register_module("layers", std::make_shared<torch::nn::Module>());
  for (int64_t i = 0; i < config.num_hidden_layers(); ++i) {
    layers.push_back(std::make_shared<DecoderLayer>(config, i, deferred));
    layer_indices.push_back(i);
    layer_list_->register_module(std::to_string(i), layers.back());
  }
  norm = register_module(
      "norm", std::make_shared<RmsNorm>(config.hidden_size(), config.rms_norm_eps(), deferred));
}

void Decoder::KeepStages(const std::vector<std::pair<int64_t, int64_t>>& stages,
                         bool keep_embedding, bool keep_norm) {
  std::vector<std::shared_ptr<DecoderLayer>> kept;
  std::vector<int64_t> kept_indices;
  for (size_t i = 0; i < layers.size(); ++i) {
    const int64_t index = layer_indices[i];
    const bool in_a_stage = std::any_of(stages.begin(), stages.end(), [index](const auto& stage) {
      return index >= stage.first && index < stage.second;
    });
    if (in_a_stage) {
      kept.push_back(layers[i]);
      kept_indices.push_back(index);
    } else {
      layer_list_->unregister_module(std::to_string(index));
    }
  }
  layers = std::move(kept);
  layer_indices = std::move(kept_indices);
  if (!keep_embedding && embed_tokens) {
    unregister_module("embed_tokens");
    embed_tokens = nullptr;
  }
  if (!keep_norm && norm) {
    unregister_module("norm");
    norm = nullptr;
  }
}

CausalLM::CausalLM(const ModelConfig& config, const at::TensorOptions& options) : config_(config) {
  model_ = register_module("model", std::make_shared<Decoder>(config, options));
  if (!config.tie_word_embeddings()) {
    lm_head_ = register_module(
        "lm_head", MakeLinear(config.hidden_size(), config.vocab_size(), false, options));
  }
  inv_freq_ = RotaryInverseFrequencies(config);
  stages_ = {{0, config.num_hidden_layers()}};
}

absl::StatusOr<std::shared_ptr<CausalLM>> CausalLM::Create(const ModelConfig& config,
                                                           const InitConfig& init) {
  PLAIT_RETURN_IF_ERROR(ValidateModelConfig(config));
  PLAIT_RETURN_IF_ERROR(ValidateInitConfig(init));
  // Built deferred, so that only the seeded draw below writes the values.
  std::shared_ptr<CausalLM> model(new CausalLM(config, at::TensorOptions()));
  model->MaterializeParameters();
  PLAIT_RETURN_IF_ERROR(model->ResetParameters(init));
  return model;
}

absl::StatusOr<std::shared_ptr<CausalLM>> CausalLM::CreateDeferred(
    const ModelConfig& config, const at::TensorOptions& options) {
  PLAIT_RETURN_IF_ERROR(ValidateModelConfig(config));
  return std::shared_ptr<CausalLM>(new CausalLM(config, options));
}

at::Tensor CausalLM::InitialValues(const ModelConfig& config, const InitConfig& init,
                                   const std::string& name, const parallel::TensorSlice& slice) {
  if (absl::EndsWith(name, "norm.weight")) return torch::ones(slice.box.lengths, at::kFloat);
  if (absl::EndsWith(name, ".bias")) return torch::zeros(slice.box.lengths, at::kFloat);
  const double std = init.has_std() ? init.std() : kDefaultInitStd;
  const double residual_std =
      init.scaled_residual_init()
          ? std / std::sqrt(2.0 * static_cast<double>(config.num_hidden_layers()))
          : std;
  return SeededNormal(base::SplitMix64(init.seed() ^ base::Fnv1a64(name)), slice,
                      IsResidualProjection(name) ? residual_std : std);
}

absl::Status CausalLM::ResetParameters(const InitConfig& init) {
  PLAIT_RETURN_IF_ERROR(ValidateInitConfig(init));
  at::NoGradGuard no_grad;
  for (const auto& item : named_parameters()) {
    item.value().copy_(InitialValues(config_, init, item.key(),
                                     parallel::TensorSlice::Whole(item.value().sizes())));
  }
  return absl::OkStatus();
}

void CausalLM::MaterializeParameters() {
  at::NoGradGuard no_grad;
  for (at::Tensor& parameter : parameters()) {
    // A deferred parameter is a view of one element; its contiguous copy has its own memory.
    if (!parameter.is_contiguous()) parameter.set_data(parameter.contiguous());
  }
}

const ForwardContext& CausalLM::Context(int64_t seq_len, const at::Device& device,
                                        at::ScalarType dtype) {
  const Attention& attention = *model_->layers.front()->self_attn;
  const int64_t groups = attention.local_heads() / attention.local_kv_heads();
  if (seq_len != context_seq_len_ || groups != context_groups_ ||
      generic_ops_ != context_.generic_ops || context_.rope.cos.device() != device ||
      context_.rope.cos.scalar_type() != dtype || seams_.version() != context_version_) {
    // Computed in fp32, then held in the compute dtype so that no op mixes dtypes; for the
    // tokens the sequence seam gives this rank.
    const auto options = at::TensorOptions().dtype(at::kFloat).device(device);
    context_.rope =
        MakeRotaryTables(inv_freq_.to(device),
                         seams_.Positions(seq_len, device, [&](int64_t seq_len, const at::Device&) {
                           return torch::arange(seq_len, options);
                         }));
    context_.rope.cos = context_.rope.cos.to(dtype);
    context_.rope.sin = context_.rope.sin.to(dtype);
    context_.mask = at::Tensor();
    // Where a layer computes the attention itself, the mask may never be read (at long
    // lengths, a large one): the model's own attention builds it if it is called.
    if (!seams_.Changed(wrap::Seam::kAttention) &&
        internal::CausalAttentionReadsMask(dtype, device.type(), generic_ops_)) {
      context_.mask = CausalMask(seq_len, groups, dtype, device);
    }
    context_.generic_ops = generic_ops_;
    context_.seams = &seams_;
    context_seq_len_ = seq_len;
    context_groups_ = groups;
    context_version_ = seams_.version();
  }
  return context_;
}

void CausalLM::KeepExperts(int64_t first, int64_t count) {
  for (const auto& layer : model_->layers) {
    if (layer->moe != nullptr) layer->moe->KeepExperts(first, count);
  }
}

at::Tensor CausalLM::OutputWeight() {
  return config_.tie_word_embeddings() ? model_->embed_tokens->weight : lm_head_->weight;
}

at::Tensor CausalLM::Forward(const at::Tensor& tokens, const at::Tensor& positions) {
  TORCH_CHECK(HoldsOutputLayers(), "CausalLM::Forward: this pipeline stage (blocks ", StageBegin(),
              "..", StageEnd() - 1, ") does not hold the output layers; it computes StageOutput");
  return Run(tokens, positions, /*to_logits=*/true);
}

at::Tensor CausalLM::StageOutput(const at::Tensor& tokens, const at::Tensor& positions) {
  TORCH_CHECK(!HoldsOutputLayers(), "CausalLM::StageOutput: the model holds the output layers (",
              "blocks ", StageBegin(), "..", StageEnd() - 1, "); it computes Forward or Loss");
  return Run(tokens, positions, /*to_logits=*/false);
}

absl::StatusOr<at::Tensor> CausalLM::StageForward(
    const at::Tensor& stage_input, const at::Tensor& tokens, const at::Tensor& positions,
    const std::function<absl::StatusOr<at::Tensor>()>& with_output_layers) {
  if (stage_input.defined()) SetStageInput(stage_input);
  if (!HoldsOutputLayers()) return StageOutput(tokens, positions);
  return with_output_layers();
}

std::string CausalLM::DecodeRefusal() const {
  if (!HoldsInputLayers() || !HoldsOutputLayers()) {
    return "the model is cut into pipeline stages";
  }
  return seams_.DecodeRefusal();
}

at::Tensor CausalLM::Decode(const at::Tensor& tokens, KvCache& cache, int64_t logits_to_keep) {
  const std::string refusal = DecodeRefusal();
  TORCH_CHECK(refusal.empty(), "CausalLM::Decode: ", refusal, ": such a model does not decode");
  TORCH_CHECK(tokens.dim() == 2 && tokens.size(0) == cache.rows(), "CausalLM::Decode: tokens ",
              tokens.sizes(), " are not [", cache.rows(), ", T] for the cache's rows");
  TORCH_CHECK(logits_to_keep >= 0 && logits_to_keep <= tokens.size(1),
              "CausalLM::Decode: logits_to_keep ", logits_to_keep, " is not in [0, ",
              tokens.size(1), "]");
  const wrap::DecodingProducts decoding;
  at::Tensor logits =
      seams_.WholeLogits(Run(tokens, at::Tensor(), /*to_logits=*/true, &cache, logits_to_keep));
  cache.Advance(tokens.size(1));
  return logits;
}

at::Tensor CausalLM::Run(const at::Tensor& tokens, const at::Tensor& positions, bool to_logits,
                         KvCache* cache, int64_t logits_to_keep) {
  at::Tensor h;
  if (!HoldsInputLayers()) {
    TORCH_CHECK(stage_input_.defined(), "CausalLM: this pipeline stage (blocks ", StageBegin(),
                "..", StageEnd() - 1, ") has no input: SetStageInput first");
    TORCH_CHECK(stage_input_.dim() == 3 && stage_input_.size(0) == tokens.size(0),
                "CausalLM: the stage input ", stage_input_.sizes(),
                " is not [B, T, hidden] for tokens ", tokens.sizes());
    h = std::exchange(stage_input_, at::Tensor());
  }
  const auto before = [this](int unit) {
    if (hooks_.before_forward) hooks_.before_forward(unit);
  };
  const auto after = [this](int unit, at::Tensor output) {
    return hooks_.after_forward ? hooks_.after_forward(unit, std::move(output)) : output;
  };
  before(kRootUnit);
  // The compute dtype: the embedding's (gathered by now, under FSDP) or the received input's.
  // Decoding reads the rotary tables of every position the cache may reach.
  const at::ScalarType dtype =
      h.defined() ? h.scalar_type() : model_->embed_tokens->weight.scalar_type();
  const ForwardContext& cached =
      Context(cache != nullptr ? cache->capacity() : tokens.size(1), tokens.device(), dtype);
  // This forward's own copy (context_ keeps only what depends on the length): the rotary
  // tables of packed rows and of decoded tokens, each row's gathered by its positions, and
  // where the layers record their routing.
  ForwardContext context = cached;
  const auto rotate_at = [&](const at::Tensor& at) {
    const at::Tensor rows = at.flatten();
    const std::vector<int64_t> shape = {tokens.size(0), tokens.size(1), cached.rope.cos.size(1)};
    context.rope.cos = cached.rope.cos.index_select(0, rows).view(shape);
    context.rope.sin = cached.rope.sin.index_select(0, rows).view(shape);
  };
  if (cache != nullptr) {
    rotate_at(cache->Positions(tokens.size(1), tokens.device()));
    context.cache = cache;
    context.cache_mask = cache->Mask(tokens.size(1), dtype, tokens.device());
  } else if (positions.defined()) {
    TORCH_CHECK(!seams_.Changed(wrap::Seam::kSequence),
                "CausalLM: packed rows (positions) where ranks compute parts of each sequence are "
                "not supported");
    TORCH_CHECK(positions.sizes() == tokens.sizes(), "CausalLM::Forward: positions ",
                positions.sizes(), " are not shaped as tokens ", tokens.sizes());
    context.positions = positions.to(tokens.device(), at::kLong);
    rotate_at(context.positions);
  }
  if (config_.num_experts() > 0) {
    last_routing_ = c10::make_intrusive<RouterStatistics>(config_.num_experts(),
                                                          config_.router_aux_loss_coef());
    context.router = last_routing_;
  }
  if (!h.defined()) {
    h = seams_.Embed(seams_.OwnPart(tokens), model_->embed_tokens->weight,
                     [](const at::Tensor& tokens, const at::Tensor& weight) {
                       return at::embedding(weight, tokens);
                     });
  }
  for (size_t i = 0; i < model_->layers.size(); ++i) {
    const int64_t index = model_->layer_indices[i];
    if (index < StageBegin() || index >= StageEnd()) continue;  // another stage's
    const int unit = static_cast<int>(i);
    before(unit);
    // A layer of the block seam may run the block again in backward, after this forward has
    // returned and maybe after another forward has changed context_: the forward holds its own.
    h = seams_.Block(unit, h, [layer = model_->layers[i], context](const at::Tensor& x) {
      return layer->forward(x, context);
    });
    h = after(unit, std::move(h));
  }
  if (!to_logits) return after(kRootUnit, std::move(h));
  h = model_->norm->forward(h, context.generic_ops);
  h = seams_.ColumnInput(h);  // the output projection's rows are the vocabulary's
  if (logits_to_keep > 0) h = h.narrow(1, h.size(1) - logits_to_keep, logits_to_keep);
  return after(kRootUnit, wrap::LinearProduct(h, OutputWeight(), at::Tensor()));
}

at::Tensor CausalLM::TokenLosses(const at::Tensor& tokens, const at::Tensor& targets,
                                 int64_t ignore_index, const at::Tensor& positions) {
  // fp32 (for 16-bit logits too) and computed a chunk of rows at a time, whatever the path
  // (a layer of the token-loss seam: from logits whose vocabulary is split over ranks).
  const at::Tensor logits = Forward(tokens, positions);
  const at::Tensor own = OwnTargets(targets);
  return seams_
      .TokenLosses(logits.view({-1, logits.size(-1)}), own.reshape({-1}), ignore_index,
                   [](const at::Tensor& logits, const at::Tensor& targets, int64_t ignore_index) {
                     return internal::TokenCrossEntropy(logits, targets, ignore_index);
                   })
      .view(own.sizes());
}

at::Tensor CausalLM::OwnTargets(const at::Tensor& targets) { return seams_.OwnPart(targets); }

at::Tensor CausalLM::Loss(const at::Tensor& tokens, const at::Tensor& targets, int64_t ignore_index,
                          const at::Tensor& positions) {
  if (seams_.Changed(wrap::Seam::kTokenLoss)) {
    // The token losses are 0 where the target is ignored: with none scored, 0 / 1.
    const at::Tensor scored =
        (OwnTargets(targets) != ignore_index).sum().clamp_min(1).to(at::kFloat);
    return TokenLosses(tokens, targets, ignore_index, positions).sum() / scored;
  }
  // 16-bit logits are scored in fp32, as Hugging Face's models do (the loss of a 32K-way
  // softmax needs more than bf16's 8 bits of mantissa), a chunk of rows at a time
  // (internal::TokenCrossEntropy): no fp32 copy of the whole logits.
  const at::Tensor logits = Forward(tokens, positions);
  const at::Tensor own = OwnTargets(targets);
  const at::Tensor mean = internal::CrossEntropy(logits.view({-1, logits.size(-1)}),
                                                 own.reshape({-1}), ignore_index, generic_ops_);
  // With nothing scored the mean is NaN, but its backward writes only the scored rows: the
  // zero gradient `where` hands it gives zero logit gradients. Where something is scored,
  // `where` passes the mean and its gradient through bit for bit.
  return at::where((own != ignore_index).any(), mean, torch::zeros_like(mean));
}

at::Tensor CausalLM::TokenLogProbs(const at::Tensor& tokens, const at::Tensor& targets,
                                   int64_t ignore_index, const at::Tensor& positions) {
  return -TokenLosses(tokens, targets, ignore_index, positions);
}

at::Tensor CausalLM::SequenceLogProbs(const at::Tensor& tokens, const at::Tensor& targets,
                                      int64_t ignore_index) {
  const at::Tensor sums = TokenLogProbs(tokens, targets, ignore_index).sum(-1);
  return seams_.SumOverParts(sums);
}

wrap::Wrappable::Split CausalLM::SplitOf(const std::string& name) const {
  if (const auto split = seams_.AddedParameterSplit(name)) return *split;
  return ParameterSplitOf(name);
}

std::vector<wrap::Wrappable::Unit> CausalLM::Blocks() {
  std::vector<Unit> blocks;
  for (size_t i = 0; i < model_->layers.size(); ++i) {
    const int64_t index = model_->layer_indices[i];
    int stage = 0;
    while (stages_[stage].second <= index) ++stage;
    blocks.push_back({absl::StrCat("model.layers.", index), model_->layers[i], stage});
  }
  return blocks;
}

std::vector<wrap::Wrappable::NamedParameter> CausalLM::RootParameters() {
  std::vector<NamedParameter> root;
  for (const auto& item : named_parameters()) {
    if (!absl::StartsWith(item.key(), "model.layers.")) root.push_back({item.key(), item.value()});
  }
  return root;
}

std::vector<wrap::Wrappable::NamedParameter> CausalLM::NamedParameters() {
  std::vector<NamedParameter> all;
  for (const auto& item : named_parameters()) all.push_back({item.key(), item.value()});
  return all;
}

absl::Status CausalLM::KeepStages(const std::vector<std::pair<int64_t, int64_t>>& stages) {
  const int64_t blocks = config_.num_hidden_layers();
  const auto named = [](const std::vector<std::pair<int64_t, int64_t>>& ranges) {
    return absl::StrCat("KeepStages(",
                        absl::StrJoin(ranges, ", ",
                                      [](std::string* out, const auto& range) {
                                        absl::StrAppend(out, "[", range.first, ", ", range.second,
                                                        ")");
                                      }),
                        ")");
  };
  if (stages_.size() != 1 || stages_[0] != std::make_pair(int64_t{0}, blocks)) {
    return absl::FailedPreconditionError(absl::StrCat(
        named(stages), ": the model was already cut to ", named(stages_), "; a model is cut once"));
  }
  if (stages.empty()) {
    return absl::InvalidArgumentError("KeepStages(): a model keeps at least one stage");
  }
  int64_t previous_end = 0;
  for (const auto& [begin, end] : stages) {
    if (begin < previous_end || begin >= end || end > blocks) {
      return absl::InvalidArgumentError(
          absl::StrCat(named(stages), ": each stage holds blocks [begin, end) of the ", blocks,
                       ", at least one, after the stage before"));
    }
    previous_end = end;
  }
  const bool output = stages.back().second == blocks;
  model_->KeepStages(
      stages,
      /*keep_embedding=*/stages.front().first == 0 || (output && config_.tie_word_embeddings()),
      /*keep_norm=*/output);
  if (!output && lm_head_) {
    unregister_module("lm_head");
    lm_head_ = nullptr;
  }
  stages_ = stages;
  selected_stage_ = 0;
  return absl::OkStatus();
}

absl::Status CausalLM::SelectStage(int index) {
  if (index < 0 || index >= static_cast<int>(stages_.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("SelectStage(", index, "): the model holds ", stages_.size(), " stage(s)"));
  }
  selected_stage_ = index;
  return absl::OkStatus();
}

void internal::UseGenericOps(CausalLM& model, bool generic) { model.generic_ops_ = generic; }

int64_t internal::SeededDraws() { return seeded_draws.load(std::memory_order_relaxed); }

absl::Status CausalLM::SetLocalHeads(int64_t num_heads, int64_t num_kv_heads) {
  const int64_t shards = num_heads > 0 && NumHeads() % num_heads == 0 ? NumHeads() / num_heads : 0;
  // With more shards than kv heads, each shard holds one kv head, shared with others.
  const bool kv_ok = shards > 0 && (NumKeyValueHeads() % shards == 0
                                        ? num_kv_heads == NumKeyValueHeads() / shards
                                        : shards % NumKeyValueHeads() == 0 && num_kv_heads == 1);
  if (!kv_ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SetLocalHeads(", num_heads, ", ", num_kv_heads, "): the model has ", NumHeads(),
        " heads and ", NumKeyValueHeads(),
        " kv heads; local counts must be the global ones divided by the same shard count (kv "
        "heads: 1 when the shard count is a multiple of them)"));
  }
  for (const std::shared_ptr<DecoderLayer>& layer : model_->layers) {
    PLAIT_RETURN_IF_ERROR(layer->self_attn->SetLocalHeads(num_heads, num_kv_heads));
  }
  return absl::OkStatus();
}

}  // namespace plait::models
