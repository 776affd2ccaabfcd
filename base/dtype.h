// The LibTorch dtype a base.Dtype (dtype.proto) names, for the configs that choose one: a
// model's parameters in a plan, FSDP's mixed precision.
//
//   torch::ScalarType dtype = ToScalarType(spec.dtype(), /*unspecified=*/torch::kFloat32);
#ifndef PLAIT_BASE_DTYPE_H_
#define PLAIT_BASE_DTYPE_H_

#include "base/dtype.pb.h"
#include "torch/torch.h"

namespace plait::base {

// The dtype `dtype` names; `unspecified` for DTYPE_UNSPECIFIED.
torch::ScalarType ToScalarType(Dtype dtype, torch::ScalarType unspecified);

}  // namespace plait::base

#endif  // PLAIT_BASE_DTYPE_H_
