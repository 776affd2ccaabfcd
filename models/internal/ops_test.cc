#include "models/internal/ops.h"

#include <cmath>
#include <functional>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include "ATen/Context.h"
#include "ATen/core/Tensor.h"
#include "ATen/ops/allclose.h"
#include "ATen/ops/cat.h"
#include "ATen/ops/equal.h"
#include "ATen/ops/log_softmax.h"
#include "ATen/ops/pow.h"
#include "base/allocation_counter.h"
#include "base/torch_compat.h"
#include "gtest/gtest.h"
#include "models/internal/fused_kernels.h"
#include "models/rotary.h"
#include "torch/csrc/autograd/function.h"
#include "torch/csrc/autograd/generated/variable_factories.h"

namespace plait::models::internal {
namespace {

using Op = std::function<at::Tensor(const std::vector<at::Tensor>&)>;

struct Result {
  at::Tensor output;
  std::vector<at::Tensor> grads;
};

// op's output and the gradients of sum(output * upstream) for each input with requires_grad
// (undefined for the others).
Result Run(const Op& op, const std::vector<at::Tensor>& inputs, const at::Tensor& upstream) {
  std::vector<at::Tensor> leaves;
  for (const at::Tensor& input : inputs) {
    leaves.push_back(input.detach().clone().requires_grad_(input.requires_grad()));
  }
  Result result;
  result.output = op(leaves);
  (result.output * upstream).sum().backward();
  for (const at::Tensor& leaf : leaves) result.grads.push_back(leaf.grad());
  return result;
}

// 16-bit results are compared with the float reference: a few of bf16's 2^-8 rounding steps,
// or of fp16's 2^-11.
double Tolerance(at::ScalarType dtype) {
  if (dtype == at::kBFloat16) return 1e-2;
  if (dtype == at::kHalf) return 2e-3;
  return dtype == at::kDouble ? 1e-12 : 1e-5;
}

// fused and reference agree on the output and on every gradient, relative to each tensor's
// largest magnitude. For 16-bit inputs the reference runs on their float values: fused bf16
// (or fp16) must be as close to the exact result as its storage allows.
void ExpectSame(const Op& fused, const Op& reference, const std::vector<at::Tensor>& inputs,
                const std::string& what) {
  SCOPED_TRACE(what);
  std::vector<at::Tensor> reference_inputs;
  for (const at::Tensor& input : inputs) {
    reference_inputs.push_back(
        c10::elementSize(input.scalar_type()) == 2
            ? input.detach().to(at::kFloat).requires_grad_(input.requires_grad())
            : input);
  }
  const at::Tensor probe = reference(reference_inputs);
  at::manual_seed(99);
  const at::Tensor upstream = torch::randn(probe.sizes(), probe.options());
  const Result got = Run(fused, inputs, upstream.to(inputs.front().scalar_type()));
  const Result want = Run(reference, reference_inputs, upstream);
  const double tolerance = Tolerance(inputs.front().scalar_type());
  const auto expect_close = [tolerance](const at::Tensor& a, const at::Tensor& b,
                                        const std::string& name) {
    ASSERT_EQ(a.sizes(), b.sizes()) << name;
    const double scale = std::max(b.abs().max().item<double>(), 1e-30);
    EXPECT_LE((a.to(b.scalar_type()) - b).abs().max().item<double>() / scale, tolerance) << name;
  };
  expect_close(got.output, want.output, "output");
  for (size_t i = 0; i < inputs.size(); ++i) {
    ASSERT_EQ(got.grads[i].defined(), want.grads[i].defined()) << "input " << i;
    if (want.grads[i].defined()) {
      expect_close(got.grads[i], want.grads[i], "gradient of input " + std::to_string(i));
    }
  }
}

at::Tensor Random(std::vector<int64_t> sizes, at::ScalarType dtype, uint64_t seed,
                  bool requires_grad = true) {
  at::manual_seed(seed);
  return torch::randn(sizes, at::TensorOptions().dtype(dtype)).requires_grad_(requires_grad);
}

// The dtypes of the fused kernels; the cross-entropy has no bf16 kernel.
const std::vector<at::ScalarType> kDtypes = {at::kFloat, at::kDouble, at::kBFloat16};
const std::vector<at::ScalarType> kWideDtypes = {at::kFloat, at::kDouble};

TEST(RmsNormTest, FusedMatchesComposite) {
  for (const at::ScalarType dtype : kDtypes) {
    for (const std::vector<int64_t>& shape :
         std::vector<std::vector<int64_t>>{{1, 1, 8}, {3, 5, 37}, {2, 256}}) {
      const std::vector<at::Tensor> inputs = {Random(shape, dtype, 1),
                                              Random({shape.back()}, dtype, 2)};
      ExpectSame([](const auto& in) { return FusedRmsNorm(in[0], in[1], 1e-6); },
                 [](const auto& in) { return CompositeRmsNorm(in[0], in[1], 1e-6); }, inputs,
                 std::string(at::toString(dtype)) + " last dim " + std::to_string(shape.back()));
    }
  }
}

TEST(SwiGluTest, FusedMatchesComposite) {
  // Gates up to ~10 and ~150 in magnitude: the second reaches the float Exp's clamps.
  for (const at::ScalarType dtype : kDtypes) {
    for (const double scale : {4.0, 40.0}) {
      const std::vector<at::Tensor> inputs = {
          (Random({3, 7, 29}, dtype, 3, /*requires_grad=*/false) * scale).requires_grad_(),
          Random({3, 7, 29}, dtype, 4)};
      ExpectSame([](const auto& in) { return FusedSwiGlu(in[0], in[1]); },
                 [](const auto& in) { return CompositeSwiGlu(in[0], in[1]); }, inputs,
                 std::string(at::toString(dtype)) + " gate scale " + std::to_string(scale));
    }
  }
}

TEST(RotaryTest, FusedMatchesApplyRotary) {
  for (const at::ScalarType dtype : kDtypes) {
    const int64_t seq = 11;
    // Frequencies 10000^(-2i/16), as a head of 16 gets them by default.
    const at::Tensor inv_freq = at::pow(10000.0, -torch::arange(0, 16, 2) / 16.0);
    const RotaryTables tables = MakeRotaryTables(inv_freq, torch::arange(seq));
    const std::vector<at::Tensor> inputs = {Random({2, seq, 3, 16}, dtype, 5), tables.cos.to(dtype),
                                            tables.sin.to(dtype)};
    ExpectSame([](const auto& in) { return FusedRotary(in[0], in[1], in[2]); },
               [](const auto& in) { return ApplyRotary(in[0], in[1], in[2]); }, inputs,
               at::toString(dtype));
  }
}

// Per-row tables [B, T, d], as packed rows gather them, fused as the composite applies them.
TEST(RotaryTest, FusedPerRowTablesMatchApplyRotary) {
  const at::Tensor inv_freq = at::pow(10000.0, -torch::arange(0, 16, 2) / 16.0);
  const RotaryTables tables = MakeRotaryTables(inv_freq, torch::arange(7));
  const at::Tensor positions = torch::tensor({0, 1, 2, 0, 1, 2, 3, 0, 0, 1, 2, 3, 4, 5});
  for (const at::ScalarType dtype : kDtypes) {
    const std::vector<at::Tensor> inputs = {
        Random({2, 7, 3, 16}, dtype, 5),
        tables.cos.index_select(0, positions).view({2, 7, 16}).to(dtype),
        tables.sin.index_select(0, positions).view({2, 7, 16}).to(dtype)};
    ExpectSame([](const auto& in) { return FusedRotary(in[0], in[1], in[2]); },
               [](const auto& in) { return ApplyRotary(in[0], in[1], in[2]); }, inputs,
               at::toString(dtype));
  }
}

TEST(CrossEntropyTest, FusedMatchesComposite) {
  for (const at::ScalarType dtype : kWideDtypes) {
    at::manual_seed(20);
    at::Tensor targets = torch::randint(37, {13}, at::kLong);
    targets[2] = -100;
    targets[7] = -100;
    const std::vector<at::Tensor> inputs = {Random({13, 37}, dtype, 21) * 3};
    ExpectSame([&targets](const auto& in) { return FusedCrossEntropy(in[0], targets, -100); },
               [&targets](const auto& in) { return CompositeCrossEntropy(in[0], targets, -100); },
               inputs, at::toString(dtype));
  }
}

TEST(CrossEntropyTest, AllIgnoredIsNanAndABadTargetThrows) {
  const at::Tensor logits = Random({3, 5}, at::kFloat, 22);
  EXPECT_TRUE(
      std::isnan(FusedCrossEntropy(logits, torch::full({3}, -100, at::kLong), -100).item<float>()));
  EXPECT_THROW(FusedCrossEntropy(logits, torch::tensor({0, 5, 1}, at::kLong), -100), c10::Error);
  EXPECT_THROW(FusedCrossEntropy(logits, torch::tensor({0, -1, 1}, at::kLong), -100), c10::Error);
}

// Targets for [rows, vocab] logits with rows 1, 2 and every 5th from 7 ignored (-100).
at::Tensor TargetsWithIgnored(int64_t rows, int64_t vocab) {
  at::manual_seed(23);
  at::Tensor targets = torch::randint(vocab, {rows}, at::kLong);
  targets.index_put_({torch::indexing::Slice(1, 3)}, -100);
  targets.index_put_({torch::indexing::Slice(7, torch::indexing::None, 5)}, -100);
  return targets;
}

// The reference per-token loss: -log_softmax gathered at the target, 0 where ignored.
at::Tensor ReferenceTokenLosses(const at::Tensor& logits, const at::Tensor& targets) {
  const at::Tensor kept = targets != -100;
  const at::Tensor picked =
      at::log_softmax(logits, -1).gather(1, targets.masked_fill(~kept, 0).unsqueeze(1));
  return -picked.squeeze(1) * kept.to(logits.scalar_type());
}

// Per-token values and logit gradients against log_softmax + gather, and their mean against
// the composite cross-entropy; 16-bit logits against the reference on their float values.
// Chunks of 1 row, of rows that do not divide the 13 rows, and one chunk of them all.
TEST(TokenCrossEntropyTest, MatchesTheComposite) {
  const int64_t rows = 13;
  const int64_t vocab = 37;
  const at::Tensor targets = TargetsWithIgnored(rows, vocab);
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    for (const int64_t chunk_rows : {int64_t{1}, int64_t{4}, int64_t{5}, rows, int64_t{100}}) {
      const std::string what =
          std::string(at::toString(dtype)) + " chunk_rows " + std::to_string(chunk_rows);
      const std::vector<at::Tensor> inputs = {
          (Random({rows, vocab}, dtype, 24, /*requires_grad=*/false) * 3).requires_grad_()};
      ExpectSame(
          [&](const auto& in) { return TokenCrossEntropy(in[0], targets, -100, chunk_rows); },
          [&](const auto& in) { return ReferenceTokenLosses(in[0], targets); }, inputs,
          what + " per token");
      ExpectSame(
          [&](const auto& in) {
            return TokenCrossEntropy(in[0], targets, -100, chunk_rows).sum() /
                   (targets != -100).sum();
          },
          [&](const auto& in) { return CompositeCrossEntropy(in[0], targets, -100); }, inputs,
          what + " mean");
      const at::Tensor losses = TokenCrossEntropy(inputs[0], targets, -100, chunk_rows);
      EXPECT_EQ(losses.scalar_type(), at::kFloat) << what;
      EXPECT_TRUE(at::equal(losses.masked_select(targets == -100), torch::zeros({4}, at::kFloat)))
          << what;
    }
  }
}

TEST(TokenCrossEntropyTest, AllIgnoredGivesZerosAndZeroGradients) {
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    SCOPED_TRACE(at::toString(dtype));
    const at::Tensor logits = Random({6, 11}, dtype, 25);
    const at::Tensor targets = torch::full({6}, -100, at::kLong);
    const at::Tensor losses = TokenCrossEntropy(logits, targets, -100, 4);
    EXPECT_TRUE(at::equal(losses, torch::zeros({6}, at::kFloat)));
    (losses * torch::randn({6})).sum().backward();
    EXPECT_EQ(logits.grad().scalar_type(), dtype);
    EXPECT_EQ(logits.grad().abs().max().item<float>(), 0.0f);
    // The mean of nothing is NaN, as the composite's.
    EXPECT_TRUE(std::isnan(CrossEntropy(logits, targets, -100, /*generic=*/true).item<float>()));
  }
}

