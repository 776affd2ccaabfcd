#include "models/internal/ops.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <utility>

#include "ATen/core/Tensor.h"
#include "ATen/ops/amax.h"
#include "ATen/ops/baddbmm.h"
#include "ATen/ops/bmm.h"
#include "ATen/ops/logsumexp.h"
#include "ATen/ops/minimum.h"
#include "ATen/ops/roll.h"
#include "ATen/ops/rsqrt.h"
#include "ATen/ops/softmax.h"
#include "ATen/record_function.h"
#include "base/torch_compat.h"
#include "models/internal/fused_kernels.h"
#include "models/rotary.h"
#include "torch/csrc/autograd/custom_function.h"
#include "torch/csrc/autograd/generated/variable_factories.h"
#include "torch/nn/functional/activation.h"
#include "torch/nn/functional/loss.h"

namespace plait::models::internal {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// Each fused forward is recorded under its own name (plait::RmsNorm, ...) for the profiler,
// which otherwise charges it to no event; the backward shows as the function's CppNode.

// Whether the fused kernels can run on these tensors: strided, of one dtype, and served by the
// fused forms on their device (FusedFormsServe).
bool Fusable(std::initializer_list<at::Tensor> tensors) {
  const at::ScalarType dtype = tensors.begin()->scalar_type();
  for (const at::Tensor& tensor : tensors) {
    if (!FusedFormsServe(tensor.scalar_type(), tensor.device().type()) ||
        tensor.layout() != at::kStrided || tensor.scalar_type() != dtype) {
      return false;
    }
  }
  return true;
}

struct RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            double eps) {
    RECORD_FUNCTION("plait::RmsNorm", {});
    const at::Tensor input = x.contiguous();
    const at::Tensor w = weight.contiguous();
    const int64_t n = input.size(-1);
    const int64_t rows = n == 0 ? 0 : input.numel() / n;
    at::Tensor y = torch::empty_like(input);
    at::Tensor rstd =
        torch::empty({rows}, input.options().dtype(ArithmeticDtype(input.scalar_type())));
    AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, input.scalar_type(), "RmsNormForward", [&] {
      using A = Arithmetic<scalar_t>;
      RmsNormForward<scalar_t>(rows, n, input.data_ptr<scalar_t>(), w.data_ptr<scalar_t>(),
                               static_cast<A>(eps), y.data_ptr<scalar_t>(), rstd.data_ptr<A>());
    });
    ctx->save_for_backward({input, w, rstd});
    return y;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const tensor_list saved = ctx->get_saved_variables();
    const at::Tensor& input = saved[0];
    const at::Tensor& w = saved[1];
    const at::Tensor dy = grads[0].contiguous();
    const int64_t n = input.size(-1);
    const int64_t rows = n == 0 ? 0 : input.numel() / n;
    at::Tensor dx = torch::empty_like(input);
    at::Tensor dw = torch::empty_like(w);
    AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, input.scalar_type(), "RmsNormBackward", [&] {
      RmsNormBackward<scalar_t>(rows, n, input.data_ptr<scalar_t>(), w.data_ptr<scalar_t>(),
                                saved[2].data_ptr<Arithmetic<scalar_t>>(), dy.data_ptr<scalar_t>(),
                                dx.data_ptr<scalar_t>(), dw.data_ptr<scalar_t>());
    });
    return {dx, dw, at::Tensor()};
  }
};

