#include <cuda_runtime.h>
#include <nccl.h>

#include "gtest/gtest.h"

namespace {

TEST(GpuRuntimeTest, CudaSeesADevice) {
  int device_count = 0;
  cudaError_t error = cudaGetDeviceCount(&device_count);
  ASSERT_EQ(error, cudaSuccess) << cudaGetErrorString(error);
  EXPECT_GE(device_count, 1);
}

TEST(GpuRuntimeTest, NcclLoads) {
  int version = 0;
  ASSERT_EQ(ncclGetVersion(&version), ncclSuccess);
  // NCCL encodes 2.x.y as 2*10000 + x*100 + y.
  EXPECT_GE(version, 20000) << "NCCL " << version;
}

}  // namespace