// On the CPU a target outside [0, vocab) that is not ignore_index fails the gather.
TEST(TokenCrossEntropyTest, ABadTargetThrowsOnTheCpu) {
  const at::Tensor logits = Random({3, 5}, at::kBFloat16, 26);
  EXPECT_THROW(TokenCrossEntropy(logits, torch::tensor({0, 5, 1}, at::kLong), -100), c10::Error);
  EXPECT_THROW(TokenCrossEntropy(logits, torch::tensor({0, -1, 1}, at::kLong), -100), c10::Error);
}

TEST(TokenCrossEntropyTest, ChunkRowsFillTheByteBudget) {
  EXPECT_EQ(CrossEntropyChunkRows(128256, at::kBFloat16), kCrossEntropyChunkBytes / (128256 * 4));
  EXPECT_EQ(CrossEntropyChunkRows(1024, at::kFloat), kCrossEntropyChunkBytes / 4096);
  EXPECT_EQ(CrossEntropyChunkRows(1024, at::kDouble), kCrossEntropyChunkBytes / 8192);
  EXPECT_EQ(CrossEntropyChunkRows(kCrossEntropyChunkBytes, at::kFloat), 1);
}

// The bytes LibTorch's CPU allocator holds at most, beyond the logits, while `loss` runs on
// them and its backward: the logits' gradient included.
int64_t PeakBytesOfLossAndBackward(const at::Tensor& logits,
                                   const std::function<at::Tensor(const at::Tensor&)>& loss) {
  const at::Tensor leaf = logits.detach().requires_grad_();
  base::AllocationCounter counter;
  {
    base::AllocationCounter::Scope counting(counter);
    loss(leaf).backward();
  }
  return counter.peak();
}

