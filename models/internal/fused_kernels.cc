#include "models/internal/fused_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "models/internal/gemm.h"
#include "torch/torch.h"

// Built with -O3 -fno-math-errno -fopenmp-simd (see BUILD.bazel): the loops vectorise, the
// reductions marked `omp simd` too. Each kernel is compiled for AVX-512, AVX2 and baseline
// x86-64, picked at load time.
#if defined(__x86_64__) && defined(__GNUC__)
#define PLAIT_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define PLAIT_VECTOR_CLONES
#endif

namespace plait::models::internal {
namespace {

template <typename T>
T SumOfProducts(int64_t n, const T* __restrict a, const T* __restrict b) {
  T sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// exp of `n` contiguous values in place, through ATen's vectorised exp (the C library's
// exp does not vectorise without -ffast-math).
template <typename T>
void ExpInPlace(int64_t n, T* x) {
  torch::from_blob(x, {n}, torch::CppTypeToScalarType<T>::value).exp_();
}

}  // namespace

template <typename T>
PLAIT_VECTOR_CLONES void RmsNormForward(int64_t rows, int64_t n, const T* __restrict x,
                                        const T* __restrict w, T eps, T* __restrict y,
                                        T* __restrict rstd) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * n;
    T* yr = y + r * n;
    const T inv = T(1) / std::sqrt(SumOfProducts(n, xr, xr) / static_cast<T>(n) + eps);
    rstd[r] = inv;
    for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * inv * w[i];
  }
}

template <typename T>
PLAIT_VECTOR_CLONES void RmsNormBackward(int64_t rows, int64_t n, const T* __restrict x,
                                         const T* __restrict w, const T* __restrict rstd,
                                         const T* __restrict dy, T* __restrict dx,
                                         T* __restrict dw) {
  std::fill(dw, dw + n, T(0));
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * n;
    const T* dyr = dy + r * n;
    T* dxr = dx + r * n;
    const T inv = rstd[r];
    T dot = 0;  // sum(dy * w * x)
#pragma omp simd reduction(+ : dot)
    for (int64_t i = 0; i < n; ++i) dot += dyr[i] * w[i] * xr[i];
    const T coef = dot * inv * inv * inv / static_cast<T>(n);
    for (int64_t i = 0; i < n; ++i) {
      dxr[i] = dyr[i] * w[i] * inv - xr[i] * coef;
      dw[i] += dyr[i] * xr[i] * inv;
    }
  }
}

template <typename T>
PLAIT_VECTOR_CLONES void SwiGluForward(int64_t n, const T* __restrict gate,
                                       const T* __restrict sigmoid_gate, const T* __restrict up,
                                       T* __restrict h) {
  for (int64_t i = 0; i < n; ++i) h[i] = gate[i] * sigmoid_gate[i] * up[i];
}

template <typename T>
PLAIT_VECTOR_CLONES void SwiGluBackward(int64_t n, const T* __restrict gate,
                                        const T* __restrict sigmoid_gate, const T* __restrict up,
                                        const T* __restrict dh, T* __restrict dgate,
                                        T* __restrict dup) {
  for (int64_t i = 0; i < n; ++i) {
    const T s = sigmoid_gate[i];
    const T silu = gate[i] * s;
    dgate[i] = dh[i] * up[i] * s * (T(1) + gate[i] * (T(1) - s));
    dup[i] = dh[i] * silu;
  }
}

template <typename T>
PLAIT_VECTOR_CLONES void RotaryForward(int64_t outer, int64_t seq, int64_t heads, int64_t d,
                                       const T* __restrict x, const T* __restrict cos,
                                       const T* __restrict sin, T* __restrict y) {
  const int64_t half = d / 2;
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t t = 0; t < seq; ++t) {
      const T* c = cos + t * d;
      const T* s = sin + t * d;
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t base = ((o * seq + t) * heads + h) * d;
        const T* xr = x + base;
        T* yr = y + base;
        for (int64_t i = 0; i < half; ++i) yr[i] = xr[i] * c[i] - xr[i + half] * s[i];
        for (int64_t i = half; i < d; ++i) yr[i] = xr[i] * c[i] + xr[i - half] * s[i];
      }
    }
  }
}