struct SwiGluFunction : public torch::autograd::Function<SwiGluFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up) {
    RECORD_FUNCTION("plait::SwiGlu", {});
    const at::Tensor g = gate.contiguous();
    const at::Tensor u = up.contiguous();
    at::Tensor h = torch::empty_like(g);
    AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, g.scalar_type(), "SwiGluForward", [&] {
      SwiGluForward<scalar_t>(g.numel(), g.data_ptr<scalar_t>(), u.data_ptr<scalar_t>(),
                              h.data_ptr<scalar_t>());
    });
    ctx->save_for_backward({g, u});
    return h;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const tensor_list saved = ctx->get_saved_variables();
    const at::Tensor& g = saved[0];
    const at::Tensor& u = saved[1];
    const at::Tensor dh = grads[0].contiguous();
    at::Tensor dgate = torch::empty_like(g);
    at::Tensor dup = torch::empty_like(u);
    AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, g.scalar_type(), "SwiGluBackward", [&] {
      SwiGluBackward<scalar_t>(g.numel(), g.data_ptr<scalar_t>(), u.data_ptr<scalar_t>(),
                               dh.data_ptr<scalar_t>(), dgate.data_ptr<scalar_t>(),
                               dup.data_ptr<scalar_t>());
    });
    return {dgate, dup};
  }
};

// RotaryForward over x [B, T, H, d] with tables [T, d] shared by the rows, or [B, T, d] of
// each row's own (a call per row then).
template <typename T>
void RotaryRows(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, at::Tensor& y) {
  const bool per_row = cos.dim() == 3;
  const int64_t rows = per_row ? x.size(0) : 1;
  const int64_t outer = per_row ? 1 : x.size(0);
  const int64_t row_values = x.size(1) * x.size(2) * x.size(3);
  const int64_t table_values = per_row ? x.size(1) * x.size(3) : 0;
  for (int64_t b = 0; b < rows; ++b) {
    RotaryForward<T>(outer, x.size(1), x.size(2), x.size(3), x.data_ptr<T>() + b * row_values,
                     cos.data_ptr<T>() + b * table_values, sin.data_ptr<T>() + b * table_values,
                     y.data_ptr<T>() + b * row_values);
  }
}

struct RotaryFunction : public torch::autograd::Function<RotaryFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos,
                            const at::Tensor& sin) {
    RECORD_FUNCTION("plait::Rotary", {});
    const at::Tensor input = x.contiguous();
    const at::Tensor c = cos.contiguous();
    const at::Tensor s = sin.contiguous();
    TORCH_CHECK(c.dim() == 2 || (c.dim() == 3 && c.size(0) == input.size(0)), "Rotary: tables ",
                c.sizes(), " are neither [T, d] nor [B, T, d] for x ", input.sizes());
    at::Tensor y = torch::empty_like(input);
    AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, input.scalar_type(), "RotaryForward",
                                   [&] { RotaryRows<scalar_t>(input, c, s, y); });
    ctx->save_for_backward({c, s});
    return y;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const tensor_list saved = ctx->get_saved_variables();
    const at::Tensor dy = grads[0].contiguous();
    // The transposed rotation: the forward's with sin[i] replaced by -sin[i -+ d/2]
    // (fused_kernels.h). The tables are [T, d] or [B, T, d], small beside dy.
    const at::Tensor transposed_sin =
        at::roll(saved[1], dy.size(3) / 2, /*dims=*/-1).neg_().contiguous();
    at::Tensor dx = torch::empty_like(dy);
    AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, dy.scalar_type(), "RotaryBackward",
                                   [&] { RotaryRows<scalar_t>(dy, saved[0], transposed_sin, dx); });
    return {dx, at::Tensor(), at::Tensor()};
  }
};

