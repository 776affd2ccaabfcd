// The rule behind ResolveDevice (parallel/device.h), with what it reads from the build and the
// machine passed in: whether the binary has its CUDA code paths, how many GPUs LibTorch sees
// and CUDA_VISIBLE_DEVICES (nullopt when unset). ResolveDevice calls it with this binary's and
// machine's answers; tests call it with any, so every branch runs on a machine without a GPU
// too.
#ifndef PLAIT_PARALLEL_INTERNAL_DEVICE_CHOICE_H_
#define PLAIT_PARALLEL_INTERNAL_DEVICE_CHOICE_H_

#include <optional>
#include <string>

#include "ATen/core/Tensor.h"
#include "absl/status/statusor.h"
#include "parallel/device.pb.h"

namespace plait::parallel::internal {

absl::StatusOr<at::Device> ChooseDevice(Device requested, int local_rank, int local_ranks,
                                        const std::string& field, bool built_for_cuda,
                                        int cuda_devices,
                                        const std::optional<std::string>& visible_devices);

}  // namespace plait::parallel::internal

#endif  // PLAIT_PARALLEL_INTERNAL_DEVICE_CHOICE_H_