// For bf16 logits [N, V] the chunked cross-entropy holds, beside them, their bf16 gradient,
// one fp32 chunk and [N]-sized vectors; the fp32 upcast and the composite (the path a GPU took
// before) hold 3 to 4 fp32 [N, V] tensors at once.
TEST(TokenCrossEntropyTest, PeakMemoryIsTheGradientAndOneChunk) {
  const int64_t rows = 1024;
  const int64_t vocab = 4096;
  const int64_t chunk_rows = 64;
  const at::Tensor logits = Random({rows, vocab}, at::kBFloat16, 27, false);
  const at::Tensor targets = TargetsWithIgnored(rows, vocab);
  const int64_t chunked = PeakBytesOfLossAndBackward(logits, [&](const at::Tensor& l) {
    return TokenCrossEntropy(l, targets, -100, chunk_rows).sum() / (targets != -100).sum();
  });
  const int64_t composite = PeakBytesOfLossAndBackward(logits, [&](const at::Tensor& l) {
    return CompositeCrossEntropy(l.to(at::kFloat), targets, -100);
  });
  const int64_t gradient = rows * vocab * 2;
  const int64_t chunk = chunk_rows * vocab * 4;
  const int64_t bound = gradient + chunk + rows * 64;
  std::cout << "bf16 logits [" << rows << ", " << vocab << "]: peak " << chunked
            << " bytes chunked (" << chunk_rows << " rows), " << composite
            << " upcast + composite; bound " << bound << "\n";
  EXPECT_LE(chunked, bound);
  EXPECT_GT(composite, bound);
}

