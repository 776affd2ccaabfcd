// How the chunked cross-entropies (models' TokenCrossEntropy, wrap/tp's
// VocabParallelCrossEntropy) split their logits, and the gradient of one chunk: both keep the logits in their own dtype and
// compute in a wide dtype a chunk of rows at a time, so that beside the logits (and, in
// backward, their gradient) they hold at most one wide chunk. Shared here because wrap/ may
// not depend on models/:
//
//   const torch::ScalarType wide = CrossEntropyDtype(logits.scalar_type());
//   const int64_t chunk_rows = CrossEntropyChunkRows(logits.size(1), logits.scalar_type());
#ifndef PLAIT_BASE_CROSS_ENTROPY_CHUNKS_H_
#define PLAIT_BASE_CROSS_ENTROPY_CHUNKS_H_

#include <algorithm>
#include <cstdint>

#include "torch/torch.h"

namespace plait::base {

// The dtype a chunked cross-entropy computes and returns in for logits of `dtype`: float for
// 16-bit logits and float, double for double.
inline torch::ScalarType CrossEntropyDtype(torch::ScalarType dtype) {
  return c10::promoteTypes(dtype, torch::kFloat32);
}

// The bound on one chunk: small beside a GPU's memory and beside the logits it scores (one
// fp32 copy of Llama-3's 128256-way logits at 8192 tokens is 4.2 GB), yet few enough chunks
// (16 there) that their kernel launches do not matter.
inline constexpr int64_t kCrossEntropyChunkBytes = int64_t{256} << 20;

// Rows per chunk for `columns` columns of logits of `dtype`: as many as
// kCrossEntropyChunkBytes of CrossEntropyDtype(dtype) hold, at least 1.
inline int64_t CrossEntropyChunkRows(int64_t columns, torch::ScalarType dtype) {
  const int64_t row_bytes = std::max<int64_t>(columns, 1) *
                            static_cast<int64_t>(c10::elementSize(CrossEntropyDtype(dtype)));
  return std::max<int64_t>(kCrossEntropyChunkBytes / row_bytes, 1);
}

// Writes into `gradient` [n, c] (rows of the logits' gradient, in the logits' dtype) the
// gradient of those rows' cross-entropies: (exp(logits - lse) - onehot(column)) * scale, the
// one-hot weighted by `target_scale` instead of `scale` (0 where the row's target is not among
// these columns). `logits` [n, c]; `lse`, `scale` and `target_scale` [n] in the wide dtype
// (CrossEntropyDtype); `column` [n] int64. Computed in the wide dtype: in `gradient` itself
// when it is wide, else in one wide chunk then rounded into it.
inline void WriteCrossEntropyGradient(const torch::Tensor& logits, const torch::Tensor& lse,
                                      const torch::Tensor& scale, const torch::Tensor& column,
                                      const torch::Tensor& target_scale, torch::Tensor gradient) {
  torch::Tensor wide = gradient.scalar_type() == lse.scalar_type()
                           ? gradient
                           : torch::empty(gradient.sizes(), lse.options());
  wide.copy_(logits).sub_(lse.unsqueeze(1)).exp_().mul_(scale.unsqueeze(1));
  wide.scatter_add_(1, column.unsqueeze(1), -target_scale.unsqueeze(1));
  if (!wide.is_same(gradient)) gradient.copy_(wide);
}

}  // namespace plait::base

#endif  // PLAIT_BASE_CROSS_ENTROPY_CHUNKS_H_