struct CrossEntropyFunction : public torch::autograd::Function<CrossEntropyFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits,
                            const at::Tensor& targets, int64_t ignore_index) {
    RECORD_FUNCTION("plait::CrossEntropy", {});
    const at::Tensor l = logits.contiguous();
    const at::Tensor t = targets.contiguous();
    const int64_t rows = l.size(0);
    const int64_t vocab = l.size(1);
    TORCH_CHECK(t.dim() == 1 && t.size(0) == rows, "CrossEntropy: targets ", t.sizes(),
                " do not match logits ", l.sizes());
    const at::Tensor kept = t != ignore_index;
    TORCH_CHECK((((t >= 0) & (t < vocab)) | ~kept).all().item<bool>(),
                "CrossEntropy: a target is outside [0, ", vocab, ") and is not ignore_index ",
                ignore_index);
    at::Tensor lse = torch::empty({rows}, l.options());
    at::Tensor loss = torch::empty({rows}, l.options());
    AT_DISPATCH_FLOATING_TYPES(l.scalar_type(), "CrossEntropyForward", [&] {
      CrossEntropyForward<scalar_t>(rows, vocab, l.data_ptr<scalar_t>(), t.data_ptr<int64_t>(),
                                    ignore_index, lse.data_ptr<scalar_t>(),
                                    loss.data_ptr<scalar_t>());
    });
    const int64_t count = kept.sum().item<int64_t>();
    ctx->save_for_backward({l, t, lse});
    ctx->saved_data["ignore_index"] = ignore_index;
    ctx->saved_data["count"] = count;
    return loss.sum() / static_cast<double>(count);
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const tensor_list saved = ctx->get_saved_variables();
    const at::Tensor& l = saved[0];
    const int64_t count = ctx->saved_data["count"].toInt();
    const double scale = grads[0].item<double>() / static_cast<double>(count);
    at::Tensor dlogits = torch::empty_like(l);
    AT_DISPATCH_FLOATING_TYPES(l.scalar_type(), "CrossEntropyBackward", [&] {
      CrossEntropyBackward<scalar_t>(
          l.size(0), l.size(1), l.data_ptr<scalar_t>(), saved[1].data_ptr<int64_t>(),
          ctx->saved_data["ignore_index"].toInt(), saved[2].data_ptr<scalar_t>(),
          static_cast<scalar_t>(scale), dlogits.data_ptr<scalar_t>());
    });
    return {dlogits, at::Tensor(), at::Tensor()};
  }
};

struct TokenCrossEntropyFunction : public torch::autograd::Function<TokenCrossEntropyFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits,
                            const at::Tensor& targets, int64_t ignore_index, int64_t chunk_rows) {
    RECORD_FUNCTION("plait::TokenCrossEntropy", {});
    TORCH_CHECK(logits.dim() == 2 && targets.dim() == 1 && targets.size(0) == logits.size(0),
                "TokenCrossEntropy: targets ", targets.sizes(), " do not match logits ",
                logits.sizes());
    TORCH_CHECK(chunk_rows > 0, "TokenCrossEntropy: chunk_rows ", chunk_rows, " must be > 0");
    const int64_t rows = logits.size(0);
    const at::ScalarType wide = CrossEntropyDtype(logits.scalar_type());
    at::Tensor losses = torch::empty({rows}, logits.options().dtype(wide));
    at::Tensor lse = torch::empty({rows}, logits.options().dtype(wide));
    for (int64_t begin = 0; begin < rows; begin += chunk_rows) {
      const int64_t n = std::min(chunk_rows, rows - begin);
      const at::Tensor chunk = logits.narrow(0, begin, n);
      const at::Tensor target = targets.narrow(0, begin, n);
      const at::Tensor ignored = target == ignore_index;
      // The log-sum-exp shifted by each row's maximum (by 0 where that is infinite, as
      // at::logsumexp does), exponentiated in place in the chunk's one wide copy.
      at::Tensor shifted = chunk.to(wide, /*non_blocking=*/false, /*copy=*/true);
      at::Tensor max = at::amax(shifted, {1}, /*keepdim=*/true);
      max.masked_fill_(max.isinf(), 0.0);
      at::Tensor chunk_lse = lse.narrow(0, begin, n);
      chunk_lse.copy_(shifted.sub_(max).exp_().sum(1)).log_().add_(max.squeeze(1));
      const at::Tensor picked =
          chunk.gather(1, target.masked_fill(ignored, 0).unsqueeze(1)).squeeze(1);
      losses.narrow(0, begin, n).copy_(chunk_lse - picked).masked_fill_(ignored, 0.0);
    }
    ctx->save_for_backward({logits, targets, lse});
    ctx->saved_data["ignore_index"] = ignore_index;
    ctx->saved_data["chunk_rows"] = chunk_rows;
    return losses;
  }

  // d loss[i] / d logits[i] = softmax(logits[i]) - onehot(target[i]), times the incoming
  // gradient of row i, 0 for ignored rows: the whole vocabulary is this function's columns.
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const tensor_list saved = ctx->get_saved_variables();
    const at::Tensor& logits = saved[0];
    return {base::ChunkedCrossEntropyBackward(
                logits, saved[1], saved[2], grads[0], ctx->saved_data["ignore_index"].toInt(),
                /*vocab_start=*/0, /*real=*/logits.size(1), ctx->saved_data["chunk_rows"].toInt()),
            at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// `positions`: contiguous int64 on the host, or undefined.
AttentionShape ShapeOf(const at::Tensor& q, const at::Tensor& k, const at::Tensor& positions) {
  return {q.size(0), q.size(1), q.size(2),
          k.size(2), q.size(3), positions.defined() ? positions.data_ptr<int64_t>() : nullptr};
}

// x [B, T, KV, d] with each head repeated `groups` times in place, [B, T, KV * groups, d]:
// query head h of grouped-query attention meets kv head h / groups. An expand and one copy:
// no index tensor, nothing read back to the host (LibTorch 1.13's repeat_interleave did both).
at::Tensor RepeatHeads(const at::Tensor& x, int64_t groups) {
  return x.unsqueeze(3)
      .expand({x.size(0), x.size(1), x.size(2), groups, x.size(3)})
      .reshape({x.size(0), x.size(1), x.size(2) * groups, x.size(3)});
}

double AttentionScale(const at::Tensor& q) {
  return 1.0 / std::sqrt(static_cast<double>(q.size(3)));
}

// The fused kernels' attention of contiguous q, k and v of `shape`: its output and each row's
// log-sum-exp [B, H, T] (in the arithmetic dtype).
std::array<at::Tensor, 2> AttentionForward(const AttentionShape& shape, const at::Tensor& q,
                                           const at::Tensor& k, const at::Tensor& v) {
  at::Tensor out = torch::empty_like(q);
  at::Tensor lse = torch::empty({shape.batch, shape.heads, shape.seq},
                                q.options().dtype(ArithmeticDtype(q.scalar_type())));
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, q.scalar_type(), "AttentionForward", [&] {
    using A = Arithmetic<scalar_t>;
    CausalAttentionForward<scalar_t>(
        shape, static_cast<A>(AttentionScale(q)), q.data_ptr<scalar_t>(), k.data_ptr<scalar_t>(),
        v.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), lse.data_ptr<A>());
  });
  return {out, lse};
}