// The composite attention's additive mask for `groups` query heads per kv head, in the dtype
// ExpectSame's reference runs in for inputs of `dtype`.
at::Tensor CausalMask(int64_t seq, int64_t groups, at::ScalarType dtype) {
  return torch::full({seq, seq}, -std::numeric_limits<double>::infinity(),
                     at::TensorOptions().dtype(dtype == at::kBFloat16 ? at::kFloat : dtype))
      .triu(1)
      .repeat({groups, 1});
}

struct AttentionCase {
  int64_t batch, seq, heads, kv_heads, head_dim;
};

TEST(CausalAttentionTest, FusedMatchesComposite) {
  // Sequences shorter than, equal to and not a multiple of the block; GQA groups of 1, 2, 4;
  // batch 1.
  const std::vector<AttentionCase> cases = {{1, 5, 4, 2, 8},
                                            {2, kAttentionBlock, 2, 2, 16},
                                            {2, kAttentionBlock + 7, 4, 1, 8},
                                            {1, 2 * kAttentionBlock + 3, 4, 2, 32}};
  for (const at::ScalarType dtype : kDtypes) {
    for (const AttentionCase& c : cases) {
      const at::Tensor mask = CausalMask(c.seq, c.heads / c.kv_heads, dtype);
      const std::vector<at::Tensor> inputs = {
          Random({c.batch, c.seq, c.heads, c.head_dim}, dtype, 6),
          Random({c.batch, c.seq, c.kv_heads, c.head_dim}, dtype, 7),
          Random({c.batch, c.seq, c.kv_heads, c.head_dim}, dtype, 8)};
      ExpectSame(
          [](const auto& in) { return FusedCausalAttention(in[0], in[1], in[2]); },
          [&mask](const auto& in) { return CompositeCausalAttention(in[0], in[1], in[2], mask); },
          inputs,
          std::string(at::toString(dtype)) + " B" + std::to_string(c.batch) + " T" +
              std::to_string(c.seq) + " H" + std::to_string(c.heads) + " KV" +
              std::to_string(c.kv_heads));
    }
  }
}

