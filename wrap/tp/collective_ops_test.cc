// Tensor parallelism's autograd operators on 2 ranks (threads over TCP): each forward and
// backward against what one process computes on the whole tensors, and the
// vocabulary-parallel cross-entropy and its gradient against torch's cross_entropy on the
// gathered logits.
#include "wrap/tp/collective_ops.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "ATen/core/Tensor.h"
#include "ATen/ops/allclose.h"
#include "ATen/ops/equal.h"
#include "ATen/ops/isfinite.h"
#include "base/allocation_counter.h"
#include "base/status_matchers.h"
#include "gtest/gtest.h"
#include "parallel/device_mesh.h"
#include "parallel/test_ranks.h"
#include "torch/csrc/autograd/generated/variable_factories.h"
#include "torch/nn/functional/loss.h"

namespace plait::wrap::tp {
namespace {

using ::plait::base::testing::IsOk;

constexpr int kRanks = 2;

parallel::MeshLayout Layout() {
  parallel::MeshConfig config;
  auto* dim = config.add_dims();
  dim->set_name("tp");
  dim->set_size(kRanks);
  return parallel::MeshLayout::Create(config, kRanks).value();
}

// Runs `body(rank, group)` on every rank.
void OnRanks(const std::function<void(int, parallel::GraphGroup&)>& body) {
  parallel::testing::RunOnRingMesh(Layout(), [&](int rank, parallel::DeviceMesh& mesh) {
    parallel::GraphGroup group(**mesh.communicator("tp"));
    body(rank, group);
    EXPECT_THAT(group.status(), IsOk());
  });
}

// Per rank, a distinct input and output gradient of shape [2, 4, 3].
at::Tensor Input(int rank) { return torch::arange(24, at::kFloat).view({2, 4, 3}) * (rank + 1); }
at::Tensor OutputGrad(int rank) { return torch::full({2, 4, 3}, 0.5f + rank); }

TEST(CollectiveOpsTest, CopyToRegionSumsTheGradient) {
  OnRanks([](int rank, parallel::GraphGroup& group) {
    const at::Tensor x = Input(rank).requires_grad_();
    const at::Tensor y = CopyToRegion(x, group);
    EXPECT_TRUE(at::equal(y, x));
    y.backward(OutputGrad(rank));
    EXPECT_TRUE(at::allclose(x.grad(), OutputGrad(0) + OutputGrad(1)));
  });
}

TEST(CollectiveOpsTest, ReduceFromRegionSumsTheForward) {
  OnRanks([](int rank, parallel::GraphGroup& group) {
    const at::Tensor x = Input(rank).requires_grad_();
    const at::Tensor y = ReduceFromRegion(x, group);
    EXPECT_TRUE(at::allclose(y, Input(0) + Input(1)));
    y.backward(OutputGrad(rank));
    EXPECT_TRUE(at::equal(x.grad(), OutputGrad(rank)));
  });
}

TEST(CollectiveOpsTest, SequenceGatherAndReduceScatterAreConjugate) {
  OnRanks([](int rank, parallel::GraphGroup& group) {
    // Gather: rank r's slice [2, 2, 3] lands at positions 2r, 2r + 1.
    const at::Tensor full = Input(0);
    const at::Tensor slice = full.narrow(1, 2 * rank, 2).clone().requires_grad_();
    const at::Tensor gathered = GatherSequence(slice, group);
    EXPECT_TRUE(at::equal(gathered, full));
    gathered.backward(OutputGrad(rank));
    EXPECT_TRUE(at::allclose(slice.grad(), (OutputGrad(0) + OutputGrad(1)).narrow(1, 2 * rank, 2)));

    const at::Tensor x = Input(rank).requires_grad_();
    const at::Tensor scattered = ReduceScatterSequence(x, group);
    EXPECT_TRUE(at::allclose(scattered, (Input(0) + Input(1)).narrow(1, 2 * rank, 2)));
    const at::Tensor grads =
        torch::randn({2, 4, 3}, at::Generator(at::detail::createCPUGenerator(7)));
    scattered.backward(grads.narrow(1, 2 * rank, 2));
    EXPECT_TRUE(at::equal(x.grad(), grads));
  });
}

// torch's per-row cross-entropy of whole fp32 `logits` [N, V] (-100 ignored) and the gradient
// of its sum weighted by `weights` [N].
struct Reference {
  at::Tensor loss;
  at::Tensor grad;
};
Reference CrossEntropyOf(const at::Tensor& logits, const at::Tensor& targets,
                         const at::Tensor& weights) {
  const at::Tensor whole = logits.clone().requires_grad_();
  const at::Tensor loss = torch::nn::functional::cross_entropy(
      whole, targets,
      torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone).ignore_index(-100));
  (loss * weights).sum().backward();
  return {loss.detach(), whole.grad()};
}

TEST(CollectiveOpsTest, VocabParallelCrossEntropyEqualsCrossEntropyOnGatheredLogits) {
  constexpr int64_t kRows = 6;
  constexpr int64_t kVocab = 10;
  const at::Generator generator = at::detail::createCPUGenerator(3);
  const at::Tensor logits = torch::randn({kRows, kVocab}, generator) * 3;
  // Targets in both ranks' halves, and one ignored.
  const at::Tensor targets = torch::tensor({0, 9, 4, 5, -100, 7}, at::kLong);
  const at::Tensor weights = torch::tensor({1.0f, 0.5f, 2.0f, -1.0f, 3.0f, 0.25f});

  const Reference expected = CrossEntropyOf(logits, targets, weights);

  OnRanks([&](int rank, parallel::GraphGroup& group) {
    constexpr int64_t kColumns = kVocab / kRanks;
    const at::Tensor mine = logits.narrow(1, rank * kColumns, kColumns).clone().requires_grad_();
    const at::Tensor loss =
        VocabParallelCrossEntropy(mine, targets, rank * kColumns, kColumns, -100, group);
    EXPECT_TRUE(at::allclose(loss, expected.loss, 1e-5, 1e-6)) << loss << expected.loss;
    (loss * weights).sum().backward();
    EXPECT_TRUE(
        at::allclose(mine.grad(), expected.grad.narrow(1, rank * kColumns, kColumns), 1e-5, 1e-6));
  });
}

// With a padded vocabulary a rank's columns may all be padding (here filled with -inf, never
// read): that rank adds nothing, and the loss is the cross-entropy over the real columns.
TEST(CollectiveOpsTest, VocabParallelCrossEntropyOfARankOfPaddingOnly) {
  constexpr int64_t kColumns = 2;  // rank 0's are the vocabulary, rank 1's padding
  const at::Tensor logits =
      torch::randn({3, kColumns}, at::Generator(at::detail::createCPUGenerator(5)));
  const at::Tensor targets = torch::tensor({1, -100, 0}, at::kLong);
  const at::Tensor expected = torch::nn::functional::cross_entropy(
      logits, targets,
      torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone).ignore_index(-100));
  OnRanks([&](int rank, parallel::GraphGroup& group) {
    const at::Tensor mine =
        (rank == 0 ? logits.clone()
                   : torch::full({3, kColumns}, -std::numeric_limits<float>::infinity()))
            .requires_grad_();
    const at::Tensor loss = VocabParallelCrossEntropy(mine, targets, rank * kColumns,
                                                      rank == 0 ? kColumns : 0, -100, group);
    EXPECT_TRUE(at::allclose(loss, expected, 1e-5, 1e-6)) << loss << expected;
    loss.sum().backward();
    EXPECT_TRUE(at::isfinite(mine.grad()).all().item<bool>()) << mine.grad();
  });
}

