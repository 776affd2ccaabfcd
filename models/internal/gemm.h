// Row-major C = alpha * op(A) op(B) + beta * C on CPU arrays with arbitrary leading
// dimensions, for kernels that multiply many small strided blocks (one attention head's rows
// of a [B, T, heads, D] tensor are a matrix with leading dimension heads * D). It calls the
// BLAS the process has loaded directly: at::mm_out on the same blocks costs ~10 us of
// dispatch per call, as much as a 64x64x256 product itself. float and double go to CBLAS
// (Debian's OpenBLAS, which both LibTorch builds link) or to Fortran BLAS (the MKL inside
// PyTorch's wheel exports only that); bf16 operands, with C in float, go to oneDNN's
// dnnl_gemm_bf16bf16f32 (Debian's, which Debian's LibTorch links and which is opened
// privately under PyTorch's wheel) or MKL's cblas_gemm_bf16bf16f32. Where none is loaded it
// falls back to ATen on views of the same memory.
#ifndef PLAIT_MODELS_INTERNAL_GEMM_H_
#define PLAIT_MODELS_INTERNAL_GEMM_H_

#include <cstdint>
#include <string>

#include "ATen/ops/mm.h"
#include "c10/util/BFloat16.h"

namespace plait::models::internal {

// The type a kernel computes in for arrays of T: T itself, float for bf16 (GEMMs on bf16
// operands accumulate and write C in float).
template <typename T>
struct ArithmeticOf {
  using type = T;
};
template <>
struct ArithmeticOf<c10::BFloat16> {
  using type = float;
};
template <typename T>
using Arithmetic = typename ArithmeticOf<T>::type;

// op(A) is m x k (A^T when trans_a), op(B) is k x n, C is m x n; lda, ldb, ldc are the
// row strides of A, B, C as stored. Defined for float, double and c10::BFloat16.
template <typename T>
void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, Arithmetic<T> alpha,
          const T* a, int64_t lda, const T* b, int64_t ldb, Arithmetic<T> beta, Arithmetic<T>* c,
          int64_t ldc);

// The library function Gemm<T> calls in this process ("cblas_sgemm", "sgemm_",
// "dnnl_gemm_bf16bf16f32", ...), or "ATen" where it falls back.
template <typename T>
std::string GemmLibrary();

// The same through ATen on views of the memory: Gemm's fallback (exposed for its test).
template <typename T>
void AtenGemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, Arithmetic<T> alpha,
              const T* a, int64_t lda, const T* b, int64_t ldb, Arithmetic<T> beta,
              Arithmetic<T>* c, int64_t ldc);

}  // namespace plait::models::internal

#endif  // PLAIT_MODELS_INTERNAL_GEMM_H_
