// Checked model configurations (model.proto): named presets with the real Hugging Face
// shapes, validation that names the offending field, and conversion from and to a Hugging
// Face config.json. A config that passes ValidateModelConfig builds a CausalLM without
// surprises:
//
//   absl::StatusOr<ModelConfig> config = ResolveModelSpec(plan.model(), "plan.model");
//   // error: "plan.model.config.num_key_value_heads: 3 does not divide
//   //         num_attention_heads (8)"
//   absl::StatusOr<ModelConfig> hf = ReadHfConfig("/ckpt/llama/config.json");
#ifndef PLAIT_MODELS_MODEL_CONFIG_H_
#define PLAIT_MODELS_MODEL_CONFIG_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/violation.h"
#include "models/model.pb.h"

namespace plait::models {

// The std of the normal initialisation when InitConfig.std is unset (GPT-2's and HF's).
inline constexpr double kDefaultInitStd = 0.02;

// The preset names ResolveModelSpec and PresetConfig accept.
std::vector<std::string> PresetNames();

// The architecture of a named preset; NotFound listing the known names otherwise.
// "tiny" (about 5.0 million parameters) is for tests and the default run; the others are the
// published shapes of Llama 3.2 1B, Llama 3.1 8B, Qwen2.5 0.5B and Qwen2.5 7B.
absl::StatusOr<ModelConfig> PresetConfig(absl::string_view name);

// The largest sizes ValidateModelConfig accepts: far beyond any published decoder (Llama 3.1
// 405B: 126 layers, hidden 16384, intermediate 53248, vocab 128256, 131072 positions), and
// small enough that every shape product and parameter count fits in int64_t
// (2^20 x 2^20 x 7 x 2^10 < 2^63) and that listing the parameters (ParameterShapes) is quick.
inline constexpr int64_t kMaxHiddenLayers = int64_t{1} << 10;
// hidden_size, intermediate_size and the head counts.
inline constexpr int64_t kMaxWidth = int64_t{1} << 20;
// vocab_size and max_position_embeddings.
inline constexpr int64_t kMaxVocabOrPositions = int64_t{1} << 24;

// InvalidArgument naming `field_path.<field>` and its value when a size is not positive or
// is above its limit (above), num_attention_heads does not divide hidden_size (unless head_dim
// is set), num_key_value_heads
// does not divide num_attention_heads, model_type is unknown, rope_scaling is not "llama3" or its
// factors are out of range, rms_norm_eps or rope_theta is not positive and finite, or a qwen2
// config sets attention_bias.
absl::Status ValidateModelConfig(const ModelConfig& config,
                                 absl::string_view field_path = "model_config");

// InvalidArgument naming the field when std is set and not positive and finite.
absl::Status ValidateInitConfig(const InitConfig& config, absl::string_view field_path = "init");

// The checked architecture a spec names (preset, explicit config or config.json path), and
// its init config checked too.
absl::StatusOr<ModelConfig> ResolveModelSpec(const ModelSpec& spec,
                                             absl::string_view field_path = "model");

// Parses the text of a Hugging Face config.json (`source` names it in errors) and validates
// the result. Fields missing from the file take Hugging Face's defaults for the model type;
// model_type, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads and
// vocab_size are required. The rotary embedding is read as transformers reads it: from
// `rope_scaling` and `rope_theta` (before transformers 5) or from `rope_parameters` (which
// transformers 5 writes, rope_theta inside), a non-empty rope_scaling first. Sliding-window
// attention, a head_dim other than hidden_size / num_attention_heads and a hidden_act other
// than "silu" are rejected as unsupported.
absl::StatusOr<ModelConfig> ParseHfConfigJson(absl::string_view text, absl::string_view source);

// Reads and parses a config.json file; errors name the file.
absl::StatusOr<ModelConfig> ReadHfConfig(const std::string& path);

// A Hugging Face config.json for `config` (with "architectures", "model_type", the fields
// above and `torch_dtype`, the dtype of the weights written beside it), which ParseHfConfigJson
// reads back to an equal config.
std::string ToHfConfigJson(const ModelConfig& config, absl::string_view torch_dtype = "float32");

// What a model of `config` (at `field_path` in the caller's config) computes that the
// preparation rules may refuse beside some steps (wrap/rules.proto's FeatureRule):
// "mixture_of_experts" (its routers' statistics count every row they route).
std::vector<base::PlanFeature> FeaturesOf(const ModelConfig& config, absl::string_view field_path);

// Each head's width: head_dim where set, else hidden_size / num_attention_heads.
inline int64_t HeadDim(const ModelConfig& config) {
  if (config.head_dim() > 0) return config.head_dim();
  return config.hidden_size() / config.num_attention_heads();
}

// Whether q_proj, k_proj and v_proj have biases: always for Qwen2, with attention_bias for
// the others.
inline bool HasQkvBias(const ModelConfig& config) {
  return config.model_type() == "qwen2" || config.attention_bias();
}

// Whether each head's queries and keys are RMS-normalised before the rotary embedding
// (self_attn.q_norm and k_norm, [head_dim] each): Qwen3's.
inline bool HasQkNorm(const ModelConfig& config) {
  return config.model_type() == "qwen3" || config.model_type() == "qwen3_moe";
}

// Whether models of `model_type` have mixture-of-experts layers: qwen3_moe and mixtral.
bool IsMixtureOfExperts(absl::string_view model_type);

// A SwiGLU MLP's projections, gate, up and down, as Llama's, Qwen's and Qwen3-MoE's experts'
// checkpoints name them.
inline const std::array<std::string, 3> kMlpProjectionNames = {"gate_proj", "up_proj", "down_proj"};

// What a mixture-of-experts layer's modules are called in the checkpoints of `config`'s type:
// the block ("mlp" in Qwen3-MoE, "block_sparse_moe" in Mixtral), which holds the router
// "gate" and "experts.<e>", and each expert's SwiGLU projections, gate, up and down
// (gate_proj, up_proj, down_proj; Mixtral's w1, w3, w2).
struct MoeModuleNames {
  std::string block;
  std::array<std::string, 3> projections;
};
const MoeModuleNames& MoeModuleNamesOf(const ModelConfig& config);

// Whether layer `layer` (0-based) of `config` is a mixture of experts (ModelConfig's
// num_experts, decoder_sparse_step and mlp_only_layers), not a dense MLP.
bool IsMoeLayer(const ModelConfig& config, int64_t layer);

}  // namespace plait::models

#endif  // PLAIT_MODELS_MODEL_CONFIG_H_
