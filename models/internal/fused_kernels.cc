#include "models/internal/fused_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "ATen/Parallel.h"
#include "models/internal/gemm.h"

// Built with -O3 -fno-math-errno -fno-trapping-math -fopenmp-simd (see BUILD.bazel): the loops
// vectorise, the reductions marked `omp simd` and the loops calling Exp too. Each kernel is
// compiled for AVX-512, AVX2 and baseline x86-64, picked at load time.
#if defined(__x86_64__) && defined(__GNUC__)
#define PLAIT_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define PLAIT_VECTOR_CLONES
#endif

namespace plait::models::internal {
namespace {

// Row maxima below are written `x > max ? x : max`: std::max's reduction does not vectorise.

template <typename T>
Arithmetic<T> SumOfProducts(int64_t n, const T* __restrict a, const T* __restrict b) {
  using A = Arithmetic<T>;
  A sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) sum += A(a[i]) * A(b[i]);
  return sum;
}

// exp(x) written so that loops over it vectorise (the C library's expf does not, without
// -ffast-math): Cephes' expf, x = n ln2 + r with |r| <= ln2 / 2, exp(r) by its polynomial
// (relative error below 2e-7), times 2^n built in the exponent bits. x above 88.37 is taken as
// 88.37 (so 2^n stays finite), and exp(x) below -87.3 (out of float's normal range) as 0.
__attribute__((always_inline)) inline float Exp(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;
  constexpr float kLn2Lo = -2.12194440e-4f;
  // Adding and subtracting 1.5 * 2^23 rounds to the nearest integer.
  constexpr float kRound = 12582912.0f;
  const float clamped = std::max(std::min(x, 88.37f), -87.3f);
  const float n = (clamped * kLog2e + kRound) - kRound;
  const float r = (clamped - n * kLn2Hi) - n * kLn2Lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  // n in [-126, 127]: 2^n's biased exponent n + 127 is in float's normal range.
  const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
  return x < -87.3f ? 0.0f : p * __builtin_bit_cast(float, bits);
}
__attribute__((always_inline)) inline double Exp(double x) { return std::exp(x); }

// sigmoid(x) = 1 / (1 + exp(-x)).
template <typename T>
__attribute__((always_inline)) inline T Sigmoid(T x) {
  return T(1) / (T(1) + Exp(-x));
}

}  // namespace

template <typename T>
PLAIT_VECTOR_CLONES void RmsNormForward(int64_t rows, int64_t n, const T* __restrict x,
                                        const T* __restrict w, Arithmetic<T> eps, T* __restrict y,
                                        Arithmetic<T>* __restrict rstd) {
  using A = Arithmetic<T>;
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * n;
    T* yr = y + r * n;
    const A inv = A(1) / std::sqrt(SumOfProducts(n, xr, xr) / static_cast<A>(n) + eps);
    rstd[r] = inv;
    for (int64_t i = 0; i < n; ++i) yr[i] = T(A(xr[i]) * inv * A(w[i]));
  }
}

template <typename T>
PLAIT_VECTOR_CLONES void RmsNormBackward(int64_t rows, int64_t n, const T* __restrict x,
                                         const T* __restrict w,
                                         const Arithmetic<T>* __restrict rstd,
                                         const T* __restrict dy, T* __restrict dx,
                                         T* __restrict dw) {
  using A = Arithmetic<T>;
  std::vector<A> dw_sum(static_cast<size_t>(n), A(0));
  A* __restrict dw_acc = dw_sum.data();
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * n;
    const T* dyr = dy + r * n;
    T* dxr = dx + r * n;
    const A inv = rstd[r];
    A dot = 0;  // sum(dy * w * x)
#pragma omp simd reduction(+ : dot)
    for (int64_t i = 0; i < n; ++i) dot += A(dyr[i]) * A(w[i]) * A(xr[i]);
    const A coef = dot * inv * inv * inv / static_cast<A>(n);
    for (int64_t i = 0; i < n; ++i) {
      dxr[i] = T(A(dyr[i]) * A(w[i]) * inv - A(xr[i]) * coef);
      dw_acc[i] += A(dyr[i]) * A(xr[i]) * inv;
    }
  }
  for (int64_t i = 0; i < n; ++i) dw[i] = T(dw_acc[i]);
}

