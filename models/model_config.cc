#include "models/model_config.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/file.h"
#include "base/json.h"
#include "base/status.h"
#include "nlohmann/json.hpp"

namespace plait::models {
namespace {

// Hugging Face's defaults for fields a config.json may leave out (LlamaConfig, Qwen2Config).
constexpr double kHfLlamaRmsNormEps = 1e-6;
constexpr double kHfRopeTheta = 10000.0;
constexpr int64_t kHfLlamaMaxPositions = 2048;
constexpr int64_t kHfQwen2MaxPositions = 32768;  // Qwen3's too
// Qwen2Config's and Qwen3Config's num_key_value_heads: a number, not the attention heads
// (LlamaConfig's and Qwen3MoeConfig's), which a config.json leaving it out gets.
constexpr int64_t kHfQwen2KeyValueHeads = 32;
// Qwen3Config's head_dim, not hidden_size / num_attention_heads.
constexpr int64_t kHfQwen3HeadDim = 128;
// MixtralConfig's.
constexpr double kHfMixtralRmsNormEps = 1e-5;
constexpr double kHfMixtralRopeTheta = 1000000.0;
constexpr int64_t kHfMixtralMaxPositions = 131072;
constexpr int64_t kHfMixtralKeyValueHeads = 8;

ModelConfig Llama(int64_t hidden, int64_t intermediate, int64_t layers, int64_t heads,
                  int64_t kv_heads, int64_t vocab, bool tie) {
  ModelConfig config;
  config.set_model_type("llama");
  config.set_hidden_size(hidden);
  config.set_intermediate_size(intermediate);
  config.set_num_hidden_layers(layers);
  config.set_num_attention_heads(heads);
  config.set_num_key_value_heads(kv_heads);
  config.set_rms_norm_eps(1e-5);
  config.set_rope_theta(500000.0);
  config.set_vocab_size(vocab);
  config.set_max_position_embeddings(131072);
  config.set_tie_word_embeddings(tie);
  return config;
}

void SetLlama3RopeScaling(double factor, ModelConfig& config) {
  RopeScaling* scaling = config.mutable_rope_scaling();
  scaling->set_rope_type("llama3");
  scaling->set_factor(factor);
  scaling->set_low_freq_factor(1.0);
  scaling->set_high_freq_factor(4.0);
  scaling->set_original_max_position_embeddings(8192);
}

ModelConfig Qwen2(int64_t hidden, int64_t intermediate, int64_t layers, int64_t heads,
                  int64_t kv_heads, int64_t vocab, bool tie) {
  ModelConfig config = Llama(hidden, intermediate, layers, heads, kv_heads, vocab, tie);
  config.set_model_type("qwen2");
  config.set_rms_norm_eps(1e-6);
  config.set_rope_theta(1000000.0);
  config.set_max_position_embeddings(32768);
  return config;
}

// Qwen3 as its Hugging Face configs have it: Qwen2's norms and rotary base, 40,960 positions,
// no biases, and heads of `head_dim`.
ModelConfig Qwen3(int64_t hidden, int64_t intermediate, int64_t layers, int64_t heads,
                  int64_t kv_heads, int64_t head_dim, int64_t vocab, bool tie) {
  ModelConfig config = Qwen2(hidden, intermediate, layers, heads, kv_heads, vocab, tie);
  config.set_model_type("qwen3");
  if (head_dim * heads != hidden) config.set_head_dim(head_dim);  // unset where it is the default
  config.set_max_position_embeddings(40960);
  return config;
}

// Qwen3-MoE as its Hugging Face configs have it: Qwen3's attention, every layer a mixture of
// `experts` experts of width `expert_width`, `per_token` of them a token, renormalised over
// the chosen, and the load-balancing loss at 0.001; `intermediate` is the width of the dense
// MLP a layer in mlp_only_layers would have.
ModelConfig Qwen3Moe(int64_t hidden, int64_t intermediate, int64_t layers, int64_t heads,
                     int64_t kv_heads, int64_t head_dim, int64_t vocab, bool tie, int64_t experts,
                     int64_t per_token, int64_t expert_width) {
  ModelConfig config = Qwen3(hidden, intermediate, layers, heads, kv_heads, head_dim, vocab, tie);
  config.set_model_type("qwen3_moe");
  config.set_num_experts(experts);
  config.set_num_experts_per_tok(per_token);
  config.set_moe_intermediate_size(expert_width);
  config.set_norm_topk_prob(true);
  config.set_decoder_sparse_step(1);
  config.set_router_aux_loss_coef(0.001);
  return config;
}

// Mixtral as its Hugging Face configs have it: Llama's attention with a rotary base of 1e6
// over 32,768 positions, every layer a mixture of `experts` experts of intermediate_size, 2 a
// token, always renormalised over the chosen, and the load-balancing loss at 0.001.
ModelConfig Mixtral(int64_t hidden, int64_t intermediate, int64_t layers, int64_t heads,
                    int64_t kv_heads, int64_t vocab, int64_t experts) {
  ModelConfig config = Llama(hidden, intermediate, layers, heads, kv_heads, vocab, false);
  config.set_model_type("mixtral");
  config.set_rope_theta(1000000.0);
  config.set_max_position_embeddings(32768);
  config.set_num_experts(experts);
  config.set_num_experts_per_tok(2);
  config.set_moe_intermediate_size(intermediate);
  config.set_norm_topk_prob(true);
  config.set_decoder_sparse_step(1);
  config.set_router_aux_loss_coef(0.001);
  return config;
}

constexpr absl::string_view kSupportedModelTypes =
    "\"llama\", \"qwen2\", \"qwen3\", \"qwen3_moe\" or \"mixtral\"";

bool IsSupportedModelType(absl::string_view type) {
  return type == "llama" || type == "qwen2" || type == "qwen3" || IsMixtureOfExperts(type);
}

struct Preset {
  const char* name;
  ModelConfig (*make)();
};

// Shapes from the published config.json of each model.
const Preset kPresets[] = {
    {"tiny",
     [] {
       ModelConfig config = Llama(256, 688, 4, 4, 2, 4096, false);
       config.set_rope_theta(10000.0);
       config.set_max_position_embeddings(2048);
       return config;
     }},
    {"llama3.2-1b",
     [] {
       ModelConfig config = Llama(2048, 8192, 16, 32, 8, 128256, true);
       SetLlama3RopeScaling(32.0, config);
       return config;
     }},
    {"llama3.1-8b",
     [] {
       ModelConfig config = Llama(4096, 14336, 32, 32, 8, 128256, false);
       SetLlama3RopeScaling(8.0, config);
       return config;
     }},
    {"llama3.1-70b",
     [] {
       ModelConfig config = Llama(8192, 28672, 80, 64, 8, 128256, false);
       SetLlama3RopeScaling(8.0, config);
       return config;
     }},
    // Qwen2.5-0.5B's shape (tied embeddings, q/k/v biases, 7:1 query to key/value heads,
    // intermediate 5.4x hidden) scaled down to train in seconds on a CPU.
    {"qwen2-tiny", [] { return Qwen2(112, 608, 4, 7, 1, 4096, true); }},
    // Heads wider than hidden_size / num_attention_heads, as Qwen3's are.
    {"qwen3-tiny", [] { return Qwen3(128, 384, 4, 4, 2, 64, 4096, true); }},
    {"qwen3-0.6b", [] { return Qwen3(1024, 3072, 28, 16, 8, 128, 151936, true); }},
    {"qwen3-8b", [] { return Qwen3(4096, 12288, 36, 32, 8, 128, 151936, false); }},
    {"qwen3-moe-tiny", [] { return Qwen3Moe(128, 384, 4, 4, 2, 64, 4096, true, 8, 2, 128); }},
    {"qwen3-30b-a3b",
     [] { return Qwen3Moe(2048, 6144, 48, 32, 4, 128, 151936, false, 128, 8, 768); }},
    // Mixtral's layout (8 experts, 2 a token, untied) at the tiny Llama's size.
    {"mixtral-tiny",
     [] {
       ModelConfig config = Mixtral(128, 256, 4, 4, 2, 4096, 8);
       config.set_max_position_embeddings(2048);
       return config;
     }},
    {"mixtral-8x7b",
     [] {
       ModelConfig config = Mixtral(4096, 14336, 32, 32, 8, 32000, 8);
       config.set_router_aux_loss_coef(0.02);
       return config;
     }},
    {"qwen2.5-0.5b", [] { return Qwen2(896, 4864, 24, 14, 2, 151936, true); }},
    {"qwen2.5-7b", [] { return Qwen2(3584, 18944, 28, 28, 4, 152064, false); }},
};

absl::Status FieldError(absl::string_view path, absl::string_view field,
                        absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(path, ".", field, ": ", problem));
}

// Positive and finite: an infinite epsilon, theta, factor or init std makes the model NaN.
absl::Status Positive(absl::string_view path, absl::string_view field, double value) {
  if (!(value > 0)) return FieldError(path, field, absl::StrCat(value, " must be > 0"));  // NaN too
  if (!std::isfinite(value)) return FieldError(path, field, absl::StrCat(value, " must be finite"));
  return absl::OkStatus();
}

// A size in [1, limit].
absl::Status Size(absl::string_view path, absl::string_view field, int64_t value, int64_t limit) {
  if (value < 1) return FieldError(path, field, absl::StrCat(value, " must be > 0"));
  if (value > limit) return FieldError(path, field, absl::StrCat(value, " must be <= ", limit));
  return absl::OkStatus();
}

absl::Status ValidateRopeScaling(const RopeScaling& scaling, absl::string_view path) {
  if (scaling.rope_type() != "llama3") {
    return FieldError(path, "rope_type",
                      absl::StrCat("\"", scaling.rope_type(),
                                   "\" is not supported; the only supported type is \"llama3\""));
  }
  PLAIT_RETURN_IF_ERROR(Positive(path, "factor", scaling.factor()));
  PLAIT_RETURN_IF_ERROR(Positive(path, "low_freq_factor", scaling.low_freq_factor()));
  if (!(scaling.high_freq_factor() > scaling.low_freq_factor())) {
    return FieldError(path, "high_freq_factor",
                      absl::StrCat(scaling.high_freq_factor(), " must be > low_freq_factor (",
                                   scaling.low_freq_factor(), ")"));
  }
  PLAIT_RETURN_IF_ERROR(Positive(path, "high_freq_factor", scaling.high_freq_factor()));
  return Size(path, "original_max_position_embeddings", scaling.original_max_position_embeddings(),
              kMaxVocabOrPositions);
}

// ---- config.json ----

using Json = nlohmann::json;

// Reads the rotary embedding's type and scaling from `json`, the object config.json names
// `field` (rope_scaling or rope_parameters). A missing type is "default", as in transformers.
absl::Status ParseRopeScaling(const Json& json, const std::string& source, const char* field,
                              RopeScaling& scaling) {
  const base::JsonFields fields(json, absl::StrCat(source, ": ", field));
  // Older checkpoints name the type "type"; HF reads either.
  const char* type_field = fields.Has("rope_type") ? "rope_type" : "type";
  PLAIT_ASSIGN_OR_RETURN(std::string type, fields.String(type_field, "default"));
  scaling.set_rope_type(type);
  if (type != "llama3") return absl::OkStatus();  // rejected by validation, naming the type
  PLAIT_ASSIGN_OR_RETURN(double factor, fields.Double("factor"));
  PLAIT_ASSIGN_OR_RETURN(double low, fields.Double("low_freq_factor"));
  PLAIT_ASSIGN_OR_RETURN(double high, fields.Double("high_freq_factor"));
  PLAIT_ASSIGN_OR_RETURN(int64_t original, fields.Int("original_max_position_embeddings"));
  scaling.set_factor(factor);
  scaling.set_low_freq_factor(low);
  scaling.set_high_freq_factor(high);
  scaling.set_original_max_position_embeddings(original);
  return absl::OkStatus();
}

// The config.json field that describes the rotary embedding, or null when none does.
// transformers >= 5 writes `rope_parameters` (the type, the scaling fields and rope_theta in
// one object); older versions write `rope_scaling` (null without scaling) and a top-level
// `rope_theta`. transformers reads a non-empty rope_scaling first, then rope_parameters.
absl::StatusOr<const char*> RopeField(const Json& json, const std::string& source) {
  for (const char* field : {"rope_scaling", "rope_parameters"}) {
    auto it = json.find(field);
    if (it == json.end() || it->is_null()) continue;
    if (!it->is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": ", field, ": expected an object or null, got ", base::DescribeJson(*it)));
    }
    if (!it->empty()) return field;
  }
  return nullptr;
}

