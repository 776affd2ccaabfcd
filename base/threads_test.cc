#include "base/threads.h"

#include <dlfcn.h>

#include "ATen/Parallel.h"
#include "gtest/gtest.h"

namespace plait::base {
namespace {

// Debian's LibTorch runs its matmuls on OpenBLAS (tools/setup.sh installs it), whose own
// pool stays at one thread; PyTorch's wheels on MKL, which follows LibTorch's pool.
TEST(SetComputeThreadsTest, SetsLibTorchsPoolAndKeepsOpenBlasAtOne) {
  using GetThreads = int (*)();
  auto blas_threads = reinterpret_cast<GetThreads>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  const bool openblas = blas_threads != nullptr;
  if (!openblas) {
    blas_threads = reinterpret_cast<GetThreads>(dlsym(RTLD_DEFAULT, "mkl_get_max_threads"));
  }
  ASSERT_NE(blas_threads, nullptr) << "LibTorch runs on neither OpenBLAS nor MKL";
  for (const int count : {2, 1}) {
    ASSERT_TRUE(SetComputeThreads(count));
    EXPECT_EQ(at::get_num_threads(), count);
    EXPECT_EQ(blas_threads(), openblas ? 1 : count);
  }
}

}  // namespace
}  // namespace plait::base
