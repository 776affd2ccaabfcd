#include "models/internal/gemm.h"

#include <functional>

#include "gtest/gtest.h"
#include "torch/torch.h"

namespace plait::models::internal {
namespace {

using GemmFn = std::function<void(bool, bool, int64_t, int64_t, int64_t, double, const double*,
                                  int64_t, const double*, int64_t, double, double*, int64_t)>;

// fn on blocks of larger row-major buffers (leading dimensions wider than the blocks), for
// every transpose pair and beta 0 and 1, against torch::mm.
void ExpectMatchesMm(const GemmFn& fn) {
  const int64_t m = 5, n = 7, k = 3, ld = 11;
  torch::manual_seed(1);
  for (const bool trans_a : {false, true}) {
    for (const bool trans_b : {false, true}) {
      for (const double beta : {0.0, 1.0}) {
        SCOPED_TRACE(::testing::Message()
                     << "trans_a " << trans_a << " trans_b " << trans_b << " beta " << beta);
        const torch::Tensor a = torch::randn({trans_a ? k : m, ld}, torch::kFloat64);
        const torch::Tensor b = torch::randn({trans_b ? n : k, ld}, torch::kFloat64);
        const torch::Tensor c = torch::randn({m, ld}, torch::kFloat64);
        const torch::Tensor a_block = a.narrow(1, 0, trans_a ? m : k);
        const torch::Tensor b_block = b.narrow(1, 0, trans_b ? k : n);
        const torch::Tensor want =
            beta * c.narrow(1, 0, n) +
            0.5 * torch::mm(trans_a ? a_block.t() : a_block, trans_b ? b_block.t() : b_block);
        const torch::Tensor untouched = c.narrow(1, n, ld - n).clone();
        fn(trans_a, trans_b, m, n, k, 0.5, a.data_ptr<double>(), ld, b.data_ptr<double>(), ld, beta,
           c.data_ptr<double>(), ld);
        EXPECT_TRUE(torch::allclose(c.narrow(1, 0, n), want, 1e-12, 1e-12));
        EXPECT_TRUE(torch::equal(c.narrow(1, n, ld - n), untouched));
      }
    }
  }
}

TEST(GemmTest, MatchesMm) { ExpectMatchesMm(Gemm<double>); }

TEST(GemmTest, AtenFallbackMatchesMm) { ExpectMatchesMm(AtenGemm<double>); }

}  // namespace
}  // namespace plait::models::internal
