// NF4 ("4-bit NormalFloat", QLoRA's storage of a frozen base weight) exactly as bitsandbytes
// 0.50 stores it with quantize_4bit(w, blocksize=64, quant_type="nf4"): the flattened tensor in
// blocks of 64, each scaled by its absolute maximum (fp32) into [-1, 1] and rounded to the
// nearest of NF4's 16 values (bucketized on their midpoints, a tie going to the lower one), two
// codes a byte with the even element in the high nibble; a last, shorter block is scaled by its
// own maximum. With double quantization (compress_statistics=True) the block maxima are
// themselves stored in 8 bits: their mean is subtracted and the rest quantized blockwise (256
// a block) with bitsandbytes' signed dynamic map, as its CPU kernel does (through a table of
// 65,536 bins of [-1, 1]). Dequantizing multiplies each code's value by its block's maximum in
// fp32 and rounds the product to the compute dtype, a million elements at a time, so that its
// temporaries stay small beside the weight it makes:
//
//   const Nf4Tensor q = Nf4Quantize(weight, /*double_quant=*/true);  // 0.5 byte a weight + scales
//   const at::Tensor w = Nf4Dequantize(q, at::kBFloat16);        // weight's shape
//
// Why it is home-made: bitsandbytes is a Python package over CUDA/C kernels, not a library a
// LibTorch C++ program can link, and LibTorch has no 4-bit type. This is the storage format
// only, in LibTorch ops: no 4-bit matmul kernel (the weight is dequantized, then multiplied),
// no FP4, no block size other than 64.
#ifndef PLAIT_WRAP_LORA_NF4_H_
#define PLAIT_WRAP_LORA_NF4_H_

#include <cstdint>
#include <vector>

#include "ATen/core/Tensor.h"

namespace plait::wrap::lora {

// Elements a block of the weight shares one maximum (bitsandbytes' default blocksize for
// quantize_4bit, QLoRA's) and block maxima a block of double quantization shares one scale
// (quantize_4bit's nested quantize_blockwise(blocksize=256)).
inline constexpr int64_t kNf4BlockSize = 64;
inline constexpr int64_t kNf4StatisticsBlockSize = 256;

// One tensor in NF4, on the device it was quantized on.
struct Nf4Tensor {
  at::Tensor packed;  // uint8 [ceil(numel / 2)], two codes a byte
  // Without double quantization: the blocks' maxima, fp32 [ceil(numel / 64)]. With it:
  // undefined, and the maxima less their mean `absmax_offset` (fp32, 0-dim) are
  // `absmax_codes` (uint8 [ceil(numel / 64)], into the dynamic map) times their block's
  // `absmax_scales` (fp32 [ceil(ceil(numel / 64) / 256)]).
  at::Tensor absmax;
  at::Tensor absmax_codes;
  at::Tensor absmax_scales;
  at::Tensor absmax_offset;
  std::vector<int64_t> shape;  // of the tensor quantized

  bool double_quant() const { return absmax_codes.defined(); }
  // The bytes of its tensors.
  int64_t bytes() const;
};

// `weight` (fp32, bf16 or fp16, any shape, at least one element) in NF4.
Nf4Tensor Nf4Quantize(const at::Tensor& weight, bool double_quant);

// Nf4Tensor::bytes() of a tensor of `numel` elements, without quantizing one.
int64_t Nf4Bytes(int64_t numel, bool double_quant);

// The values `tensor` stands for, in `dtype`, shaped as the tensor quantized.
at::Tensor Nf4Dequantize(const Nf4Tensor& tensor, at::ScalarType dtype);

}  // namespace plait::wrap::lora

#endif  // PLAIT_WRAP_LORA_NF4_H_
