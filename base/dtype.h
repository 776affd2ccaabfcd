// The LibTorch dtype a base.Dtype (dtype.proto) names, for the configs that choose one: a
// model's parameters in a plan, FSDP's mixed precision.
//
//   at::ScalarType dtype = ToScalarType(spec.dtype(), /*unspecified=*/at::kFloat);
#ifndef PLAIT_BASE_DTYPE_H_
#define PLAIT_BASE_DTYPE_H_

#include "ATen/core/Tensor.h"
#include "base/dtype.pb.h"

namespace plait::base {

// The dtype `dtype` names; `unspecified` for DTYPE_UNSPECIFIED.
at::ScalarType ToScalarType(Dtype dtype, at::ScalarType unspecified);

// Why a config may not choose DTYPE_FLOAT16, for its violation: LibTorch's CPU kernels (1.13)
// have no fp16 matmul.
inline constexpr char kNoCpuFp16[] =
    "DTYPE_FLOAT16 has no CPU matmul; use DTYPE_BFLOAT16 or DTYPE_FLOAT32";

// Why a config other than a model's may not choose DTYPE_AUTO, for its violation: AUTO chooses
// a model's dtype for its device, and the dtypes of its wrappers follow the model's.
inline constexpr char kAutoIsForModels[] =
    "DTYPE_AUTO is for model.dtype only; leave this unset to follow the model's dtype";

}  // namespace plait::base

#endif  // PLAIT_BASE_DTYPE_H_
