// Row-major C = alpha * op(A) op(B) + beta * C on CPU arrays with arbitrary leading
// dimensions, for kernels that multiply many small strided blocks (one attention head's rows
// of a [B, T, heads, D] tensor are a matrix with leading dimension heads * D). It calls the
// process's CBLAS (OpenBLAS under Debian's LibTorch) directly: at::mm_out on the same blocks
// costs ~10 us of dispatch per call, as much as a 64x64x256 product itself. Where no CBLAS
// symbol is loaded (a LibTorch with MKL linked in statically) it falls back to at::mm_out
// on views of the same memory.
#ifndef PLAIT_MODELS_INTERNAL_GEMM_H_
#define PLAIT_MODELS_INTERNAL_GEMM_H_

#include <cstdint>

namespace plait::models::internal {

// op(A) is m x k (A^T when trans_a), op(B) is k x n, C is m x n; lda, ldb, ldc are the
// row strides of A, B, C as stored. Defined for float and double.
template <typename T>
void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
          int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc);

// The same through at::addmm_out on views of the memory: Gemm's fallback where no CBLAS is
// loaded (exposed for its test).
template <typename T>
void AtenGemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
              int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc);

}  // namespace plait::models::internal

#endif  // PLAIT_MODELS_INTERNAL_GEMM_H_
