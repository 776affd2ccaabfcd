#include "models/internal/gemm.h"

#include <dlfcn.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "ATen/core/Tensor.h"
#include "ATen/ops/addmm.h"
#include "ATen/ops/mm.h"
#include "torch/csrc/autograd/generated/variable_factories.h"

namespace plait::models::internal {
namespace {

// CBLAS's enum values (cblas.h), fixed by the CBLAS standard.
constexpr int kRowMajor = 101;
constexpr int kNoTrans = 111;
constexpr int kTrans = 112;

// The signatures of the library functions, by their headers (cblas.h, the Fortran BLAS
// reference, dnnl.h, mkl_cblas.h), with 32-bit BLAS integers as LibTorch's builds use them.
template <typename T>
using CblasGemm = void (*)(int order, int trans_a, int trans_b, int m, int n, int k, T alpha,
                           const T* a, int lda, const T* b, int ldb, T beta, T* c, int ldc);
template <typename T>
using FortranGemm = void (*)(const char* trans_a, const char* trans_b, const int* m, const int* n,
                             const int* k, const T* alpha, const T* a, const int* lda, const T* b,
                             const int* ldb, const T* beta, T* c, const int* ldc);
using DnnlGemmBf16 = int (*)(char trans_a, char trans_b, int64_t m, int64_t n, int64_t k,
                             float alpha, const c10::BFloat16* a, int64_t lda,
                             const c10::BFloat16* b, int64_t ldb, float beta, float* c,
                             int64_t ldc);
using CblasGemmBf16 = void (*)(int order, int trans_a, int trans_b, int m, int n, int k,
                               float alpha, const c10::BFloat16* a, int lda, const c10::BFloat16* b,
                               int ldb, float beta, float* c, int ldc);

template <typename F>
F LookUp(const char* name) {
  return reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));
}

// The BLAS functions of one element type found in this process, looked up once.
template <typename T>
struct Library;
template <typename T>
struct FloatingLibrary {
  FloatingLibrary(const char* cblas_name, const char* fortran_name)
      : cblas(LookUp<CblasGemm<T>>(cblas_name)), fortran(LookUp<FortranGemm<T>>(fortran_name)) {
    name = cblas != nullptr ? cblas_name : fortran != nullptr ? fortran_name : "ATen";
  }
  CblasGemm<T> cblas;
  FortranGemm<T> fortran;
  std::string name;
};
template <>
struct Library<float> : FloatingLibrary<float> {
  Library() : FloatingLibrary("cblas_sgemm", "sgemm_") {}
};
template <>
struct Library<double> : FloatingLibrary<double> {
  Library() : FloatingLibrary("cblas_dgemm", "dgemm_") {}
};
// Debian's oneDNN, opened for this library alone where the process has no oneDNN GEMM of its
// own: PyTorch's wheels keep their oneDNN to themselves and export MKL's bf16 GEMM, which on
// AMD's EPYC runs at about 0.4x oneDNN's (one Zen 4 core, attention's block shapes: 76-84
// against 174-199 GFLOP/s). RTLD_DEEPBIND binds the library's references to its own
// definitions before the wheel's, which bundles another oneDNN. Null where it is not
// installed (Debian's LibTorch depends on it) or does not load.
void* OpenDebiansOneDnn() { return dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND); }

template <>
struct Library<c10::BFloat16> {
  Library()
      : dnnl(LookUp<DnnlGemmBf16>("dnnl_gemm_bf16bf16f32")),
        cblas(LookUp<CblasGemmBf16>("cblas_gemm_bf16bf16f32")) {
    name = "dnnl_gemm_bf16bf16f32";
    if (dnnl == nullptr) {
      void* debians = OpenDebiansOneDnn();
      if (debians != nullptr) {
        dnnl = reinterpret_cast<DnnlGemmBf16>(dlsym(debians, "dnnl_gemm_bf16bf16f32"));
        name = "dnnl_gemm_bf16bf16f32 of libdnnl.so.2";
      }
    }
    if (dnnl == nullptr) name = cblas != nullptr ? "cblas_gemm_bf16bf16f32" : "ATen";
  }
  DnnlGemmBf16 dnnl;
  CblasGemmBf16 cblas;
  std::string name;
};

template <typename T>
const Library<T>& Loaded() {
  static const Library<T> library;
  return library;
}

