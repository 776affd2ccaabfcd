#include "generation/generate.h"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "base/file.h"
#include "base/status_matchers.h"
#include "base/test_paths.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/causal_lm.h"
#include "models/model_config.h"
#include "models/testing_models.h"
#include "torch/csrc/autograd/grad_mode.h"

namespace plait::generation {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::base::testing::StatusIs;
using ::testing::HasSubstr;

SamplingConfig Greedy(int max_new_tokens) {
  SamplingConfig config;
  config.set_max_new_tokens(max_new_tokens);
  return config;
}

const std::vector<std::vector<int64_t>> kPrompts = {{5, 17, 300, 9, 41}, {7}, {1000, 2, 3}};

// Greedy decoding with the cache draws what the full forward of each prompt alone, run again
// for every new token, makes most likely; each log-probability is that forward's.
TEST(GenerateTest, GreedyEqualsTheFullForwardOfEachPromptAlone) {
  for (const std::string preset : {"tiny", "qwen3-moe-tiny"}) {
    std::shared_ptr<models::CausalLM> model = models::testing::SeededModel(preset, 5);
    absl::StatusOr<std::vector<Completion>> completions = Generate(*model, kPrompts, Greedy(8));
    ASSERT_THAT(completions, IsOk());
    ASSERT_EQ(completions->size(), kPrompts.size());
    at::NoGradGuard no_grad;
    for (size_t p = 0; p < kPrompts.size(); ++p) {
      const Completion& completion = (*completions)[p];
      EXPECT_EQ(completion.prompt, static_cast<int64_t>(p));
      EXPECT_EQ(completion.stop, StopReason::kMaxNewTokens);
      ASSERT_EQ(completion.tokens.size(), 8u);
      std::vector<int64_t> sequence = kPrompts[p];
      for (size_t i = 0; i < completion.tokens.size(); ++i) {
        const at::Tensor logits =
            model->Forward(at::tensor(sequence, at::kLong).unsqueeze(0))[0][-1];
        EXPECT_EQ(completion.tokens[i], logits.argmax().item<int64_t>()) << preset << " " << p;
        EXPECT_NEAR(completion.logprobs[i],
                    logits.log_softmax(0)[completion.tokens[i]].item<float>(), 1e-5);
        EXPECT_EQ(completion.sampling_logprobs[i], 0.0f);
        sequence.push_back(completion.tokens[i]);
      }
    }
  }
}

// Sampled: prompt 0's completions are the same alone and with 15 other prompts in the batch.
TEST(GenerateTest, ACompletionIsTheSameAloneAndInABatchOf16) {
  std::shared_ptr<models::CausalLM> model = models::testing::SeededModel("tiny", 5);
  SamplingConfig config;
  config.set_temperature(1.0);
  config.set_top_p(0.95);
  config.set_max_new_tokens(12);
  config.set_seed(3);
  std::vector<std::vector<int64_t>> batch = {kPrompts[0]};
  for (int64_t i = 1; i < 16; ++i) batch.push_back(std::vector<int64_t>(1 + i % 6, 10 * i));
  absl::StatusOr<std::vector<Completion>> alone = Generate(*model, {kPrompts[0]}, config);
  absl::StatusOr<std::vector<Completion>> together = Generate(*model, batch, config);
  ASSERT_THAT(alone, IsOk());
  ASSERT_THAT(together, IsOk());
  ASSERT_EQ(together->size(), 16u);
  EXPECT_EQ((*alone)[0].tokens, (*together)[0].tokens);
  for (size_t i = 0; i < (*alone)[0].logprobs.size(); ++i) {
    EXPECT_NEAR((*alone)[0].logprobs[i], (*together)[0].logprobs[i], 1e-5);
    EXPECT_LE((*alone)[0].logprobs[i], 0.0f);
    EXPECT_GE((*alone)[0].sampling_logprobs[i], (*alone)[0].logprobs[i] - 1e-4);  // top-p's
  }
  // Another seed draws another completion; two samples of one prompt differ.
  config.set_seed(4);
  config.set_num_samples(2);
  absl::StatusOr<std::vector<Completion>> reseeded = Generate(*model, {kPrompts[0]}, config);
  ASSERT_THAT(reseeded, IsOk());
  ASSERT_EQ(reseeded->size(), 2u);
  EXPECT_EQ((*reseeded)[1].sample, 1);
  EXPECT_NE((*reseeded)[0].tokens, (*alone)[0].tokens);
  EXPECT_NE((*reseeded)[0].tokens, (*reseeded)[1].tokens);
}

// A completion stops at an end-of-sequence id or a stop string, keeping it.
TEST(GenerateTest, StopsAtAnEndOfSequenceIdOrAStopString) {
  std::shared_ptr<models::CausalLM> model = models::testing::SeededModel("tiny", 5);
  absl::StatusOr<std::vector<Completion>> free = Generate(*model, kPrompts, Greedy(6));
  ASSERT_THAT(free, IsOk());
  const std::vector<int64_t>& first = (*free)[0].tokens;
  GenerateOptions options;
  options.end_of_sequence = {first[2]};
  absl::StatusOr<std::vector<Completion>> ended = Generate(*model, kPrompts, Greedy(6), options);
  ASSERT_THAT(ended, IsOk());
  const auto upto = [&](size_t n) {
    return std::vector<int64_t>(first.begin(), first.begin() + n);
  };
  const size_t eos_at = std::find(first.begin(), first.end(), first[2]) - first.begin() + 1;
  EXPECT_EQ((*ended)[0].tokens, upto(eos_at));
  EXPECT_EQ((*ended)[0].stop, StopReason::kEndOfSequence);

  // Text: each id as "<id>"; stop at the text of its second token.
  SamplingConfig config = Greedy(6);
  config.add_stop_strings(absl::StrCat("<", first[1], ">"));
  options.end_of_sequence.clear();
  options.detokenize = [](const std::vector<int64_t>& ids) -> absl::StatusOr<std::string> {
    std::string text;
    for (int64_t id : ids) absl::StrAppend(&text, "<", id, ">");
    return text;
  };
  absl::StatusOr<std::vector<Completion>> stopped = Generate(*model, kPrompts, config, options);
  ASSERT_THAT(stopped, IsOk());
  const size_t stop_at = std::find(first.begin(), first.end(), first[1]) - first.begin() + 1;
  EXPECT_EQ((*stopped)[0].tokens, upto(stop_at));
  EXPECT_EQ((*stopped)[0].stop, StopReason::kStopString);
  EXPECT_EQ(StopReasonName((*stopped)[0].stop), "stop_string");
}

// Prompts generated in two batches draw what they draw in one: a prompt's draws are seeded
// by its index among all of them.
TEST(GenerateTest, BatchesOfPromptsDrawAsOneBatch) {
  std::shared_ptr<models::CausalLM> model = models::testing::SeededModel("tiny", 5);
  SamplingConfig config;
  config.set_temperature(1.0);
  config.set_max_new_tokens(6);
  config.set_seed(9);
  absl::StatusOr<std::vector<Completion>> one = Generate(*model, kPrompts, config);
  absl::StatusOr<std::vector<Completion>> second =
      Generate(*model, {kPrompts[1], kPrompts[2]}, config, {.first_prompt = 1});
  ASSERT_THAT(one, IsOk());
  ASSERT_THAT(second, IsOk());
  ASSERT_EQ(second->size(), 2u);
  EXPECT_EQ((*second)[0].prompt, 1);
  EXPECT_EQ((*second)[0].tokens, (*one)[1].tokens);
  EXPECT_EQ((*second)[1].tokens, (*one)[2].tokens);
}

TEST(EndOfSequenceIdsTest, ReadsGenerationConfigThenConfig) {
  const std::string dir = base::testing::FreshTestDir("eos");
  std::filesystem::create_directories(dir);
  ASSERT_THAT(EndOfSequenceIds(dir), IsOk());
  EXPECT_TRUE(EndOfSequenceIds(dir)->empty());
  ASSERT_THAT(base::WriteFileAtomically(dir + "/config.json", R"({"eos_token_id": 2})"), IsOk());
  EXPECT_EQ(*EndOfSequenceIds(dir), std::vector<int64_t>({2}));
  ASSERT_THAT(base::WriteFileAtomically(dir + "/generation_config.json",
                                        R"({"eos_token_id": [151645, 151643]})"),
              IsOk());
  EXPECT_EQ(*EndOfSequenceIds(dir), std::vector<int64_t>({151645, 151643}));
  ASSERT_THAT(
      base::WriteFileAtomically(dir + "/generation_config.json", R"({"eos_token_id": [2, 2.5]})"),
      IsOk());
  EXPECT_THAT(EndOfSequenceIds(dir),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("generation_config.json: eos_token_id[1]: expected an integer")));
  ASSERT_THAT(
      base::WriteFileAtomically(dir + "/generation_config.json", R"({"eos_token_id": "</s>"})"),
      IsOk());
  EXPECT_THAT(EndOfSequenceIds(dir),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("generation_config.json: eos_token_id: expected an integer, "
                                 "got \"</s>\"")));
}

TEST(GenerateTest, NamesWhatIsWrong) {
  std::shared_ptr<models::CausalLM> model = models::testing::SeededModel("tiny", 5);
  EXPECT_THAT(Generate(*model, {{1, 2}, {}}, Greedy(4)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("prompt 1 is empty")));
  EXPECT_THAT(Generate(*model, {{1, 4096}}, Greedy(4)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("prompt 0: token 1 is 4096, not an id below the model's "
                                 "vocabulary size 4096")));
  EXPECT_THAT(Generate(*model, {{1}}, Greedy(0)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("sampling.max_new_tokens: must be at least 1")));
  SamplingConfig config = Greedy(4);
  config.add_stop_strings("\n");
  EXPECT_THAT(Generate(*model, {{1}}, config),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("sampling.stop_strings")));
}

}  // namespace
}  // namespace plait::generation