// Logits in their own dtype over several chunks of rows (3, 3 and 1), with rank 1's last two
// columns padding (NaN: they must never be read): fp32 computed in fp32 from the logits'
// values, so within rounding of the fp32 reference on those values; 16-bit logits' gradient
// rounded to their dtype; padding columns' gradient exactly 0.
TEST(CollectiveOpsTest, VocabParallelCrossEntropyKeepsTheDtypeOverChunksAndSkipsPadding) {
  constexpr int64_t kRows = 7;
  constexpr int64_t kColumns = 6;  // per rank; the vocabulary is 10, padded to 12
  constexpr int64_t kVocab = 10;
  constexpr int64_t kChunkRows = 3;
  const at::Tensor targets = torch::tensor({0, 9, 4, 5, -100, 7, 6}, at::kLong);
  const at::Tensor weights = torch::tensor({1.0f, 0.5f, 2.0f, -1.0f, 3.0f, 0.25f, 1.5f});
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    SCOPED_TRACE(c10::toString(dtype));
    const at::Tensor logits =
        (torch::randn({kRows, kVocab}, at::Generator(at::detail::createCPUGenerator(11))) * 3)
            .to(dtype);
    const Reference expected = CrossEntropyOf(logits.to(at::kFloat), targets, weights);
    const double grad_tolerance = dtype == at::kFloat ? 1e-5 : 1e-2;
    OnRanks([&](int rank, parallel::GraphGroup& group) {
      const int64_t real = std::min(kColumns, kVocab - rank * kColumns);
      at::Tensor slice =
          torch::full({kRows, kColumns}, std::numeric_limits<float>::quiet_NaN(), dtype);
      slice.narrow(1, 0, real).copy_(logits.narrow(1, rank * kColumns, real));
      const at::Tensor mine = slice.requires_grad_();
      const at::Tensor loss =
          VocabParallelCrossEntropy(mine, targets, rank * kColumns, real, -100, group, kChunkRows);
      EXPECT_EQ(loss.scalar_type(), at::kFloat);
      EXPECT_TRUE(at::allclose(loss, expected.loss, 1e-5, 1e-6)) << loss << expected.loss;
      (loss * weights).sum().backward();
      EXPECT_EQ(mine.grad().scalar_type(), dtype);
      const at::Tensor grad = mine.grad().to(at::kFloat);
      EXPECT_TRUE(at::allclose(grad.narrow(1, 0, real),
                               expected.grad.narrow(1, rank * kColumns, real), grad_tolerance,
                               grad_tolerance * 0.1))
          << grad << expected.grad;
      EXPECT_TRUE(
          at::equal(grad.narrow(1, real, kColumns - real), torch::zeros({kRows, kColumns - real})))
          << grad;
    });
  }
}

