// Ring attention on 2 and 4 ranks (threads over TCP), in both its forms (the fused CPU
// kernels and the generic ops in tiles): each rank's output and the gradients of its queries,
// keys and values are the rows of its chunks of one process's causal attention over the whole
// sequence and of that attention's gradients, with grouped-query attention, in fp32 (within
// 1e-5) and bf16 (within bf16's rounding); a model computing its slice of the sequence through
// RingContext; and the chunk layout itself.
#include "wrap/cp/ring_attention.h"

#include <cmath>
#include <functional>
#include <string>
#include <utility>

#include "ATen/Context.h"
#include "ATen/Parallel.h"
#include "ATen/core/Tensor.h"
#include "ATen/ops/matmul.h"
#include "ATen/ops/softmax.h"
#include "ATen/ops/stack.h"
#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/causal_lm.h"
#include "models/model_config.h"
#include "models/testing_gradients.h"
#include "parallel/ring_communicator.h"
#include "parallel/test_ranks.h"
#include "torch/csrc/autograd/generated/variable_factories.h"

namespace plait::wrap::cp {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::base::testing::StatusIs;
using ::plait::models::testing::ExpectElementsClose;
using ::testing::HasSubstr;

// Runs `body(rank, group)` on every rank of a group of `ranks`.
void OnRanks(int ranks, const std::function<void(int, parallel::GraphGroup&)>& body) {
  parallel::testing::RunOnRingGroup("cp", ranks,
                                    [&](int rank, parallel::RingCommunicator& communicator) {
                                      parallel::GraphGroup group(communicator);
                                      body(rank, group);
                                      EXPECT_THAT(group.status(), IsOk());
                                    });
}

// One process's causal grouped-query attention, in fp32: q [B, T, H, d], k and v
// [B, T, KV, d] -> [B, T, H, d].
at::Tensor FullAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const int64_t groups = q.size(2) / k.size(2);
  const int64_t len = q.size(1);
  const at::Tensor qh = q.to(at::kFloat).transpose(1, 2);  // [B, H, T, d]
  const at::Tensor kh = k.to(at::kFloat).repeat_interleave(groups, 2).transpose(1, 2);
  const at::Tensor vh = v.to(at::kFloat).repeat_interleave(groups, 2).transpose(1, 2);
  const at::Tensor scores = at::matmul(qh, kh.transpose(-1, -2)) / std::sqrt(q.size(3));
  const at::Tensor above = torch::ones({len, len}, at::kBool).triu(1);
  return at::matmul(at::softmax(scores.masked_fill(above, -INFINITY), -1), vh).transpose(1, 2);
}

struct Case {
  int ranks;
  int64_t seq_len;
  int64_t heads;
  int64_t kv_heads;
  at::ScalarType dtype;
  double tolerance;  // relative to each tensor's largest value
  int64_t max_score_elements = kMaxScoreElements;
  ChunkOrder order = ChunkOrder::kLoadBalanced;
};

std::string Name(const Case& c) {
  return std::string("cp ") + std::to_string(c.ranks) + ", T " + std::to_string(c.seq_len) +
         ", heads " + std::to_string(c.heads) + "/" + std::to_string(c.kv_heads) + " " +
         c10::toString(c.dtype) + ", tiles of " + std::to_string(c.max_score_elements) + " scores" +
         (c.order == ChunkOrder::kContiguous ? ", contiguous" : "");
}