// Its gradients dq, dk and dv from the output `out` and log-sum-exp `lse` of the attention
// they are taken of (contiguous, as every tensor here).
std::array<at::Tensor, 3> AttentionBackward(const AttentionShape& shape, const at::Tensor& q,
                                            const at::Tensor& k, const at::Tensor& v,
                                            const at::Tensor& out, const at::Tensor& lse,
                                            const at::Tensor& dout) {
  at::Tensor dq = torch::empty_like(q);
  at::Tensor dk = torch::empty_like(k);
  at::Tensor dv = torch::empty_like(k);
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, q.scalar_type(), "AttentionBackward", [&] {
    using A = Arithmetic<scalar_t>;
    CausalAttentionBackward<scalar_t>(
        shape, static_cast<A>(AttentionScale(q)), q.data_ptr<scalar_t>(), k.data_ptr<scalar_t>(),
        v.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), lse.data_ptr<A>(),
        dout.data_ptr<scalar_t>(), dq.data_ptr<scalar_t>(), dk.data_ptr<scalar_t>(),
        dv.data_ptr<scalar_t>());
  });
  return {dq, dk, dv};
}

struct CausalAttentionFunction : public torch::autograd::Function<CausalAttentionFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& query, const at::Tensor& key,
                            const at::Tensor& value,
                            const c10::optional<at::Tensor>& packed_positions) {
    RECORD_FUNCTION("plait::CausalAttention", {});
    const at::Tensor q = query.contiguous();
    const at::Tensor k = key.contiguous();
    const at::Tensor v = value.contiguous();
    at::Tensor positions;
    if (packed_positions.has_value()) {
      TORCH_CHECK(packed_positions->dim() == 2 && packed_positions->size(0) == q.size(0) &&
                      packed_positions->size(1) == q.size(1),
                  "CausalAttention: positions ", packed_positions->sizes(),
                  " are not [batch, seq] of q ", q.sizes());
      positions = packed_positions->to(at::kCPU, at::kLong).contiguous();
    }
    auto [out, lse] = AttentionForward(ShapeOf(q, k, positions), q, k, v);
    ctx->save_for_backward({q, k, v, out, lse, positions});
    return out;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const tensor_list saved = ctx->get_saved_variables();
    auto [dq, dk, dv] = AttentionBackward(ShapeOf(saved[0], saved[1], saved[5]), saved[0], saved[1],
                                          saved[2], saved[3], saved[4], grads[0].contiguous());
    return {dq, dk, dv, at::Tensor()};
  }
};

