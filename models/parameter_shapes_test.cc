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
  return {llama, tied, qwen, attention_bias};
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

}  // namespace
}  // namespace plait::models
