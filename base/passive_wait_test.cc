// UsePassiveOpenMpWait re-executes the test binary, so this test has its own main(), which
// calls it first, as a training job's main() does.
#include <cstdlib>
#include <string>
#include <vector>

#include "base/threads.h"
#include "gtest/gtest.h"

namespace plait::base {
namespace {

bool g_passive = false;
std::vector<std::string> g_arguments;

TEST(UsePassiveOpenMpWaitTest, ReExecutedWithThePolicyAndTheSameArguments) {
  EXPECT_TRUE(g_passive);
  EXPECT_STREQ(std::getenv("OMP_WAIT_POLICY"), "passive");
  // The BUILD rule passes it; it survives the re-execution.
  ASSERT_GE(g_arguments.size(), 2u);
  EXPECT_EQ(g_arguments.back(), "--first=kept");
}

TEST(UsePassiveOpenMpWaitTest, APolicySetIsKeptWithoutReExecuting) {
  EXPECT_TRUE(UsePassiveOpenMpWait(nullptr));
  setenv("OMP_WAIT_POLICY", "ACTIVE", 1);
  EXPECT_FALSE(UsePassiveOpenMpWait(nullptr));
  EXPECT_STREQ(std::getenv("OMP_WAIT_POLICY"), "ACTIVE");
  setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
  EXPECT_TRUE(UsePassiveOpenMpWait(nullptr));
  setenv("OMP_WAIT_POLICY", "passive", 1);
}

}  // namespace
}  // namespace plait::base

int main(int argc, char** argv) {
  // Whatever the environment of the test runner, the first start has no policy.
  if (std::getenv("PLAIT_PASSIVE_WAIT_TEST_STARTED") == nullptr) {
    setenv("PLAIT_PASSIVE_WAIT_TEST_STARTED", "1", 1);
    unsetenv("OMP_WAIT_POLICY");
  }
  plait::base::g_passive = plait::base::UsePassiveOpenMpWait(argv);
  plait::base::g_arguments.assign(argv, argv + argc);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