template <typename T>
PLAIT_VECTOR_CLONES void RotaryBackward(int64_t outer, int64_t seq, int64_t heads, int64_t d,
                                        const T* __restrict dy, const T* __restrict cos,
                                        const T* __restrict sin, T* __restrict dx) {
  const int64_t half = d / 2;
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t t = 0; t < seq; ++t) {
      const T* c = cos + t * d;
      const T* s = sin + t * d;
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t base = ((o * seq + t) * heads + h) * d;
        const T* g = dy + base;
        T* dxr = dx + base;
        for (int64_t i = 0; i < half; ++i) dxr[i] = g[i] * c[i] + g[i + half] * s[i + half];
        for (int64_t i = half; i < d; ++i) dxr[i] = g[i] * c[i] - g[i - half] * s[i - half];
      }
    }
  }
}

namespace {

// Scores of query rows i0 .. i0 + m - 1 against keys 0 .. i0 + m - 1, [m, n] with n = i0 + m:
// turned in place into exp(score - shift[row]) with the keys after each row's position set to
// zero. shift is the row maximum (forward, written to `shift`) or the saved log-sum-exp
// (backward, read from `shift`).
template <typename T>
PLAIT_VECTOR_CLONES void MaskedExp(int64_t i0, int64_t m, T* __restrict scores, bool find_max,
                                   T* __restrict shift) {
  const int64_t n = i0 + m;
  for (int64_t r = 0; r < m; ++r) {
    T* row = scores + r * n;
    const int64_t valid = i0 + r + 1;
    if (find_max) {
      T max = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : max)
      for (int64_t j = 0; j < valid; ++j) max = std::max(max, row[j]);
      shift[r] = max;
    }
    const T sub = shift[r];
    for (int64_t j = 0; j < valid; ++j) row[j] -= sub;
    for (int64_t j = valid; j < n; ++j) row[j] = -std::numeric_limits<T>::infinity();
  }
  ExpInPlace(m * n, scores);
}

// Normalises each probability row (the forward's masked exp) and turns its shift into the
// row's log-sum-exp.
template <typename T>
PLAIT_VECTOR_CLONES void NormaliseRows(int64_t m, int64_t n, T* __restrict probs,
                                       T* __restrict lse) {
  for (int64_t r = 0; r < m; ++r) {
    T* row = probs + r * n;
    T sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < n; ++j) sum += row[j];
    const T inv = T(1) / sum;
    for (int64_t j = 0; j < n; ++j) row[j] *= inv;
    lse[r] += std::log(sum);
  }
}

// dS = P * (dP - delta[row]) in place of dP.
template <typename T>
PLAIT_VECTOR_CLONES void SoftmaxBackward(int64_t m, int64_t n, const T* __restrict probs,
                                         const T* __restrict delta, T* __restrict dp) {
  for (int64_t r = 0; r < m; ++r) {
    const T* p = probs + r * n;
    T* g = dp + r * n;
    const T dr = delta[r];
    for (int64_t j = 0; j < n; ++j) g[j] = p[j] * (g[j] - dr);
  }
}

// The pointers and strides of one (batch, kv head) pair and the query heads that share it.
template <typename T>
struct HeadGroup {
  HeadGroup(const AttentionShape& shape, int64_t index)
      : b(index / shape.kv_heads),
        kv(index % shape.kv_heads),
        groups(shape.heads / shape.kv_heads),
        ldq(shape.heads * shape.head_dim),
        ldk(shape.kv_heads * shape.head_dim),
        q_offset(b * shape.seq * ldq + kv * groups * shape.head_dim),
        k_offset(b * shape.seq * ldk + kv * shape.head_dim) {}
  int64_t b, kv, groups, ldq, ldk, q_offset, k_offset;
};

}  // namespace

template <typename T>
void CausalAttentionForward(const AttentionShape& shape, T scale, const T* q, const T* k,
                            const T* v, T* out, T* lse) {
  const int64_t seq = shape.seq;
  const int64_t d = shape.head_dim;
  at::parallel_for(0, shape.batch * shape.kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<T> scores(static_cast<size_t>(kAttentionBlock * seq));
    for (int64_t index = begin; index < end; ++index) {
      const HeadGroup<T> g(shape, index);
      const T* kb = k + g.k_offset;
      const T* vb = v + g.k_offset;
      for (int64_t j = 0; j < g.groups; ++j) {
        const int64_t h = g.kv * g.groups + j;
        T* lse_h = lse + (g.b * shape.heads + h) * seq;
        for (int64_t i0 = 0; i0 < seq; i0 += kAttentionBlock) {
          const int64_t m = std::min(kAttentionBlock, seq - i0);
          const int64_t n = i0 + m;
          const int64_t row = g.q_offset + i0 * g.ldq + j * d;
          Gemm<T>(false, true, m, n, d, scale, q + row, g.ldq, kb, g.ldk, T(0), scores.data(), n);
          MaskedExp<T>(i0, m, scores.data(), /*find_max=*/true, lse_h + i0);
          NormaliseRows<T>(m, n, scores.data(), lse_h + i0);
          Gemm<T>(false, false, m, d, n, T(1), scores.data(), n, vb, g.ldk, T(0), out + row, g.ldq);
        }
      }
    }
  });
}

