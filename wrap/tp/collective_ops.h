// The autograd operators of Megatron-style tensor parallelism over one group of ranks: the
// conjugate pairs that enter and leave a tensor-parallel region (identity forward and
// all-reduce backward, and the reverse), their sequence-parallel forms (all-gather along the
// sequence forward and reduce-scatter backward, and the reverse), and the cross-entropy of
// vocabulary-sharded logits with its own backward (Megatron's vocab_parallel_cross_entropy).
// A forward or backward pass cannot return an error, so each records the first failed
// collective in its group (parallel::GraphGroup), which the caller checks after backward:
//
//   parallel::GraphGroup group(*mesh.communicator("tp").value());
//   at::Tensor h = CopyToRegion(x, group);            // then column-parallel matmuls
//   at::Tensor y = ReduceFromRegion(partial, group);  // after a row-parallel matmul
//   loss.backward();
//   PLAIT_RETURN_IF_ERROR(group.status());
#ifndef PLAIT_WRAP_TP_COLLECTIVE_OPS_H_
#define PLAIT_WRAP_TP_COLLECTIVE_OPS_H_

#include <cstdint>
#include <memory>

#include "ATen/core/Tensor.h"
#include "parallel/graph_group.h"

namespace plait::wrap::tp {

// Identity forward; backward sums the gradient over the group (Megatron's f).
at::Tensor CopyToRegion(const at::Tensor& x, parallel::GraphGroup& group);

// Sums `x` over the group forward; identity backward (Megatron's g).
at::Tensor ReduceFromRegion(const at::Tensor& x, parallel::GraphGroup& group);

// [B, T / n, ...] -> [B, T, ...]: the ranks' slices of the sequence (dim 1), rank r's at
// r * T / n, gathered forward; backward reduce-scatters the gradient along the sequence.
at::Tensor GatherSequence(const at::Tensor& x, parallel::GraphGroup& group);

// [B, T, ...] -> [B, T / n, ...]: the sum over the group of `x`, of which this rank keeps its
// slice of the sequence (dim 1) forward; backward all-gathers the gradient. T must divide
// by the group's size.
at::Tensor ReduceScatterSequence(const at::Tensor& x, parallel::GraphGroup& group);

// Per row i, -log softmax(full logits)[targets[i]], computed from this rank's columns
// `logits` [N, columns] (the vocabulary ids vocab_start .. vocab_start + columns - 1, of which
// the first `real_columns` are real and the rest padding, never read) and the global
// `targets` [N] (int64), without gathering the logits: one all-reduce of the row maxima and
// one of the sums of exponentials and target logits. 0 where the target is `ignore_index`.
// The logits stay in their dtype (float, double, bf16, fp16); it computes in
// base::CrossEntropyDtype (fp32 for 16-bit logits) a chunk of rows at a time and keeps only the
// logits themselves (no copy) and a log-sum-exp [N] for backward, so that beside them it holds
// at most one wide chunk and, in backward, the logits' gradient (in their dtype). Returns [N]
// in that wide dtype. Differentiable in `logits`: softmax minus the one-hot target on this
// rank's real columns, 0 on its padding columns. Nothing is read back to the host.
at::Tensor VocabParallelCrossEntropy(const at::Tensor& logits, const at::Tensor& targets,
                                     int64_t vocab_start, int64_t real_columns,
                                     int64_t ignore_index, parallel::GraphGroup& group);
// As above with `chunk_rows` (> 0) rows per chunk in place of
// base::CrossEntropyChunkRows(real_columns, dtype): for tests that cross chunk boundaries with
// small tensors.
at::Tensor VocabParallelCrossEntropy(const at::Tensor& logits, const at::Tensor& targets,
                                     int64_t vocab_start, int64_t real_columns,
                                     int64_t ignore_index, parallel::GraphGroup& group,
                                     int64_t chunk_rows);

}  // namespace plait::wrap::tp

#endif  // PLAIT_WRAP_TP_COLLECTIVE_OPS_H_