// A ring block's shape (no positions), after checking its tensors.
AttentionShape BlockShapeOf(const at::Tensor& q, const at::Tensor& k, bool causal) {
  for (const at::Tensor* tensor : {&q, &k}) {
    TORCH_CHECK(
        tensor->is_contiguous() && FusedFormsServe(tensor->scalar_type(), tensor->device().type()),
        "FusedAttentionBlock: a ", tensor->scalar_type(), " tensor on ", tensor->device(),
        " is not a contiguous tensor the fused kernels serve");
  }
  AttentionShape shape = ShapeOf(q, k, at::Tensor());
  shape.causal = causal;
  return shape;
}

}  // namespace

at::ScalarType ArithmeticDtype(at::ScalarType dtype) {
  return dtype == at::kBFloat16 ? at::kFloat : dtype;
}

bool FusedFormsServe(at::ScalarType dtype, at::DeviceType device_type) {
  return device_type == at::kCPU &&
         (dtype == at::kFloat || dtype == at::kDouble || dtype == at::kBFloat16);
}

at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps, bool generic) {
  return !generic && Fusable({x, weight}) ? FusedRmsNorm(x, weight, eps)
                                          : CompositeRmsNorm(x, weight, eps);
}

at::Tensor FusedRmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  return RmsNormFunction::apply(x, weight, eps);
}

at::Tensor CompositeRmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  // Normalised in the fused kernels' arithmetic (float for bf16), as Hugging Face's models do:
  // a bf16 rstd alone would be off by up to 2^-9.
  const at::Tensor wide = x.to(ArithmeticDtype(x.scalar_type()));
  const at::Tensor rstd = at::rsqrt(wide.pow(2).mean(-1, /*keepdim=*/true).add_(eps));
  return (wide * rstd).to(x.scalar_type()) * weight;
}

at::Tensor SwiGlu(const at::Tensor& gate, const at::Tensor& up, bool generic) {
  return !generic && Fusable({gate, up}) ? FusedSwiGlu(gate, up) : CompositeSwiGlu(gate, up);
}

at::Tensor FusedSwiGlu(const at::Tensor& gate, const at::Tensor& up) {
  return SwiGluFunction::apply(gate, up);
}

at::Tensor CompositeSwiGlu(const at::Tensor& gate, const at::Tensor& up) {
  return torch::nn::functional::silu(gate) * up;
}

at::Tensor Rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool generic) {
  return !generic && Fusable({x, cos, sin}) ? FusedRotary(x, cos, sin) : ApplyRotary(x, cos, sin);
}

at::Tensor FusedRotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  return RotaryFunction::apply(x, cos, sin);
}

at::Tensor CrossEntropy(const at::Tensor& logits, const at::Tensor& targets, int64_t ignore_index,
                        bool generic) {
  const bool fusable = !generic &&
                       FusedCrossEntropyServes(logits.scalar_type(), logits.device().type()) &&
                       logits.layout() == at::kStrided && targets.device().is_cpu() &&
                       targets.scalar_type() == at::kLong;
  if (fusable) return FusedCrossEntropy(logits, targets, ignore_index);
  return TokenCrossEntropy(logits, targets, ignore_index).sum() / (targets != ignore_index).sum();
}

