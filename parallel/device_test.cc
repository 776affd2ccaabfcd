#include "parallel/device.h"

#include <fstream>
#include <optional>
#include <string>

#include "ATen/core/Tensor.h"
#include "absl/strings/str_split.h"
#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "parallel/internal/device_choice.h"

namespace plait::parallel {
namespace {

using ::plait::base::testing::IsOkAndHolds;
using ::plait::base::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(ResolveDeviceTest, CpuIsAlwaysTheCpu) {
  EXPECT_THAT(ResolveDevice(DEVICE_CPU, 1, 2, "plan.device"), IsOkAndHolds(at::Device(at::kCPU)));
}

TEST(ResolveDeviceTest, DefaultIsCudaExactlyWhenThereIsAGpu) {
  const at::Device expected =
      CudaDeviceCount() > 0 ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU);
  EXPECT_THAT(ResolveDevice(DEVICE_DEFAULT, 0, 1, "plan.device"), IsOkAndHolds(expected));
}

TEST(ResolveDeviceTest, CudaNamesWhatIsMissing) {
  if (!BuiltForCuda()) {
    EXPECT_THAT(ResolveDevice(DEVICE_CUDA, 0, 1, "plan.device"),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         AllOf(HasSubstr("plan.device: DEVICE_CUDA"), HasSubstr("--config=gpu"))));
    return;
  }
  const int devices = CudaDeviceCount();
  if (devices == 0) {
    EXPECT_THAT(ResolveDevice(DEVICE_CUDA, 0, 1, "plan.device"),
                StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("sees no GPU")));
    return;
  }
  EXPECT_THAT(ResolveDevice(DEVICE_CUDA, devices - 1, devices, "plan.device"),
              IsOkAndHolds(at::Device(at::kCUDA, devices - 1)));
  EXPECT_THAT(ResolveDevice(DEVICE_DEFAULT, 0, devices + 1, "plan.device"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("plan.device: the default, CUDA,"),
                             HasSubstr("each rank needs its own"))));
}

// The rule itself, for builds and machines this one may not be.
using internal::ChooseDevice;
const std::optional<std::string> kUnset;  // CUDA_VISIBLE_DEVICES

TEST(ChooseDeviceTest, EachLocalRankGetsTheGpuOfItsIndex) {
  EXPECT_THAT(ChooseDevice(DEVICE_CUDA, 3, 4, "plan.device", /*built_for_cuda=*/true, 4, kUnset),
              IsOkAndHolds(at::Device(at::kCUDA, 3)));
  EXPECT_THAT(ChooseDevice(DEVICE_DEFAULT, 1, 2, "plan.device", /*built_for_cuda=*/true, 8, kUnset),
              IsOkAndHolds(at::Device(at::kCUDA, 1)));
}

TEST(ChooseDeviceTest, DefaultIsTheCpuWithoutAGpu) {
  EXPECT_THAT(ChooseDevice(DEVICE_DEFAULT, 1, 2, "plan.device", /*built_for_cuda=*/true, 0, kUnset),
              IsOkAndHolds(at::Device(at::kCPU)));
  EXPECT_THAT(
      ChooseDevice(DEVICE_DEFAULT, 1, 2, "plan.device", /*built_for_cuda=*/false, 0, kUnset),
      IsOkAndHolds(at::Device(at::kCPU)));
  EXPECT_THAT(ChooseDevice(DEVICE_CPU, 1, 2, "plan.device", /*built_for_cuda=*/true, 2, kUnset),
              IsOkAndHolds(at::Device(at::kCPU)));
}

TEST(ChooseDeviceTest, CudaWithoutTheCudaBuildOrAGpuSaysWhich) {
  EXPECT_THAT(ChooseDevice(DEVICE_CUDA, 0, 1, "plan.device", /*built_for_cuda=*/false, 0, kUnset),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("plan.device: DEVICE_CUDA"), HasSubstr("--config=gpu"))));
  EXPECT_THAT(ChooseDevice(DEVICE_CUDA, 0, 1, "plan.device", /*built_for_cuda=*/true, 0, kUnset),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("sees no GPU")));
}

