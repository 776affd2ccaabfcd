// The LibTorch calls plait's models make whose spelling is not a stable public C++ API
// (ATen internals that moved between LibTorch 1.x and 2.x), kept in one place so the models
// build against LibTorch 1.13 and 2.x and only this file changes when they move again.
#ifndef PLAIT_MODELS_INTERNAL_TORCH_COMPAT_H_
#define PLAIT_MODELS_INTERNAL_TORCH_COMPAT_H_

#include <cstdint>

#include "ATen/CPUGeneratorImpl.h"
#include "torch/torch.h"

namespace plait::models::internal {

// A CPU random generator seeded with `seed`, for seeded initialisation independent of the
// global generator. at::detail::createCPUGenerator is an ATen detail API (present in 1.13
// and 2.x).
inline at::Generator MakeCpuGenerator(uint64_t seed) {
  return at::detail::createCPUGenerator(seed);
}

}  // namespace plait::models::internal

#endif  // PLAIT_MODELS_INTERNAL_TORCH_COMPAT_H_