template <typename T>
void CausalAttentionBackward(const AttentionShape& shape, T scale, const T* q, const T* k,
                             const T* v, const T* out, const T* lse, const T* dout, T* dq, T* dk,
                             T* dv) {
  const int64_t seq = shape.seq;
  const int64_t d = shape.head_dim;
  at::parallel_for(0, shape.batch * shape.kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<T> probs(static_cast<size_t>(kAttentionBlock * seq));
    std::vector<T> grad(static_cast<size_t>(kAttentionBlock * seq));
    std::vector<T> delta(static_cast<size_t>(kAttentionBlock));
    std::vector<T> shift(static_cast<size_t>(kAttentionBlock));
    for (int64_t index = begin; index < end; ++index) {
      const HeadGroup<T> g(shape, index);
      const T* kb = k + g.k_offset;
      const T* vb = v + g.k_offset;
      T* dkb = dk + g.k_offset;
      T* dvb = dv + g.k_offset;
      for (int64_t i = 0; i < seq; ++i) {
        std::fill(dkb + i * g.ldk, dkb + i * g.ldk + d, T(0));
        std::fill(dvb + i * g.ldk, dvb + i * g.ldk + d, T(0));
      }
      for (int64_t j = 0; j < g.groups; ++j) {
        const int64_t h = g.kv * g.groups + j;
        const T* lse_h = lse + (g.b * shape.heads + h) * seq;
        for (int64_t i0 = 0; i0 < seq; i0 += kAttentionBlock) {
          const int64_t m = std::min(kAttentionBlock, seq - i0);
          const int64_t n = i0 + m;
          const int64_t row = g.q_offset + i0 * g.ldq + j * d;
          for (int64_t r = 0; r < m; ++r) {
            delta[r] = SumOfProducts(d, dout + row + r * g.ldq, out + row + r * g.ldq);
            shift[r] = lse_h[i0 + r];
          }
          Gemm<T>(false, true, m, n, d, scale, q + row, g.ldq, kb, g.ldk, T(0), probs.data(), n);
          MaskedExp<T>(i0, m, probs.data(), /*find_max=*/false, shift.data());
          Gemm<T>(false, true, m, n, d, T(1), dout + row, g.ldq, vb, g.ldk, T(0), grad.data(), n);
          SoftmaxBackward<T>(m, n, probs.data(), delta.data(), grad.data());
          Gemm<T>(false, false, m, d, n, scale, grad.data(), n, kb, g.ldk, T(0), dq + row, g.ldq);
          Gemm<T>(true, false, n, d, m, scale, grad.data(), n, q + row, g.ldq, T(1), dkb, g.ldk);
          Gemm<T>(true, false, n, d, m, T(1), probs.data(), n, dout + row, g.ldq, T(1), dvb, g.ldk);
        }
      }
    }
  });
}

#define PLAIT_INSTANTIATE_FUSED_KERNELS(T)                                                         \
  template void RmsNormForward<T>(int64_t, int64_t, const T*, const T*, T, T*, T*);                \
  template void RmsNormBackward<T>(int64_t, int64_t, const T*, const T*, const T*, const T*, T*,   \
                                   T*);                                                            \
  template void SwiGluForward<T>(int64_t, const T*, const T*, const T*, T*);                       \
  template void SwiGluBackward<T>(int64_t, const T*, const T*, const T*, const T*, T*, T*);        \
  template void RotaryForward<T>(int64_t, int64_t, int64_t, int64_t, const T*, const T*, const T*, \
                                 T*);                                                              \
  template void RotaryBackward<T>(int64_t, int64_t, int64_t, int64_t, const T*, const T*,          \
                                  const T*, T*);                                                   \
  template void CausalAttentionForward<T>(const AttentionShape&, T, const T*, const T*, const T*,  \
                                          T*, T*);                                                 \
  template void CausalAttentionBackward<T>(const AttentionShape&, T, const T*, const T*, const T*, \
                                           const T*, const T*, const T*, T*, T*, T*);
PLAIT_INSTANTIATE_FUSED_KERNELS(float)
PLAIT_INSTANTIATE_FUSED_KERNELS(double)
#undef PLAIT_INSTANTIATE_FUSED_KERNELS

}  // namespace plait::models::internal
