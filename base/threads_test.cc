#include "base/threads.h"

#include <dlfcn.h>

#include "ATen/Parallel.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace plait::base {
namespace {

using ::testing::HasSubstr;

// Both LibTorch builds run their fp32 matmuls on Debian's OpenBLAS (tools/setup.sh installs
// it; @libtorch links it first, so its sgemm_ is the one the wheel's LibTorch binds to as
// well as Debian's), whose pool follows the compute threads as LibTorch's does.
TEST(SetComputeThreadsTest, SetsLibTorchsPoolAndOpenBlasToTheCount) {
  using GetThreads = int (*)();
  auto blas_threads = reinterpret_cast<GetThreads>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  ASSERT_NE(blas_threads, nullptr) << "OpenBLAS is not loaded";
  for (const int count : {2, 1}) {
    ASSERT_TRUE(SetComputeThreads(count));
    EXPECT_EQ(at::get_num_threads(), count);
    EXPECT_EQ(blas_threads(), count);
  }
}

TEST(DescribeMatmulLibrariesTest, Fp32MatmulsBindToOpenBlas) {
  EXPECT_THAT(DescribeMatmulLibraries(), HasSubstr("fp32 libopenblas.so.0 (sgemm_), bf16 "));
}

}  // namespace
}  // namespace plait::base
