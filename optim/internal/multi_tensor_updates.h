// The update rules of fused_kernels.h over a bucket of fp32 tensors on any one device, as
// multi-tensor operations: for the parameters the CPU loops cannot reach (CUDA). Adam, AdamW
// and SGD go through ATen's fused kernels where base::kHasFusedOptimizers (one pass over each
// element, torch.optim's arithmetic); Lion, and everything on LibTorch 1.13, through
// at::_foreach_* operations with the fused loops' scalars and order of operations (a few
// passes over memory, each a kernel per bucket rather than per tensor; only Lion's sign and
// SGD's first momentum copy are a kernel per tensor on 1.13, which has no foreach form of
// them). Internal to //optim:optimizer, which groups parameters into buckets that share
// every scalar.
#ifndef PLAIT_OPTIM_INTERNAL_MULTI_TENSOR_UPDATES_H_
#define PLAIT_OPTIM_INTERNAL_MULTI_TENSOR_UPDATES_H_

#include "optim/internal/fused_kernels.h"

namespace plait::optim::internal {

// `p`, `m`, `v` and `b` are updated in place, the i-th of each list (and of `g`) being one
// parameter's; `b` is empty when s.momentum is 0.
void AdamUpdate(const AdamStep& s, at::TensorList p, at::TensorList g, at::TensorList m,
                at::TensorList v);
void SgdUpdate(const SgdStep& s, at::TensorList p, at::TensorList g, at::TensorList b);
void LionUpdate(const LionStep& s, at::TensorList p, at::TensorList g, at::TensorList m);

}  // namespace plait::optim::internal

#endif  // PLAIT_OPTIM_INTERNAL_MULTI_TENSOR_UPDATES_H_
