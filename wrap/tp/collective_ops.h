// The autograd operators of Megatron-style tensor parallelism over one group of ranks: the
// conjugate pairs that enter and leave a tensor-parallel region (identity forward and
// all-reduce backward, and the reverse), their sequence-parallel forms (all-gather along the
// sequence forward and reduce-scatter backward, and the reverse), and the cross-entropy of
// vocabulary-sharded logits with its own backward (Megatron's vocab_parallel_cross_entropy).
// A forward or backward pass cannot return an error, so each records the first failed
// collective in its TpGroup, which the caller checks after backward:
//
//   TpGroup group(*mesh.communicator("tp").value());
//   torch::Tensor h = CopyToRegion(x, group);            // then column-parallel matmuls
//   torch::Tensor y = ReduceFromRegion(partial, group);  // after a row-parallel matmul
//   loss.backward();
//   PLAIT_RETURN_IF_ERROR(group.status());
#ifndef PLAIT_WRAP_TP_COLLECTIVE_OPS_H_
#define PLAIT_WRAP_TP_COLLECTIVE_OPS_H_

#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "parallel/communicator.h"
#include "torch/torch.h"

namespace plait::wrap::tp {

// The communicator of a tensor-parallel group and the first error of its operators' collectives.
// It must outlive every autograd graph built with it.
class TpGroup {
 public:
  explicit TpGroup(parallel::Communicator& communicator) : communicator_(communicator) {}

  parallel::Communicator& communicator() const { return communicator_; }
  int size() const { return communicator_.size(); }
  int rank() const { return communicator_.rank(); }

  // Waits for `work` and keeps its error if it is the first.
  void Wait(const std::shared_ptr<parallel::Work>& work);

  // The first error of a collective; it stays, since the ranks are out of step after it.
  absl::Status status() const;

 private:
  parallel::Communicator& communicator_;
  mutable absl::Mutex mutex_;
  absl::Status status_ ABSL_GUARDED_BY(mutex_);
};

// Identity forward; backward sums the gradient over the group (Megatron's f).
torch::Tensor CopyToRegion(const torch::Tensor& x, TpGroup& group);

// Sums `x` over the group forward; identity backward (Megatron's g).
torch::Tensor ReduceFromRegion(const torch::Tensor& x, TpGroup& group);

// [B, T / n, ...] -> [B, T, ...]: the ranks' slices of the sequence (dim 1), rank r's at
// r * T / n, gathered forward; backward reduce-scatters the gradient along the sequence.
torch::Tensor GatherSequence(const torch::Tensor& x, TpGroup& group);

// [B, T, ...] -> [B, T / n, ...]: the sum over the group of `x`, of which this rank keeps its
// slice of the sequence (dim 1) forward; backward all-gathers the gradient. T must divide
// by the group's size.
torch::Tensor ReduceScatterSequence(const torch::Tensor& x, TpGroup& group);

// Per row i, -log softmax(full logits)[targets[i]], computed from this rank's columns
// `logits` [N, V / n] (fp32; the vocabulary ids vocab_start .. vocab_start + V / n - 1) and the
// global `targets` [N] (int64), without gathering the logits: all-reduces of the row maxima
// and of the sums of exponentials and target logits. 0 where the target is `ignore_index`.
// Differentiable in `logits`: softmax minus the one-hot target, this rank's columns.
torch::Tensor VocabParallelCrossEntropy(const torch::Tensor& logits, const torch::Tensor& targets,
                                        int64_t vocab_start, int64_t ignore_index, TpGroup& group);

}  // namespace plait::wrap::tp

#endif  // PLAIT_WRAP_TP_COLLECTIVE_OPS_H_
