// The items one optimizer step scores (Objective::ScoredItems: tokens for causal LM and SFT,
// pairs for DPO), counted over its micro-batches and data-parallel ranks before any backward,
// and the scale of each micro-batch's loss that makes the step's gradient the gradient of one
// loss: the sum of the losses of all the step's items over their count N. That is the single
// process's loss and TRL's SFT loss (transformers' Trainer divides the step's summed token
// losses by num_items_in_batch, counted over every micro-batch and, with
// average_tokens_across_devices, every rank).
//
// Micro-batch i of a rank scores n_i items and its objective returns their mean; the
// data-parallel wrappers (DDP, FSDP, hybrid sharding) average the gradients over the D ranks of
// the dimensions that split the batch. So micro-batch i's mean is divided by N / (n_i D)
// before its backward: summed over the micro-batches and averaged over the ranks, the step's
// gradient is that of (sum of item losses) / N, whatever the micro-batches' lengths. The
// wrappers keep their plain average over D, as PyTorch's do. When every micro-batch scores the
// same n items (causal LM scores every token; DPO batches hold B pairs), N / (n D) is exactly
// the accumulation count, and the gradients are bit for bit those of each mean divided by the
// accumulation. Tensor-parallel ranks of one group read the same batch: the count is summed
// over the data-parallel dimensions only. Context-parallel ranks each score their slice of the
// same sequences: the count is summed over their dimension too, whose gradients context
// parallelism averages as the data-parallel wrappers average theirs, so D counts its ranks.
//
//   std::vector<int64_t> items;  // objective->ScoredItems(batch) of each micro-batch
//   PLAIT_ASSIGN_OR_RETURN(StepItems step, StepItems::Count(items, mesh, resolved.scoring_dims));
//   for (int micro = 0; ...) {
//     PLAIT_ASSIGN_OR_RETURN(ObjectiveOutput out, objective->Compute(policy, batches[micro]));
//     step.ScaledForBackward(out.loss, micro).backward();
//   }
#ifndef PLAIT_OBJECTIVES_STEP_ITEMS_H_
#define PLAIT_OBJECTIVES_STEP_ITEMS_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/statusor.h"
#include "parallel/device_mesh.h"

namespace plait::objectives {

class StepItems {
 public:
  // Sums `items` (this rank's micro-batches', in order) over the ranks of `mesh` along
  // `scoring_dims` (those whose ranks score different items: ResolvedPlan::scoring_dims;
  // every rank of the mesh must call it). FailedPrecondition when the
  // step scores no item on any rank, which every rank then reports: its loss would be 0 / 0.
  static absl::StatusOr<StepItems> Count(std::vector<int64_t> items,
                                         const parallel::DeviceMesh& mesh,
                                         const std::vector<std::string>& scoring_dims);

  // N: the items of every micro-batch of the step on every data-parallel rank.
  int64_t total() const { return total_; }
  // n_micro: this rank's micro-batch `micro`'s.
  int64_t items(int micro) const { return items_.at(micro); }
  // Micro-batch `micro`'s on every rank of the scoring dimensions (N sums them).
  int64_t global_items(int micro) const { return global_items_.at(micro); }
  // D: the ranks of the scoring dimensions.
  int data_parallel_size() const { return data_parallel_size_; }

  // `loss`, the mean over micro-batch `micro`'s items, divided by N / (n_micro D) for its
  // backward. A micro-batch with no item contributes 0 and a zero gradient (its loss is 0 by
  // Objective's contract; it still runs its backward, whose collectives every rank joins).
  at::Tensor ScaledForBackward(const at::Tensor& loss, int micro) const;

 private:
  StepItems(std::vector<int64_t> items, std::vector<int64_t> global_items, int64_t total,
            int data_parallel_size)
      : items_(std::move(items)),
        global_items_(std::move(global_items)),
        total_(total),
        data_parallel_size_(data_parallel_size) {}

  std::vector<int64_t> items_;
  std::vector<int64_t> global_items_;
  int64_t total_;
  int data_parallel_size_;
};

}  // namespace plait::objectives

#endif  // PLAIT_OBJECTIVES_STEP_ITEMS_H_
