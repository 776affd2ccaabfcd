#include "models/hf_checkpoint.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "ATen/ops/equal.h"
#include "base/file.h"
#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/model_config.h"
#include "models/safetensors.h"
#include "torch/csrc/autograd/generated/variable_factories.h"
#include "torch/nn/module.h"

namespace plait::models {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::base::testing::StatusIs;
using ::testing::HasSubstr;

std::string FreshDir(const std::string& name) {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
  std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str());
  return dir;
}

ModelConfig Small(const std::string& type, bool tie) {
  ModelConfig config = PresetConfig("tiny").value();
  config.set_model_type(type);
  config.set_hidden_size(32);
  config.set_intermediate_size(48);
  config.set_num_hidden_layers(2);
  config.set_num_attention_heads(4);
  config.set_num_key_value_heads(2);
  config.set_vocab_size(50);
  config.set_tie_word_embeddings(tie);
  return config;
}

std::shared_ptr<CausalLM> Make(const ModelConfig& config, uint64_t seed) {
  InitConfig init;
  init.set_seed(seed);
  return CausalLM::Create(config, init).value();
}

TEST(HfCheckpointTest, ExportThenImportRoundTrips) {
  for (const std::string type : {"llama", "qwen2"}) {
    for (bool tie : {false, true}) {
      for (uint64_t shard_bytes : {0, 4096}) {
        const ModelConfig config = Small(type, tie);
        std::shared_ptr<CausalLM> model = Make(config, 1);
        const std::string dir = FreshDir("export");
        ASSERT_THAT(SaveHfModel(*model, dir, at::kFloat, shard_bytes), IsOk());
        absl::StatusOr<std::shared_ptr<CausalLM>> loaded = LoadHfModel(dir);
        ASSERT_THAT(loaded, IsOk());
        EXPECT_EQ((*loaded)->config().SerializeAsString(), config.SerializeAsString());
        auto expected = model->named_parameters();
        for (const auto& item : (*loaded)->named_parameters()) {
          EXPECT_TRUE(at::equal(item.value(), expected[item.key()]))
              << type << " " << tie << " " << item.key();
        }
        // The HF names are what is on disk.
        SafetensorsCheckpoint checkpoint = SafetensorsCheckpoint::Open(dir).value();
        EXPECT_TRUE(checkpoint.Contains("model.layers.1.self_attn.q_proj.weight"));
        EXPECT_TRUE(checkpoint.Contains("model.embed_tokens.weight"));
        EXPECT_TRUE(checkpoint.Contains("model.norm.weight"));
        EXPECT_EQ(checkpoint.Contains("lm_head.weight"), !tie);
        EXPECT_EQ(checkpoint.Contains("model.layers.0.self_attn.k_proj.bias"), type == "qwen2");
      }
    }
  }
}

TEST(HfCheckpointTest, Bf16ExportRoundsEachWeightOnce) {
  std::shared_ptr<CausalLM> model = Make(Small("llama", false), 2);
  const std::string dir = FreshDir("bf16");
  ASSERT_THAT(SaveHfModel(*model, dir, at::kBFloat16), IsOk());
  SafetensorsCheckpoint checkpoint = SafetensorsCheckpoint::Open(dir).value();
  EXPECT_EQ(checkpoint.Find("model.norm.weight").value().first->dtype, at::kBFloat16);
  std::shared_ptr<CausalLM> loaded = LoadHfModel(dir).value();
  auto original = model->named_parameters();
  for (const auto& item : loaded->named_parameters()) {
    EXPECT_TRUE(at::equal(item.value(), original[item.key()].to(at::kBFloat16).to(at::kFloat)))
        << item.key();
  }
  EXPECT_THAT(SaveHfModel(*model, dir, at::kHalf),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("use float32 or bfloat16")));
}

// A checkpoint folder with the tiny model's config and the given tensors.
std::string Folder(const std::string& name, const ModelConfig& config,
                   std::vector<std::pair<std::string, at::Tensor>> tensors) {
  const std::string dir = FreshDir(name);
  std::ofstream(dir + "/config.json") << ToHfConfigJson(config);
  EXPECT_THAT(WriteSafetensors(dir + "/model.safetensors", tensors), IsOk());
  return dir;
}