bool FusedCrossEntropyServes(at::ScalarType dtype, at::DeviceType device_type) {
  return device_type == at::kCPU && (dtype == at::kFloat || dtype == at::kDouble);
}

at::Tensor FusedCrossEntropy(const at::Tensor& logits, const at::Tensor& targets,
                             int64_t ignore_index) {
  return CrossEntropyFunction::apply(logits, targets, ignore_index);
}

at::Tensor CompositeCrossEntropy(const at::Tensor& logits, const at::Tensor& targets,
                                 int64_t ignore_index) {
  return torch::nn::functional::cross_entropy(
      logits, targets, torch::nn::functional::CrossEntropyFuncOptions().ignore_index(ignore_index));
}

at::Tensor TokenCrossEntropy(const at::Tensor& logits, const at::Tensor& targets,
                             int64_t ignore_index) {
  return TokenCrossEntropy(logits, targets, ignore_index,
                           CrossEntropyChunkRows(logits.size(-1), logits.scalar_type()));
}

at::Tensor TokenCrossEntropy(const at::Tensor& logits, const at::Tensor& targets,
                             int64_t ignore_index, int64_t chunk_rows) {
  return TokenCrossEntropyFunction::apply(logits, targets, ignore_index, chunk_rows);
}

at::Tensor CausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& mask, bool generic, const at::Tensor& positions) {
  if (!generic && Fusable({q, k, v})) return FusedCausalAttention(q, k, v, positions);
  if (base::kHasCausalSdpa) {
    // LibTorch's CUDA kernel for grouped kv heads (flash attention) is 16-bit only, and its
    // fp32 kernel (memory-efficient attention) takes as many kv heads as query heads: given
    // fewer, fp32 falls back to the math form, which keeps every head's [T, T] probabilities.
    // Repeating the kv heads keeps fp32 on the fused kernel.
    const int64_t groups = q.size(2) / k.size(2);
    // [B, 1, T, T]: one mask for every head.
    const at::Tensor allowed =
        positions.defined() ? PackedAttentionMask(positions).unsqueeze(1) : at::Tensor();
    std::optional<at::Tensor> out =
        groups > 1 && c10::elementSize(q.scalar_type()) > 2
            ? base::CausalSdpa(q, RepeatHeads(k, groups), RepeatHeads(v, groups), allowed)
            : base::CausalSdpa(q, k, v, allowed);
    return *std::move(out);
  }
  return CompositeCausalAttention(q, k, v, mask, positions);
}

bool CausalAttentionReadsMask(at::ScalarType dtype, at::DeviceType device_type, bool generic) {
  return !base::kHasCausalSdpa && (generic || !FusedFormsServe(dtype, device_type));
}

at::Tensor FusedCausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const at::Tensor& positions) {
  // An optional, not an undefined tensor: autograd's apply takes every tensor argument as an
  // input with a device.
  return CausalAttentionFunction::apply(
      q, k, v, positions.defined() ? c10::optional<at::Tensor>(positions) : c10::nullopt);
}

double FusedAttentionScratchBytes(int64_t keys) {
  return 2.0 * static_cast<double>(kAttentionBlock * keys) * sizeof(float);
}

AttentionBlock FusedAttentionBlock(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   bool causal) {
  auto [out, lse] = AttentionForward(BlockShapeOf(q, k, causal), q, k, v.contiguous());
  return {out, lse};
}

std::array<at::Tensor, 3> FusedAttentionBlockBackward(const at::Tensor& q, const at::Tensor& k,
                                                      const at::Tensor& v, const at::Tensor& out,
                                                      const at::Tensor& lse, const at::Tensor& dout,
                                                      bool causal) {
  return AttentionBackward(BlockShapeOf(q, k, causal), q, k, v.contiguous(), out.contiguous(),
                           lse.contiguous(), dout.contiguous());
}

