#include "wrap/lora/nf4.h"

#include <cstdint>
#include <vector>

#include "ATen/Context.h"
#include "ATen/core/Tensor.h"
#include "ATen/ops/equal.h"
#include "gtest/gtest.h"
#include "torch/csrc/autograd/generated/variable_factories.h"

namespace plait::wrap::lora {
namespace {

// NF4's values, as bitsandbytes lists them (0.50, backends/utils.py), in decimal.
const std::vector<float> kValues = {-1.0f,
                                    -0.6961928009986877f,
                                    -0.5250730514526367f,
                                    -0.39491748809814453f,
                                    -0.28444138169288635f,
                                    -0.18477343022823334f,
                                    -0.09105003625154495f,
                                    0.0f,
                                    0.07958029955625534f,
                                    0.16093020141124725f,
                                    0.24611230194568634f,
                                    0.33791524171829224f,
                                    0.44070982933044434f,
                                    0.5626170039176941f,
                                    0.7229568362236023f,
                                    1.0f};

// The unpacked codes of `q`, high nibble first.
std::vector<int> Codes(const Nf4Tensor& q) {
  std::vector<int> codes;
  const at::Tensor packed = q.packed.contiguous();
  for (int64_t i = 0; i < packed.numel(); ++i) {
    const int byte = packed.data_ptr<uint8_t>()[i];
    codes.push_back(byte >> 4);
    codes.push_back(byte & 0xF);
  }
  return codes;
}

// A block whose maximum is 2 holding each NF4 value times 2: every code is its own, the even
// element's in the high nibble, and the values come back exactly.
TEST(Nf4Test, CodebookValuesRoundTripExactly) {
  std::vector<float> values;
  for (int i = 0; i < 64; ++i) values.push_back(2.0f * kValues[(i * 7) % 16]);
  const at::Tensor weight = torch::tensor(values).view({4, 16});
  const Nf4Tensor q = Nf4Quantize(weight, /*double_quant=*/false);
  ASSERT_EQ(q.packed.numel(), 32);
  EXPECT_EQ(q.packed.scalar_type(), at::kByte);
  ASSERT_EQ(q.absmax.numel(), 1);
  EXPECT_EQ(q.absmax.item<float>(), 2.0f);
  const std::vector<int> codes = Codes(q);
  for (int i = 0; i < 64; ++i) EXPECT_EQ(codes[i], (i * 7) % 16) << i;
  EXPECT_TRUE(at::equal(Nf4Dequantize(q, at::kFloat), weight));
  EXPECT_EQ(Nf4Dequantize(q, at::kFloat).sizes(), weight.sizes());
}

// A value goes to the nearest code; one exactly between two goes to the lower (bucketize on
// the midpoints, right=False), above 1 or below -1 of the block's scale it cannot be.
TEST(Nf4Test, RoundsToTheNearestCodeTiesDown) {
  std::vector<float> values(64, 0.0f);
  values[0] = 1.0f;                                       // the maximum: code 15
  values[1] = 0.5f * (kValues[9] + kValues[10]);          // a midpoint: the lower, 9
  values[2] = 0.5f * (kValues[9] + kValues[10]) + 1e-6f;  // just above: 10
  values[3] = -0.03f;                                     // nearer 0 than -0.091: 7
  values[4] = -0.06f;                                     // nearer -0.091: 6
  const Nf4Tensor q = Nf4Quantize(torch::tensor(values), false);
  const std::vector<int> codes = Codes(q);
  EXPECT_EQ(codes[0], 15);
  EXPECT_EQ(codes[1], 9);
  EXPECT_EQ(codes[2], 10);
  EXPECT_EQ(codes[3], 7);
  EXPECT_EQ(codes[4], 6);
  EXPECT_EQ(codes[5], 7);  // zero
}

// numel not a multiple of 64: the last block has its own maximum; an odd count is padded
// with a zero code (7) in the last low nibble.
TEST(Nf4Test, ATailBlockHasItsOwnMaximum) {
  at::manual_seed(1);
  const at::Tensor weight = torch::randn({3, 45});  // 135 = 2 blocks of 64 + 7
  const Nf4Tensor q = Nf4Quantize(weight, false);
  EXPECT_EQ(q.packed.numel(), 68);
  ASSERT_EQ(q.absmax.numel(), 3);
  const at::Tensor flat = weight.reshape({-1});
  EXPECT_EQ(q.absmax[2].item<float>(), flat.slice(0, 128).abs().max().item<float>());
  EXPECT_EQ(Codes(q).back(), 7);
  const at::Tensor back = Nf4Dequantize(q, at::kFloat);
  EXPECT_EQ(back.sizes(), weight.sizes());
  // Each value within half the widest gap between codes (0.28 of its block's maximum).
  const at::Tensor bound = q.absmax.repeat_interleave(64).slice(0, 0, 135) * 0.15;
  EXPECT_TRUE((back.reshape({-1}) - flat).abs().le(bound).all().item<bool>());
}

// 0.5 byte a weight plus 4 bytes a block of 64; double quantization keeps 1 byte a block plus
// 4 bytes per 256 blocks and the offset, and gives back maxima within the 8-bit map's step.
TEST(Nf4Test, DoubleQuantizationShrinksTheScales) {
  at::manual_seed(2);
  const at::Tensor weight = torch::randn({512, 128}) * 0.02;  // 1,024 blocks
  const Nf4Tensor single = Nf4Quantize(weight, false);
  const Nf4Tensor twice = Nf4Quantize(weight, true);
  EXPECT_EQ(single.packed.numel(), 512 * 128 / 2);
  EXPECT_EQ(single.bytes(), 512 * 128 / 2 + 1024 * 4);
  EXPECT_TRUE(twice.double_quant());
  EXPECT_FALSE(twice.absmax.defined());
  EXPECT_EQ(twice.absmax_codes.numel(), 1024);
  EXPECT_EQ(twice.absmax_scales.numel(), 4);
  EXPECT_EQ(twice.absmax_offset.dim(), 0);
  EXPECT_EQ(twice.bytes(), 512 * 128 / 2 + 1024 + 4 * 4 + 4);
  EXPECT_EQ(Nf4Bytes(512 * 128, false), single.bytes());
  EXPECT_EQ(Nf4Bytes(512 * 128, true), twice.bytes());
  EXPECT_EQ(Nf4Bytes(135, false), Nf4Quantize(torch::zeros({135}), false).bytes());
  EXPECT_EQ(Nf4Bytes(135, true), Nf4Quantize(torch::zeros({135}), true).bytes());
  EXPECT_TRUE(at::equal(twice.packed, single.packed));
  EXPECT_NEAR(twice.absmax_offset.item<double>(), single.absmax.mean().item<double>(), 1e-9);
  const at::Tensor a = Nf4Dequantize(single, at::kFloat);
  const at::Tensor b = Nf4Dequantize(twice, at::kFloat);
  // The maxima, recovered from any code's value ratio, within 1% of their own.
  const at::Tensor ratio = b.abs().max() / a.abs().max();
  EXPECT_NEAR(ratio.item<float>(), 1.0f, 0.01f);
  EXPECT_FALSE(at::equal(a, b));
}

// bf16 in, any compute dtype out: the product is taken in fp32 and rounded once.
TEST(Nf4Test, DequantizesToTheComputeDtype) {
  at::manual_seed(3);
  const at::Tensor weight = torch::randn({8, 64}).to(at::kBFloat16);
  const Nf4Tensor q = Nf4Quantize(weight, false);
  EXPECT_TRUE(at::equal(q.absmax, weight.to(at::kFloat).view({8, 64}).abs().amax(1)));
  const at::Tensor fp32 = Nf4Dequantize(q, at::kFloat);
  const at::Tensor bf16 = Nf4Dequantize(q, at::kBFloat16);
  EXPECT_EQ(bf16.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::equal(bf16, fp32.to(at::kBFloat16)));
}

// A tensor of more than a million elements (dequantized in chunks) with an odd count and a
// tail block of one element: every element is its code's value times its block's maximum.
TEST(Nf4Test, DequantizesEveryElementOfALargeTensor) {
  at::manual_seed(4);
  const at::Tensor weight = torch::randn({1025, 1025});
  const Nf4Tensor q = Nf4Quantize(weight, false);
  const std::vector<int> codes = Codes(q);
  const at::Tensor values = torch::tensor(kValues).index(
      {torch::tensor(std::vector<int64_t>(codes.begin(), codes.end())).narrow(0, 0, 1025 * 1025)});
  const at::Tensor expected =
      values * q.absmax.repeat_interleave(kNf4BlockSize).narrow(0, 0, 1025 * 1025);
  EXPECT_TRUE(at::equal(Nf4Dequantize(q, at::kFloat), expected.view({1025, 1025})));
}

// An all-zero tensor (a block whose maximum is 0) quantizes to zeros without NaN, with and
// without double quantization.
TEST(Nf4Test, ZeroBlocksStayZero) {
  for (const bool double_quant : {false, true}) {
    const Nf4Tensor q = Nf4Quantize(torch::zeros({4, 64}), double_quant);
    EXPECT_TRUE(at::equal(Nf4Dequantize(q, at::kFloat), torch::zeros({4, 64}))) << double_quant;
  }
}

}  // namespace
}  // namespace plait::wrap::lora