std::vector<std::pair<std::string, at::Tensor>> Weights(CausalLM& model) {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& item : model.named_parameters()) tensors.emplace_back(item.key(), item.value());
  return tensors;
}

TEST(HfCheckpointTest, MismatchedCheckpointsAreNamedErrors) {
  const ModelConfig config = Small("llama", false);
  std::shared_ptr<CausalLM> model = Make(config, 3);
  auto tensors = Weights(*model);

  auto missing = tensors;
  missing.erase(missing.begin() + 3);
  EXPECT_THAT(LoadHfModel(Folder("missing", config, missing)),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("missing tensor \"" + tensors[3].first + "\"")));

  auto extra = tensors;
  extra.emplace_back("model.layers.9.mlp.up_proj.weight", torch::zeros({2}));
  EXPECT_THAT(LoadHfModel(Folder("extra", config, extra)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("model.safetensors: unexpected tensor "
                                 "\"model.layers.9.mlp.up_proj.weight\"")));

  auto reshaped = tensors;
  reshaped[0].second = torch::zeros({50, 16});
  EXPECT_THAT(LoadHfModel(Folder("reshaped", config, reshaped)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("has shape [50, 16], the model expects [50, 32]")));

  auto integer = tensors;
  integer[0].second = torch::zeros({50, 32}, at::kLong);
  EXPECT_THAT(LoadHfModel(Folder("integer", config, integer)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("floating-point")));

  // Tolerated: the precomputed rotary buffers older Llama checkpoints carry, and an
  // lm_head.weight beside tied embeddings.
  auto with_buffers = tensors;
  with_buffers.emplace_back("model.layers.0.self_attn.rotary_emb.inv_freq", torch::zeros({4}));
  EXPECT_THAT(LoadHfModel(Folder("buffers", config, with_buffers)), IsOk());
  const ModelConfig tied = Small("llama", true);
  auto tied_tensors = Weights(*Make(tied, 4));
  tied_tensors.emplace_back("lm_head.weight", tied_tensors[0].second);
  EXPECT_THAT(LoadHfModel(Folder("tied", tied, tied_tensors)), IsOk());

  EXPECT_THAT(LoadHfModel(FreshDir("empty")),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("config.json")));
}

// A rank that holds part of the model (a pipeline stage's blocks, a rank's experts) reads its
// parts alone, and still checks the folder whole against the model: a tensor of no rank's, one
// missing or of another shape among the parts other ranks hold, is refused as for a rank that
// holds every parameter.
TEST(HfCheckpointTest, APartOfTheModelLoadsAndTheFolderIsCheckedWhole) {
  const ModelConfig config = Small("llama", false);
  auto tensors = Weights(*Make(config, 3));
  // Block 0's parameters, as the first of two stages holds them.
  std::vector<HfParameterPart> block0;
  for (const auto& [name, tensor] : tensors) {
    if (name.rfind("model.layers.0.", 0) != 0) continue;
    const std::vector<int64_t> shape = tensor.sizes().vec();
    block0.push_back(
        {name, shape, std::vector<int64_t>(shape.size(), 0), shape, torch::zeros(shape)});
  }
  ASSERT_FALSE(block0.empty());
  const auto load = [&](const std::string& name,
                        const std::vector<std::pair<std::string, at::Tensor>>& folder) {
    absl::StatusOr<SafetensorsCheckpoint> checkpoint =
        SafetensorsCheckpoint::Open(Folder(name, config, folder));
    return checkpoint.ok() ? LoadHfParts(*checkpoint, config, block0) : checkpoint.status();
  };
  ASSERT_THAT(load("stage0", tensors), IsOk());
  for (const HfParameterPart& part : block0) {
    for (const auto& [name, tensor] : tensors) {
      if (name == part.name) {
        EXPECT_TRUE(at::equal(part.destination, tensor)) << name;
      }
    }
  }

  const std::string other_stage = "model.layers.1.mlp.down_proj.weight";
  auto missing = tensors;
  missing.erase(std::find_if(missing.begin(), missing.end(),
                             [&](const auto& named) { return named.first == other_stage; }));
  EXPECT_THAT(load("stage0_missing", missing),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(other_stage)));

  auto reshaped = tensors;
  for (auto& [name, tensor] : reshaped) {
    if (name == other_stage) tensor = torch::zeros({3, 3});
  }
  EXPECT_THAT(load("stage0_reshaped", reshaped),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("\"" + other_stage + "\" has shape [3, 3]")));

  auto extra = tensors;
  extra.emplace_back("model.layers.9.mlp.up_proj.weight", torch::zeros({2}));
  EXPECT_THAT(load("stage0_extra", extra),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("unexpected tensor \"model.layers.9.mlp.up_proj.weight\"")));
}

