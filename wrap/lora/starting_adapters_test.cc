#include "wrap/lora/starting_adapters.h"

#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "models/causal_lm.h"
#include "models/model_config.h"
#include "models/peft_adapter.h"
#include "torch/types.h"
#include "torch/utils.h"
#include "wrap/lora/lora.h"
#include "wrap/strategies.h"

namespace plait::wrap::lora {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::base::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// The tiny Llama (hidden 256, 4 blocks, 2 key/value heads of 64).
std::shared_ptr<models::CausalLM> MakeModel() {
  models::InitConfig init;
  init.set_seed(7);
  return models::CausalLM::Create(models::PresetConfig("tiny").value(), init).value();
}

LoraConfig Config(const std::string& text) {
  LoraConfig config;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &config)) << text;
  return config;
}

ModelShape ShapeOf(models::CausalLM& model) {
  ModelShape shape;
  for (const auto& named : model.NamedParameters()) {
    shape.parameters += static_cast<double>(named.parameter.numel());
    shape.parameter_list.push_back(
        {named.name, named.parameter.sizes().vec(), model.TensorParallelSplit(named.name)});
  }
  shape.num_blocks = 4;
  return shape;
}

// The violations the strategy of `config` finds on the tiny model, one "field: message" each.
std::vector<std::string> Violations(const LoraConfig& config) {
  PrepareStep step;
  *step.mutable_lora() = config;
  auto strategy = MakeStrategy(step);
  EXPECT_THAT(strategy, IsOk());
  std::vector<std::string> lines;
  for (const base::Violation& violation :
       (*strategy)->Check(ShapeOf(*MakeModel()), parallel::MeshConfig(), "plan.prepare[0]")) {
    lines.push_back(violation.ToString());
  }
  return lines;
}

constexpr char kSaved[] = R"pb(rank: 4 alpha: 8 target: "*q_proj" target: "*v_proj" seed: 3)pb";

// A folder holding the adapters of kSaved, trained away from their start (B no longer zero),
// and the logits of the adapted model on `tokens`.
std::pair<std::string, torch::Tensor> SavedFolder(const torch::Tensor& tokens) {
  const std::string dir = ::testing::TempDir() + "/starting_adapters";
  std::filesystem::remove_all(dir);
  std::shared_ptr<models::CausalLM> model = MakeModel();
  auto lora = Lora::Create(*model, Config(kSaved));
  EXPECT_THAT(lora, IsOk());
  std::vector<std::pair<std::string, torch::Tensor>> adapters;
  torch::manual_seed(5);
  torch::NoGradGuard no_grad;
  for (const auto& named : model->NamedParameters()) {
    if (named.name.find(".lora_") == std::string::npos) continue;
    named.parameter.copy_(torch::randn_like(named.parameter) * 0.05);
    adapters.emplace_back(named.name, named.parameter);
  }
  EXPECT_THAT(models::SavePeftAdapter(dir, Config(kSaved), adapters, "base"), IsOk());
  return {dir, model->Forward(tokens)};
}

TEST(StartingAdaptersTest, AStepStartsFromTheFolderAndComputesWhatItsModelDid) {
  torch::manual_seed(11);
  const torch::Tensor tokens = torch::randint(4096, {2, 16});
  const auto [dir, saved_logits] = SavedFolder(tokens);
  LoraConfig config = Config(kSaved);
  config.set_seed(99);      // the draw is not used
  config.set_dropout(0.1);  // the step's own
  config.set_initial_adapter_dir(dir);
  EXPECT_THAT(Violations(config), IsEmpty());
  std::shared_ptr<models::CausalLM> model = MakeModel();
  auto lora = Lora::Create(*model, config);
  ASSERT_THAT(lora, IsOk());
  model->eval();
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(torch::equal(model->Forward(tokens), saved_logits));
  auto parameters = model->named_parameters();
  const torch::Tensor b = parameters["model.layers.3.self_attn.v_proj.lora_B.weight"];
  EXPECT_TRUE(b.requires_grad());
  EXPECT_GT(b.abs().max().item<double>(), 0.0);
}

TEST(StartingAdaptersTest, AFolderThatDoesNotFitTheStepIsAViolationNamingWhy) {
  torch::manual_seed(11);
  const std::string dir = SavedFolder(torch::randint(4096, {2, 16})).first;
  const std::string field = "plan.prepare[0].lora.initial_adapter_dir: " + dir + ": ";
  for (const auto& [text, why] : std::vector<std::pair<std::string, std::string>>{
           {R"pb(rank: 8 alpha: 8 target: "*q_proj" target: "*v_proj")pb",
            "its adapters have rank (r) 4, the step's rank is 8"},
           {R"pb(rank: 4 alpha: 16 target: "*q_proj" target: "*v_proj")pb",
            "its lora_alpha is 8, the step's alpha is 16"},
           {R"pb(rank: 4 alpha: 8 use_rslora: true target: "*q_proj" target: "*v_proj")pb",
            "its use_rslora is false, the step's true"},
           {R"pb(rank: 4 alpha: 8 target: "*q_proj")pb",
            "it adapts model.layers.0.self_attn.v_proj, which the step's targets (*q_proj) do "
            "not match"},
           {R"pb(rank: 4 alpha: 8 target: "*_proj")pb",
            "it has no adapters for model.layers.0.mlp.down_proj, which the step's targets "
            "(*_proj) match"}}) {
    LoraConfig config = Config(text);
    config.set_initial_adapter_dir(dir);
    EXPECT_THAT(Violations(config), testing::ElementsAre(field + why)) << text;
    // Applied, the same error, and the model is left as it was.
    std::shared_ptr<models::CausalLM> model = MakeModel();
    EXPECT_THAT(Lora::Create(*model, config),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("lora.initial_adapter_dir: " + dir + ": " + why)));
    for (const auto& named : model->NamedParameters()) {
      EXPECT_TRUE(named.parameter.requires_grad()) << named.name;
    }
  }
  LoraConfig missing = Config(kSaved);
  missing.set_initial_adapter_dir(dir + "/nowhere");
  const std::vector<std::string> violations = Violations(missing);
  ASSERT_EQ(violations.size(), 1u);
  EXPECT_THAT(violations[0], HasSubstr("plan.prepare[0].lora.initial_adapter_dir: "));
  EXPECT_THAT(violations[0], HasSubstr(dir + "/nowhere/adapter_config.json"));
}

}  // namespace
}  // namespace plait::wrap::lora