template <typename T>
PLAIT_VECTOR_CLONES void SwiGluForward(int64_t n, const T* __restrict gate, const T* __restrict up,
                                       T* __restrict h) {
  using A = Arithmetic<T>;
  for (int64_t i = 0; i < n; ++i) {
    const A g = A(gate[i]);
    h[i] = T(g * Sigmoid(g) * A(up[i]));
  }
}

template <typename T>
PLAIT_VECTOR_CLONES void SwiGluBackward(int64_t n, const T* __restrict gate, const T* __restrict up,
                                        const T* __restrict dh, T* __restrict dgate,
                                        T* __restrict dup) {
  using A = Arithmetic<T>;
  for (int64_t i = 0; i < n; ++i) {
    const A g = A(gate[i]);
    const A s = Sigmoid(g);
    dgate[i] = T(A(dh[i]) * A(up[i]) * s * (A(1) + g * (A(1) - s)));
    dup[i] = T(A(dh[i]) * g * s);
  }
}

template <typename T>
PLAIT_VECTOR_CLONES void RotaryForward(int64_t outer, int64_t seq, int64_t heads, int64_t d,
                                       const T* __restrict x, const T* __restrict cos,
                                       const T* __restrict sin, T* __restrict y) {
  using A = Arithmetic<T>;
  const int64_t half = d / 2;
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t t = 0; t < seq; ++t) {
      const T* c = cos + t * d;
      const T* s = sin + t * d;
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t base = ((o * seq + t) * heads + h) * d;
        const T* xr = x + base;
        T* yr = y + base;
        for (int64_t i = 0; i < half; ++i) {
          yr[i] = T(A(xr[i]) * A(c[i]) - A(xr[i + half]) * A(s[i]));
        }
        for (int64_t i = half; i < d; ++i) {
          yr[i] = T(A(xr[i]) * A(c[i]) + A(xr[i - half]) * A(s[i]));
        }
      }
    }
  }
}

template <typename T>
PLAIT_VECTOR_CLONES void CrossEntropyForward(int64_t rows, int64_t vocab,
                                             const T* __restrict logits,
                                             const int64_t* __restrict targets,
                                             int64_t ignore_index, T* __restrict lse,
                                             T* __restrict loss) {
  std::vector<T> scratch(static_cast<size_t>(vocab));
  T* __restrict exps = scratch.data();
  for (int64_t r = 0; r < rows; ++r) {
    const T* row = logits + r * vocab;
    if (targets[r] == ignore_index) {
      lse[r] = 0;
      loss[r] = 0;
      continue;
    }
    T max = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : max)
    for (int64_t j = 0; j < vocab; ++j) max = row[j] > max ? row[j] : max;
    // The exps go through `exps` first: a reduction over Exp's clamps does not vectorise.
    for (int64_t j = 0; j < vocab; ++j) exps[j] = Exp(row[j] - max);
    T sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < vocab; ++j) sum += exps[j];
    lse[r] = max + std::log(sum);
    loss[r] = lse[r] - row[targets[r]];
  }
}

template <typename T>
PLAIT_VECTOR_CLONES void CrossEntropyBackward(int64_t rows, int64_t vocab,
                                              const T* __restrict logits,
                                              const int64_t* __restrict targets,
                                              int64_t ignore_index, const T* __restrict lse,
                                              T scale, T* __restrict dlogits) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* row = logits + r * vocab;
    T* grad = dlogits + r * vocab;
    if (targets[r] == ignore_index) {
      std::fill(grad, grad + vocab, T(0));
      continue;
    }
    const T shift = lse[r];
    for (int64_t j = 0; j < vocab; ++j) grad[j] = scale * Exp(row[j] - shift);
    grad[targets[r]] -= scale;
  }
}

