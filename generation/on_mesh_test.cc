// Generation on a prepared model against one process. Under FSDP over 2 ranks (gathered a
// block at a time, and once for the phase), tensor parallelism over 2 (with a vocabulary
// padded to split), both on a 2 x 2 mesh, and LoRA adapters: the KV-cache path's logits at
// every position equal the same model's full forward, and GenerateOnMesh's completions (each
// data-parallel rank generating its own prompts, every rank receiving all) equal those one
// process generates with the same weights.
#include "generation/on_mesh.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "base/status_matchers.h"
#include "generation/generate.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "models/causal_lm.h"
#include "models/estimates.h"
#include "models/kv_cache.h"
#include "models/model_config.h"
#include "parallel/test_ranks.h"
#include "prepared/prepared_model.h"
#include "torch/csrc/autograd/grad_mode.h"

namespace plait::generation {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::base::testing::StatusIs;
using ::testing::HasSubstr;

constexpr int64_t kNewTokens = 6;
const std::vector<std::vector<int64_t>> kPrompts = {
    {5, 17, 300, 9, 41}, {7}, {1000, 2, 3}, {4000, 12, 12, 12, 90, 1, 77}, {64, 64}};

// A layout of the model's preparation: its mesh and steps, one PrepareStep text each.
struct Layout {
  std::string name;
  std::vector<std::pair<std::string, int>> dims;
  std::vector<std::string> steps;
  bool keep_gathered = false;
};

models::ModelSpec Spec(int64_t vocab) {
  models::ModelSpec spec;
  absl::StatusOr<models::ModelConfig> config = models::PresetConfig("tiny");
  EXPECT_THAT(config, IsOk());
  *spec.mutable_config() = *config;
  spec.mutable_config()->set_vocab_size(vocab);
  spec.mutable_init()->set_seed(9);
  return spec;
}

google::protobuf::RepeatedPtrField<wrap::PrepareStep> Steps(const Layout& layout) {
  google::protobuf::RepeatedPtrField<wrap::PrepareStep> steps;
  for (const std::string& text : layout.steps) {
    EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, steps.Add())) << text;
  }
  return steps;
}

// Runs `body(rank, mesh, prepared)` on every rank of `layout`'s mesh (ring communicators on
// loopback), `prepared` being `spec`'s model prepared by `layout`'s steps as `role`.
void OnPreparedRanks(
    const Layout& layout, const models::ModelSpec& spec, prepared::Role role,
    const std::function<void(int, parallel::DeviceMesh&, prepared::PreparedModel&)>& body) {
  parallel::MeshConfig mesh_config;
  int world = 1;
  for (const auto& [name, size] : layout.dims) {
    parallel::MeshConfig::Dimension* dim = mesh_config.add_dims();
    dim->set_name(name);
    dim->set_size(size);
    world *= size;
  }
  absl::StatusOr<parallel::MeshLayout> mesh_layout =
      parallel::MeshLayout::Create(mesh_config, world);
  ASSERT_THAT(mesh_layout, IsOk());
  parallel::testing::RunOnRingMesh(*mesh_layout, [&](int rank, parallel::DeviceMesh& mesh) {
    absl::StatusOr<std::unique_ptr<prepared::PreparedModel>> prepared =
        prepared::PreparedModel::Prepare(spec, spec.config(), "", Steps(layout), mesh, role,
                                         "plan");
    ASSERT_THAT(prepared, IsOk()) << layout.name;
    body(rank, mesh, **prepared);
  });
}

// Gives the adapters of a LoRA model values that change what it computes (PEFT starts B at 0).
void PerturbAdapters(prepared::PreparedModel& prepared) {
  at::NoGradGuard no_grad;
  at::manual_seed(4);
  for (const parallel::TrainableParameter& adapter : prepared.trainable_parameters()) {
    adapter.tensor.copy_(at::randn_like(adapter.tensor) * 0.05);
  }
}

// The largest difference between the logits of kPrompts decoded in one batch (left-padded,
// then kNewTokens tokens one at a time) and those the model's full forward gives each row
// alone, whole vocabulary: every rank of the model's mesh calls it.
double LargestDecodeDifference(models::CausalLM& model) {
  at::NoGradGuard no_grad;
  const auto rows = static_cast<int64_t>(kPrompts.size());
  int64_t longest = 0;
  for (const std::vector<int64_t>& prompt : kPrompts) {
    longest = std::max<int64_t>(longest, static_cast<int64_t>(prompt.size()));
  }
  at::Tensor pads = at::empty({rows}, at::kLong);
  at::Tensor prompts = at::zeros({rows, longest}, at::kLong);
  std::vector<std::vector<int64_t>> sequences = kPrompts;
  for (int64_t r = 0; r < rows; ++r) {
    const auto length = static_cast<int64_t>(kPrompts[r].size());
    pads[r] = longest - length;
    for (int64_t i = 0; i < length; ++i) prompts[r][longest - length + i] = kPrompts[r][i];
    for (int64_t i = 0; i < kNewTokens; ++i) sequences[r].push_back((r * 131 + i * 17) % 4000);
  }
  models::KvCache cache(pads, longest + kNewTokens);
  std::vector<at::Tensor> decoded = {model.Decode(prompts, cache)};
  for (int64_t i = 0; i < kNewTokens; ++i) {
    at::Tensor next = at::empty({rows, 1}, at::kLong);
    for (int64_t r = 0; r < rows; ++r) next[r][0] = sequences[r][kPrompts[r].size() + i];
    decoded.push_back(model.Decode(next, cache));
  }
  const at::Tensor logits = at::cat(decoded, 1);
  double largest = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    const auto own = static_cast<int64_t>(sequences[r].size());
    const at::Tensor alone = model.seams().WholeLogits(
        model.Forward(at::tensor(sequences[r], at::kLong).unsqueeze(0)))[0];
    EXPECT_EQ(alone.size(-1), model.config().vocab_size());
    const at::Tensor batched = logits[r].narrow(0, pads[r].item<int64_t>(), own);
    largest = std::max(largest, (alone - batched).abs().max().item<double>());
  }
  return largest;
}