TEST(CausalAttentionTest, LibTorchsFusedKernelMatchesComposite) {
  const at::Tensor probe = torch::zeros({1, 1, 1, 1});
  if (!base::CausalSdpa(probe, probe, probe).has_value()) {
    GTEST_SKIP() << "LibTorch " << base::kTorchVersion << " has no scaled_dot_product_attention";
  }
  const std::vector<AttentionCase> cases = {{1, 5, 4, 2, 8}, {2, kAttentionBlock + 7, 4, 1, 8}};
  for (const at::ScalarType dtype : kDtypes) {
    for (const AttentionCase& c : cases) {
      const at::Tensor mask = CausalMask(c.seq, c.heads / c.kv_heads, dtype);
      ExpectSame(
          [](const auto& in) { return *base::CausalSdpa(in[0], in[1], in[2]); },
          [&mask](const auto& in) { return CompositeCausalAttention(in[0], in[1], in[2], mask); },
          {Random({c.batch, c.seq, c.heads, c.head_dim}, dtype, 6),
           Random({c.batch, c.seq, c.kv_heads, c.head_dim}, dtype, 7),
           Random({c.batch, c.seq, c.kv_heads, c.head_dim}, dtype, 8)},
          std::string(at::toString(dtype)) + " T" + std::to_string(c.seq) + " H" +
              std::to_string(c.heads) + " KV" + std::to_string(c.kv_heads));
    }
  }
}