// Weights holding a NaN (saved by a run that diverged) are refused, naming the file and the
// tensor.
TEST(HfCheckpointTest, NonFiniteWeightsAreRefusedNamingTheFileAndTensor) {
  const ModelConfig config = Small("llama", false);
  auto tensors = Weights(*Make(config, 3));
  const std::string name = "model.layers.0.mlp.up_proj.weight";
  for (auto& [tensor_name, tensor] : tensors) {
    if (tensor_name != name) continue;
    tensor = tensor.detach().clone();
    tensor[1][2] = std::numeric_limits<float>::quiet_NaN();
  }
  const std::string dir = Folder("nan", config, tensors);
  EXPECT_THAT(LoadHfModel(dir), StatusIs(absl::StatusCode::kInvalidArgument,
                                         dir + "/model.safetensors: " + name + ": holds NaN"));
}

// An export never overwrites what it did not write: the input weights, a file, a folder of
// other things.
TEST(HfCheckpointTest, ExportFoldersAreCheckedBeforeTraining) {
  const std::string dir = FreshDir("export");
  std::shared_ptr<CausalLM> model =
      CausalLM::Create(PresetConfig("tiny").value(), InitConfig()).value();
  ASSERT_THAT(SaveHfModel(*model, dir), IsOk());
  EXPECT_TRUE(CheckHfExportFolder(dir, {}, "save_hf_dir").empty());  // an earlier export
  EXPECT_TRUE(CheckHfExportFolder(dir + "/new", {}, "save_hf_dir").empty());
  EXPECT_TRUE(CheckHfExportFolder("", {{"hf_weights_dir", dir}}, "save_hf_dir").empty());

  auto message = [](const std::vector<base::Violation>& violations) {
    return violations.empty() ? std::string("(none)") : violations[0].ToString();
  };
  EXPECT_THAT(message(CheckHfExportFolder(dir, {{"hf_weights_dir", dir + "/."}}, "save_hf_dir")),
              HasSubstr("is also hf_weights_dir (\"" + dir +
                        "/.\"), an input: writing there would overwrite it"));
  EXPECT_THAT(message(CheckHfExportFolder(dir + "/config.json", {}, "save_hf_dir")),
              HasSubstr("exists and is a regular file, not a folder"));
  std::system(("echo notes > " + dir + "/notes.txt").c_str());
  EXPECT_THAT(message(CheckHfExportFolder(dir, {}, "save_hf_dir")),
              HasSubstr("holds \"notes.txt\", which a plait export did not write"));
  EXPECT_THAT(message(CheckHfExportFolder(dir + "/config.json/x", {}, "save_hf_dir")),
              HasSubstr("is not a folder"));
}

// A folder a model was downloaded into holds the names an export writes, without plait's
// mark: neither the check nor the export itself replaces a byte of it.
TEST(HfCheckpointTest, ADownloadedModelsFolderIsNeverAnEarlierExport) {
  std::shared_ptr<CausalLM> model =
      CausalLM::Create(PresetConfig("tiny").value(), InitConfig()).value();
  const std::string dir = Folder("downloaded", model->config(), Weights(*model));
  const std::string config = base::ReadFile(dir + "/config.json").value();
  const std::string weights = base::ReadFile(dir + "/model.safetensors").value();

  const std::vector<base::Violation> violations = CheckHfExportFolder(dir, {}, "save_hf_dir");
  ASSERT_EQ(violations.size(), 1u);
  EXPECT_THAT(violations[0].ToString(), HasSubstr("which a plait export did not write"));
  EXPECT_THAT(SaveHfModel(*model, dir), StatusIs(absl::StatusCode::kFailedPrecondition,
                                                 HasSubstr("which a plait export did not write")));
  EXPECT_EQ(base::ReadFile(dir + "/config.json").value(), config);
  EXPECT_EQ(base::ReadFile(dir + "/model.safetensors").value(), weights);
}

}  // namespace
}  // namespace plait::models
