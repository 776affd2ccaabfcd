// The tensor dtype a wrap.Dtype (wrap.proto) names, for the configs that choose one: FSDP's
// mixed precision, and a model's parameters in a plan.
#ifndef PLAIT_WRAP_DTYPE_H_
#define PLAIT_WRAP_DTYPE_H_

#include "torch/torch.h"
#include "wrap/wrap.pb.h"

namespace plait::wrap {

// The dtype `dtype` names; `unspecified` for DTYPE_UNSPECIFIED.
torch::ScalarType ToScalarType(Dtype dtype, torch::ScalarType unspecified);

}  // namespace plait::wrap

#endif  // PLAIT_WRAP_DTYPE_H_