namespace {

// The query rows i0 .. i0 + m - 1 of one (batch, head) and the keys they meet: row r meets
// keys starts[r] .. i0 + r, and the block's scores cover keys k0 .. i0 + m - 1, k0 being the
// earliest start, so a block skips the keys before it. Without a causal mask every row meets
// every key.
struct QueryBlock {
  QueryBlock(const AttentionShape& shape, int64_t b, int64_t i0)
      : i0(i0), m(std::min(kAttentionBlock, shape.seq - i0)), causal(shape.causal) {
    if (!causal) {
      std::fill(starts, starts + m, int64_t{0});
      k0 = 0;
      n = shape.seq;
      return;
    }
    const int64_t* positions =
        shape.positions == nullptr ? nullptr : shape.positions + b * shape.seq;
    for (int64_t r = 0; r < m; ++r) {
      const int64_t t = i0 + r;
      // Clamped to [0, t]: a wrong position may change what a row meets, never where it reads.
      starts[r] = positions == nullptr ? 0 : std::clamp(t - positions[t], int64_t{0}, t);
      k0 = std::min(k0, starts[r]);
    }
    n = i0 + m - k0;
  }
  // The score columns of row r that are keys it meets: [begin, end).
  int64_t Begin(int64_t r) const { return starts[r] - k0; }
  int64_t End(int64_t r) const { return causal ? i0 + r + 1 - k0 : n; }

  int64_t i0, m;
  bool causal;
  int64_t k0 = std::numeric_limits<int64_t>::max();
  int64_t n;  // the scores' columns, keys k0 .. i0 + m - 1
  int64_t starts[kAttentionBlock];
};

// The block's scores [m, n] turned in place into each row's softmax over the keys it meets;
// the other keys get 0. lse receives each row's log-sum-exp.
template <typename T>
PLAIT_VECTOR_CLONES void CausalSoftmax(const QueryBlock& block, T* __restrict scores,
                                       T* __restrict lse) {
  const int64_t n = block.n;
  for (int64_t r = 0; r < block.m; ++r) {
    T* row = scores + r * n;
    const int64_t begin = block.Begin(r);
    const int64_t end = block.End(r);
    T max = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : max)
    for (int64_t j = begin; j < end; ++j) max = row[j] > max ? row[j] : max;
    T sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = begin; j < end; ++j) {
      row[j] = Exp(row[j] - max);
      sum += row[j];
    }
    const T inv = T(1) / sum;
    for (int64_t j = begin; j < end; ++j) row[j] *= inv;
    std::fill(row, row + begin, T(0));
    std::fill(row + end, row + n, T(0));
    lse[r] = max + std::log(sum);
  }
}

// The same probabilities again from the scores and the saved lse: exp(score - lse[row]).
template <typename T>
PLAIT_VECTOR_CLONES void CausalProbabilities(const QueryBlock& block, T* __restrict scores,
                                             const T* __restrict lse) {
  const int64_t n = block.n;
  for (int64_t r = 0; r < block.m; ++r) {
    T* row = scores + r * n;
    const int64_t begin = block.Begin(r);
    const int64_t end = block.End(r);
    const T shift = lse[r];
    for (int64_t j = begin; j < end; ++j) row[j] = Exp(row[j] - shift);
    std::fill(row, row + begin, T(0));
    std::fill(row + end, row + n, T(0));
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

// `count` values as GEMM operands of type T: the values themselves where T is their type,
// else rounded into `storage`.
template <typename T>
PLAIT_VECTOR_CLONES const T* AsOperand(const Arithmetic<T>* __restrict values, int64_t count,
                                       std::vector<T>& storage) {
  if constexpr (std::is_same_v<T, Arithmetic<T>>) {
    return values;
  } else {
    T* __restrict rounded = storage.data();
    for (int64_t i = 0; i < count; ++i) rounded[i] = T(values[i]);
    return rounded;
  }
}

// Rounds the rows x cols values of `from` (row stride ld_from) into `to` (row stride ld_to).
template <typename T>
PLAIT_VECTOR_CLONES void StoreRows(int64_t rows, int64_t cols, const Arithmetic<T>* __restrict from,
                                   int64_t ld_from, T* __restrict to, int64_t ld_to) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < cols; ++i) to[r * ld_to + i] = T(from[r * ld_from + i]);
  }
}

// Where a GEMM writes rows bound for `destination` (row stride ld), of type T: there itself
// where T is the arithmetic type, else a float scratch of the same rows (row stride `cols`),
// which Store() then rounds into place.
template <typename T>
class GemmTarget {
 public:
  using A = Arithmetic<T>;
  static constexpr bool kDirect = std::is_same_v<T, A>;

