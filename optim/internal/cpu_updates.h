// How an Optimizer updates its CPU parameters: with the fused loops (what Optimizer::Create
// does), or with the tensor operations a CUDA parameter's update always takes. Internal to
// //optim: the seam through which a CPU test runs the whole optimizer on the GPU's update
// path (grouping, 16-bit masters, clipping, state) and compares it with the fused one.
#ifndef PLAIT_OPTIM_INTERNAL_CPU_UPDATES_H_
#define PLAIT_OPTIM_INTERNAL_CPU_UPDATES_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "optim/optimizer.h"
#include "optim/optimizer.pb.h"
#include "parallel/trainable_parameter.h"

namespace plait::optim::internal {

enum class CpuUpdates {
  kFusedLoops,  // internal/fused_kernels.h, one pass over memory
  kTensorOps,   // internal/tensor_updates.h, as on CUDA
};

// Optimizer::Create with the CPU parameters' updates chosen by `cpu_updates`; parameters on
// another device take the tensor operations either way.
absl::StatusOr<std::unique_ptr<Optimizer>> CreateOptimizer(
    std::vector<parallel::TrainableParameter> parameters, const OptimizerConfig& config,
    CpuUpdates cpu_updates);

}  // namespace plait::optim::internal

#endif  // PLAIT_OPTIM_INTERNAL_CPU_UPDATES_H_
