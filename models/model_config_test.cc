#include "models/model_config.h"

#include <cstdlib>
#include <fstream>
#include <limits>
#include <string>

#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace plait::models {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::base::testing::StatusIs;
using ::testing::HasSubstr;

ModelConfig Tiny() { return PresetConfig("tiny").value(); }

TEST(PresetConfigTest, EveryPresetIsValid) {
  for (const std::string& name : PresetNames()) {
    absl::StatusOr<ModelConfig> config = PresetConfig(name);
    ASSERT_THAT(config, IsOk()) << name;
    EXPECT_THAT(ValidateModelConfig(*config), IsOk()) << name;
  }
}

TEST(PresetConfigTest, RealShapes) {
  const ModelConfig llama = PresetConfig("llama3.2-1b").value();
  EXPECT_EQ(llama.hidden_size(), 2048);
  EXPECT_EQ(llama.num_key_value_heads(), 8);
  EXPECT_EQ(llama.rope_scaling().factor(), 32.0);
  EXPECT_TRUE(llama.tie_word_embeddings());
  const ModelConfig qwen = PresetConfig("qwen2.5-7b").value();
  EXPECT_EQ(qwen.model_type(), "qwen2");
  EXPECT_EQ(qwen.intermediate_size(), 18944);
  EXPECT_EQ(qwen.vocab_size(), 152064);
}

TEST(PresetConfigTest, UnknownNameListsTheKnownOnes) {
  EXPECT_THAT(PresetConfig("gpt5"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("tiny, llama3.2-1b")));
}

struct BadCase {
  const char* edit;     // text proto merged over the tiny preset
  const char* message;  // expected in the error
};

class ValidateModelConfigTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(ValidateModelConfigTest, NamesTheField) {
  ModelConfig config = Tiny();
  ASSERT_TRUE(google::protobuf::TextFormat::MergeFromString(GetParam().edit, &config));
  EXPECT_THAT(ValidateModelConfig(config, "plan.model"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(GetParam().message)));
}

