// The update rules of fused_kernels.h on fp32 tensors of any device, as LibTorch tensor
// operations (cuBLAS-free elementwise kernels on CUDA): for parameters the CPU loops cannot
// reach. Same scalars, same order of operations; each rule costs a few passes over memory
// where the fused loop costs one. Internal to //optim:optimizer.
#ifndef PLAIT_OPTIM_INTERNAL_TENSOR_UPDATES_H_
#define PLAIT_OPTIM_INTERNAL_TENSOR_UPDATES_H_

#include "optim/internal/fused_kernels.h"
#include "torch/torch.h"

namespace plait::optim::internal {

// `p`, `m`, `v` and `b` are updated in place; `b` may be undefined when s.momentum is 0.
void AdamUpdate(const AdamScalars& s, torch::Tensor& p, const torch::Tensor& g, torch::Tensor& m,
                torch::Tensor& v);
void SgdUpdate(const SgdScalars& s, torch::Tensor& p, const torch::Tensor& g, torch::Tensor& b);
void LionUpdate(const LionScalars& s, torch::Tensor& p, const torch::Tensor& g, torch::Tensor& m);

}  // namespace plait::optim::internal

#endif  // PLAIT_OPTIM_INTERNAL_TENSOR_UPDATES_H_
