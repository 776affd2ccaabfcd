// StepItems and MetricMeans on a dp x tp mesh of ranks as threads: the step's items are summed
// over the data-parallel dimension only, each micro-batch's mean is scaled by its share of
// them (bit for bit the old division by the accumulation when the shares are equal), a
// micro-batch with no item adds nothing, a step with none is an error, and the logged means
// weigh each micro-batch by its items.
#include "objectives/step_items.h"

#include <vector>

#include "ATen/core/Tensor.h"
#include "base/status_matchers.h"
#include "base/text_proto.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "objectives/metric_means.h"
#include "parallel/device_mesh.h"
#include "parallel/test_ranks.h"
#include "torch/csrc/autograd/generated/variable_factories.h"

namespace plait::objectives {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::base::testing::StatusIs;
using ::testing::HasSubstr;

// dp 2 x tp 2: ranks 0 and 1 are dp rank 0, ranks 2 and 3 dp rank 1.
parallel::MeshLayout DpTp() {
  parallel::MeshConfig config;
  EXPECT_THAT(base::ParseTextProto(R"pb(dims { name: "dp" size: 2 }
                                        dims { name: "tp" size: 2 })pb",
                                   "DpTp", config),
              IsOk());
  return parallel::MeshLayout::Create(config, 4).value();
}

int DpRank(int rank) { return rank / 2; }

TEST(StepItemsTest, CountsOverTheDataParallelRanksAndScalesEachMeanByItsShare) {
  parallel::testing::RunOnRingMesh(DpTp(), [](int rank, parallel::DeviceMesh& mesh) {
    // dp rank 0 scores 3 then 0 items, dp rank 1 scores 5 then 12: the step scores 20.
    const std::vector<int64_t> items =
        DpRank(rank) == 0 ? std::vector<int64_t>{3, 0} : std::vector<int64_t>{5, 12};
    absl::StatusOr<StepItems> step = StepItems::Count(items, mesh, {"dp"});
    ASSERT_THAT(step, IsOk());
    EXPECT_EQ(step->total(), 20);
    // Each micro-batch's over the dp ranks, the same on every rank (not summed over "tp", whose
    // ranks score the same items).
    EXPECT_EQ(step->global_items(0), 8);
    EXPECT_EQ(step->global_items(1), 12);
    // Micro-batch 0 of dp rank 1 holds 5 of the 20 items; DDP then halves its gradient.
    const at::Tensor mean = torch::tensor(1.5f, at::requires_grad());
    const at::Tensor scaled = step->ScaledForBackward(mean, 0);
    EXPECT_FLOAT_EQ(scaled.item<float>(), 1.5f * items[0] * 2 / 20);
    // Nothing scored: 0 and a zero gradient, even from a loss that is not 0.
    const at::Tensor none = step->ScaledForBackward(mean, 1);
    if (items[1] == 0) {
      EXPECT_EQ(none.item<float>(), 0.0f);
      none.backward();
      EXPECT_EQ(mean.grad().item<float>(), 0.0f);
    }
  });
}

TEST(StepItemsTest, EqualSharesScaleAsTheDivisionByTheAccumulation) {
  parallel::testing::RunOnRingMesh(DpTp(), [](int, parallel::DeviceMesh& mesh) {
    absl::StatusOr<StepItems> step = StepItems::Count({7, 7, 7}, mesh, {"dp"});
    ASSERT_THAT(step, IsOk());
    const at::Tensor mean = torch::tensor(2.3456789f, at::requires_grad());
    const at::Tensor scaled = step->ScaledForBackward(mean, 2);
    scaled.backward();
    const at::Tensor reference = torch::tensor(2.3456789f, at::requires_grad());
    const at::Tensor divided = reference / 3;
    divided.backward();
    EXPECT_EQ(scaled.item<float>(), divided.item<float>());
    EXPECT_EQ(mean.grad().item<float>(), reference.grad().item<float>());
  });
}

TEST(StepItemsTest, AStepThatScoresNothingIsAnErrorOnEveryRank) {
  parallel::testing::RunOnRingMesh(DpTp(), [](int, parallel::DeviceMesh& mesh) {
    EXPECT_THAT(StepItems::Count({0, 0}, mesh, {"dp"}),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         HasSubstr("none of the step's 2 micro-batches on 2 data-parallel")));
  });
}

TEST(MetricMeansTest, WeighsEachMicroBatchByItsItems) {
  parallel::testing::RunOnRingMesh(DpTp(), [](int rank, parallel::DeviceMesh& mesh) {
    MetricMeans means;
    // dp rank 0: a mean of 1 over 3 items and an empty batch; dp rank 1: 2 over 1 item.
    if (DpRank(rank) == 0) {
      means.Add({torch::tensor(1.0f), {{"m", torch::tensor(10.0f)}}}, 3);
      means.Add({torch::tensor(0.0f), {{"m", torch::tensor(0.0f)}}}, 0);
    } else {
      means.Add({torch::tensor(2.0f), {{"m", torch::tensor(30.0f)}}}, 1);
    }
    absl::StatusOr<MeanMetrics> mean = means.Mean(mesh);
    ASSERT_THAT(mean, IsOk());
    EXPECT_NEAR(mean->loss, (3 * 1.0 + 2.0) / 4, 1e-6);
    ASSERT_EQ(mean->metrics.size(), 1u);
    EXPECT_EQ(mean->metrics[0].first, "m");
    EXPECT_NEAR(mean->metrics[0].second, (3 * 10.0 + 30.0) / 4, 1e-5);
  });
}

// A rank that computes no loss (a pipeline stage before the last) adds nothing, yet knows the
// metrics' names, so every rank reduces alike and reports the others' means.
TEST(MetricMeansTest, ARankThatAddsNothingReportsTheNamedMetrics) {
  parallel::testing::RunOnRingMesh(DpTp(), [](int rank, parallel::DeviceMesh& mesh) {
    MetricMeans means({"m", "n"});
    if (DpRank(rank) == 1) {
      means.Add({torch::tensor(2.0f), {{"m", torch::tensor(30.0f)}, {"n", torch::tensor(4.0f)}}},
                2);
    }
    absl::StatusOr<MeanMetrics> mean = means.Mean(mesh);
    ASSERT_THAT(mean, IsOk());
    EXPECT_NEAR(mean->loss, 2.0, 1e-6);
    ASSERT_EQ(mean->metrics.size(), 2u);
    EXPECT_EQ(mean->metrics[0].first, "m");
    EXPECT_NEAR(mean->metrics[0].second, 30.0, 1e-5);
    EXPECT_EQ(mean->metrics[1].first, "n");
    EXPECT_NEAR(mean->metrics[1].second, 4.0, 1e-6);
  });
}

TEST(MetricMeansTest, NoItemAnywhereIsAnError) {
  parallel::testing::RunOnRingMesh(DpTp(), [](int, parallel::DeviceMesh& mesh) {
    MetricMeans means;
    means.Add({torch::tensor(0.0f), {}}, 0);
    EXPECT_THAT(means.Mean(mesh), StatusIs(absl::StatusCode::kFailedPrecondition,
                                           HasSubstr("no rank's batches score an item")));
  });
}

}  // namespace
}  // namespace plait::objectives
