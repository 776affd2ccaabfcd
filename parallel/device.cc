#include "parallel/device.h"

#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "parallel/internal/device_choice.h"
#include "parallel/ring_communicator.h"
#include "torch/cuda.h"

#ifdef PLAIT_GPU
#include <cuda_runtime.h>

#include "ATen/core/Tensor.h"
#include "c10/cuda/CUDACachingAllocator.h"
#include "parallel/nccl_communicator.h"
#endif

namespace plait::parallel {

bool BuiltForCuda() {
#ifdef PLAIT_GPU
  return true;
#else
  return false;
#endif
}

int CudaDeviceCount() { return BuiltForCuda() ? static_cast<int>(torch::cuda::device_count()) : 0; }

absl::StatusOr<at::Device> ResolveDevice(Device requested, int local_rank, int local_ranks,
                                         const std::string& field) {
  const char* visible_devices = std::getenv("CUDA_VISIBLE_DEVICES");
  return internal::ChooseDevice(
      requested, local_rank, local_ranks, field, BuiltForCuda(), CudaDeviceCount(),
      visible_devices == nullptr ? std::nullopt : std::optional<std::string>(visible_devices));
}

namespace {

std::optional<std::string> CpuNativeBf16() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("amx-bf16")) return "AMX";
  if (__builtin_cpu_supports("avx512bf16")) return "AVX512_BF16";
  return std::nullopt;
}

}  // namespace

#ifdef PLAIT_GPU

namespace {

// Each failed call's error is cleared from the thread's last error, which LibTorch checks
// after its kernel launches: it is reported here, not as the failure of a later kernel.
absl::Status CudaStatus(cudaError_t error, const char* call) {
  if (error == cudaSuccess) return absl::OkStatus();
  (void)cudaGetLastError();
  return absl::InternalError(absl::StrCat(call, " failed: ", cudaGetErrorString(error)));
}

// cudaGetDeviceProperties creates no CUDA context, so a launcher that checks a plan leaves
// the GPUs' memory to its ranks.
std::optional<cudaDeviceProp> Properties(const at::Device& device) {
  cudaDeviceProp properties;
  if (!device.is_cuda()) return std::nullopt;
  if (!CudaStatus(cudaGetDeviceProperties(&properties, device.index()), "cudaGetDeviceProperties")
           .ok()) {
    return std::nullopt;
  }
  return properties;
}

}  // namespace

std::string DescribeDevice(const at::Device& device) {
  const std::optional<cudaDeviceProp> properties = Properties(device);
  if (!properties) return device.str();
  return absl::StrFormat("%s (%s, %.0f GiB)", device.str(), properties->name,
                         static_cast<double>(properties->totalGlobalMem) / (1 << 30));
}

std::optional<int64_t> DeviceMemoryBytes(const at::Device& device) {
  const std::optional<cudaDeviceProp> properties = Properties(device);
  if (!properties) return std::nullopt;
  return static_cast<int64_t>(properties->totalGlobalMem);
}

std::optional<std::string> NativeBf16(const at::Device& device) {
  if (!device.is_cuda()) return CpuNativeBf16();
  const std::optional<cudaDeviceProp> properties = Properties(device);
  if (!properties || properties->major < 8) return std::nullopt;
  return absl::StrCat("compute capability ", properties->major, ".", properties->minor);
}

absl::Status BindDevice(const at::Device& device) {
  if (!device.is_cuda()) return absl::OkStatus();
  return CudaStatus(cudaSetDevice(device.index()), "cudaSetDevice");
}

// The caching allocator's statistics are those of the LibTorch the binary runs with: index 0
// of a StatArray is the aggregate over pool kinds in every LibTorch version plait supports.
std::optional<int64_t> PeakMemory(const at::Device& device) {
  if (!device.is_cuda()) return std::nullopt;
  return c10::cuda::CUDACachingAllocator::getDeviceStats(device.index()).allocated_bytes[0].peak;
}

void ResetPeakMemory(const at::Device& device) {
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
}

#else  // !PLAIT_GPU: no device but the CPU can be resolved.

std::string DescribeDevice(const at::Device& device) { return device.str(); }
std::optional<std::string> NativeBf16(const at::Device&) { return CpuNativeBf16(); }
std::optional<int64_t> DeviceMemoryBytes(const at::Device&) { return std::nullopt; }
absl::Status BindDevice(const at::Device&) { return absl::OkStatus(); }
std::optional<int64_t> PeakMemory(const at::Device&) { return std::nullopt; }
void ResetPeakMemory(const at::Device&) {}

#endif  // PLAIT_GPU

CommunicatorFactory DeviceCommunicatorFactory(const at::Device& device, c10d::Store& store,
                                              std::string address, CommunicatorOptions options) {
#ifdef PLAIT_GPU
  if (device.is_cuda()) {
    return [&store, index = device.index(), options](
               const std::string& name, int rank,
               int size) -> absl::StatusOr<std::unique_ptr<Communicator>> {
      return NcclCommunicator::Create(c10::intrusive_ptr<c10d::Store>::reclaim_copy(&store), name,
                                      rank, size, index, options);
    };
  }
#endif
  return RingCommunicatorFactory(store, std::move(address), options);
}

}  // namespace plait::parallel