SamplingConfig Sampled() {
  SamplingConfig config;
  config.set_max_new_tokens(kNewTokens);
  config.set_temperature(0.8);
  config.set_top_p(0.9);
  config.set_num_samples(2);
  config.set_seed(21);
  return config;
}

void ExpectSameCompletions(const std::vector<Completion>& actual,
                           const std::vector<Completion>& expected, const std::string& layout) {
  ASSERT_EQ(actual.size(), expected.size()) << layout;
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(actual[i].prompt, expected[i].prompt) << layout << " " << i;
    EXPECT_EQ(actual[i].sample, expected[i].sample) << layout << " " << i;
    EXPECT_EQ(actual[i].stop, expected[i].stop) << layout << " " << i;
    EXPECT_EQ(actual[i].tokens, expected[i].tokens) << layout << " " << i;
    ASSERT_EQ(actual[i].logprobs.size(), expected[i].logprobs.size()) << layout << " " << i;
    for (size_t t = 0; t < expected[i].logprobs.size(); ++t) {
      EXPECT_NEAR(actual[i].logprobs[t], expected[i].logprobs[t], 1e-4) << layout << " " << i;
      EXPECT_NEAR(actual[i].sampling_logprobs[t], expected[i].sampling_logprobs[t], 1e-4)
          << layout << " " << i;
    }
  }
}

// What one process generates from `spec`'s model: the completions of kPrompts.
std::vector<Completion> OneProcess(const models::ModelSpec& spec) {
  absl::StatusOr<std::shared_ptr<models::CausalLM>> model =
      models::CausalLM::Create(spec.config(), spec.init());
  EXPECT_THAT(model, IsOk());
  absl::StatusOr<std::vector<Completion>> completions = Generate(**model, kPrompts, Sampled());
  EXPECT_THAT(completions, IsOk());
  return completions.value_or(std::vector<Completion>());
}

class OnMeshTest : public ::testing::TestWithParam<Layout> {};

TEST_P(OnMeshTest, DecodesAndGeneratesAsOneProcess) {
  const Layout& layout = GetParam();
  // A vocabulary that tensor parallelism pads to split over 2 ranks.
  const models::ModelSpec spec = Spec(layout.name == "tp2_padded" ? 4093 : 4096);
  const std::vector<Completion> expected = OneProcess(spec);
  OnPreparedRanks(
      layout, spec, prepared::Role::kFrozen,
      [&](int rank, parallel::DeviceMesh& mesh, prepared::PreparedModel& model) {
        wrap::Preparation& preparation = model.preparation();
        EXPECT_LT(LargestDecodeDifference(model.model()), 1e-5) << layout.name << " " << rank;
        preparation.ResetPeak();
        absl::StatusOr<std::vector<Completion>> completions = GenerateOnMesh(
            model, mesh, kPrompts, Sampled(), GenerateOptions(), layout.keep_gathered);
        ASSERT_THAT(completions, IsOk());
        ExpectSameCompletions(*completions, expected, layout.name);
        // Gathered once, every unit is whole at the end of the phase; block by block, the root and
        // two blocks at most; and nothing stays gathered after it.
        if (!layout.dims.empty() && layout.dims.front().first == "dp") {
          // fp32, each tensor-parallel rank's slices.
          const int64_t split = layout.dims.size() > 1 ? layout.dims.back().second : 1;
          const int64_t whole_bytes = models::NumParameters(spec.config()) * 4 / split;
          EXPECT_EQ(preparation.peak_gathered_bytes() >= whole_bytes, layout.keep_gathered)
              << layout.name << ": " << preparation.peak_gathered_bytes() << " of " << whole_bytes;
        }
        EXPECT_EQ(preparation.gathered_bytes(), 0) << layout.name;
      });
}

const char kFsdp[] = "fsdp { mesh_dim: 'dp' }";
const char kTp[] = "tensor_parallel { mesh_dim: 'tp' }";

