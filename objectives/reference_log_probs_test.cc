#include "objectives/reference_log_probs.h"

#include <memory>
#include <vector>

#include "ATen/core/Tensor.h"
#include "ATen/ops/equal.h"
#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/causal_lm.h"
#include "models/model_config.h"
#include "torch/csrc/autograd/generated/variable_factories.h"

namespace plait::objectives {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::base::testing::StatusIs;
using ::testing::HasSubstr;

std::shared_ptr<models::CausalLM> TinyModel() {
  absl::StatusOr<models::ModelConfig> config = models::PresetConfig("tiny");
  EXPECT_THAT(config, IsOk());
  absl::StatusOr<std::shared_ptr<models::CausalLM>> model =
      models::CausalLM::Create(*config, models::InitConfig());
  EXPECT_THAT(model, IsOk());
  return *model;
}

// A row per entry of `firsts`: tokens first .. first + 7, the last half scored.
data::Batch Rows(const std::vector<int64_t>& firsts) {
  const int64_t T = 8;
  data::Batch batch{
      torch::zeros({static_cast<int64_t>(firsts.size()), T}, at::kLong),
      torch::full({static_cast<int64_t>(firsts.size()), T}, data::kIgnoreTarget, at::kLong)};
  for (size_t r = 0; r < firsts.size(); ++r) {
    batch.inputs[r] = torch::arange(firsts[r], firsts[r] + T, at::kLong);
    batch.targets[r].narrow(0, T / 2, T / 2) =
        torch::arange(firsts[r] + T / 2 + 1, firsts[r] + T + 1, at::kLong);
  }
  return batch;
}

TEST(ReferenceLogProbsTest, FindsEveryRowAddedInAnyBatchBitForBit) {
  auto reference = TinyModel();
  ReferenceLogProbs table;
  table.Add(*reference, Rows({1, 20}));
  table.Add(*reference, Rows({40, 1}));  // the first row again
  EXPECT_EQ(table.rows(), 3);
  // Rows of two batches, in another order and composition than they were added in.
  const data::Batch mixed = Rows({40, 20, 1});
  const absl::StatusOr<at::Tensor> found = table.Find(mixed);
  ASSERT_THAT(found, IsOk());
  const at::Tensor expected = ReferenceLogProbs::Compute(*reference, mixed);
  EXPECT_TRUE(at::equal(*found, expected)) << *found << expected;
}

TEST(ReferenceLogProbsTest, ARowWithOtherScoredTargetsIsAnotherRow) {
  auto reference = TinyModel();
  ReferenceLogProbs table;
  table.Add(*reference, Rows({1}));
  data::Batch rescored = Rows({1});
  rescored.targets[0][0] = 2;  // the same tokens, one more target scored
  EXPECT_THAT(table.Find(rescored),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("sequence 0 of the batch has no precomputed reference "
                                 "log-probability (1 sequences were precomputed)")));
}

}  // namespace
}  // namespace plait::objectives