// More ranks on a machine than GPUs fails on every rank before any of them touches a GPU (the
// launcher's plan check calls it too), naming the ranks left without one.
TEST(ChooseDeviceTest, MoreLocalRanksThanGpusNamesTheRanksWithoutOne) {
  EXPECT_THAT(ChooseDevice(DEVICE_CUDA, 3, 4, "plan.device", /*built_for_cuda=*/true, 2, kUnset),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("plan.device: DEVICE_CUDA with 4 ranks on this machine, "
                                       "but it has 2 GPUs: local ranks 2 to 3 have none"),
                             HasSubstr("use at most 2 ranks per machine"),
                             HasSubstr("this is local rank 3"))));
  // A rank that has a GPU fails all the same (its peers could not start), without the tail.
  EXPECT_THAT(ChooseDevice(DEVICE_DEFAULT, 0, 2, "plan.device", /*built_for_cuda=*/true, 1, kUnset),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("plan.device: the default, CUDA, with 2 ranks on this "
                                       "machine, but it has 1 GPU: local rank 1 has none"),
                             Not(HasSubstr("this is local rank")))));
}

// srun --gpus-per-task=1 gives each task one GPU in CUDA_VISIBLE_DEVICES: every local rank
// computes on its process's cuda:0. Without that variable one GPU is one GPU for the machine.
TEST(ChooseDeviceTest, AProcessGivenItsOwnGpuComputesOnIt) {
  for (const std::string visible : {"3", "GPU-8f3c1d2e-7a4b-4c55-9e1f-0a2b3c4d5e6f"}) {
    EXPECT_THAT(ChooseDevice(DEVICE_CUDA, 3, 8, "plan.device", /*built_for_cuda=*/true, 1, visible),
                IsOkAndHolds(at::Device(at::kCUDA, 0)))
        << visible;
  }
  EXPECT_THAT(ChooseDevice(DEVICE_DEFAULT, 1, 4, "plan.device", /*built_for_cuda=*/true, 1, "1"),
              IsOkAndHolds(at::Device(at::kCUDA, 0)));
  EXPECT_THAT(ChooseDevice(DEVICE_CUDA, 1, 2, "plan.device", /*built_for_cuda=*/true, 1, kUnset),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("local rank 1 has none"),
                             HasSubstr("give each process its own GPU in CUDA_VISIBLE_DEVICES"))));
  // Two GPUs for four local ranks is not one each.
  EXPECT_THAT(ChooseDevice(DEVICE_CUDA, 1, 4, "plan.device", /*built_for_cuda=*/true, 2, "0,1"),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("local ranks 2 to 3")));
  // An empty CUDA_VISIBLE_DEVICES hides every GPU.
  EXPECT_THAT(ChooseDevice(DEVICE_CUDA, 0, 1, "plan.device", /*built_for_cuda=*/true, 0, ""),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("sees no GPU")));
}

TEST(DeviceTest, TheCpuHasNoMemoryStatistics) {
  EXPECT_EQ(PeakMemory(at::Device(at::kCPU)), std::nullopt);
  EXPECT_EQ(DescribeDevice(at::Device(at::kCPU)), "cpu");
}

// The kernel's view of the CPU (the flags of /proc/cpuinfo) agrees with NativeBf16's.
TEST(DeviceTest, NativeBf16OfTheCpuIsWhatTheKernelReports) {
  std::ifstream cpuinfo("/proc/cpuinfo");
  ASSERT_TRUE(cpuinfo) << "/proc/cpuinfo";
  bool amx = false;
  bool avx512 = false;
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("flags", 0) != 0) continue;
    for (absl::string_view flag : absl::StrSplit(line, ' ')) {
      amx |= flag == "amx_bf16";
      avx512 |= flag == "avx512_bf16";
    }
    break;
  }
  const std::optional<std::string> native = NativeBf16(at::Device(at::kCPU));
  if (amx) {
    EXPECT_EQ(native, "AMX");
  } else if (avx512) {
    EXPECT_EQ(native, "AVX512_BF16");
  } else {
    EXPECT_EQ(native, std::nullopt);
  }
}

}  // namespace
}  // namespace plait::parallel