  GemmTarget(int64_t rows, int64_t cols) : cols_(cols) {
    if constexpr (!kDirect) scratch_.resize(static_cast<size_t>(rows * cols));
  }
  A* Rows(T* destination) {
    if constexpr (kDirect) {
      return destination;
    } else {
      return scratch_.data();
    }
  }
  int64_t Stride(int64_t ld) const { return kDirect ? ld : cols_; }
  void Store(int64_t rows, T* destination, int64_t ld) const {
    if constexpr (!kDirect) StoreRows<T>(rows, cols_, scratch_.data(), cols_, destination, ld);
  }

 private:
  int64_t cols_;
  std::vector<A> scratch_;
};

// The offsets and strides of one (batch, kv head) pair and the query heads that share it.
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
void CausalAttentionForward(const AttentionShape& shape, Arithmetic<T> scale, const T* q,
                            const T* k, const T* v, T* out, Arithmetic<T>* lse) {
  using A = Arithmetic<T>;
  const int64_t seq = shape.seq;
  const int64_t d = shape.head_dim;
  at::parallel_for(0, shape.batch * shape.kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<A> scores(static_cast<size_t>(kAttentionBlock * seq));
    std::vector<T> probs(GemmTarget<T>::kDirect ? 0 : scores.size());
    GemmTarget<T> out_rows(kAttentionBlock, d);
    for (int64_t index = begin; index < end; ++index) {
      const HeadGroup g(shape, index);
      const T* kb = k + g.k_offset;
      const T* vb = v + g.k_offset;
      for (int64_t j = 0; j < g.groups; ++j) {
        const int64_t h = g.kv * g.groups + j;
        A* lse_h = lse + (g.b * shape.heads + h) * seq;
        for (int64_t i0 = 0; i0 < seq; i0 += kAttentionBlock) {
          const QueryBlock block(shape, g.b, i0);
          const int64_t m = block.m;
          const int64_t n = block.n;
          const int64_t row = g.q_offset + i0 * g.ldq + j * d;
          const int64_t keys = block.k0 * g.ldk;
          Gemm<T>(false, true, m, n, d, scale, q + row, g.ldq, kb + keys, g.ldk, A(0),
                  scores.data(), n);
          CausalSoftmax<A>(block, scores.data(), lse_h + i0);
          Gemm<T>(false, false, m, d, n, A(1), AsOperand<T>(scores.data(), m * n, probs), n,
                  vb + keys, g.ldk, A(0), out_rows.Rows(out + row), out_rows.Stride(g.ldq));
          out_rows.Store(m, out + row, g.ldq);
        }
      }
    }
  });
}

