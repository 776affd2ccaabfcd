#include "models/internal/gemm.h"

#include <cmath>
#include <cstdio>
#include <string>

#include "ATen/Context.h"
#include "ATen/core/Tensor.h"
#include "ATen/ops/allclose.h"
#include "ATen/ops/mm.h"
#include "gtest/gtest.h"
#include "torch/csrc/autograd/generated/variable_factories.h"

namespace plait::models::internal {
namespace {

template <typename T>
using GemmFn = void (*)(bool, bool, int64_t, int64_t, int64_t, Arithmetic<T>, const T*, int64_t,
                        const T*, int64_t, Arithmetic<T>, Arithmetic<T>*, int64_t);

// fn on blocks of larger row-major buffers (leading dimensions wider than the blocks), for
// every transpose pair and beta 0 and 1 (C starts as NaN for beta 0, which must ignore it),
// against at::mm in double on the same values.
template <typename T>
void ExpectMatchesMm(GemmFn<T> fn, double tolerance) {
  using A = Arithmetic<T>;
  const auto operand = at::TensorOptions().dtype(at::CppTypeToScalarType<T>::value);
  const auto result = at::TensorOptions().dtype(at::CppTypeToScalarType<A>::value);
  const int64_t m = 5, n = 7, k = 3, ld = 11;
  at::manual_seed(1);
  for (const bool trans_a : {false, true}) {
    for (const bool trans_b : {false, true}) {
      for (const double beta : {0.0, 1.0}) {
        SCOPED_TRACE(::testing::Message()
                     << "trans_a " << trans_a << " trans_b " << trans_b << " beta " << beta);
        const at::Tensor a = torch::randn({trans_a ? k : m, ld}, operand);
        const at::Tensor b = torch::randn({trans_b ? n : k, ld}, operand);
        const at::Tensor c =
            beta == 0 ? torch::full({m, ld}, NAN, result) : torch::randn({m, ld}, result);
        const at::Tensor a_block = a.narrow(1, 0, trans_a ? m : k).to(at::kDouble);
        const at::Tensor b_block = b.narrow(1, 0, trans_b ? k : n).to(at::kDouble);
        const at::Tensor product =
            0.5 * at::mm(trans_a ? a_block.t() : a_block, trans_b ? b_block.t() : b_block);
        const at::Tensor want = beta == 0 ? product : c.narrow(1, 0, n).to(at::kDouble) + product;
        const at::Tensor untouched = c.narrow(1, n, ld - n).clone();
        fn(trans_a, trans_b, m, n, k, A(0.5), a.data_ptr<T>(), ld, b.data_ptr<T>(), ld, A(beta),
           c.data_ptr<A>(), ld);
        EXPECT_TRUE(at::allclose(c.narrow(1, 0, n).to(at::kDouble), want, tolerance, tolerance));
        EXPECT_TRUE(at::allclose(c.narrow(1, n, ld - n), untouched, 0, 0, /*equal_nan=*/true));
      }
    }
  }
}

TEST(GemmTest, MatchesMm) {
  ExpectMatchesMm<double>(Gemm<double>, 1e-12);
  ExpectMatchesMm<float>(Gemm<float>, 1e-5);
  ExpectMatchesMm<c10::BFloat16>(Gemm<c10::BFloat16>, 1e-5);
}

TEST(GemmTest, AtenFallbackMatchesMm) {
  ExpectMatchesMm<double>(AtenGemm<double>, 1e-12);
  ExpectMatchesMm<float>(AtenGemm<float>, 1e-5);
  ExpectMatchesMm<c10::BFloat16>(AtenGemm<c10::BFloat16>, 1e-5);
}

// Both LibTorch builds plait supports load a BLAS for every type: falling back to ATen would
// cost the attention kernels their speed (~10 us of dispatch per block).
TEST(GemmTest, EveryTypeFindsALibrary) {
  EXPECT_NE(GemmLibrary<float>(), "ATen");
  EXPECT_NE(GemmLibrary<double>(), "ATen");
  EXPECT_NE(GemmLibrary<c10::BFloat16>(), "ATen");
  std::printf("float: %s, double: %s, bf16: %s\n", GemmLibrary<float>().c_str(),
              GemmLibrary<double>().c_str(), GemmLibrary<c10::BFloat16>().c_str());
}

}  // namespace
}  // namespace plait::models::internal