// The mixture-of-experts fields: set, within bounds, for qwen3_moe and mixtral (whose layers
// are all mixtures of experts of intermediate_size, renormalised); unset for the others.
absl::Status ValidateExperts(const ModelConfig& config, absl::string_view path) {
  if (!IsMixtureOfExperts(config.model_type())) {
    if (config.num_experts() != 0 || config.num_experts_per_tok() != 0 ||
        config.moe_intermediate_size() != 0 || config.decoder_sparse_step() != 0 ||
        config.mlp_only_layers_size() != 0 || config.router_aux_loss_coef() != 0.0 ||
        config.norm_topk_prob()) {
      return FieldError(path, "num_experts",
                        absl::StrCat("the mixture-of-experts fields are for qwen3_moe and "
                                     "mixtral, not ",
                                     config.model_type(), "; leave them unset"));
    }
    return absl::OkStatus();
  }
  if (config.model_type() == "mixtral") {
    if (config.moe_intermediate_size() != config.intermediate_size()) {
      return FieldError(path, "moe_intermediate_size",
                        absl::StrCat(config.moe_intermediate_size(),
                                     ": mixtral's experts are intermediate_size (",
                                     config.intermediate_size(), ") wide; set it to that"));
    }
    if (!config.norm_topk_prob()) {
      return FieldError(path, "norm_topk_prob",
                        "is false; mixtral always renormalises over the chosen experts");
    }
    if (config.decoder_sparse_step() > 1 || config.mlp_only_layers_size() != 0) {
      return FieldError(path, "decoder_sparse_step",
                        "mixtral's layers are all mixtures of experts; leave decoder_sparse_step "
                        "and mlp_only_layers unset");
    }
  }
  PLAIT_RETURN_IF_ERROR(Size(path, "num_experts", config.num_experts(), kMaxWidth));
  PLAIT_RETURN_IF_ERROR(
      Size(path, "num_experts_per_tok", config.num_experts_per_tok(), config.num_experts()));
  PLAIT_RETURN_IF_ERROR(
      Size(path, "moe_intermediate_size", config.moe_intermediate_size(), kMaxWidth));
  if (config.decoder_sparse_step() < 0) {
    return FieldError(path, "decoder_sparse_step",
                      absl::StrCat(config.decoder_sparse_step(), " must be >= 0 (0: 1)"));
  }
  for (const int64_t layer : config.mlp_only_layers()) {
    if (layer < 0 || layer >= config.num_hidden_layers()) {
      return FieldError(
          path, "mlp_only_layers",
          absl::StrCat(layer, " is not a layer of the ", config.num_hidden_layers(), " (0-based)"));
    }
  }
  if (!(config.router_aux_loss_coef() >= 0.0) || !std::isfinite(config.router_aux_loss_coef())) {
    return FieldError(path, "router_aux_loss_coef",
                      absl::StrCat(config.router_aux_loss_coef(), " must be finite and >= 0"));
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<std::string> PresetNames() {
  std::vector<std::string> names;
  for (const Preset& preset : kPresets) names.push_back(preset.name);
  return names;
}

absl::StatusOr<ModelConfig> PresetConfig(absl::string_view name) {
  for (const Preset& preset : kPresets) {
    if (name == preset.name) return preset.make();
  }
  return absl::NotFoundError(absl::StrCat(
      "unknown model preset \"", name, "\"; known presets: ", absl::StrJoin(PresetNames(), ", ")));
}

bool IsMixtureOfExperts(absl::string_view model_type) {
  return model_type == "qwen3_moe" || model_type == "mixtral";
}

const MoeModuleNames& MoeModuleNamesOf(const ModelConfig& config) {
  static const MoeModuleNames kQwen3Moe{"mlp", kMlpProjectionNames};
  static const MoeModuleNames kMixtral{"block_sparse_moe", {"w1", "w3", "w2"}};
  return config.model_type() == "mixtral" ? kMixtral : kQwen3Moe;
}

bool IsMoeLayer(const ModelConfig& config, int64_t layer) {
  if (config.num_experts() <= 0) return false;
  for (const int64_t dense : config.mlp_only_layers()) {
    if (dense == layer) return false;
  }
  const int64_t step = std::max<int64_t>(1, config.decoder_sparse_step());
  return (layer + 1) % step == 0;
}

absl::Status ValidateModelConfig(const ModelConfig& config, absl::string_view field_path) {
  const absl::string_view path = field_path;
  const std::string& type = config.model_type();
  if (!IsSupportedModelType(type)) {
    return FieldError(path, "model_type",
                      absl::StrCat("\"", type, "\" is not supported; use ", kSupportedModelTypes));
  }
  PLAIT_RETURN_IF_ERROR(Size(path, "hidden_size", config.hidden_size(), kMaxWidth));
  PLAIT_RETURN_IF_ERROR(Size(path, "intermediate_size", config.intermediate_size(), kMaxWidth));
  PLAIT_RETURN_IF_ERROR(
      Size(path, "num_hidden_layers", config.num_hidden_layers(), kMaxHiddenLayers));
  PLAIT_RETURN_IF_ERROR(Size(path, "num_attention_heads", config.num_attention_heads(), kMaxWidth));
  PLAIT_RETURN_IF_ERROR(Size(path, "num_key_value_heads", config.num_key_value_heads(), kMaxWidth));
  PLAIT_RETURN_IF_ERROR(Size(path, "vocab_size", config.vocab_size(), kMaxVocabOrPositions));
  PLAIT_RETURN_IF_ERROR(Size(path, "max_position_embeddings", config.max_position_embeddings(),
                             kMaxVocabOrPositions));
  PLAIT_RETURN_IF_ERROR(Positive(path, "rms_norm_eps", config.rms_norm_eps()));
  PLAIT_RETURN_IF_ERROR(Positive(path, "rope_theta", config.rope_theta()));
  if (config.head_dim() != 0) {
    PLAIT_RETURN_IF_ERROR(Size(path, "head_dim", config.head_dim(), kMaxWidth));
  } else if (config.hidden_size() % config.num_attention_heads() != 0) {
    return FieldError(path, "num_attention_heads",
                      absl::StrCat(config.num_attention_heads(), " does not divide hidden_size (",
                                   config.hidden_size(), ") and head_dim is unset"));
  }
  if (config.num_attention_heads() % config.num_key_value_heads() != 0) {
    return FieldError(
        path, "num_key_value_heads",
        absl::StrCat(config.num_key_value_heads(), " does not divide num_attention_heads (",
                     config.num_attention_heads(), ")"));
  }
  if (HeadDim(config) % 2 != 0) {
    return FieldError(
        path, config.head_dim() != 0 ? "head_dim" : "num_attention_heads",
        absl::StrCat("head dimension ", HeadDim(config), " must be even for rotary embeddings"));
  }
  if (type == "qwen2" && config.attention_bias()) {
    return FieldError(path, "attention_bias",
                      "qwen2 always has q/k/v biases and none on o_proj; leave it unset");
  }
  if (config.has_rope_scaling()) {
    PLAIT_RETURN_IF_ERROR(
        ValidateRopeScaling(config.rope_scaling(), absl::StrCat(path, ".rope_scaling")));
  }
  return ValidateExperts(config, path);
}

absl::Status ValidateInitConfig(const InitConfig& config, absl::string_view field_path) {
  if (config.has_std()) return Positive(field_path, "std", config.std());
  return absl::OkStatus();
}

absl::StatusOr<ModelConfig> ResolveModelSpec(const ModelSpec& spec, absl::string_view field_path) {
  PLAIT_RETURN_IF_ERROR(ValidateInitConfig(spec.init(), absl::StrCat(field_path, ".init")));
  switch (spec.architecture_case()) {
    case ModelSpec::kPreset: {
      absl::StatusOr<ModelConfig> config = PresetConfig(spec.preset());
      if (!config.ok()) {
        // An unknown preset is a bad plan field here, not a missing thing.
        return absl::InvalidArgumentError(
            absl::StrCat(field_path, ".preset: ", config.status().message()));
      }
      return config;
    }
    case ModelSpec::kConfig:
      PLAIT_RETURN_IF_ERROR(
          ValidateModelConfig(spec.config(), absl::StrCat(field_path, ".config")));
      return spec.config();
    case ModelSpec::kHfConfigPath: {
      return base::Annotate(ReadHfConfig(spec.hf_config_path()),
                            absl::StrCat(field_path, ".hf_config_path"));
    }
    case ModelSpec::ARCHITECTURE_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(field_path, ": set one of preset, config or hf_config_path"));
}

namespace {

// The expert count of a config.json, `fallback` (the config class's default) when it gives
// none. transformers' Qwen3MoeConfig and MixtralConfig read num_experts and num_local_experts
// as one attribute (attribute_map), and transformers 5 writes it as num_local_experts; given
// both, the one the class does not declare overwrites the other (Mixtral takes num_experts,
// Qwen3-MoE num_local_experts), an accident of its keyword handling, so two different values
// are refused rather than guessed between.
absl::StatusOr<int64_t> ExpertCount(const base::JsonFields& fields, int64_t fallback) {
  if (!fields.Has("num_experts")) return fields.Int("num_local_experts", fallback);
  PLAIT_ASSIGN_OR_RETURN(const int64_t experts, fields.Int("num_experts"));
  PLAIT_ASSIGN_OR_RETURN(const int64_t local_experts, fields.Int("num_local_experts", experts));
  if (local_experts != experts) {
    return fields.Error(
        "num_experts",
        absl::StrCat(experts, " and num_local_experts ", local_experts,
                     " both give the expert count, which transformers reads as one field; "
                     "keep one"));
  }
  return experts;
}

// A qwen3_moe config.json's mixture-of-experts fields, with transformers' Qwen3MoeConfig
// defaults where one is absent.
absl::Status ParseExperts(const Json& json, const base::JsonFields& fields, ModelConfig& config) {
  PLAIT_ASSIGN_OR_RETURN(const int64_t experts, ExpertCount(fields, 128));
  PLAIT_ASSIGN_OR_RETURN(const int64_t per_token, fields.Int("num_experts_per_tok", 8));
  PLAIT_ASSIGN_OR_RETURN(const int64_t width, fields.Int("moe_intermediate_size", 768));
  PLAIT_ASSIGN_OR_RETURN(const bool normalise, fields.Bool("norm_topk_prob", false));
  PLAIT_ASSIGN_OR_RETURN(const int64_t step, fields.Int("decoder_sparse_step", 1));
  // In the plan's ModelConfig 0 means unset (1); here it is the file's value, which
  // transformers' Qwen3MoeDecoderLayer divides by ((layer + 1) % step) and cannot build with.
  if (step < 1) {
    return fields.Error("decoder_sparse_step",
                        absl::StrCat(step,
                                     " must be 1 or more (every decoder_sparse_step-th "
                                     "layer is a mixture of experts)"));
  }
  PLAIT_ASSIGN_OR_RETURN(const double coefficient, fields.Double("router_aux_loss_coef", 0.001));
  config.set_num_experts(experts);
  config.set_num_experts_per_tok(per_token);
  config.set_moe_intermediate_size(width);
  config.set_norm_topk_prob(normalise);
  config.set_decoder_sparse_step(step);
  config.set_router_aux_loss_coef(coefficient);
  if (fields.Has("mlp_only_layers")) {
    const Json& layers = json["mlp_only_layers"];
    if (!layers.is_array()) return fields.Error("mlp_only_layers", "expected a list of layers");
    for (size_t i = 0; i < layers.size(); ++i) {
      PLAIT_ASSIGN_OR_RETURN(const int64_t layer,
                             fields.IntValue(layers[i], absl::StrCat("mlp_only_layers[", i, "]")));
      config.add_mlp_only_layers(layer);
    }
  }
  return absl::OkStatus();
}

// A mixtral config.json's mixture-of-experts fields, with transformers' MixtralConfig defaults
// where one is absent: every layer's experts are intermediate_size wide and renormalised.
absl::Status ParseMixtralExperts(const base::JsonFields& fields, ModelConfig& config) {
  PLAIT_ASSIGN_OR_RETURN(const int64_t experts, ExpertCount(fields, 8));
  PLAIT_ASSIGN_OR_RETURN(const int64_t per_token, fields.Int("num_experts_per_tok", 2));
  PLAIT_ASSIGN_OR_RETURN(const double coefficient, fields.Double("router_aux_loss_coef", 0.001));
  PLAIT_ASSIGN_OR_RETURN(const double jitter, fields.Double("router_jitter_noise", 0.0));
  if (jitter != 0.0) {
    return fields.Error("router_jitter_noise",
                        absl::StrCat(jitter,
                                     " is not supported (a random scaling of the router's "
                                     "input in training); set it to 0"));
  }
  config.set_num_experts(experts);
  config.set_num_experts_per_tok(per_token);
  config.set_moe_intermediate_size(config.intermediate_size());
  config.set_norm_topk_prob(true);
  config.set_decoder_sparse_step(1);
  config.set_router_aux_loss_coef(coefficient);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelConfig> ParseHfConfigJson(absl::string_view text, absl::string_view source) {
  const std::string name(source);
  PLAIT_ASSIGN_OR_RETURN(const Json json, base::ParseJson(name, text));
  if (!json.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": expected a JSON object"));
  }
  const base::JsonFields fields(json, name);
  ModelConfig config;
  PLAIT_ASSIGN_OR_RETURN(std::string type, fields.String("model_type"));
  if (!IsSupportedModelType(type)) {
    return fields.Error(
        "model_type", absl::StrCat("\"", type, "\" is not supported; use ", kSupportedModelTypes));
  }
  const bool qwen2 = type == "qwen2";
  const bool qwen3 = type == "qwen3" || type == "qwen3_moe";
  const bool mixtral = type == "mixtral";
  config.set_model_type(type);
  PLAIT_ASSIGN_OR_RETURN(int64_t hidden, fields.Int("hidden_size"));
  PLAIT_ASSIGN_OR_RETURN(int64_t intermediate, fields.Int("intermediate_size"));
  PLAIT_ASSIGN_OR_RETURN(int64_t layers, fields.Int("num_hidden_layers"));
  PLAIT_ASSIGN_OR_RETURN(int64_t heads, fields.Int("num_attention_heads"));
  const bool dense_qwen3 = type == "qwen3";  // whose defaults differ from Qwen3-MoE's
  const int64_t default_kv_heads = qwen2 || dense_qwen3 ? kHfQwen2KeyValueHeads
                                   : mixtral            ? kHfMixtralKeyValueHeads
                                                        : heads;
  PLAIT_ASSIGN_OR_RETURN(int64_t kv_heads, fields.Int("num_key_value_heads", default_kv_heads));
  PLAIT_ASSIGN_OR_RETURN(int64_t vocab, fields.Int("vocab_size"));
  PLAIT_ASSIGN_OR_RETURN(double eps, fields.Double("rms_norm_eps", mixtral ? kHfMixtralRmsNormEps
                                                                           : kHfLlamaRmsNormEps));
  PLAIT_ASSIGN_OR_RETURN(const char* rope_field, RopeField(json, name));
  // rope_theta inside the rope object wins over the top-level field, as in transformers.
  PLAIT_ASSIGN_OR_RETURN(double theta,
                         fields.Double("rope_theta", mixtral ? kHfMixtralRopeTheta : kHfRopeTheta));
  if (rope_field != nullptr) {
    const base::JsonFields rope_fields(json[rope_field], absl::StrCat(name, ": ", rope_field));
    PLAIT_ASSIGN_OR_RETURN(theta, rope_fields.Double("rope_theta", theta));
  }
  PLAIT_ASSIGN_OR_RETURN(int64_t max_positions,
                         fields.Int("max_position_embeddings", qwen2 || qwen3 ? kHfQwen2MaxPositions
                                                               : mixtral ? kHfMixtralMaxPositions
                                                                         : kHfLlamaMaxPositions));
  PLAIT_ASSIGN_OR_RETURN(bool tie, fields.Bool("tie_word_embeddings", false));
  PLAIT_ASSIGN_OR_RETURN(bool bias, fields.Bool("attention_bias", false));
  PLAIT_ASSIGN_OR_RETURN(std::string activation, fields.String("hidden_act", "silu"));
  if (activation != "silu") {
    return fields.Error("hidden_act", absl::StrCat("\"", activation,
                                                   "\" is not supported; plait's MLP is SwiGLU "
                                                   "(\"silu\")"));
  }
  PLAIT_ASSIGN_OR_RETURN(bool sliding, fields.Bool("use_sliding_window", false));
  if (sliding)
    return fields.Error("use_sliding_window", "sliding-window attention is not supported");
  // Mixtral's (and Mistral's) window, applied whenever it is set.
  if (mixtral && fields.Has("sliding_window")) {
    return fields.Error("sliding_window",
                        "is set, and sliding-window attention is not supported; it must be null");
  }
  // Written by transformers for every model; kept only where it is not hidden / heads.
  int64_t head_dim = 0;
  if (fields.Has("head_dim") || dense_qwen3) {
    PLAIT_ASSIGN_OR_RETURN(head_dim, fields.Int("head_dim", kHfQwen3HeadDim));
    if (heads > 0 && hidden % heads == 0 && head_dim == hidden / heads) head_dim = 0;
  }
  config.set_hidden_size(hidden);
  config.set_intermediate_size(intermediate);
  config.set_num_hidden_layers(layers);
  config.set_num_attention_heads(heads);
  config.set_num_key_value_heads(kv_heads);
  config.set_vocab_size(vocab);
  config.set_rms_norm_eps(eps);
  config.set_rope_theta(theta);
  config.set_max_position_embeddings(max_positions);
  config.set_tie_word_embeddings(tie);
  config.set_head_dim(head_dim);
  // Qwen2's q/k/v biases are implied by its model type; Mixtral has none.
  if (!qwen2 && !mixtral) config.set_attention_bias(bias);
  if (rope_field != nullptr) {
    PLAIT_RETURN_IF_ERROR(
        ParseRopeScaling(json[rope_field], name, rope_field, *config.mutable_rope_scaling()));
    if (config.rope_scaling().rope_type() == "default") config.clear_rope_scaling();
  }
  if (type == "qwen3_moe") PLAIT_RETURN_IF_ERROR(ParseExperts(json, fields, config));
  if (mixtral) PLAIT_RETURN_IF_ERROR(ParseMixtralExperts(fields, config));
  PLAIT_RETURN_IF_ERROR(ValidateModelConfig(config, name));
  return config;
}

absl::StatusOr<ModelConfig> ReadHfConfig(const std::string& path) {
  PLAIT_ASSIGN_OR_RETURN(const std::string text, base::ReadFile(path));
  return ParseHfConfigJson(text, path);
}

std::string ToHfConfigJson(const ModelConfig& config, absl::string_view torch_dtype) {
  const bool qwen2 = config.model_type() == "qwen2";
  Json json;
  const bool mixtral = config.model_type() == "mixtral";
  json["architectures"] = {qwen2                                ? "Qwen2ForCausalLM"
                           : config.model_type() == "qwen3"     ? "Qwen3ForCausalLM"
                           : config.model_type() == "qwen3_moe" ? "Qwen3MoeForCausalLM"
                           : mixtral                            ? "MixtralForCausalLM"
                                                                : "LlamaForCausalLM"};
  json["model_type"] = config.model_type();
  json["hidden_size"] = config.hidden_size();
  json["intermediate_size"] = config.intermediate_size();
  json["num_hidden_layers"] = config.num_hidden_layers();
  json["num_attention_heads"] = config.num_attention_heads();
  json["num_key_value_heads"] = config.num_key_value_heads();
  json["head_dim"] = HeadDim(config);
  json["rms_norm_eps"] = config.rms_norm_eps();
  json["rope_theta"] = config.rope_theta();
  json["vocab_size"] = config.vocab_size();
  json["max_position_embeddings"] = config.max_position_embeddings();
  json["tie_word_embeddings"] = config.tie_word_embeddings();
  json["hidden_act"] = "silu";
  if (!qwen2 && !mixtral) json["attention_bias"] = config.attention_bias();
  if (config.has_rope_scaling()) {
    const RopeScaling& scaling = config.rope_scaling();
    json["rope_scaling"] = {
        {"rope_type", scaling.rope_type()},
        {"factor", scaling.factor()},
        {"low_freq_factor", scaling.low_freq_factor()},
        {"high_freq_factor", scaling.high_freq_factor()},
        {"original_max_position_embeddings", scaling.original_max_position_embeddings()},
    };
  } else {
    json["rope_scaling"] = nullptr;
  }
  if (config.model_type() == "qwen3_moe") {
    json["num_experts"] = config.num_experts();
    json["num_experts_per_tok"] = config.num_experts_per_tok();
    json["moe_intermediate_size"] = config.moe_intermediate_size();
    json["norm_topk_prob"] = config.norm_topk_prob();
    json["decoder_sparse_step"] = std::max<int64_t>(1, config.decoder_sparse_step());
    json["mlp_only_layers"] =
        std::vector<int64_t>(config.mlp_only_layers().begin(), config.mlp_only_layers().end());
    json["router_aux_loss_coef"] = config.router_aux_loss_coef();
  }
  if (mixtral) {
    json["num_local_experts"] = config.num_experts();
    json["num_experts_per_tok"] = config.num_experts_per_tok();
    json["router_aux_loss_coef"] = config.router_aux_loss_coef();
    json["router_jitter_noise"] = 0.0;
    json["sliding_window"] = nullptr;
  }
  json["torch_dtype"] = std::string(torch_dtype);
  return json.dump(2);
}

std::vector<base::PlanFeature> FeaturesOf(const ModelConfig& config, absl::string_view field_path) {
  if (config.num_experts() == 0) return {};
  return {{"mixture_of_experts", std::string(field_path),
           "routes each token to some of its experts, its routers' statistics counting every "
           "row they route, a row's padding too",
           "train a dense model"}};
}

}  // namespace plait::models