INSTANTIATE_TEST_SUITE_P(
    Cases, ValidateModelConfigTest,
    ::testing::Values(
        BadCase{"model_type: 'gpt2'", "plan.model.model_type: \"gpt2\" is not supported"},
        BadCase{"hidden_size: 0", "plan.model.hidden_size: 0 must be > 0"},
        BadCase{"intermediate_size: -3", "plan.model.intermediate_size: -3 must be > 0"},
        BadCase{"num_hidden_layers: 0", "plan.model.num_hidden_layers"},
        BadCase{"vocab_size: 0", "plan.model.vocab_size"},
        // Sizes past the limits: a plan check listing 2^31 layers' parameters never ended,
        // and shape products overflowed.
        BadCase{"num_hidden_layers: 2147483647",
                "plan.model.num_hidden_layers: 2147483647 must be <= 1024"},
        BadCase{"hidden_size: 4611686018427387904 num_attention_heads: 1 num_key_value_heads: 1",
                "plan.model.hidden_size: 4611686018427387904 must be <= 1048576"},
        BadCase{"intermediate_size: 1048577", "plan.model.intermediate_size: 1048577 must be <="},
        BadCase{"vocab_size: 16777217", "plan.model.vocab_size: 16777217 must be <= 16777216"},
        BadCase{"max_position_embeddings: 9223372036854775807",
                "plan.model.max_position_embeddings: 9223372036854775807 must be <= 16777216"},
        BadCase{"num_attention_heads: 3",
                "plan.model.num_attention_heads: 3 does not divide hidden_size (256)"},
        BadCase{"num_key_value_heads: 3",
                "plan.model.num_key_value_heads: 3 does not divide num_attention_heads (4)"},
        BadCase{"rms_norm_eps: 0", "plan.model.rms_norm_eps"},
        BadCase{"rope_theta: -1", "plan.model.rope_theta"},
        // Infinite values made the model NaN; the plan check let them through.
        BadCase{"rms_norm_eps: inf", "plan.model.rms_norm_eps: inf must be finite"},
        BadCase{"rope_scaling { rope_type: 'llama3' factor: 8 low_freq_factor: 1 "
                "high_freq_factor: inf original_max_position_embeddings: 8192 }",
                "plan.model.rope_scaling.high_freq_factor: inf must be finite"},
        BadCase{"rope_scaling { rope_type: 'yarn' factor: 4 }",
                "plan.model.rope_scaling.rope_type: \"yarn\" is not supported"},
        BadCase{"rope_scaling { rope_type: 'llama3' factor: 8 low_freq_factor: 4 "
                "high_freq_factor: 1 original_max_position_embeddings: 8192 }",
                "plan.model.rope_scaling.high_freq_factor"},
        BadCase{"model_type: 'qwen2' attention_bias: true", "plan.model.attention_bias"},
        BadCase{"num_experts: 4",
                "plan.model.num_experts: the mixture-of-experts fields are for qwen3_moe and "
                "mixtral, not llama"},
        BadCase{"model_type: 'qwen3_moe'", "plan.model.num_experts: 0 must be > 0"},
        BadCase{"model_type: 'qwen3_moe' num_experts: 4 num_experts_per_tok: 5 "
                "moe_intermediate_size: 8",
                "plan.model.num_experts_per_tok: 5 must be <= 4"},
        BadCase{"model_type: 'qwen3_moe' num_experts: 4 num_experts_per_tok: 2 "
                "moe_intermediate_size: 8 mlp_only_layers: 7",
                "plan.model.mlp_only_layers: 7 is not a layer of the"},
        BadCase{"model_type: 'qwen3_moe' num_experts: 4 num_experts_per_tok: 2 "
                "moe_intermediate_size: 8 router_aux_loss_coef: -1",
                "plan.model.router_aux_loss_coef: -1 must be finite and >= 0"},
        BadCase{"model_type: 'mixtral' num_experts: 4 num_experts_per_tok: 2 "
                "moe_intermediate_size: 8 norm_topk_prob: true",
                "plan.model.moe_intermediate_size: 8: mixtral's experts are intermediate_size "
                "(688) wide; set it to that"},
        BadCase{"model_type: 'mixtral' num_experts: 4 num_experts_per_tok: 2 "
                "moe_intermediate_size: 688",
                "plan.model.norm_topk_prob: is false; mixtral always renormalises"},
        BadCase{"model_type: 'mixtral' num_experts: 4 num_experts_per_tok: 2 "
                "moe_intermediate_size: 688 norm_topk_prob: true mlp_only_layers: 0",
                "plan.model.decoder_sparse_step: mixtral's layers are all mixtures of experts"}));

TEST(ValidateInitConfigTest, NonPositiveOrInfiniteStd) {
  InitConfig init;
  init.set_std(0.0);
  EXPECT_THAT(ValidateInitConfig(init, "plan.init"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("plan.init.std")));
  init.set_std(std::numeric_limits<double>::infinity());
  EXPECT_THAT(ValidateInitConfig(init, "plan.init"),
              StatusIs(absl::StatusCode::kInvalidArgument, "plan.init.std: inf must be finite"));
}

TEST(ResolveModelSpecTest, PresetConfigAndErrors) {
  ModelSpec spec;
  spec.set_preset("tiny");
  EXPECT_THAT(ResolveModelSpec(spec), IsOk());
  spec.set_preset("nope");
  EXPECT_THAT(ResolveModelSpec(spec, "plan.model"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("plan.model.preset")));
  *spec.mutable_config() = Tiny();
  spec.mutable_config()->set_num_key_value_heads(3);
  EXPECT_THAT(ResolveModelSpec(spec, "plan.model"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("plan.model.config.num_key_value_heads")));
  EXPECT_THAT(ResolveModelSpec(ModelSpec(), "plan.model"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("plan.model: set one")));
}

// The config.json of meta-llama/Llama-3.2-1B, as published.
constexpr char kLlama32Json[] = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 128000,
  "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2048,
  "initializer_range": 0.02, "intermediate_size": 8192, "max_position_embeddings": 131072,
  "mlp_bias": false, "model_type": "llama", "num_attention_heads": 32,
  "num_hidden_layers": 16, "num_key_value_heads": 8, "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0", "use_cache": true, "vocab_size": 128256
})";

// The config.json of Qwen/Qwen2.5-0.5B, as published.
constexpr char kQwen25Json[] = R"({
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896,
  "initializer_range": 0.02, "intermediate_size": 4864, "max_position_embeddings": 32768,
  "max_window_layers": 24, "model_type": "qwen2", "num_attention_heads": 14,
  "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": true,
  "torch_dtype": "bfloat16", "transformers_version": "4.40.1", "use_cache": true,
  "use_sliding_window": false, "vocab_size": 151936
})";

