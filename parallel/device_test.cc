#include "parallel/device.h"

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

}  // namespace
}  // namespace plait::parallel
