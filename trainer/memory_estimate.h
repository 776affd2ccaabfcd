// The memory one rank of a plan needs, estimated from the plan alone (nothing is built), and
// the check that the ranks a machine runs fit in the memory it has. The estimate counts the
// trained model's share of parameters and gradients in its dtype and of fp32 optimizer state
// (with fp32 masters of 16-bit parameters), what its preparation steps hold whole at once
// (FSDP's gathered units), the activations of one micro-batch (less what activation
// checkpointing recomputes), and the frozen models' shares:
//
//   PLAIT_ASSIGN_OR_RETURN(MemoryEstimate estimate, EstimateMemory(plan, world_size));
//   PLAIT_RETURN_IF_ERROR(CheckMemoryFits(estimate, local_ranks, available_bytes));
#ifndef PLAIT_TRAINER_MEMORY_ESTIMATE_H_
#define PLAIT_TRAINER_MEMORY_ESTIMATE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "trainer/plan.pb.h"
#include "wrap/strategy.h"

namespace plait::trainer {

// What a model's preparation steps leave on each rank: each step's own estimate, the share of
// the parameters a rank owns after all of them, the most it holds whole at once, and the
// activation bytes they save (activation checkpointing).
struct PreparationEstimate {
  std::vector<wrap::StepEstimate> steps;
  double parameter_fraction = 1.0;
  double gathered_bytes = 0.0;
  double activation_bytes_saved = 0.0;
};

// A frozen model's share on each rank: its parameters and the units it gathers at once.
struct FrozenEstimate {
  PreparationEstimate preparation;
  double parameter_bytes = 0;
  double total_bytes() const { return parameter_bytes + preparation.gathered_bytes; }
};

struct MemoryEstimate {
  PreparationEstimate preparation;  // of the trained model
  double optimizer_slots = 0;       // fp32 state buffers per parameter
  bool fp32_masters = false;        // a 16-bit model's optimizer keeps fp32 copies
  double trained_state_bytes = 0;   // parameters, gradients, optimizer state (and masters)
  double activation_bytes = 0;
  double frozen_bytes = 0;             // the frozen models' parameters and gathered units
  std::vector<FrozenEstimate> frozen;  // each frozen model's, in plan order
  double total_bytes() const {
    return trained_state_bytes + preparation.gathered_bytes + activation_bytes + frozen_bytes;
  }
};

// The estimate for one rank of `plan` on a world of `world_size` ranks; `plan` must pass
// ValidatePlan for `world_size`.
absl::StatusOr<MemoryEstimate> EstimateMemory(const Plan& plan, int world_size);

// OK when `local_ranks` ranks, each needing `estimate`, fit in `available_bytes`; else
// ResourceExhausted giving the estimate, its parts and the limit, and what to change.
absl::Status CheckMemoryFits(const MemoryEstimate& estimate, int local_ranks,
                             int64_t available_bytes);

// One line on the estimate: "… parameters + gradients + optimizer state (2 slots), …".
std::string DescribeMemory(const MemoryEstimate& estimate);

}  // namespace plait::trainer

#endif  // PLAIT_TRAINER_MEMORY_ESTIMATE_H_
