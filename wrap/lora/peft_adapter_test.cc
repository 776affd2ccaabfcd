#include "wrap/lora/peft_adapter.h"

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "ATen/Context.h"
#include "ATen/core/Tensor.h"
#include "base/file.h"
#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/safetensors.h"
#include "nlohmann/json.hpp"
#include "torch/csrc/autograd/generated/variable_factories.h"

namespace plait::wrap::lora {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::base::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

std::string FreshDir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

wrap::LoraConfig Config() {
  wrap::LoraConfig config;
  config.set_rank(2);
  config.set_alpha(4.0);
  config.set_dropout(0.1);
  config.set_use_rslora(true);
  config.add_target("*q_proj");
  return config;
}

NamedTensors Adapters() {
  at::manual_seed(0);
  return {{"model.layers.0.self_attn.q_proj.lora_A.weight", torch::randn({2, 8})},
          {"model.layers.0.self_attn.q_proj.lora_B.weight", torch::randn({6, 2})},
          {"model.layers.1.self_attn.q_proj.lora_A.weight", torch::randn({2, 8})},
          {"model.layers.1.self_attn.q_proj.lora_B.weight", torch::randn({6, 2})}};
}

// What PEFT reads: its names, its fields; and plait reads back the same adapters, with the
// adapted modules as its targets.
TEST(PeftAdapterTest, SavesPeftsFilesAndReadsThemBack) {
  const std::string dir = FreshDir("round_trip");
  const NamedTensors adapters = Adapters();
  ASSERT_THAT(SavePeftAdapter(dir, Config(), adapters, "/ckpt/base"), IsOk());

  const nlohmann::json json =
      nlohmann::json::parse(base::ReadFile(dir + "/adapter_config.json").value());
  EXPECT_EQ(json["peft_type"], "LORA");
  EXPECT_EQ(json["r"], 2);
  EXPECT_EQ(json["lora_alpha"], 4.0);
  EXPECT_EQ(json["use_rslora"], true);
  EXPECT_EQ(json["base_model_name_or_path"], "/ckpt/base");
  EXPECT_EQ(json["target_modules"],
            nlohmann::json({"model.layers.0.self_attn.q_proj", "model.layers.1.self_attn.q_proj"}));
  std::unique_ptr<models::SafetensorsFile> file =
      models::SafetensorsFile::Open(dir + "/adapter_model.safetensors").value();
  EXPECT_EQ(file->entries().count("base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight"),
            1u);

  // Its own earlier adapter is replaced; a folder holding another file is refused.
  ASSERT_THAT(SavePeftAdapter(dir, Config(), adapters, "/ckpt/base"), IsOk());
  EXPECT_THAT(CheckPeftAdapterFolder(dir, "field"), ::testing::IsEmpty());
  const std::string foreign = FreshDir("foreign");
  ASSERT_THAT(base::WriteFileAtomically(foreign + "/README.md", "mine"), IsOk());
  EXPECT_THAT(SavePeftAdapter(foreign, Config(), adapters, "base"),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("README.md")));
  ASSERT_EQ(CheckPeftAdapterFolder(foreign, "plan.training.save_adapter_dir").size(), 1u);
  EXPECT_EQ(CheckPeftAdapterFolder(foreign, "plan.training.save_adapter_dir")[0].field,
            "plan.training.save_adapter_dir");

  absl::StatusOr<PeftAdapter> read = ReadPeftAdapter(dir);
  ASSERT_THAT(read, IsOk());
  EXPECT_EQ(read->config.rank(), 2);
  EXPECT_EQ(read->config.alpha(), 4.0);
  EXPECT_EQ(read->config.dropout(), 0.1);
  EXPECT_TRUE(read->config.use_rslora());
  EXPECT_THAT(read->config.target(),
              ElementsAre("model.layers.0.self_attn.q_proj", "model.layers.1.self_attn.q_proj"));
  ASSERT_EQ(read->tensors.size(), adapters.size());
  for (const auto& [name, value] : adapters) {
    const auto it = std::find_if(read->tensors.begin(), read->tensors.end(),
                                 [&](const auto& item) { return item.first == name; });
    ASSERT_NE(it, read->tensors.end()) << name;
    EXPECT_TRUE(it->second.equal(value)) << name;
  }
}

TEST(PeftAdapterTest, SavingRefusesWhatIsNotAnAdapterPair) {
  const std::string dir = FreshDir("refused");
  NamedTensors adapters = Adapters();
  adapters.pop_back();
  EXPECT_THAT(SavePeftAdapter(dir, Config(), adapters, "base"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("model.layers.1.self_attn.q_proj has A but not B")));
  adapters.emplace_back("model.norm.weight", torch::ones({8}));
  EXPECT_THAT(SavePeftAdapter(dir, Config(), adapters, "base"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("model.norm.weight is not a LoRA matrix")));
  wrap::LoraConfig rank3 = Config();
  rank3.set_rank(3);
  EXPECT_THAT(SavePeftAdapter(dir, rank3, Adapters(), "base"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("[r, in] with r = 3")));
}

// An adapter folder PEFT wrote with what plait's LoRA does not compute as PEFT would is
// refused, naming the file and the field or tensor.
TEST(PeftAdapterTest, ReadingRefusesWhatPlaitCannotApply) {
  const std::string dir = FreshDir("unsupported");
  ASSERT_THAT(SavePeftAdapter(dir, Config(), Adapters(), "base"), IsOk());
  const std::string config_path = dir + "/adapter_config.json";
  const nlohmann::json saved = nlohmann::json::parse(base::ReadFile(config_path).value());
  struct Case {
    const char* field;
    nlohmann::json value;
    const char* message;
  };
  for (const Case& edit : std::vector<Case>{
           {"peft_type", "IA3", "peft_type: \"IA3\" is not a LoRA adapter"},
           {"use_dora", true, "use_dora: true (DoRA) is not supported"},
           {"bias", "lora_only", "bias: \"lora_only\" (trained biases)"},
           {"rank_pattern", {{"q_proj", 4}}, "rank_pattern: an object (per-module ranks)"},
           {"modules_to_save", {"lm_head"}, "modules_to_save: an array"},
           {"r", 3, "[r, in] with r = 3"},
           {"r", 0, "r: 0 is not a positive rank"},
       }) {
    nlohmann::json edited = saved;
    edited[edit.field] = edit.value;
    ASSERT_THAT(base::WriteFileAtomically(config_path, edited.dump()), IsOk());
    EXPECT_THAT(ReadPeftAdapter(dir),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(edit.message)))
        << edit.field;
  }
  ASSERT_THAT(base::WriteFileAtomically(config_path, saved.dump()), IsOk());
  ASSERT_THAT(models::WriteSafetensors(
                  dir + "/adapter_model.safetensors",
                  {{"base_model.model.model.embed_tokens.lora_embedding_A", torch::zeros({2, 8})}}),
              IsOk());
  EXPECT_THAT(ReadPeftAdapter(dir), StatusIs(absl::StatusCode::kInvalidArgument,
                                             HasSubstr("lora_embedding_A is not a LoRA matrix")));
  ASSERT_THAT(
      models::WriteSafetensors(dir + "/adapter_model.safetensors",
                               {{"model.layers.0.q_proj.lora_A.weight", torch::zeros({2, 8})}}),
      IsOk());
  EXPECT_THAT(ReadPeftAdapter(dir), StatusIs(absl::StatusCode::kInvalidArgument,
                                             HasSubstr("is not named as PEFT saves")));
  EXPECT_THAT(ReadPeftAdapter(dir + "/absent"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("adapter_config.json")));
}

}  // namespace
}  // namespace plait::wrap::lora