// The config.json of mistralai/Mixtral-8x7B-v0.1, as published.
constexpr char kMixtral8x7bJson[] = R"({
  "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
  "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
  "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mixtral",
  "num_attention_heads": 32, "num_experts_per_tok": 2, "num_hidden_layers": 32,
  "num_key_value_heads": 8, "num_local_experts": 8, "output_router_logits": false,
  "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02,
  "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.36.0.dev0", "use_cache": true, "vocab_size": 32000
})";

TEST(ParseHfConfigJsonTest, PublishedConfigsEqualThePresets) {
  absl::StatusOr<ModelConfig> llama = ParseHfConfigJson(kLlama32Json, "config.json");
  ASSERT_THAT(llama, IsOk());
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(
      *llama, PresetConfig("llama3.2-1b").value()))
      << llama->DebugString();
  absl::StatusOr<ModelConfig> qwen = ParseHfConfigJson(kQwen25Json, "config.json");
  ASSERT_THAT(qwen, IsOk());
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(
      *qwen, PresetConfig("qwen2.5-0.5b").value()))
      << qwen->DebugString();
  absl::StatusOr<ModelConfig> mixtral = ParseHfConfigJson(kMixtral8x7bJson, "config.json");
  ASSERT_THAT(mixtral, IsOk());
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(
      *mixtral, PresetConfig("mixtral-8x7b").value()))
      << mixtral->DebugString();
}

// The same two configs as transformers 5.17 writes them (save_pretrained): rope_theta and
// the rope scaling moved into one `rope_parameters` object, no top-level rope_theta.
constexpr char kLlama32Transformers5Json[] = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "dtype": "bfloat16", "eos_token_id": 128001, "head_dim": 64,
  "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
  "intermediate_size": 8192, "max_position_embeddings": 131072, "mlp_bias": false,
  "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 16,
  "num_key_value_heads": 8, "pad_token_id": null, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_parameters": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                      "original_max_position_embeddings": 8192, "rope_theta": 500000.0,
                      "rope_type": "llama3"},
  "tie_word_embeddings": true, "transformers_version": "5.17.0", "use_cache": true,
  "vocab_size": 128256
})";

constexpr char kQwen25Transformers5Json[] = R"({
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "dtype": "bfloat16", "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896,
  "initializer_range": 0.02, "intermediate_size": 4864,
  "layer_types": ["full_attention", "full_attention"], "max_position_embeddings": 32768,
  "max_window_layers": 24, "model_type": "qwen2", "num_attention_heads": 14,
  "num_hidden_layers": 24, "num_key_value_heads": 2, "pad_token_id": null,
  "rms_norm_eps": 1e-06, "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
  "sliding_window": null, "tie_word_embeddings": true, "transformers_version": "5.17.0",
  "use_cache": true, "use_sliding_window": false, "vocab_size": 151936
})";

TEST(ParseHfConfigJsonTest, ReadsTheRopeParametersOfTransformers5) {
  absl::StatusOr<ModelConfig> llama = ParseHfConfigJson(kLlama32Transformers5Json, "config.json");
  ASSERT_THAT(llama, IsOk());
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(
      *llama, PresetConfig("llama3.2-1b").value()))
      << llama->DebugString();
  absl::StatusOr<ModelConfig> qwen = ParseHfConfigJson(kQwen25Transformers5Json, "config.json");
  ASSERT_THAT(qwen, IsOk());
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(
      *qwen, PresetConfig("qwen2.5-0.5b").value()))
      << qwen->DebugString();
}