namespace {

// Attention (scale 1 / sqrt(d)) of q [B, T, H, d] over k, v [B, KV, L, d] under the additive
// `mask`, broadcast to [B * KV, H / KV * T, L] (row g * T + t: query head g of a kv head's
// group at position t). The query heads of one kv head are stacked along the rows, so each kv
// head meets all its query heads in one matmul without copying k and v per head.
at::Tensor GroupedAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& mask) {
  const int64_t batch = q.size(0);
  const int64_t seq = q.size(1);
  const int64_t heads = q.size(2);
  const int64_t kv_heads = k.size(1);
  const int64_t keys = k.size(2);
  const int64_t groups = heads / kv_heads;
  const int64_t d = q.size(3);
  const at::Tensor q3 = q.reshape({batch, seq, kv_heads, groups, d})
                            .permute({0, 2, 3, 1, 4})
                            .reshape({batch * kv_heads, groups * seq, d});
  // Views where each head's keys are rows of one matrix (a KvCache's), else copies.
  const at::Tensor k3 = k.reshape({batch * kv_heads, keys, d});
  const at::Tensor v3 = v.reshape({batch * kv_heads, keys, d});
  // scale * q k^T + mask in one call: the mask is copied into the output, then the product
  // accumulated onto it.
  const at::Tensor scores =
      at::baddbmm(mask, q3, k3.transpose(1, 2), /*beta=*/1.0, /*alpha=*/AttentionScale(q));
  const at::Tensor probs = at::softmax(scores, /*dim=*/-1);
  return at::bmm(probs, v3)
      .view({batch, kv_heads, groups, seq, d})
      .permute({0, 3, 1, 2, 4})
      .reshape({batch, seq, heads, d});
}

// A mask of each row, [B, T, L], as GroupedAttention takes it for `kv_heads` kv heads of
// `groups` query heads each: [B * kv_heads, groups * T, L].
at::Tensor GroupedMask(const at::Tensor& mask, int64_t kv_heads, int64_t groups) {
  const int64_t batch = mask.size(0);
  const int64_t seq = mask.size(1);
  const int64_t keys = mask.size(2);
  return mask.repeat({1, groups, 1})
      .unsqueeze(1)
      .expand({batch, kv_heads, groups * seq, keys})
      .reshape({batch * kv_heads, groups * seq, keys});
}

}  // namespace

at::Tensor CompositeCausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const at::Tensor& mask, const at::Tensor& positions) {
  TORCH_CHECK(mask.defined() || positions.defined(),
              "CompositeCausalAttention: no mask (CausalAttentionReadsMask)");
  const at::Tensor k_heads = k.transpose(1, 2);
  const at::Tensor v_heads = v.transpose(1, 2);
  if (!positions.defined()) return GroupedAttention(q, k_heads, v_heads, mask);
  // Packed rows have a mask of their own.
  const int64_t seq = q.size(1);
  const at::Tensor packed = torch::zeros({q.size(0), seq, seq}, q.options())
                                .masked_fill_(PackedAttentionMask(positions).logical_not(),
                                              -std::numeric_limits<double>::infinity());
  return GroupedAttention(q, k_heads, v_heads,
                          GroupedMask(packed, k.size(2), q.size(2) / k.size(2)));
}

at::Tensor CachedAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& mask) {
  const at::ScalarType wide = ArithmeticDtype(q.scalar_type());
  return GroupedAttention(q.to(wide), k.to(wide), v.to(wide),
                          GroupedMask(mask.to(wide), k.size(1), q.size(2) / k.size(1)))
      .to(q.scalar_type());
}

at::Tensor PackedAttentionMask(const at::Tensor& positions) {
  const int64_t seq = positions.size(1);
  const at::Tensor t = torch::arange(seq, positions.options().dtype(at::kLong));
  // [B, T, 1] against keys [1, 1, T].
  const at::Tensor start = at::minimum(t - positions.to(at::kLong), t).unsqueeze(2);
  const at::Tensor s = t.view({1, 1, seq});
  return (s <= t.view({1, seq, 1})) & (s >= start);
}

}  // namespace plait::models::internal