INSTANTIATE_TEST_SUITE_P(
    Layouts, OnMeshTest,
    ::testing::Values(Layout{"one_process", {}, {}},
                      Layout{"fsdp2_block_by_block", {{"dp", 2}}, {kFsdp}},
                      Layout{"fsdp2_gathered_once", {{"dp", 2}}, {kFsdp}, true},
                      Layout{"tp2", {{"tp", 2}}, {kTp}},
                      Layout{"tp2_padded",
                             {{"tp", 2}},
                             {"tensor_parallel { mesh_dim: 'tp' pad_vocab_to_multiple: true }"}},
                      Layout{"fsdp2_x_tp2", {{"dp", 2}, {"tp", 2}}, {kTp, kFsdp}, true}),
    [](const ::testing::TestParamInfo<Layout>& info) { return info.param.name; });

// LoRA's adapters change what every projection computes: decoding through them equals their
// full forward, and generating through them equals generating with them merged into the base.
TEST(OnMeshLoraTest, DecodesThroughTheAdaptersAsTheMergedModel) {
  const models::ModelSpec spec = Spec(4096);
  const Layout lora = {"lora",
                       {},
                       {"lora { rank: 4 alpha: 8 target: '*q_proj' target: '*v_proj' "
                        "target: '*down_proj' seed: 3 }"}};
  OnPreparedRanks(lora, spec, prepared::Role::kTrained,
                  [&](int, parallel::DeviceMesh& mesh, prepared::PreparedModel& model) {
                    PerturbAdapters(model);
                    EXPECT_LT(LargestDecodeDifference(model.model()), 1e-5);
                    absl::StatusOr<std::vector<Completion>> adapted =
                        GenerateOnMesh(model, mesh, kPrompts, Sampled(), GenerateOptions(), false);
                    ASSERT_THAT(adapted, IsOk());

                    absl::StatusOr<std::map<std::string, at::Tensor>> merged =
                        model.preparation().MergedParameters();
                    ASSERT_THAT(merged, IsOk());
                    absl::StatusOr<std::shared_ptr<models::CausalLM>> plain =
                        models::CausalLM::Create(spec.config(), spec.init());
                    ASSERT_THAT(plain, IsOk());
                    at::NoGradGuard no_grad;
                    for (const auto& item : (*plain)->named_parameters()) {
                      ASSERT_TRUE(merged->count(item.key())) << item.key();
                      item.value().copy_(merged->at(item.key()));
                    }
                    absl::StatusOr<std::vector<Completion>> expected =
                        Generate(**plain, kPrompts, Sampled());
                    ASSERT_THAT(expected, IsOk());
                    ExpectSameCompletions(*adapted, *expected, "lora");
                    // The adapters change what is drawn.
                    const std::vector<Completion> base = OneProcess(spec);
                    bool changed = false;
                    for (size_t i = 0; i < base.size(); ++i)
                      changed |= base[i].tokens != (*adapted)[i].tokens;
                    EXPECT_TRUE(changed);
                  });
}

// A model whose steps split every forward's tokens cannot decode a token at a time: refused
// before any decoding, on every rank, saying why.
TEST(OnMeshTest, RefusesSequenceParallelism) {
  const Layout sequence_parallel = {
      "sp", {{"tp", 2}}, {"tensor_parallel { mesh_dim: 'tp' sequence_parallel: true }"}};
  OnPreparedRanks(
      sequence_parallel, Spec(4096), prepared::Role::kFrozen,
      [&](int, parallel::DeviceMesh& mesh, prepared::PreparedModel& model) {
        EXPECT_THAT(
            GenerateOnMesh(model, mesh, kPrompts, Sampled(), GenerateOptions(), false),
            StatusIs(absl::StatusCode::kFailedPrecondition,
                     HasSubstr("this model cannot generate: tensor_parallel.sequence_parallel")));
      });
}

// A rank whose decoding fails (here its stop strings' text cannot be read) stops every rank at
// that token, rather than leaving its peers waiting in the next gather.
TEST(OnMeshTest, ARankThatFailsWhileDecodingStopsEveryRank) {
  SamplingConfig config = Sampled();
  config.add_stop_strings("never");
  OnPreparedRanks(
      {"fsdp2", {{"dp", 2}}, {kFsdp}}, Spec(4096), prepared::Role::kFrozen,
      [&](int rank, parallel::DeviceMesh& mesh, prepared::PreparedModel& model) {
        GenerateOptions options;
        options.detokenize =
            [rank](const std::vector<int64_t>& ids) -> absl::StatusOr<std::string> {
          if (rank == 1 && ids.size() == 2) return absl::DataLossError("no text for these ids");
          return std::string("text");
        };
        const absl::StatusOr<std::vector<Completion>> completions =
            GenerateOnMesh(model, mesh, kPrompts, config, options, false);
        if (rank == 1) {
          EXPECT_THAT(completions, StatusIs(absl::StatusCode::kDataLoss,
                                            HasSubstr("prompt 3 sample 0: no text for these ids")));
        } else {
          EXPECT_THAT(completions, StatusIs(absl::StatusCode::kAborted,
                                            HasSubstr("generation failed on another rank")));
        }
      });
}

}  // namespace
}  // namespace plait::generation