TEST(CausalAttentionTest, NoPositionSeesALaterOne) {
  const int64_t seq = kAttentionBlock + 9;
  const int64_t cut = kAttentionBlock - 3;  // the first changed position
  at::Tensor q = Random({2, seq, 4, 8}, at::kFloat, 9);
  at::Tensor k = Random({2, seq, 2, 8}, at::kFloat, 10);
  at::Tensor v = Random({2, seq, 2, 8}, at::kFloat, 11);
  const at::Tensor out = FusedCausalAttention(q, k, v);
  // Gradients of the outputs before `cut` reach no input at or after it.
  out.narrow(1, 0, cut).sum().backward();
  for (const at::Tensor& input : {q, k, v}) {
    EXPECT_EQ(input.grad().narrow(1, cut, seq - cut).abs().max().item<float>(), 0.0f);
    EXPECT_GT(input.grad().narrow(1, 0, cut).abs().max().item<float>(), 0.0f);
  }
  // Changing k and v from `cut` on changes no earlier output, and changes the later ones.
  at::NoGradGuard no_grad;
  const at::Tensor k2 = k.detach().clone();
  const at::Tensor v2 = v.detach().clone();
  k2.narrow(1, cut, seq - cut).add_(1.0);
  v2.narrow(1, cut, seq - cut).add_(1.0);
  const at::Tensor changed = FusedCausalAttention(q, k2, v2);
  EXPECT_TRUE(at::equal(changed.narrow(1, 0, cut), out.narrow(1, 0, cut)));
  EXPECT_FALSE(at::allclose(changed.narrow(1, cut, seq - cut), out.narrow(1, cut, seq - cut)));
}

// Positions [batch, seq] of rows that each pack sequences of `lengths` (summing to seq).
at::Tensor PackedPositions(int64_t batch, const std::vector<int64_t>& lengths) {
  std::vector<at::Tensor> parts;
  for (const int64_t length : lengths) parts.push_back(torch::arange(length, at::kLong));
  return at::cat(parts).unsqueeze(0).repeat({batch, 1});
}

// Causal attention run on each sequence of `lengths` alone, by the composite, and the outputs
// concatenated along the sequence: what attention over the packed rows must give.
at::Tensor EachSequenceAlone(const std::vector<at::Tensor>& in,
                             const std::vector<int64_t>& lengths) {
  const int64_t groups = in[0].size(2) / in[1].size(2);
  std::vector<at::Tensor> outputs;
  int64_t start = 0;
  for (const int64_t length : lengths) {
    outputs.push_back(CompositeCausalAttention(
        in[0].narrow(1, start, length), in[1].narrow(1, start, length),
        in[2].narrow(1, start, length), CausalMask(length, groups, in[0].scalar_type())));
    start += length;
  }
  return at::cat(outputs, /*dim=*/1);
}

// Packed rows: sequence boundaries on and off the 64-row blocks, a sequence of 1, a sequence
// spanning blocks, a short one then a long one; GQA groups of 2. The fused form and the
// generic one (LibTorch's SDPA on 2.x, the composite on 1.13) against each sequence alone.
TEST(CausalAttentionTest, PackedRowsMatchEachSequenceAlone) {
  const std::vector<std::vector<int64_t>> packings = {{64, 1, 70, 65}, {3, 197}, {200}};
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    for (const std::vector<int64_t>& lengths : packings) {
      const at::Tensor positions = PackedPositions(2, lengths);
      const std::vector<at::Tensor> inputs = {Random({2, 200, 4, 16}, dtype, 6),
                                              Random({2, 200, 2, 16}, dtype, 7),
                                              Random({2, 200, 2, 16}, dtype, 8)};
      std::string what = std::string(at::toString(dtype)) + " lengths";
      for (const int64_t length : lengths) what += " " + std::to_string(length);
      const auto alone = [&lengths](const auto& in) { return EachSequenceAlone(in, lengths); };
      ExpectSame(
          [&positions](const auto& in) {
            return FusedCausalAttention(in[0], in[1], in[2], positions);
          },
          alone, inputs, what + " fused");
      ExpectSame(
          [&positions](const auto& in) {
            return CausalAttention(in[0], in[1], in[2], at::Tensor(), /*generic=*/true, positions);
          },
          alone, inputs, what + " generic");
    }
  }
}