template <typename T>
void CausalAttentionBackward(const AttentionShape& shape, Arithmetic<T> scale, const T* q,
                             const T* k, const T* v, const T* out, const Arithmetic<T>* lse,
                             const T* dout, T* dq, T* dk, T* dv) {
  using A = Arithmetic<T>;
  const int64_t seq = shape.seq;
  const int64_t d = shape.head_dim;
  at::parallel_for(0, shape.batch * shape.kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<A> probs(static_cast<size_t>(kAttentionBlock * seq));
    std::vector<A> grad(static_cast<size_t>(kAttentionBlock * seq));
    std::vector<T> probs_operand(GemmTarget<T>::kDirect ? 0 : probs.size());
    std::vector<T> grad_operand(GemmTarget<T>::kDirect ? 0 : grad.size());
    std::vector<A> delta(static_cast<size_t>(kAttentionBlock));
    GemmTarget<T> dq_rows(kAttentionBlock, d);
    // dk and dv sum over every query block and head of the group: in float for bf16.
    GemmTarget<T> dk_rows(seq, d);
    GemmTarget<T> dv_rows(seq, d);
    for (int64_t index = begin; index < end; ++index) {
      const HeadGroup g(shape, index);
      const T* kb = k + g.k_offset;
      const T* vb = v + g.k_offset;
      A* dk_sum = dk_rows.Rows(dk + g.k_offset);
      A* dv_sum = dv_rows.Rows(dv + g.k_offset);
      const int64_t ld_sum = dk_rows.Stride(g.ldk);
      for (int64_t i = 0; i < seq; ++i) {
        std::fill(dk_sum + i * ld_sum, dk_sum + i * ld_sum + d, A(0));
        std::fill(dv_sum + i * ld_sum, dv_sum + i * ld_sum + d, A(0));
      }
      for (int64_t j = 0; j < g.groups; ++j) {
        const int64_t h = g.kv * g.groups + j;
        const A* lse_h = lse + (g.b * shape.heads + h) * seq;
        for (int64_t i0 = 0; i0 < seq; i0 += kAttentionBlock) {
          const QueryBlock block(shape, g.b, i0);
          const int64_t m = block.m;
          const int64_t n = block.n;
          const int64_t row = g.q_offset + i0 * g.ldq + j * d;
          const int64_t keys = block.k0 * g.ldk;
          const int64_t sums = block.k0 * ld_sum;
          for (int64_t r = 0; r < m; ++r) {
            delta[r] = SumOfProducts(d, dout + row + r * g.ldq, out + row + r * g.ldq);
          }
          Gemm<T>(false, true, m, n, d, scale, q + row, g.ldq, kb + keys, g.ldk, A(0), probs.data(),
                  n);
          CausalProbabilities<A>(block, probs.data(), lse_h + i0);
          Gemm<T>(false, true, m, n, d, A(1), dout + row, g.ldq, vb + keys, g.ldk, A(0),
                  grad.data(), n);
          SoftmaxBackward<A>(m, n, probs.data(), delta.data(), grad.data());
          const T* ds = AsOperand<T>(grad.data(), m * n, grad_operand);
          const T* p = AsOperand<T>(probs.data(), m * n, probs_operand);
          Gemm<T>(false, false, m, d, n, scale, ds, n, kb + keys, g.ldk, A(0),
                  dq_rows.Rows(dq + row), dq_rows.Stride(g.ldq));
          dq_rows.Store(m, dq + row, g.ldq);
          Gemm<T>(true, false, n, d, m, scale, ds, n, q + row, g.ldq, A(1), dk_sum + sums, ld_sum);
          Gemm<T>(true, false, n, d, m, A(1), p, n, dout + row, g.ldq, A(1), dv_sum + sums, ld_sum);
        }
      }
      dk_rows.Store(seq, dk + g.k_offset, g.ldk);
      dv_rows.Store(seq, dv + g.k_offset, g.ldk);
    }
  });
}

#define PLAIT_INSTANTIATE_KERNELS(T)                                                               \
  template void RmsNormForward<T>(int64_t, int64_t, const T*, const T*, Arithmetic<T>, T*,         \
                                  Arithmetic<T>*);                                                 \
  template void RmsNormBackward<T>(int64_t, int64_t, const T*, const T*, const Arithmetic<T>*,     \
                                   const T*, T*, T*);                                              \
  template void SwiGluForward<T>(int64_t, const T*, const T*, T*);                                 \
  template void SwiGluBackward<T>(int64_t, const T*, const T*, const T*, T*, T*);                  \
  template void RotaryForward<T>(int64_t, int64_t, int64_t, int64_t, const T*, const T*, const T*, \
                                 T*);                                                              \
  template void CausalAttentionForward<T>(const AttentionShape&, Arithmetic<T>, const T*,          \
                                          const T*, const T*, T*, Arithmetic<T>*);                 \
  template void CausalAttentionBackward<T>(const AttentionShape&, Arithmetic<T>, const T*,         \
                                           const T*, const T*, const T*, const Arithmetic<T>*,     \
                                           const T*, T*, T*, T*);
#define PLAIT_INSTANTIATE_CROSS_ENTROPY(T)                                                      \
  template void CrossEntropyForward<T>(int64_t, int64_t, const T*, const int64_t*, int64_t, T*, \
                                       T*);                                                     \
  template void CrossEntropyBackward<T>(int64_t, int64_t, const T*, const int64_t*, int64_t,    \
                                        const T*, T, T*);
PLAIT_INSTANTIATE_KERNELS(float)
PLAIT_INSTANTIATE_KERNELS(double)
PLAIT_INSTANTIATE_KERNELS(c10::BFloat16)
PLAIT_INSTANTIATE_CROSS_ENTROPY(float)
PLAIT_INSTANTIATE_CROSS_ENTROPY(double)
#undef PLAIT_INSTANTIATE_KERNELS
#undef PLAIT_INSTANTIATE_CROSS_ENTROPY

}  // namespace plait::models::internal