void ExpectRingEqualsFullAttention(const Case& c) {
  const std::string name = Name(c);
  constexpr int64_t kBatch = 2, kHeadDim = 8;
  at::manual_seed(3);
  const auto draw = [&](int64_t heads) {
    return torch::randn({kBatch, c.seq_len, heads, kHeadDim}).to(c.dtype);
  };
  const at::Tensor q = draw(c.heads), k = draw(c.kv_heads), v = draw(c.kv_heads);
  const at::Tensor weights = torch::randn({kBatch, c.seq_len, c.heads, kHeadDim});
  // One process, in fp32 from the same (rounded) inputs.
  const at::Tensor fq = q.to(at::kFloat).clone().requires_grad_();
  const at::Tensor fk = k.to(at::kFloat).clone().requires_grad_();
  const at::Tensor fv = v.to(at::kFloat).clone().requires_grad_();
  const at::Tensor expected = FullAttention(fq, fk, fv);
  (expected * weights).sum().backward();
  for (const bool generic : {false, true}) {
    OnRanks(c.ranks, [&](int rank, parallel::GraphGroup& group) {
      at::set_num_threads(1);
      absl::StatusOr<ChunkLayout> layout = ChunkLayout::Create(c.seq_len, c.ranks, rank, c.order);
      ASSERT_THAT(layout, IsOk());
      const at::Tensor lq = layout->Slice(q, 1).clone().requires_grad_();
      const at::Tensor lk = layout->Slice(k, 1).clone().requires_grad_();
      const at::Tensor lv = layout->Slice(v, 1).clone().requires_grad_();
      const at::Tensor out =
          RingAttention(lq, lk, lv, group, {c.max_score_elements, c.order, generic});
      EXPECT_EQ(out.scalar_type(), c.dtype);
      (out.to(at::kFloat) * layout->Slice(weights, 1)).sum().backward();
      const std::string where =
          name + (generic ? ", generic" : ", fused") + ", rank " + std::to_string(rank);
      ExpectElementsClose(out, layout->Slice(expected.detach(), 1), c.tolerance, where + " output");
      ExpectElementsClose(lq.grad(), layout->Slice(fq.grad(), 1), c.tolerance,
                          where + " query gradient");
      ExpectElementsClose(lk.grad(), layout->Slice(fk.grad(), 1), c.tolerance,
                          where + " key gradient");
      ExpectElementsClose(lv.grad(), layout->Slice(fv.grad(), 1), c.tolerance,
                          where + " value gradient");
    });
  }
}

TEST(RingAttentionTest, EqualsFullAttentionRowsAndGradientsInFp32) {
  for (const Case& c : {Case{2, 16, 4, 4, at::kFloat, 1e-5}, Case{2, 32, 4, 2, at::kFloat, 1e-5},
                        Case{4, 32, 4, 1, at::kFloat, 1e-5}, Case{4, 8, 2, 2, at::kFloat, 1e-5}}) {
    ExpectRingEqualsFullAttention(c);
  }
}

// bf16 inputs and outputs, computed in fp32: the outputs and gradients are fp32's rounded
// to bf16 (a relative step of 2^-8), against fp32 attention of the same bf16 inputs.
TEST(RingAttentionTest, EqualsFullAttentionInBf16WithinItsRounding) {
  for (const Case& c :
       {Case{2, 32, 4, 2, at::kBFloat16, 1e-2}, Case{4, 32, 4, 2, at::kBFloat16, 1e-2}}) {
    ExpectRingEqualsFullAttention(c);
  }
}

// The generic form's tiles of a few query rows (3 of a chunk of 8, the last one 2; single
// rows) give the same attention as whole chunks, causal tiles meeting only the keys before
// their last row.
TEST(RingAttentionTest, EqualsFullAttentionInTilesOfFewRows) {
  constexpr int64_t kBatch = 2;
  EXPECT_EQ(ScoreTileRows(kBatch, 2, 8, 3 * kBatch * 2 * 8), 3);
  EXPECT_EQ(ScoreTileRows(kBatch, 1, 4, 1), 1);
  EXPECT_EQ(ScoreTileRows(kBatch, 1, 4, kMaxScoreElements), 4);
  for (const Case& c : {Case{2, 32, 4, 2, at::kFloat, 1e-5, 3 * kBatch * 2 * 8},
                        Case{4, 32, 4, 1, at::kFloat, 1e-5, 1},
                        Case{2, 32, 4, 2, at::kBFloat16, 1e-2, 3 * kBatch * 2 * 8}}) {
    ExpectRingEqualsFullAttention(c);
  }
}

// The contiguous split (rank r keeps chunks 2r and 2r + 1) attends alike.
TEST(RingAttentionTest, EqualsFullAttentionOnTheContiguousSplit) {
  for (const Case& c :
       {Case{2, 32, 4, 2, at::kFloat, 1e-5, kMaxScoreElements, ChunkOrder::kContiguous},
        Case{4, 32, 4, 1, at::kFloat, 1e-5, 7, ChunkOrder::kContiguous}}) {
    ExpectRingEqualsFullAttention(c);
  }
}

// One rank is plain causal attention: its two chunks are the whole sequence.
TEST(RingAttentionTest, OneRankIsCausalAttention) {
  ExpectRingEqualsFullAttention(Case{1, 12, 4, 2, at::kFloat, 1e-5});
}