// Row-major calls through a column-major BLAS compute C^T = op(B)^T op(A)^T: the same
// memory, read with the operands swapped.
template <typename T>
bool CallLibrary(const Library<T>& library, bool trans_a, bool trans_b, int m, int n, int k,
                 Arithmetic<T> alpha, const T* a, int lda, const T* b, int ldb, Arithmetic<T> beta,
                 Arithmetic<T>* c, int ldc) {
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    if (library.dnnl != nullptr) {
      return library.dnnl(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb,
                          beta, c, ldc) == 0;
    }
    if (library.cblas == nullptr) return false;
    library.cblas(kRowMajor, trans_a ? kTrans : kNoTrans, trans_b ? kTrans : kNoTrans, m, n, k,
                  alpha, a, lda, b, ldb, beta, c, ldc);
    return true;
  } else {
    if (library.cblas != nullptr) {
      library.cblas(kRowMajor, trans_a ? kTrans : kNoTrans, trans_b ? kTrans : kNoTrans, m, n, k,
                    alpha, a, lda, b, ldb, beta, c, ldc);
      return true;
    }
    if (library.fortran == nullptr) return false;
    const char op_a = trans_a ? 'T' : 'N';
    const char op_b = trans_b ? 'T' : 'N';
    library.fortran(&op_b, &op_a, &n, &m, &k, &alpha, b, &ldb, a, &lda, &beta, c, &ldc);
    return true;
  }
}

// The stored matrix of `rows` x `cols` with row stride `ld`, as a tensor view of `data`.
template <typename T>
at::Tensor View(const T* data, int64_t rows, int64_t cols, int64_t ld) {
  return torch::from_blob(const_cast<T*>(data), {rows, cols}, {ld, 1},
                          at::CppTypeToScalarType<T>::value);
}

}  // namespace

template <typename T>
void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, Arithmetic<T> alpha,
          const T* a, int64_t lda, const T* b, int64_t ldb, Arithmetic<T> beta, Arithmetic<T>* c,
          int64_t ldc) {
  if (!CallLibrary(Loaded<T>(), trans_a, trans_b, static_cast<int>(m), static_cast<int>(n),
                   static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb),
                   beta, c, static_cast<int>(ldc))) {
    AtenGemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
}

template <typename T>
std::string GemmLibrary() {
  return Loaded<T>().name;
}

template <typename T>
void AtenGemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, Arithmetic<T> alpha,
              const T* a, int64_t lda, const T* b, int64_t ldb, Arithmetic<T> beta,
              Arithmetic<T>* c, int64_t ldc) {
  const at::Tensor a_view = trans_a ? View(a, k, m, lda).t() : View(a, m, k, lda);
  const at::Tensor b_view = trans_b ? View(b, n, k, ldb).t() : View(b, k, n, ldb);
  at::Tensor c_view = View(c, m, n, ldc);
  if constexpr (std::is_same_v<T, Arithmetic<T>>) {
    at::addmm_out(c_view, c_view, a_view, b_view, beta, alpha);
  } else {
    // In C's dtype, as the libraries accumulate; beta == 0 ignores what C held (NaN included),
    // as BLAS does.
    const at::Tensor product =
        at::mm(a_view.to(c_view.scalar_type()), b_view.to(c_view.scalar_type())).mul_(alpha);
    if (beta == 0) {
      c_view.copy_(product);
    } else {
      c_view.mul_(beta).add_(product);
    }
  }
}

#define PLAIT_INSTANTIATE_GEMM(T)                                                                \
  template void Gemm<T>(bool, bool, int64_t, int64_t, int64_t, Arithmetic<T>, const T*, int64_t, \
                        const T*, int64_t, Arithmetic<T>, Arithmetic<T>*, int64_t);              \
  template std::string GemmLibrary<T>();                                                         \
  template void AtenGemm<T>(bool, bool, int64_t, int64_t, int64_t, Arithmetic<T>, const T*,      \
                            int64_t, const T*, int64_t, Arithmetic<T>, Arithmetic<T>*, int64_t);
PLAIT_INSTANTIATE_GEMM(float)
PLAIT_INSTANTIATE_GEMM(double)
PLAIT_INSTANTIATE_GEMM(c10::BFloat16)
#undef PLAIT_INSTANTIATE_GEMM

}  // namespace plait::models::internal
