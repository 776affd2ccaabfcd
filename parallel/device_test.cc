#include "parallel/device.h"

#include <fstream>
#include <string>

#include "absl/strings/str_split.h"
#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "torch/torch.h"

namespace plait::parallel {
namespace {

using ::plait::base::testing::IsOkAndHolds;
using ::plait::base::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(ResolveDeviceTest, CpuIsAlwaysTheCpu) {
  EXPECT_THAT(ResolveDevice(DEVICE_CPU, 1, 2, "plan.device"),
              IsOkAndHolds(torch::Device(torch::kCPU)));
}

TEST(ResolveDeviceTest, DefaultIsCudaExactlyWhenThereIsAGpu) {
  const torch::Device expected =
      CudaDeviceCount() > 0 ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
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
              IsOkAndHolds(torch::Device(torch::kCUDA, devices - 1)));
  EXPECT_THAT(ResolveDevice(DEVICE_DEFAULT, 0, devices + 1, "plan.device"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("plan.device: the default, CUDA,"),
                             HasSubstr("each rank needs its own"))));
}

TEST(DeviceTest, TheCpuHasNoMemoryStatistics) {
  EXPECT_EQ(PeakMemory(torch::Device(torch::kCPU)), std::nullopt);
  EXPECT_EQ(DescribeDevice(torch::Device(torch::kCPU)), "cpu");
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
  const std::optional<std::string> native = NativeBf16(torch::Device(torch::kCPU));
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
