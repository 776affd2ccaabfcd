#include "base/forward_generator.h"

#include "ATen/Context.h"
#include "base/torch_compat.h"
#include "gtest/gtest.h"

namespace plait::base {
namespace {

const c10::Device kCpu(c10::kCPU);

// A scope installs its generator for its device, nested scopes restore the one they replaced,
// and without one the device's default generator draws.
TEST(ForwardGeneratorTest, ScopesInstallAndRestore) {
  const at::Generator fallback = at::globalContext().defaultGenerator(kCpu);
  EXPECT_EQ(ForwardGenerator(kCpu), fallback);
  const at::Generator outer = MakeCpuGenerator(1);
  const at::Generator inner = MakeCpuGenerator(2);
  {
    const ScopedForwardGenerator installed(outer);
    EXPECT_EQ(ForwardGenerator(kCpu), outer);
    {
      const ScopedForwardGenerator nested(inner);
      EXPECT_EQ(ForwardGenerator(kCpu), inner);
    }
    EXPECT_EQ(ForwardGenerator(kCpu), outer);
  }
  EXPECT_EQ(ForwardGenerator(kCpu), fallback);
}

}  // namespace
}  // namespace plait::base
