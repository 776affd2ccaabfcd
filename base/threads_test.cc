#include "base/threads.h"

#include <dlfcn.h>

#include "ATen/Parallel.h"
#include "gtest/gtest.h"

namespace plait::base {
namespace {

// Debian's LibTorch runs its matmuls on OpenBLAS (tools/setup.sh installs it), PyTorch's
// wheels on MKL.
TEST(SetComputeThreadsTest, SetsLibTorchsAndItsBlasPools) {
  using GetThreads = int (*)();
  auto blas_threads = reinterpret_cast<GetThreads>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  if (blas_threads == nullptr) {
    blas_threads = reinterpret_cast<GetThreads>(dlsym(RTLD_DEFAULT, "mkl_get_max_threads"));
  }
  ASSERT_NE(blas_threads, nullptr) << "LibTorch runs on neither OpenBLAS nor MKL";
  for (const int count : {2, 1}) {
    ASSERT_TRUE(SetComputeThreads(count));
    EXPECT_EQ(at::get_num_threads(), count);
    EXPECT_EQ(blas_threads(), count);
  }
}

}  // namespace
}  // namespace plait::base