// The memory of forward and backward on bf16 logits: besides the logits, the gradient (bf16)
// and one fp32 chunk of rows, only tensors of a few values per row. The former form held an
// fp32 copy of the logits, their exponentials (the saved softmax) and the backward's clone.
TEST(CollectiveOpsTest, VocabParallelCrossEntropyHoldsTheGradientAndOneChunk) {
  constexpr int64_t kRows = 512;
  constexpr int64_t kColumns = 4096;
  constexpr int64_t kChunkRows = 64;
  const at::Tensor targets =
      torch::randint(2 * kColumns, {kRows}, at::Generator(at::detail::createCPUGenerator(13)));
  OnRanks([&](int rank, parallel::GraphGroup& group) {
    const at::Tensor mine =
        torch::randn({kRows, kColumns}, at::Generator(at::detail::createCPUGenerator(rank)))
            .to(at::kBFloat16)
            .requires_grad_();
    base::AllocationCounter counter;
    {
      base::AllocationCounter::Scope counting(counter);
      VocabParallelCrossEntropy(mine, targets, rank * kColumns, kColumns, -100, group, kChunkRows)
          .sum()
          .backward();
    }
    const int64_t gradient = kRows * kColumns * 2;
    const int64_t chunk = kChunkRows * kColumns * 4;
    const int64_t small = 64 * kRows * 8;  // a few [N] tensors
    EXPECT_LE(counter.peak(), gradient + chunk + small)
        << "peak " << counter.peak() << ", gradient " << gradient << ", chunk " << chunk;
  });
}

}  // namespace
}  // namespace plait::wrap::tp
