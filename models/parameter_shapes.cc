#include "models/parameter_shapes.h"

#include "absl/strings/str_cat.h"
#include "models/model_config.h"

namespace plait::models {

int64_t ParameterShape::numel() const {
  int64_t count = 1;
  for (const int64_t size : shape) count *= size;
  return count;
}

std::vector<ParameterShape> ParameterShapes(const ModelConfig& config) {
  const int64_t hidden = config.hidden_size();
  const int64_t q_width = config.num_attention_heads() * HeadDim(config);
  const int64_t kv_width = config.num_key_value_heads() * HeadDim(config);
  const int64_t inner = config.intermediate_size();
  const bool qkv_bias = HasQkvBias(config);

  std::vector<ParameterShape> shapes;
  shapes.push_back({"model.embed_tokens.weight", {config.vocab_size(), hidden}});
  for (int64_t i = 0; i < config.num_hidden_layers(); ++i) {
    const std::string layer = absl::StrCat("model.layers.", i, ".");
    auto linear = [&](const std::string& name, int64_t in, int64_t out, bool bias) {
      shapes.push_back({absl::StrCat(layer, name, ".weight"), {out, in}});
      if (bias) shapes.push_back({absl::StrCat(layer, name, ".bias"), {out}});
    };
    shapes.push_back({absl::StrCat(layer, "input_layernorm.weight"), {hidden}});
    linear("self_attn.q_proj", hidden, q_width, qkv_bias);
    linear("self_attn.k_proj", hidden, kv_width, qkv_bias);
    linear("self_attn.v_proj", hidden, kv_width, qkv_bias);
    linear("self_attn.o_proj", q_width, hidden, config.attention_bias());
    if (HasQkNorm(config)) {
      shapes.push_back({absl::StrCat(layer, "self_attn.q_norm.weight"), {HeadDim(config)}});
      shapes.push_back({absl::StrCat(layer, "self_attn.k_norm.weight"), {HeadDim(config)}});
    }
    shapes.push_back({absl::StrCat(layer, "post_attention_layernorm.weight"), {hidden}});
    const auto mlp = [&](const std::string& prefix, int64_t width,
                         const std::array<std::string, 3>& names) {
      linear(prefix + names[0], hidden, width, false);
      linear(prefix + names[1], hidden, width, false);
      linear(prefix + names[2], width, hidden, false);
    };
    if (IsMoeLayer(config, i)) {
      const MoeModuleNames& names = MoeModuleNamesOf(config);
      linear(names.block + ".gate", hidden, config.num_experts(), false);
      for (int64_t e = 0; e < config.num_experts(); ++e) {
        mlp(absl::StrCat(names.block, ".experts.", e, "."), config.moe_intermediate_size(),
            names.projections);
      }
    } else {
      mlp("mlp.", inner, kMlpProjectionNames);
    }
  }
  shapes.push_back({"model.norm.weight", {hidden}});
  if (!config.tie_word_embeddings()) {
    shapes.push_back({"lm_head.weight", {config.vocab_size(), hidden}});
  }
  return shapes;
}

}  // namespace plait::models
