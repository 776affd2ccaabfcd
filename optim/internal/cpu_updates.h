// How an Optimizer updates its parameters: its CPU parameters with the fused loops (what
// Optimizer::Create does) or with the multi-tensor updates a CUDA parameter's update always
// takes, and how large a multi-tensor bucket grows. Internal to //optim: the seam through
// which a CPU test runs the whole optimizer on the GPU's update path (bucketing, 16-bit
// masters, clipping, state) and compares it with the fused one.
#ifndef PLAIT_OPTIM_INTERNAL_CPU_UPDATES_H_
#define PLAIT_OPTIM_INTERNAL_CPU_UPDATES_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "optim/optimizer.h"
#include "optim/optimizer.pb.h"
#include "parallel/trainable_parameter.h"

namespace plait::optim::internal {

enum class CpuUpdates {
  kFusedLoops,   // internal/fused_kernels.h, one pass over memory
  kMultiTensor,  // internal/multi_tensor_updates.h, in buckets, as on CUDA
};

// The most elements a multi-tensor bucket holds (a larger parameter is a bucket alone): a
// bucket's fp32 gradients widened from 16-bit ones, and the foreach updates' temporaries, are
// allocated for the whole bucket at once, so this bounds them (512 MiB of fp32) while keeping
// an 8B-parameter model's step to ~60 buckets.
inline constexpr int64_t kBucketElements = int64_t{1} << 27;

struct UpdatePaths {
  CpuUpdates cpu_updates = CpuUpdates::kFusedLoops;  // parameters on another device: kMultiTensor
  int64_t bucket_elements = kBucketElements;
};

// Optimizer::Create with the updates chosen by `paths`.
absl::StatusOr<std::unique_ptr<Optimizer>> CreateOptimizer(
    std::vector<parallel::TrainableParameter> parameters, const OptimizerConfig& config,
    const UpdatePaths& paths);

}  // namespace plait::optim::internal

#endif  // PLAIT_OPTIM_INTERNAL_CPU_UPDATES_H_
