#include "wrap/lora/nf4.h"

#include <algorithm>
#include <array>
#include <cstdint>

#include "ATen/core/Tensor.h"
#include "ATen/ops/bucketize.h"
#include "ATen/ops/cat.h"
#include "torch/csrc/autograd/generated/variable_factories.h"

namespace plait::wrap::lora {
namespace {

// NF4's 16 values, sorted (bitsandbytes 0.50, backends/utils.py _NF4_QUANT_TABLE: the
// quantiles of N(0, 1) normalised to [-1, 1], with an exact zero), as fp32.
constexpr float kNf4Values[16] = {
    -0x1p+0f,        -0x1.647362p-1f, -0x1.0cd66p-1f,  -0x1.94654p-2f,
    -0x1.23449ap-2f, -0x1.7a6a7ep-3f, -0x1.74f0e2p-4f, 0.0f,
    0x1.45f5fep-4f,  0x1.4995c6p-3f,  0x1.f809bap-3f,  0x1.5a0674p-2f,
    0x1.c3497p-2f,   0x1.200f56p-1f,  0x1.722766p-1f,  0x1p+0f,
};

// bitsandbytes' signed 8-bit dynamic map (functional.create_dynamic_map(signed=True), 0.50),
// the 256 fp32 values double quantization stores the block maxima in, sorted.
constexpr float kDynamicMap[256] = {
    -0x1.fc6666p-1f,  -0x1.f53334p-1f,  -0x1.eep-1f,      -0x1.e6ccccp-1f,
    -0x1.df999ap-1f,  -0x1.d86666p-1f,  -0x1.d13334p-1f,  -0x1.cap-1f,
    -0x1.c2ccccp-1f,  -0x1.bb999ap-1f,  -0x1.b46666p-1f,  -0x1.ad3334p-1f,
    -0x1.a6p-1f,      -0x1.9eccccp-1f,  -0x1.97999ap-1f,  -0x1.906666p-1f,
    -0x1.893334p-1f,  -0x1.82p-1f,      -0x1.7accccp-1f,  -0x1.73999ap-1f,
    -0x1.6c6668p-1f,  -0x1.653334p-1f,  -0x1.5ep-1f,      -0x1.56ccccp-1f,
    -0x1.4f999ap-1f,  -0x1.486668p-1f,  -0x1.413334p-1f,  -0x1.3ap-1f,
    -0x1.32ccccp-1f,  -0x1.2b999ap-1f,  -0x1.246668p-1f,  -0x1.1d3334p-1f,
    -0x1.16p-1f,      -0x1.0eccccp-1f,  -0x1.079998p-1f,  -0x1.006666p-1f,
    -0x1.f26664p-2f,  -0x1.e4p-2f,      -0x1.d59998p-2f,  -0x1.c73334p-2f,
    -0x1.b8ccccp-2f,  -0x1.aa6666p-2f,  -0x1.9cp-2f,      -0x1.8d9998p-2f,
    -0x1.7f3334p-2f,  -0x1.70ccccp-2f,  -0x1.626666p-2f,  -0x1.54p-2f,
    -0x1.459998p-2f,  -0x1.373334p-2f,  -0x1.28ccccp-2f,  -0x1.1a6668p-2f,
    -0x1.0cp-2f,      -0x1.fb3332p-3f,  -0x1.de6666p-3f,  -0x1.c1999ap-3f,
    -0x1.a4ccccp-3f,  -0x1.88p-3f,      -0x1.6b3334p-3f,  -0x1.4e6666p-3f,
    -0x1.31999ap-3f,  -0x1.14ccccp-3f,  -0x1.fp-4f,       -0x1.b66668p-4f,
    -0x1.93d70ap-4f,  -0x1.8851eep-4f,  -0x1.7ccccep-4f,  -0x1.7147aep-4f,
    -0x1.65c29p-4f,   -0x1.5a3d7p-4f,   -0x1.4eb854p-4f,  -0x1.433334p-4f,
    -0x1.37ae14p-4f,  -0x1.2c28f6p-4f,  -0x1.20a3d6p-4f,  -0x1.151ebap-4f,
    -0x1.09999ap-4f,  -0x1.fc28f6p-5f,  -0x1.e51ebap-5f,  -0x1.ce147ap-5f,
    -0x1.b70a3ep-5f,  -0x1.ap-5f,       -0x1.88f5c2p-5f,  -0x1.71eb86p-5f,
    -0x1.5ae146p-5f,  -0x1.43d70ap-5f,  -0x1.2ccccep-5f,  -0x1.15c29p-5f,
    -0x1.fd70a4p-6f,  -0x1.cf5c2ap-6f,  -0x1.a147aep-6f,  -0x1.733334p-6f,
    -0x1.451ebap-6f,  -0x1.170a3ep-6f,  -0x1.d1eb86p-7f,  -0x1.75c29p-7f,
    -0x1.3e76c8p-7f,  -0x1.2c083p-7f,   -0x1.19999ap-7f,  -0x1.072b02p-7f,
    -0x1.e978d4p-8f,  -0x1.c49ba6p-8f,  -0x1.9fbe76p-8f,  -0x1.7ae148p-8f,
    -0x1.56041ap-8f,  -0x1.3126e8p-8f,  -0x1.0c49bap-8f,  -0x1.ced914p-9f,
    -0x1.851eb8p-9f,  -0x1.3b645ap-9f,  -0x1.e353f8p-10f, -0x1.4fdf3ap-10f,
    -0x1.eecbfep-11f, -0x1.b3d07cp-11f, -0x1.78d5p-11f,   -0x1.3dd982p-11f,
    -0x1.02de02p-11f, -0x1.8fc506p-12f, -0x1.19ce0ap-12f, -0x1.47ae16p-13f,
    -0x1.743e96p-14f, -0x1.15df66p-14f, -0x1.6f0068p-15f, -0x1.64840cp-16f,
    -0x1.040bfep-17f, -0x1.b43528p-19f, -0x1.27476ep-21f, 0.0f,
    0x1.27476ep-21f,  0x1.b43528p-19f,  0x1.040bfep-17f,  0x1.64840cp-16f,
    0x1.6f0068p-15f,  0x1.15df66p-14f,  0x1.743e96p-14f,  0x1.47ae16p-13f,
    0x1.19ce0ap-12f,  0x1.8fc506p-12f,  0x1.02de02p-11f,  0x1.3dd982p-11f,
    0x1.78d5p-11f,    0x1.b3d07cp-11f,  0x1.eecbfep-11f,  0x1.4fdf3ap-10f,
    0x1.e353f8p-10f,  0x1.3b645ap-9f,   0x1.851eb8p-9f,   0x1.ced914p-9f,
    0x1.0c49bap-8f,   0x1.3126e8p-8f,   0x1.56041ap-8f,   0x1.7ae148p-8f,
    0x1.9fbe76p-8f,   0x1.c49ba6p-8f,   0x1.e978d4p-8f,   0x1.072b02p-7f,
    0x1.19999ap-7f,   0x1.2c083p-7f,    0x1.3e76c8p-7f,   0x1.75c29p-7f,
    0x1.d1eb86p-7f,   0x1.170a3ep-6f,   0x1.451ebap-6f,   0x1.733334p-6f,
    0x1.a147aep-6f,   0x1.cf5c2ap-6f,   0x1.fd70a4p-6f,   0x1.15c29p-5f,
    0x1.2ccccep-5f,   0x1.43d70ap-5f,   0x1.5ae146p-5f,   0x1.71eb86p-5f,
    0x1.88f5c2p-5f,   0x1.ap-5f,        0x1.b70a3ep-5f,   0x1.ce147ap-5f,
    0x1.e51ebap-5f,   0x1.fc28f6p-5f,   0x1.09999ap-4f,   0x1.151ebap-4f,
    0x1.20a3d6p-4f,   0x1.2c28f6p-4f,   0x1.37ae14p-4f,   0x1.433334p-4f,
    0x1.4eb854p-4f,   0x1.5a3d7p-4f,    0x1.65c29p-4f,    0x1.7147aep-4f,
    0x1.7ccccep-4f,   0x1.8851eep-4f,   0x1.93d70ap-4f,   0x1.b66668p-4f,
    0x1.fp-4f,        0x1.14ccccp-3f,   0x1.31999ap-3f,   0x1.4e6666p-3f,
    0x1.6b3334p-3f,   0x1.88p-3f,       0x1.a4ccccp-3f,   0x1.c1999ap-3f,
    0x1.de6666p-3f,   0x1.fb3332p-3f,   0x1.0cp-2f,       0x1.1a6668p-2f,
    0x1.28ccccp-2f,   0x1.373334p-2f,   0x1.459998p-2f,   0x1.54p-2f,
    0x1.626666p-2f,   0x1.70ccccp-2f,   0x1.7f3334p-2f,   0x1.8d9998p-2f,
    0x1.9cp-2f,       0x1.aa6666p-2f,   0x1.b8ccccp-2f,   0x1.c73334p-2f,
    0x1.d59998p-2f,   0x1.e4p-2f,       0x1.f26664p-2f,   0x1.006666p-1f,
    0x1.079998p-1f,   0x1.0eccccp-1f,   0x1.16p-1f,       0x1.1d3334p-1f,
    0x1.246668p-1f,   0x1.2b999ap-1f,   0x1.32ccccp-1f,   0x1.3ap-1f,
    0x1.413334p-1f,   0x1.486668p-1f,   0x1.4f999ap-1f,   0x1.56ccccp-1f,
    0x1.5ep-1f,       0x1.653334p-1f,   0x1.6c6668p-1f,   0x1.73999ap-1f,
    0x1.7accccp-1f,   0x1.82p-1f,       0x1.893334p-1f,   0x1.906666p-1f,
    0x1.97999ap-1f,   0x1.9eccccp-1f,   0x1.a6p-1f,       0x1.ad3334p-1f,
    0x1.b46666p-1f,   0x1.bb999ap-1f,   0x1.c2ccccp-1f,   0x1.cap-1f,
    0x1.d13334p-1f,   0x1.d86666p-1f,   0x1.df999ap-1f,   0x1.e6ccccp-1f,
    0x1.eep-1f,       0x1.f53334p-1f,   0x1.fc6666p-1f,   0x1p+0f,
};

// The bins bitsandbytes' CPU kernel for blockwise 8-bit quantization (csrc/cpu_ops.cpp,
// quantize_cpu_impl) rounds a scaled value in [-1, 1] to before looking its code up.
constexpr int64_t kLutSize = 65536;

at::Tensor Table(const float* values, int64_t size, const at::Device& device) {
  return torch::tensor(c10::ArrayRef<float>(values, size), at::kFloat).to(device);
}

// The NF4 values of each byte's two codes, [256, 2]: its high nibble's (the even element's),
// then its low nibble's.
at::Tensor CodePairValues(const at::Device& device) {
  static const std::array<float, 512> pairs = [] {
    std::array<float, 512> values;
    for (int byte = 0; byte < 256; ++byte) {
      values[2 * byte] = kNf4Values[byte >> 4];
      values[2 * byte + 1] = kNf4Values[byte & 0xF];
    }
    return values;
  }();
  return Table(pairs.data(), pairs.size(), device).view({256, 2});
}

// Elements Nf4Dequantize computes at once, a multiple of the block size: its index and fp32
// temporaries stay within about 16 MB whatever the tensor's size.
constexpr int64_t kDequantizeChunk = int64_t{1} << 20;

// The midpoints of sorted `code`'s neighbours, which a value is bucketized on to find its
// nearest code (a value on a midpoint gets the lower one).
at::Tensor Midpoints(const at::Tensor& code) {
  return (code.slice(0, 0, -1) + code.slice(0, 1)) * 0.5;
}

// bitsandbytes' quantize_4bit (backends/default/ops.py, the kernel its CPU backend runs):
// blocks of 64 scaled by the reciprocal of their maximum (clamped to 1e-38), a shorter last
// block divided by its own; codes padded to an even count with a zero.
void QuantizeBlocks(const at::Tensor& weight, Nf4Tensor& out) {
  const at::Tensor flat = weight.reshape({-1}).to(at::kFloat);
  const int64_t n = flat.numel();
  const int64_t rem = n % kNf4BlockSize;
  const int64_t full = n - rem;
  const at::Tensor blocks = flat.slice(0, 0, full).reshape({-1, kNf4BlockSize});
  at::Tensor absmax = std::get<0>(blocks.abs().max(/*dim=*/-1));
  at::Tensor scaled =
      (blocks * absmax.clamp_min(1e-38).reciprocal().view({-1, 1})).clamp(-1, 1).reshape({-1});
  if (rem > 0) {
    const at::Tensor tail = flat.slice(0, full);
    const at::Tensor tail_max = tail.abs().max().clamp_min(1e-38);
    absmax = at::cat({absmax, tail_max.unsqueeze(0)});
    scaled = at::cat({scaled, (tail / tail_max).clamp(-1, 1)});
  }
  if (scaled.numel() % 2 != 0) scaled = at::cat({scaled, torch::zeros({1}, scaled.options())});
  const at::Tensor bounds = Midpoints(Table(kNf4Values, 16, weight.device()));
  const at::Tensor codes = at::bucketize(scaled, bounds, /*out_int32=*/true).to(at::kByte);
  const at::Tensor pairs = codes.view({-1, 2});
  out.packed = pairs.select(1, 0).bitwise_left_shift(4).bitwise_or(pairs.select(1, 1));
  out.absmax = absmax;
}

// The code of each of the 65,536 bins, as bitsandbytes' build_quantize_lut builds it: bin i's
// left edge -1 + 2i / 65535 (in fp32 arithmetic) gets the code whose midpoints below it it has
// passed. A constant table, built once by the kernel's own loop so the fp32 rounding is its.
const at::Tensor& DynamicMapLut() {
  static const at::Tensor* lut = [] {
    float midpoints[255];
    for (int i = 0; i < 255; ++i) midpoints[i] = 0.5f * (kDynamicMap[i] + kDynamicMap[i + 1]);
    auto* table = new at::Tensor(torch::empty({kLutSize}, at::kLong));
    int64_t* codes = table->data_ptr<int64_t>();
    int code = 0;
    for (int64_t i = 0; i < kLutSize; ++i) {
      const float edge = -1.0f + (2.0f * static_cast<float>(i)) / static_cast<float>(kLutSize - 1);
      while (code < 255 && midpoints[code] < edge) ++code;
      codes[i] = code;
    }
    return table;
  }();
  return *lut;
}

// bitsandbytes' CPU kernel quantize_cpu_impl on fp32 `values` with the dynamic map, blocks of
// 256: each block times the reciprocal of its maximum, rounded into one of 65,536 bins of
// [-1, 1] ((v + 1) * 0.5 * 65535 + 0.5, truncated), each bin taking the code nearest its left
// edge; a block whose maximum is 0 gets code 0.
void QuantizeStatistics(const at::Tensor& values, Nf4Tensor& out) {
  const int64_t n = values.numel();
  const int64_t blocks = (n + kNf4StatisticsBlockSize - 1) / kNf4StatisticsBlockSize;
  const int64_t padded = blocks * kNf4StatisticsBlockSize;
  // Padding with zeros changes no block's maximum.
  const at::Tensor grid =
      at::cat({values, torch::zeros({padded - n}, values.options())}).view({blocks, -1});
  const at::Tensor absmax = std::get<0>(grid.abs().max(/*dim=*/-1));
  const at::Tensor zero_block = (absmax == 0).view({-1, 1});
  const at::Tensor scaled = grid * absmax.masked_fill(absmax == 0, 1).reciprocal().view({-1, 1});
  const at::Tensor bins =
      ((scaled.clamp(-1, 1) + 1.0) * 0.5 * static_cast<double>(kLutSize - 1) + 0.5).to(at::kLong);
  const at::Tensor lut = DynamicMapLut().to(values.device());
  const at::Tensor codes =
      lut.index({bins.reshape({-1})}).view({blocks, -1}).masked_fill(zero_block, 0);
  out.absmax_codes = codes.reshape({-1}).slice(0, 0, n).to(at::kByte);
  out.absmax_scales = absmax;
}

}  // namespace

int64_t Nf4Tensor::bytes() const {
  int64_t bytes = 0;
  for (const at::Tensor* tensor :
       {&packed, &absmax, &absmax_codes, &absmax_scales, &absmax_offset}) {
    if (tensor->defined()) bytes += tensor->numel() * tensor->element_size();
  }
  return bytes;
}

int64_t Nf4Bytes(int64_t numel, bool double_quant) {
  const int64_t blocks = (numel + kNf4BlockSize - 1) / kNf4BlockSize;
  const int64_t packed = (numel + 1) / 2;
  if (!double_quant) return packed + 4 * blocks;
  const int64_t scales = (blocks + kNf4StatisticsBlockSize - 1) / kNf4StatisticsBlockSize;
  return packed + blocks + 4 * scales + 4;
}

Nf4Tensor Nf4Quantize(const at::Tensor& weight, bool double_quant) {
  at::NoGradGuard no_grad;
  Nf4Tensor out;
  out.shape = weight.sizes().vec();
  QuantizeBlocks(weight, out);
  if (double_quant) {
    // quantize_4bit with compress_statistics: offset = absmax.mean(), then
    // quantize_blockwise(absmax - offset, blocksize=256).
    out.absmax_offset = out.absmax.mean();
    QuantizeStatistics(out.absmax - out.absmax_offset, out);
    out.absmax = at::Tensor();
  }
  return out;
}

at::Tensor Nf4Dequantize(const Nf4Tensor& tensor, at::ScalarType dtype) {
  at::NoGradGuard no_grad;
  const at::Device device = tensor.packed.device();
  at::Tensor absmax = tensor.absmax;
  if (tensor.double_quant()) {
    // dequantize_blockwise (code[q] * its block's scale, fp32), plus the offset.
    const int64_t n = tensor.absmax_codes.numel();
    const at::Tensor scales =
        tensor.absmax_scales.repeat_interleave(kNf4StatisticsBlockSize).slice(0, 0, n);
    absmax = Table(kDynamicMap, 256, device).index({tensor.absmax_codes.to(at::kLong)}) * scales +
             tensor.absmax_offset;
  }
  int64_t n = 1;
  for (const int64_t size : tensor.shape) n *= size;
  const at::Tensor pair_values = CodePairValues(device);
  at::Tensor out = torch::empty({n}, tensor.packed.options().dtype(dtype));
  for (int64_t begin = 0; begin < n; begin += kDequantizeChunk) {
    const int64_t count = std::min(kDequantizeChunk, n - begin);
    const at::Tensor bytes = tensor.packed.narrow(0, begin / 2, (count + 1) / 2);
    const at::Tensor values =
        pair_values.index({bytes.to(at::kLong)}).view({-1}).narrow(0, 0, count);
    const int64_t blocks = (count + kNf4BlockSize - 1) / kNf4BlockSize;
    const at::Tensor scales = absmax.narrow(0, begin / kNf4BlockSize, blocks)
                                  .repeat_interleave(kNf4BlockSize)
                                  .narrow(0, 0, count);
    // In fp32, then rounded to `dtype`, as bitsandbytes' dequantize_4bit.
    out.narrow(0, begin, count).copy_(values * scales);
  }
  return out.view(tensor.shape);
}

}  // namespace plait::wrap::lora
