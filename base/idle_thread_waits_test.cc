// SetIdleThreadWaits re-executes the test binary, so this test has its own main(), which
// calls it first, as a training job's main() does.
#include <cstdlib>
#include <string>
#include <vector>

#include "base/threads.h"
#include "gtest/gtest.h"

namespace plait::base {
namespace {

bool g_set = false;
std::vector<std::string> g_arguments;

TEST(SetIdleThreadWaitsTest, ReExecutedWithBothWaitsAndTheSameArguments) {
  EXPECT_TRUE(g_set);
  EXPECT_STREQ(std::getenv("OPENBLAS_THREAD_TIMEOUT"), "4");
  EXPECT_STREQ(std::getenv("GOMP_SPINCOUNT"), "300000");
  // The BUILD rule passes it; it survives the re-execution.
  ASSERT_GE(g_arguments.size(), 2u);
  EXPECT_EQ(g_arguments.back(), "--first=kept");
}

TEST(SetIdleThreadWaitsTest, ValuesSetAreKeptWithoutReExecuting) {
  EXPECT_TRUE(SetIdleThreadWaits(nullptr));
  setenv("OPENBLAS_THREAD_TIMEOUT", "28", 1);
  EXPECT_FALSE(SetIdleThreadWaits(nullptr));
  EXPECT_STREQ(std::getenv("OPENBLAS_THREAD_TIMEOUT"), "28");
  setenv("OPENBLAS_THREAD_TIMEOUT", "2", 1);  // OpenBLAS's least, 4, too
  EXPECT_TRUE(SetIdleThreadWaits(nullptr));
  setenv("OPENBLAS_THREAD_TIMEOUT", "4", 1);
  setenv("OMP_WAIT_POLICY", "passive", 1);  // the user's choice for OpenMP
  EXPECT_FALSE(SetIdleThreadWaits(nullptr));
  EXPECT_STREQ(std::getenv("OMP_WAIT_POLICY"), "passive");
  unsetenv("OMP_WAIT_POLICY");
  EXPECT_TRUE(SetIdleThreadWaits(nullptr));
}

}  // namespace
}  // namespace plait::base

int main(int argc, char** argv) {
  // Whatever the environment of the test runner, the first start has none of them.
  if (std::getenv("PLAIT_IDLE_THREAD_WAITS_TEST_STARTED") == nullptr) {
    setenv("PLAIT_IDLE_THREAD_WAITS_TEST_STARTED", "1", 1);
    for (const char* name : {"OPENBLAS_THREAD_TIMEOUT", "GOMP_SPINCOUNT", "OMP_WAIT_POLICY"}) {
      unsetenv(name);
    }
  }
  plait::base::g_set = plait::base::SetIdleThreadWaits(argv);
  plait::base::g_arguments.assign(argv, argv + argc);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