TEST(ParseHfConfigJsonTest, RopeScalingComesBeforeRopeParametersAsInTransformers) {
  const std::string base = R"({"model_type": "llama", "hidden_size": 64,
    "intermediate_size": 96, "num_hidden_layers": 1, "num_attention_heads": 4,
    "vocab_size": 10, "rope_theta": 1000.0,
    "rope_parameters": {"rope_type": "default", "rope_theta": 2000.0}, )";
  // A non-empty rope_scaling is read instead of rope_parameters, with the top-level theta.
  absl::StatusOr<ModelConfig> config = ParseHfConfigJson(
      base + R"("rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64}})",
      "c.json");
  ASSERT_THAT(config, IsOk());
  EXPECT_EQ(config->rope_theta(), 1000.0);
  EXPECT_EQ(config->rope_scaling().rope_type(), "llama3");
  // A null or empty rope_scaling is not.
  for (const std::string scaling : {"null", "{}"}) {
    config = ParseHfConfigJson(base + R"("rope_scaling": )" + scaling + "}", "c.json");
    ASSERT_THAT(config, IsOk()) << scaling;
    EXPECT_EQ(config->rope_theta(), 2000.0) << scaling;
    EXPECT_FALSE(config->has_rope_scaling()) << scaling;
  }
  EXPECT_THAT(ParseHfConfigJson(base + R"("rope_scaling": 3})", "c.json"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("c.json: rope_scaling: expected an object or null, got 3")));
  std::string text = kLlama32Transformers5Json;
  text.replace(text.find("\"factor\": 32.0"), 14, "\"factor\": \"32\"");
  EXPECT_THAT(ParseHfConfigJson(text, "c.json"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("c.json: rope_parameters: factor: expected a number")));
}

TEST(ParseHfConfigJsonTest, RoundTripsThroughToHfConfigJson) {
  for (const std::string& name : PresetNames()) {
    const ModelConfig config = PresetConfig(name).value();
    absl::StatusOr<ModelConfig> back = ParseHfConfigJson(ToHfConfigJson(config), name);
    ASSERT_THAT(back, IsOk());
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*back, config)) << name;
  }
}

TEST(ParseHfConfigJsonTest, ErrorsNameTheSourceAndField) {
  EXPECT_THAT(
      ParseHfConfigJson("{not json", "ckpt/config.json"),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("ckpt/config.json: not valid JSON")));
  EXPECT_THAT(ParseHfConfigJson("[1]", "c.json"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("c.json: expected a JSON")));
  EXPECT_THAT(ParseHfConfigJson(R"({"model_type": "llama"})", "c.json"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("c.json: hidden_size: is required and missing")));
  EXPECT_THAT(ParseHfConfigJson(R"({"model_type": "mistral"})", "c.json"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("c.json: model_type: \"mistral\" is not supported")));
  std::string text = kLlama32Json;
  text.replace(text.find("\"hidden_size\": 2048"), 19, "\"hidden_size\": \"2048\"");
  EXPECT_THAT(ParseHfConfigJson(text, "c.json"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("c.json: hidden_size: expected an integer, got \"2048\"")));
  // Nested far deeper than a real config: named by its type; writing it out overflowed the
  // stack.
  text = kLlama32Json;
  text.replace(text.find("\"hidden_size\": 2048"), 19,
               "\"hidden_size\": " + std::string(100000, '[') + std::string(100000, ']'));
  EXPECT_THAT(ParseHfConfigJson(text, "c.json"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("c.json: hidden_size: expected an integer, got an array")));
  text = kLlama32Json;
  text.replace(text.find("\"llama3\""), 8, "\"dynamic\"");
  EXPECT_THAT(ParseHfConfigJson(text, "c.json"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("c.json.rope_scaling.rope_type: \"dynamic\" is not supported")));
  text = kLlama32Json;
  text.replace(text.find("\"num_key_value_heads\": 8"), 24, "\"num_key_value_heads\": 5");
  EXPECT_THAT(ParseHfConfigJson(text, "c.json"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("c.json.num_key_value_heads: 5 does not divide")));
  // Another activation would load and compute SwiGLU all the same.
  text = kLlama32Json;
  text.replace(text.find("\"silu\""), 6, "\"gelu\"");
  EXPECT_THAT(ParseHfConfigJson(text, "c.json"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("c.json: hidden_act: \"gelu\" is not supported")));
  // Mixtral's window and router noise would compute another model.
  text = kMixtral8x7bJson;
  text.replace(text.find("\"sliding_window\": null"), 22, "\"sliding_window\": 4096");
  EXPECT_THAT(ParseHfConfigJson(text, "c.json"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("c.json: sliding_window: is set, and sliding-window attention is "
                                 "not supported")));
  text = kMixtral8x7bJson;
  text.replace(text.find("\"router_aux_loss_coef\""), 0, "\"router_jitter_noise\": 0.01, ");
  EXPECT_THAT(ParseHfConfigJson(text, "c.json"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("c.json: router_jitter_noise: 0.01 is not supported")));
  text = kQwen25Json;
  text.replace(text.find("\"use_sliding_window\": false"), 27, "\"use_sliding_window\": true");
  EXPECT_THAT(ParseHfConfigJson(text, "c.json"), StatusIs(absl::StatusCode::kInvalidArgument,
                                                          HasSubstr("c.json: use_sliding_window")));
}