// Each row's own packing, and rows whose sequences differ: the mask is per row.
TEST(CausalAttentionTest, PackedRowsDifferPerRow) {
  const at::Tensor positions =
      at::cat({PackedPositions(1, {3, 197}), PackedPositions(1, {130, 70})});
  const std::vector<at::Tensor> inputs = {Random({2, 200, 4, 8}, at::kFloat, 6),
                                          Random({2, 200, 2, 8}, at::kFloat, 7),
                                          Random({2, 200, 2, 8}, at::kFloat, 8)};
  ExpectSame(
      [&positions](const auto& in) { return FusedCausalAttention(in[0], in[1], in[2], positions); },
      [](const auto& in) {
        const auto row = [&in](int64_t b) {
          return std::vector<at::Tensor>{in[0].narrow(0, b, 1), in[1].narrow(0, b, 1),
                                         in[2].narrow(0, b, 1)};
        };
        return at::cat({EachSequenceAlone(row(0), {3, 197}), EachSequenceAlone(row(1), {130, 70})});
      },
      inputs, "rows 3+197 and 130+70");
}

// Positions 0 .. T-1 are one sequence: exactly plain causal attention, forward and backward.
// Positions that point before the row (or are negative) are clamped, not read out of bounds.
TEST(CausalAttentionTest, PositionsOfOneSequenceAreExactlyCausal) {
  const int64_t seq = 2 * kAttentionBlock + 5;
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    SCOPED_TRACE(at::toString(dtype));
    const std::vector<at::Tensor> inputs = {Random({2, seq, 4, 8}, dtype, 6),
                                            Random({2, seq, 2, 8}, dtype, 7),
                                            Random({2, seq, 2, 8}, dtype, 8)};
    const at::Tensor upstream = Random({2, seq, 4, 8}, dtype, 9, false);
    const Op plain = [](const auto& in) { return FusedCausalAttention(in[0], in[1], in[2]); };
    const at::Tensor positions = PackedPositions(2, {seq});
    const Result want = internal::Run(plain, inputs, upstream);
    const Result got = internal::Run(
        [&positions](const auto& in) {
          return FusedCausalAttention(in[0], in[1], in[2], positions);
        },
        inputs, upstream);
    EXPECT_TRUE(at::equal(got.output, want.output));
    for (size_t i = 0; i < inputs.size(); ++i) {
      EXPECT_TRUE(at::equal(got.grads[i], want.grads[i])) << "input " << i;
    }
    // Beyond the row's start: the whole prefix, as plain causal attention.
    const Result far = internal::Run(
        [&positions](const auto& in) {
          return FusedCausalAttention(in[0], in[1], in[2], positions + 1000);
        },
        inputs, upstream);
    EXPECT_TRUE(at::equal(far.output, want.output));
    // Negative: each token meets only itself, so its output is its own value.
    const at::Tensor own =
        FusedCausalAttention(inputs[0], inputs[1], inputs[2], torch::full({2, seq}, -5, at::kLong));
    EXPECT_TRUE(at::equal(own, inputs[2].repeat_interleave(2, /*dim=*/2)));
  }
}

std::string GradFnName(const at::Tensor& t) { return t.grad_fn()->name(); }

// Whether t's backward graph has a node of the custom autograd function (the struct) `name`:
// LibTorch names such a node torch::autograd::CppNode<qualified name>.
bool GraphHas(const at::Tensor& t, const std::string& name) {
  const std::string needle = "::" + name + ">";
  std::vector<torch::autograd::Node*> pending = {t.grad_fn().get()};
  while (!pending.empty()) {
    torch::autograd::Node* node = pending.back();
    pending.pop_back();
    if (node == nullptr) continue;
    if (node->name().find(needle) != std::string::npos) return true;
    for (const torch::autograd::Edge& edge : node->next_edges()) {
      pending.push_back(edge.function.get());
    }
  }
  return false;
}

