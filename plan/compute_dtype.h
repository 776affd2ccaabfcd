// DTYPE_AUTO (base/dtype.proto) resolved for the device a rank computes on: the plan's models,
// the trained one and the frozen ones, compute in bf16 (with fp32 master weights) where the
// device computes bf16 natively and in fp32 elsewhere. A run resolves its plan before it
// builds anything, and its first line says what its model computes in and why:
//
//   std::cout << "compute: " << DescribeComputeDtype(plan, device) << "\n";
//   Plan resolved = ResolveAutoDtypes(plan, device);
#ifndef PLAIT_PLAN_COMPUTE_DTYPE_H_
#define PLAIT_PLAN_COMPUTE_DTYPE_H_

#include <optional>
#include <string>

#include "ATen/core/Tensor.h"
#include "base/dtype.pb.h"
#include "plan/plan.pb.h"

namespace plait::plan {

// `requested` with DTYPE_AUTO replaced: DTYPE_BFLOAT16 when `native_bf16` names what computes
// bf16 natively (parallel::NativeBf16), else DTYPE_FLOAT32.
base::Dtype ResolveAutoDtype(base::Dtype requested, const std::optional<std::string>& native_bf16);

// `plan` with every model's DTYPE_AUTO resolved for `device`, or for a device whose native
// bf16 is `native_bf16` (one the check does not run on: a target's GPU).
Plan ResolveAutoDtypes(const Plan& plan, const at::Device& device);
Plan ResolveAutoDtypes(const Plan& plan, const std::optional<std::string>& native_bf16);

// What the trained model of `plan` computes in on a device whose native bf16 is
// `native_bf16`: "fp32", "bf16 with fp32 master weights (auto: the CPU has AVX512_BF16)",
// "fp32 (auto: the CPU has no native bf16)", and for bf16 asked for where it is emulated,
// that it runs correctly but slower than fp32.
std::string DescribeComputeDtype(base::Dtype requested, const at::Device& device,
                                 const std::optional<std::string>& native_bf16);
std::string DescribeComputeDtype(const Plan& plan, const at::Device& device);

}  // namespace plait::plan

#endif  // PLAIT_PLAN_COMPUTE_DTYPE_H_