// A model whose forward runs through RingContext computes its slice of each sequence: its
// tokens' log-probabilities are the whole model's rows, and the gradients of their sum, summed
// over the ranks, are the whole sequence's, for the tiny Llama (4 heads on 2 key/value heads)
// and the tiny Qwen2 (biases, 7 heads on 1, a tied embedding), on 2 and 4 ranks, in the fused
// ops and the generic ones.
TEST(RingContextTest, AModelComputesItsSliceOfTheSequence) {
  constexpr int64_t kSeqLen = 32;
  for (const std::string preset : {"tiny", "qwen2-tiny"}) {
    const models::ModelConfig config = *models::PresetConfig(preset);
    models::InitConfig init;
    init.set_seed(5);
    init.set_std(0.05);
    at::manual_seed(6);
    const at::Tensor tokens = torch::randint(config.vocab_size(), {2, kSeqLen}, at::kLong);
    at::Tensor targets = torch::randint(config.vocab_size(), {2, kSeqLen}, at::kLong);
    targets.index_put_({0, torch::indexing::Slice(3, 9)}, models::kIgnoreIndex);  // unscored
    const std::shared_ptr<models::CausalLM> whole = *models::CausalLM::Create(config, init);
    const at::Tensor expected = whole->TokenLogProbs(tokens, targets);
    expected.sum().backward();
    for (const auto& [ranks, generic] : {std::pair{2, false}, {4, false}, {2, true}}) {
      OnRanks(ranks, [&](int rank, parallel::GraphGroup& group) {
        at::set_num_threads(1);
        const std::string where = preset + (generic ? ", generic" : ", fused") + ", rank " +
                                  std::to_string(rank) + " of " + std::to_string(ranks);
        const std::shared_ptr<models::CausalLM> model = *models::CausalLM::Create(config, init);
        models::internal::UseGenericOps(*model, generic);
        RingContext context(group);
        model->seams().Add(&context);
        const ChunkLayout layout = *ChunkLayout::Create(kSeqLen, ranks, rank);
        const at::Tensor own = model->TokenLogProbs(tokens, targets);
        ExpectElementsClose(own, layout.Slice(expected.detach(), 1), 1e-5,
                            where + " log-probabilities");
        own.sum().backward();
        const auto expected_grads = whole->named_parameters();
        for (const auto& named : model->named_parameters()) {
          at::Tensor grad = named.value().grad().clone();
          ASSERT_THAT(group.communicator().AllReduce(grad, parallel::ReduceOp::kSum)->Wait(),
                      IsOk());
          ExpectElementsClose(grad, expected_grads[named.key()].grad(), 1e-5,
                              where + " gradient of " + named.key());
        }
      });
    }
  }
}

// Rank r keeps chunks r and 2n - 1 - r, at their global positions.
TEST(ChunkLayoutTest, EachRankKeepsAnEarlyAndALateChunk) {
  absl::StatusOr<ChunkLayout> first = ChunkLayout::Create(16, 2, 0);
  absl::StatusOr<ChunkLayout> second = ChunkLayout::Create(16, 2, 1);
  ASSERT_THAT(first, IsOk());
  ASSERT_THAT(second, IsOk());
  EXPECT_EQ(first->chunk_len(), 4);
  EXPECT_TRUE(first->Positions().equal(torch::tensor({0, 1, 2, 3, 12, 13, 14, 15}, at::kLong)));
  EXPECT_TRUE(second->Positions().equal(torch::tensor({4, 5, 6, 7, 8, 9, 10, 11}, at::kLong)));
  const at::Tensor tokens = torch::arange(32).view({2, 16});
  EXPECT_TRUE(
      second->Slice(tokens, 1).equal(at::stack({torch::arange(4, 12), torch::arange(20, 28)})));
  EXPECT_EQ(ChunkLayout::ChunksOf(4, 1), (std::array<int, 2>{1, 6}));
  EXPECT_EQ(ChunkLayout::ChunksOf(4, 1, ChunkOrder::kContiguous), (std::array<int, 2>{2, 3}));
}

TEST(ChunkLayoutTest, RefusesASequenceThatDoesNotDivideIntoTheChunks) {
  EXPECT_THAT(ChunkLayout::Create(20, 4, 0),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("a sequence of 20 tokens does not divide into them: use a "
                                 "multiple of 8")));
  EXPECT_THAT(ChunkLayout::Create(16, 2, 2),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank 2 of 2 ranks")));
}

}  // namespace
}  // namespace plait::wrap::cp
