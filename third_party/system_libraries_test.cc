// Checks that each system library links and behaves as plait relies on, so that a missing
// or wrong Debian package fails here with a clear message instead of deep inside a library.
#include <fstream>
#include <sstream>
#include <string>

#include "absl/flags/marshalling.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "torch/types.h"
#include "torch/utils.h"

namespace {

std::string ProcessMaps() {
  std::ifstream maps("/proc/self/maps");
  std::stringstream contents;
  contents << maps.rdbuf();
  return contents.str();
}

TEST(LibTorchTest, MatmulMatchesAnExplicitSum) {
  torch::manual_seed(0);
  const torch::Tensor a = torch::randn({17, 33}, torch::kFloat64);
  const torch::Tensor b = torch::randn({33, 9}, torch::kFloat64);
  const torch::Tensor expected = (a.unsqueeze(2) * b.unsqueeze(0)).sum(1);
  EXPECT_TRUE(torch::allclose(torch::mm(a, b), expected, 1e-12, 1e-12));
}

// Without libopenblas0-pthread, Debian's LibTorch falls back to the reference BLAS and its
// matmuls run ~25x slower: tools/setup.sh must install it. PyTorch's wheels carry MKL.
TEST(LibTorchTest, MatmulsRunOnOpenBlasOrMkl) {
  const torch::Tensor a = torch::ones({64, 64});
  EXPECT_EQ(torch::mm(a, a).sum().item<float>(), 64.0f * 64 * 64);
  EXPECT_TRUE(at::hasMKL() || ProcessMaps().find("libopenblas") != std::string::npos)
      << "LibTorch is using neither MKL nor OpenBLAS; run tools/setup.sh (libopenblas0-pthread)";
}

TEST(AbseilTest, FlagsTimeAndSynchronizationLink) {
  int parsed = 0;
  std::string error;
  ASSERT_TRUE(absl::ParseFlag("42", &parsed, &error)) << error;
  EXPECT_EQ(parsed, 42);
  absl::Mutex mutex;
  absl::MutexLock lock(&mutex);
  EXPECT_GT(absl::Now(), absl::UnixEpoch());
}

TEST(NlohmannJsonTest, ParsesAndRejects) {
  const nlohmann::json config = nlohmann::json::parse(R"({"hidden_size": 64})");
  EXPECT_EQ(config.at("hidden_size").get<int>(), 64);
  EXPECT_FALSE(nlohmann::json::accept("{bad"));
}

}  // namespace
