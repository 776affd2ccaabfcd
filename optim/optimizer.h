// The optimizer of a training run, over exactly the parameters the (prepared) model trains:
// whole tensors, or the shards a wrapper hands over (parallel::TrainableParameter). It never walks
// a module. Built from an OptimizerConfig: AdamW, Adam, SGD or Lion, parameter groups from name
// rules, and optional sharding-aware gradient clipping. The learning rate comes from outside
// at every step, typically from a plait::sched::Schedule:
//
//   PLAIT_ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> optimizer,
//                          Optimizer::Create(prepared.trainable_parameters(), config));
//   for (int64_t step = 0; step < steps; ++step) {
//     loss.backward();
//     PLAIT_ASSIGN_OR_RETURN(StepReport report, optimizer->Step(schedule.LearningRate(step)));
//     optimizer->ZeroGrad();
//   }
//
// Each update is one fused pass over a CPU parameter's memory (internal/fused_kernels.h) that
// matches torch::optim's arithmetic. CUDA parameters are updated in buckets that share every
// scalar (group, update count, dtype), each by LibTorch's multi-tensor kernels
// (internal/multi_tensor_updates.h): ATen's fused Adam, AdamW and SGD on LibTorch 2.x, one
// pass over memory; foreach operations for Lion and on 1.13; kernels per bucket, not per
// parameter. Clipping's norm is reduced on the device, whose one read on the host is the norm
// itself. Optimizer state is fp32 whatever the parameter dtype, on the parameter's device,
// allocated by each parameter's first update (as torch.optim's), so building an optimizer
// costs no memory beyond the masters below;
// bf16 and fp16 parameters are updated through fp32 master weights kept here: a
// TrainableParameter's `master` where given, else the parameter widened.
#ifndef PLAIT_OPTIM_OPTIMIZER_H_
#define PLAIT_OPTIM_OPTIMIZER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "optim/optimizer.pb.h"
#include "optim/param_groups.h"
#include "parallel/trainable_parameter.h"

namespace plait::optim {

class Optimizer;

// The seam internal/cpu_updates.h defines.
namespace internal {
struct UpdatePaths;
absl::StatusOr<std::unique_ptr<Optimizer>> CreateOptimizer(
    std::vector<parallel::TrainableParameter> parameters, const OptimizerConfig& config,
    const UpdatePaths& paths);
}  // namespace internal

struct StepReport {
  int64_t step = 0;                 // updates applied so far, this one included
  std::optional<double> grad_norm;  // before clipping; set when clipping is configured
  double clip_factor = 1.0;         // what the gradients were multiplied by
  bool skipped = false;             // a non-finite norm or loss (not FAIL): nothing changed
};

// Optimizer state keyed by parameter name, so it survives re-wrapping and can be saved per
// shard. Keys are "<parameter name>:<slot>", slots being the algorithm's buffers (exp_avg,
// exp_avg_sq, momentum_buffer), "step" (updates this parameter received) and, for bf16 and
// fp16 parameters, "master".
struct OptimizerState {
  int64_t step = 0;
  std::map<std::string, at::Tensor> tensors;
};

// The checks Optimizer::Create makes of `config` for parameters named `parameter_names`,
// without tensors, so that a plan can be checked before a model exists: InvalidArgument
// naming the field, as Create's.
absl::Status ValidateOptimizerConfig(const OptimizerConfig& config,
                                     const std::vector<std::string>& parameter_names);

// The fp32 state buffers `config`'s algorithm keeps per parameter element (AdamW and Adam
// two, Lion one, SGD one with momentum), not counting fp32 masters of 16-bit parameters; 0
// for a config without an algorithm. For memory estimates.
int StateBuffersPerElement(const OptimizerConfig& config);

class Optimizer {
 public:
  // InvalidArgument naming the field for an invalid config (optimizer.adamw.beta1: 1 must be
  // in [0, 1), ...) or parameter (duplicate or empty name, non-floating or non-contiguous
  // tensor, parameters on different devices, a master that is not a 16-bit parameter's fp32
  // values), and for a parameter-group rule that matches nothing.
  static absl::StatusOr<std::unique_ptr<Optimizer>> Create(
      std::vector<parallel::TrainableParameter> parameters, const OptimizerConfig& config);

  ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // Clips (when configured), then updates every parameter that has a gradient with learning
  // rate `lr` times its group's lr_scale. InvalidArgument for a negative or non-finite `lr`;
  // FailedPrecondition naming the step for a non-finite gradient norm under FAIL; the
  // communicators' errors while computing the norm.
  absl::StatusOr<StepReport> Step(double lr);

  // Instead of Step for a step whose loss, `loss`, is not finite: its gradients never reach
  // the parameters, with clipping or without. The update is skipped as Step skips one whose
  // gradient norm is not finite (nothing changes; the report says skipped), or under
  // clipping's FAIL policy FailedPrecondition naming the step. InvalidArgument for a finite
  // `loss`.
  absl::StatusOr<StepReport> SkipNonFiniteLoss(double loss) const;

  // Drops every parameter's gradient.
  void ZeroGrad();

  int64_t step() const { return step_; }
  const std::vector<ParamGroup>& groups() const { return groups_; }
  const std::vector<parallel::TrainableParameter>& parameters() const { return parameters_; }

  // A copy of the state in host memory: a GPU's state is copied there once, here, and never
  // duplicated on the device. State not allocated yet is saved as the zeros it starts from.
  OptimizerState SaveState() const;

  // SaveState's keys, step and tensor shapes and dtypes, without its data: each tensor is on
  // the meta device (no memory, no copy), so that a resume learns what to read without
  // copying a GPU's state to the host.
  OptimizerState StateLayout() const;

  // Replaces the state, whose tensors may be on any device: each is copied onto its
  // parameter's. InvalidArgument naming the parameters the state lacks or has in excess, or
  // an entry whose shape differs from the parameter's.
  absl::Status LoadState(const OptimizerState& state);

 private:
  struct Slot;
  friend absl::StatusOr<std::unique_ptr<Optimizer>> internal::CreateOptimizer(
      std::vector<parallel::TrainableParameter> parameters, const OptimizerConfig& config,
      const internal::UpdatePaths& paths);

  Optimizer(std::vector<parallel::TrainableParameter> parameters, OptimizerConfig config,
            std::vector<ParamGroup> groups, std::vector<Slot> slots, int64_t bucket_elements);

  // `report` of an update skipped because `quantity` ("the loss") is `value`, not finite;
  // FailedPrecondition naming the step under clipping's FAIL policy.
  absl::StatusOr<StepReport> SkipNonFinite(StepReport report, absl::string_view quantity,
                                           double value) const;
  // Updates parameter `index` (a fused slot) by the fused loops.
  void UpdateFused(size_t index, double lr);
  // Updates the parameters `bucket` (of one group, update count and dtype; not fused) by the
  // multi-tensor updates.
  void UpdateBucket(const std::vector<size_t>& bucket, double lr);
  // SaveState's entries, each tensor passed through `take`.
  OptimizerState DescribeState(const std::function<at::Tensor(const at::Tensor&)>& take) const;

  std::vector<parallel::TrainableParameter> parameters_;
  OptimizerConfig config_;
  std::vector<ParamGroup> groups_;
  std::vector<Slot> slots_;  // one per parameter, same order
  int64_t bucket_elements_;  // internal/cpu_updates.h
  int64_t step_ = 0;
};

}  // namespace plait::optim

#endif  // PLAIT_OPTIM_OPTIMIZER_H_
