#include "base/threads.h"

#include <dlfcn.h>

#include "ATen/Parallel.h"
#include "gtest/gtest.h"

namespace plait::base {
namespace {

// Debian's LibTorch runs its matmuls on OpenBLAS (tools/setup.sh installs it).
TEST(SetComputeThreadsTest, SetsLibTorchsAndOpenBlasPools) {
  using GetThreads = int (*)();
  auto openblas_threads =
      reinterpret_cast<GetThreads>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  ASSERT_NE(openblas_threads, nullptr) << "LibTorch is not running on OpenBLAS";
  for (const int count : {2, 1}) {
    ASSERT_TRUE(SetComputeThreads(count));
    EXPECT_EQ(at::get_num_threads(), count);
    EXPECT_EQ(openblas_threads(), count);
  }
}

}  // namespace
}  // namespace plait::base
