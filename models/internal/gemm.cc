#include "models/internal/gemm.h"

#include <dlfcn.h>

#include <cstdint>

#include "torch/torch.h"

namespace plait::models::internal {
namespace {

// CBLAS's enum values (cblas.h), fixed by the CBLAS standard.
constexpr int kRowMajor = 101;
constexpr int kNoTrans = 111;
constexpr int kTrans = 112;

template <typename T>
using CblasGemm = void (*)(int order, int trans_a, int trans_b, int m, int n, int k, T alpha,
                           const T* a, int lda, const T* b, int ldb, T beta, T* c, int ldc);

template <typename T>
CblasGemm<T> LookUp(const char* name) {
  return reinterpret_cast<CblasGemm<T>>(dlsym(RTLD_DEFAULT, name));
}

template <typename T>
CblasGemm<T> Cblas();
template <>
CblasGemm<float> Cblas<float>() {
  static const CblasGemm<float> gemm = LookUp<float>("cblas_sgemm");
  return gemm;
}
template <>
CblasGemm<double> Cblas<double>() {
  static const CblasGemm<double> gemm = LookUp<double>("cblas_dgemm");
  return gemm;
}

// The stored matrix of `rows` x `cols` with row stride `ld`, as a tensor view of `data`.
template <typename T>
torch::Tensor View(const T* data, int64_t rows, int64_t cols, int64_t ld) {
  return torch::from_blob(const_cast<T*>(data), {rows, cols}, {ld, 1},
                          torch::CppTypeToScalarType<T>::value);
}

}  // namespace

template <typename T>
void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
          int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  if (const CblasGemm<T> gemm = Cblas<T>()) {
    gemm(kRowMajor, trans_a ? kTrans : kNoTrans, trans_b ? kTrans : kNoTrans, static_cast<int>(m),
         static_cast<int>(n), static_cast<int>(k), alpha, a, static_cast<int>(lda), b,
         static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
    return;
  }
  AtenGemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

template <typename T>
void AtenGemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
              int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  const torch::Tensor a_view = trans_a ? View(a, k, m, lda).t() : View(a, m, k, lda);
  const torch::Tensor b_view = trans_b ? View(b, n, k, ldb).t() : View(b, k, n, ldb);
  torch::Tensor c_view = View(c, m, n, ldc);
  at::addmm_out(c_view, c_view, a_view, b_view, beta, alpha);
}

template void Gemm<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t,
                          const float*, int64_t, float, float*, int64_t);
template void Gemm<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*, int64_t,
                           const double*, int64_t, double, double*, int64_t);
template void AtenGemm<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t,
                              const float*, int64_t, float, float*, int64_t);
template void AtenGemm<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*,
                               int64_t, const double*, int64_t, double, double*, int64_t);

}  // namespace plait::models::internal
