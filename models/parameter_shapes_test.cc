#include "models/parameter_shapes.h"

#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "models/causal_lm.h"
#include "models/estimates.h"
#include "models/model_config.h"

namespace plait::models {
namespace {

// Small configs that between them cover every optional parameter.
std::vector<ModelConfig> Configs() {
  ModelConfig llama = PresetConfig("tiny").value();
  llama.set_num_hidden_layers(2);
  ModelConfig tied = llama;
  tied.set_tie_word_embeddings(true);
  ModelConfig qwen = PresetConfig("qwen2.5-0.5b").value();
  qwen.set_num_hidden_layers(2);
  qwen.set_hidden_size(64);
  qwen.set_num_attention_heads(4);
  qwen.set_num_key_value_heads(2);
  qwen.set_intermediate_size(96);
  qwen.set_vocab_size(128);
  ModelConfig attention_bias = llama;
  attention_bias.set_attention_bias(true);
  // Experts beside a dense layer, and Mixtral's experts under their own names.
  ModelConfig qwen3_moe = PresetConfig("qwen3-moe-tiny").value();
  qwen3_moe.set_num_hidden_layers(2);
  qwen3_moe.add_mlp_only_layers(0);
  ModelConfig mixtral = PresetConfig("mixtral-tiny").value();
  mixtral.set_num_hidden_layers(2);
  return {llama, tied, qwen, attention_bias, qwen3_moe, mixtral};
}

TEST(ParameterShapesTest, AreTheBuiltModelsNamesShapesAndOrder) {
  for (const ModelConfig& config : Configs()) {
    SCOPED_TRACE(config.DebugString());
    ASSERT_TRUE(ValidateModelConfig(config).ok());
    const std::shared_ptr<CausalLM> model = CausalLM::Create(config, InitConfig()).value();
    const std::vector<ParameterShape> shapes = ParameterShapes(config);
    const auto named = model->NamedParameters();
    ASSERT_EQ(shapes.size(), named.size());
    int64_t total = 0;
    for (size_t i = 0; i < shapes.size(); ++i) {
      EXPECT_EQ(shapes[i].name, named[i].name);
      EXPECT_EQ(shapes[i].shape, named[i].parameter.sizes().vec()) << shapes[i].name;
      EXPECT_EQ(shapes[i].numel(), named[i].parameter.numel()) << shapes[i].name;
      total += shapes[i].numel();
    }
    EXPECT_EQ(total, NumParameters(config));
  }
}

// The published counts: Qwen3-30B-A3B's 30.5B parameters, 3.3B of them active (3.35B here,
// both embeddings counted); Mixtral 8x7B's 46.7B, 12.9B active.
TEST(NumActiveParametersTest, CountsTheExpertsATokenChooses) {
  const ModelConfig qwen = PresetConfig("qwen3-30b-a3b").value();
  EXPECT_NEAR(NumParameters(qwen) / 1e9, 30.5, 0.05);
  EXPECT_NEAR(NumActiveParameters(qwen) / 1e9, 3.35, 0.01);
  const ModelConfig mixtral = PresetConfig("mixtral-8x7b").value();
  EXPECT_NEAR(NumParameters(mixtral) / 1e9, 46.7, 0.05);
  EXPECT_NEAR(NumActiveParameters(mixtral) / 1e9, 12.9, 0.05);
  const ModelConfig dense = PresetConfig("llama3.2-1b").value();
  EXPECT_EQ(NumActiveParameters(dense), NumParameters(dense));
}

}  // namespace
}  // namespace plait::models