TEST(DispatchTest, FusedForCpuFloatCompositeOtherwise) {
  const at::Tensor x = Random({2, 3, 8}, at::kFloat, 12);
  const at::Tensor w = Random({8}, at::kFloat, 13);
  const at::Tensor targets = torch::zeros({3}, at::kLong);
  EXPECT_NE(GradFnName(RmsNorm(x, w, 1e-6, false)).find("RmsNormFunction"), std::string::npos);
  EXPECT_NE(GradFnName(SwiGlu(x, x, false)).find("SwiGluFunction"), std::string::npos);
  EXPECT_NE(GradFnName(CrossEntropy(x[0], targets, -100, false)).find("CrossEntropyFunction"),
            std::string::npos);

  // bf16 on the CPU is fused too (computed in float), except the cross-entropy: chunked.
  const at::Tensor xb = x.detach().to(at::kBFloat16).requires_grad_();
  const at::Tensor wb = w.detach().to(at::kBFloat16).requires_grad_();
  EXPECT_NE(GradFnName(RmsNorm(xb, wb, 1e-6, false)).find("RmsNormFunction"), std::string::npos);
  EXPECT_NE(GradFnName(SwiGlu(xb, xb, false)).find("SwiGluFunction"), std::string::npos);
  const at::Tensor bf16_loss = CrossEntropy(xb[0], targets, -100, false);
  EXPECT_FALSE(GraphHas(bf16_loss, "CrossEntropyFunction"));
  EXPECT_TRUE(GraphHas(bf16_loss, "TokenCrossEntropyFunction"));
  const at::Tensor qb = Random({1, 4, 2, 8}, at::kBFloat16, 14);
  const at::Tensor attention = CausalAttention(qb, qb, qb, at::Tensor(), false);
  EXPECT_EQ(attention.scalar_type(), at::kBFloat16);
  EXPECT_NE(GradFnName(attention).find("CausalAttentionFunction"), std::string::npos);
  // Mixed dtypes take the composite.
  EXPECT_EQ(GradFnName(RmsNorm(xb, w, 1e-6, false)).find("RmsNormFunction"), std::string::npos);
}

// `generic` takes the forms a GPU runs on CPU tensors the fused kernels serve; the composite
// attention's mask is needed only where LibTorch has no fused attention of its own.
TEST(DispatchTest, GenericTakesTheGpuFormsOnTheCpu) {
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    SCOPED_TRACE(at::toString(dtype));
    const at::Tensor x = Random({2, 3, 8}, dtype, 12);
    const at::Tensor w = Random({8}, dtype, 13);
    EXPECT_EQ(GradFnName(RmsNorm(x, w, 1e-6, true)).find("RmsNormFunction"), std::string::npos);
    EXPECT_EQ(GradFnName(SwiGlu(x, x, true)).find("SwiGluFunction"), std::string::npos);
    const at::Tensor table = torch::ones({3, 8}, dtype);
    EXPECT_EQ(GradFnName(Rotary(x.view({2, 3, 1, 8}), table, table, true)).find("RotaryFunction"),
              std::string::npos);
    const at::Tensor q = Random({1, 4, 4, 8}, dtype, 14);
    const at::Tensor kv = Random({1, 4, 2, 8}, dtype, 15);
    EXPECT_EQ(CausalAttentionReadsMask(dtype, at::kCPU, true), !base::kHasCausalSdpa);
    EXPECT_FALSE(CausalAttentionReadsMask(dtype, at::kCPU, false));
    EXPECT_EQ(CausalAttentionReadsMask(dtype, at::kCUDA, false), !base::kHasCausalSdpa);
    const at::Tensor mask = base::kHasCausalSdpa ? at::Tensor() : CausalMask(4, 2, dtype).to(dtype);
    const at::Tensor attention = CausalAttention(q, kv, kv, mask, true);
    EXPECT_EQ(GradFnName(attention).find("CausalAttentionFunction"), std::string::npos);
    EXPECT_TRUE(at::allclose(attention, FusedCausalAttention(q, kv, kv), 1e-2, 1e-2));
  }
  const at::Tensor logits = Random({3, 5}, at::kFloat, 16);
  EXPECT_TRUE(GraphHas(CrossEntropy(logits, torch::zeros({3}, at::kLong), -100, true),
                       "TokenCrossEntropyFunction"));
}

}  // namespace
}  // namespace plait::models::internal