// The fields a config.json leaves out, or gives under another name, read as transformers
// 5.17's config classes read them (their defaults and attribute_map), never as a default of
// plait's own.
TEST(ParseHfConfigJsonTest, AbsentAndRenamedFieldsAreReadAsTransformersReadsThem) {
  const auto parse = [](const nlohmann::json& json) {
    return ParseHfConfigJson(json.dump(), "c.json");
  };
  const auto equals = [](const absl::StatusOr<ModelConfig>& config, const std::string& preset) {
    return config.ok() && google::protobuf::util::MessageDifferencer::Equals(
                              *config, PresetConfig(preset).value());
  };
  // MixtralConfig and Qwen3MoeConfig read num_experts and num_local_experts as one field.
  nlohmann::json mixtral = nlohmann::json::parse(kMixtral8x7bJson);
  mixtral.erase("num_local_experts");
  mixtral["num_experts"] = 4;
  absl::StatusOr<ModelConfig> config = parse(mixtral);
  ASSERT_THAT(config, IsOk());
  EXPECT_EQ(config->num_experts(), 4);
  mixtral["num_local_experts"] = 4;
  EXPECT_THAT(parse(mixtral), IsOk());
  mixtral["num_local_experts"] = 8;
  EXPECT_THAT(parse(mixtral),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("c.json: num_experts: 4 and num_local_experts 8 both give the "
                                 "expert count")));
  nlohmann::json qwen3_moe =
      nlohmann::json::parse(ToHfConfigJson(PresetConfig("qwen3-moe-tiny").value()));
  qwen3_moe["num_local_experts"] = qwen3_moe["num_experts"];
  qwen3_moe.erase("num_experts");
  EXPECT_TRUE(equals(parse(qwen3_moe), "qwen3-moe-tiny"));
  // transformers divides the layer number by decoder_sparse_step: 0 builds no model.
  qwen3_moe["decoder_sparse_step"] = 0;
  EXPECT_THAT(parse(qwen3_moe),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("c.json: decoder_sparse_step: 0 must be 1 or more")));
  // Without num_key_value_heads: MixtralConfig's 8 (Mixtral 8x7B's), Qwen2Config's 32 (which
  // Qwen2.5-0.5B's 14 attention heads cannot share), not the attention heads.
  mixtral = nlohmann::json::parse(kMixtral8x7bJson);
  mixtral.erase("num_key_value_heads");
  EXPECT_TRUE(equals(parse(mixtral), "mixtral-8x7b"));
  nlohmann::json qwen2 = nlohmann::json::parse(kQwen25Json);
  qwen2.erase("num_key_value_heads");
  EXPECT_THAT(parse(qwen2), StatusIs(absl::StatusCode::kInvalidArgument,
                                     HasSubstr("c.json.num_key_value_heads: 32 does not divide "
                                               "num_attention_heads (14)")));
  // Without head_dim: Qwen3Config's 128 (Qwen3-0.6B's), not hidden_size / heads (64).
  nlohmann::json qwen3 = nlohmann::json::parse(ToHfConfigJson(PresetConfig("qwen3-0.6b").value()));
  qwen3.erase("head_dim");
  EXPECT_TRUE(equals(parse(qwen3), "qwen3-0.6b"));
}

TEST(ReadHfConfigTest, ReadsAFileAndNamesAMissingOne) {
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/config.json";
  std::ofstream(path) << kQwen25Json;
  EXPECT_THAT(ReadHfConfig(path), IsOk());
  EXPECT_THAT(ReadHfConfig(path + ".missing"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("config.json.missing")));
  ModelSpec spec;
  spec.set_hf_config_path(path);
  EXPECT_THAT(ResolveModelSpec(spec), IsOk());
}

}  // namespace
}  // namespace plait::models
