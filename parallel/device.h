// The device each rank computes on, and what follows from it: the communicators of its mesh
// (NCCL on CUDA, RingCommunicator's TCP rings on CPU) and its memory statistics. A plan names
// a Device (device.proto); each rank resolves it once, binds the result and builds its mesh
// on it:
//
//   PLAIT_ASSIGN_OR_RETURN(at::Device device,
//                          ResolveDevice(plan.device(), world.local_rank, world.local_world_size,
//                                        "plan.device"));
//   PLAIT_RETURN_IF_ERROR(BindDevice(device));
//   DeviceMesh::Create(layout, rank, DeviceCommunicatorFactory(device, *store, address, {}));
//
// The CUDA code is compiled only under --config=gpu; without it, asking for CUDA is an error
// that says so.
#ifndef PLAIT_PARALLEL_DEVICE_H_
#define PLAIT_PARALLEL_DEVICE_H_

#include <cstdint>
#include <optional>
#include <string>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "parallel/communicator.h"
#include "parallel/device.pb.h"
#include "parallel/device_mesh.h"
#include "torch/csrc/distributed/c10d/Store.hpp"

namespace plait::parallel {

// Whether this binary was built with --config=gpu (NCCL and the CUDA code paths).
bool BuiltForCuda();

// The CUDA devices this process sees: 0 without --config=gpu or without a CUDA LibTorch.
int CudaDeviceCount();

// The device `requested` means for the rank with local rank `local_rank` of `local_ranks`
// on its machine: cpu, or cuda:<local_rank>; or cuda:0 in a process that CUDA_VISIBLE_DEVICES
// gives one GPU of its own (srun --gpus-per-task=1). FailedPrecondition naming `field` when
// CUDA is asked for in a binary built without --config=gpu, on a machine without a GPU, or
// with fewer GPUs than local ranks.
absl::StatusOr<at::Device> ResolveDevice(Device requested, int local_rank, int local_ranks,
                                         const std::string& field);

// "cpu", or "cuda:0 (NVIDIA H200, 140 GiB)": for the first line of a run.
std::string DescribeDevice(const at::Device& device);

// What computes bf16 natively on `device`: "AMX" or "AVX512_BF16" on a CPU with either,
// "compute capability 9.0" on a GPU of 8.0 or newer (bf16 tensor cores); nullopt where bf16
// matmuls are emulated (correct, but slower than fp32).
std::optional<std::string> NativeBf16(const at::Device& device);

// Makes `device` the calling thread's current CUDA device (nothing for the CPU).
absl::Status BindDevice(const at::Device& device);

// The memory `device` has in all (without starting CUDA on it); nullopt on the CPU.
std::optional<int64_t> DeviceMemoryBytes(const at::Device& device);

// The most bytes of tensors that were allocated on `device` at once since the last
// ResetPeakMemory (LibTorch's CUDA caching allocator statistics); nullopt on the CPU.
std::optional<int64_t> PeakMemory(const at::Device& device);
void ResetPeakMemory(const at::Device& device);

// A DeviceMesh factory for ranks computing on `device`: NcclCommunicators on CUDA (the unique
// id exchanged through `store`), RingCommunicators reached at `address` on the CPU. `store`
// must outlive the mesh's creation.
CommunicatorFactory DeviceCommunicatorFactory(const at::Device& device, c10d::Store& store,
                                              std::string address,
                                              CommunicatorOptions options = {});

}  // namespace plait::parallel

#endif  // PLAIT_PARALLEL_DEVICE_H_
