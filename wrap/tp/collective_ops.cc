#include "wrap/tp/collective_ops.h"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "ATen/core/Tensor.h"
#include "ATen/ops/amax.h"
#include "ATen/ops/logsumexp.h"
#include "ATen/ops/where.h"
#include "base/cross_entropy_chunks.h"
#include "torch/csrc/autograd/custom_function.h"
#include "torch/csrc/autograd/generated/variable_factories.h"

namespace plait::wrap::tp {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What the collectives here are for, as their errors say: "step 3, backward, all_reduce of
// tensor-parallel input gradient (f) on group 'tp' ...".
constexpr const char* kInputGradient = "tensor-parallel input gradient (f)";
constexpr const char* kOutputSum = "tensor-parallel output (g)";
constexpr const char* kSequence = "tensor-parallel sequence";
constexpr const char* kCrossEntropy = "vocabulary-parallel cross-entropy";

at::Tensor AllReduced(const at::Tensor& x, parallel::GraphGroup& group, parallel::Pass pass,
                      const char* purpose) {
  at::Tensor sum = x.contiguous().clone();
  const parallel::ScopedPlace place = group.Place(pass, purpose);
  group.Wait(group.communicator().AllReduce(sum, parallel::ReduceOp::kSum));
  return sum;
}

// The collectives split flat buffers into contiguous chunks: the sequence (dim 1 of
// [B, T, ...]) goes first for them.
at::Tensor SequenceFirst(const at::Tensor& x) { return x.transpose(0, 1).contiguous(); }

// Batch-first again, and contiguous: the column-parallel projections after it flatten it
// into rows, which of a transposed view each would copy (and keep for its backward).
at::Tensor AllGatheredSequence(const at::Tensor& x, parallel::GraphGroup& group,
                               parallel::Pass pass) {
  const at::Tensor input = SequenceFirst(x);
  std::vector<int64_t> sizes = input.sizes().vec();
  sizes[0] *= group.size();
  at::Tensor output = torch::empty(sizes, input.options());
  const parallel::ScopedPlace place = group.Place(pass, kSequence);
  group.Wait(group.communicator().AllGather(input, output));
  return output.transpose(0, 1).contiguous();
}

at::Tensor ReduceScatteredSequence(const at::Tensor& x, parallel::GraphGroup& group,
                                   parallel::Pass pass) {
  const at::Tensor input = SequenceFirst(x);
  std::vector<int64_t> sizes = input.sizes().vec();
  sizes[0] /= group.size();
  at::Tensor output = torch::empty(sizes, input.options());
  const parallel::ScopedPlace place = group.Place(pass, kSequence);
  group.Wait(group.communicator().ReduceScatter(input, output, parallel::ReduceOp::kSum));
  return output.transpose(0, 1);
}

struct CopyToRegionFunction : torch::autograd::Function<CopyToRegionFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x,
                            parallel::GraphGroup* group) {
    group->SaveIn(ctx);
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {AllReduced(grads[0], parallel::GraphGroup::SavedIn(ctx), parallel::Pass::kBackward,
                       kInputGradient),
            at::Tensor()};
  }
};

struct ReduceFromRegionFunction : torch::autograd::Function<ReduceFromRegionFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x,
                            parallel::GraphGroup* group) {
    return AllReduced(x, *group, parallel::Pass::kForward, kOutputSum);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {grads[0], at::Tensor()};
  }
};

struct GatherSequenceFunction : torch::autograd::Function<GatherSequenceFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x,
                            parallel::GraphGroup* group) {
    group->SaveIn(ctx);
    return AllGatheredSequence(x, *group, parallel::Pass::kForward);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {ReduceScatteredSequence(grads[0], parallel::GraphGroup::SavedIn(ctx),
                                    parallel::Pass::kBackward),
            at::Tensor()};
  }
};

struct ReduceScatterSequenceFunction : torch::autograd::Function<ReduceScatterSequenceFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x,
                            parallel::GraphGroup* group) {
    group->SaveIn(ctx);
    return ReduceScatteredSequence(x, *group, parallel::Pass::kForward);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {AllGatheredSequence(grads[0], parallel::GraphGroup::SavedIn(ctx),
                                parallel::Pass::kBackward),
            at::Tensor()};
  }
};

struct VocabParallelCrossEntropyFunction
    : torch::autograd::Function<VocabParallelCrossEntropyFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits,
                            const at::Tensor& targets, int64_t vocab_start, int64_t real,
                            int64_t ignore_index, parallel::GraphGroup* group, int64_t chunk_rows) {
    TORCH_CHECK(logits.dim() == 2 && targets.dim() == 1 && targets.size(0) == logits.size(0),
                "VocabParallelCrossEntropy: targets ", targets.sizes(), " do not match logits ",
                logits.sizes());
    TORCH_CHECK(real >= 0 && real <= logits.size(1), "VocabParallelCrossEntropy: real columns ",
                real, " outside [0, ", logits.size(1), "]");
    TORCH_CHECK(chunk_rows > 0, "VocabParallelCrossEntropy: chunk_rows ", chunk_rows,
                " must be > 0");
    const int64_t rows = logits.size(0);
    const at::ScalarType wide = base::CrossEntropyDtype(logits.scalar_type());
    const at::TensorOptions wide_options = logits.options().dtype(wide);
    const at::Tensor scored = logits.narrow(1, 0, real);
    // The row maxima are exact in the logits' dtype; a rank of padding only offers -inf.
    at::Tensor max =
        real == 0 ? torch::full({rows}, -std::numeric_limits<double>::infinity(), wide_options)
                  : at::amax(scored, {1}).to(wide);
    const parallel::ScopedPlace place = group->Place(parallel::Pass::kForward, kCrossEntropy);
    group->Wait(group->communicator().AllReduce(max, parallel::ReduceOp::kMax));
    // Shifted by 0 where the maximum is infinite, as at::logsumexp does.
    max.masked_fill_(max.isinf(), 0.0);
    const base::HeldTargets mine = base::HeldTargetsOf(targets, vocab_start, real);
    // Of the shifted logits: this rank's sums of exponentials and its targets' values, if any
    // (selected, not multiplied by `held`: an infinite logit times 0 would be NaN).
    at::Tensor sums = torch::zeros({2, rows}, wide_options);
    for (int64_t begin = 0; real > 0 && begin < rows; begin += chunk_rows) {
      const int64_t n = std::min(chunk_rows, rows - begin);
      const at::Tensor chunk = scored.narrow(0, begin, n);
      const at::Tensor chunk_max = max.narrow(0, begin, n);
      at::Tensor shifted = chunk.to(wide, /*non_blocking=*/false, /*copy=*/true);
      sums[0].narrow(0, begin, n).copy_(shifted.sub_(chunk_max.unsqueeze(1)).exp_().sum(1));
      const at::Tensor picked =
          chunk.gather(1, mine.column.narrow(0, begin, n).unsqueeze(1)).squeeze(1).to(wide);
      sums[1]
          .narrow(0, begin, n)
          .copy_(at::where(mine.held.narrow(0, begin, n), picked - chunk_max,
                           torch::zeros_like(chunk_max)));
    }
    group->Wait(group->communicator().AllReduce(sums, parallel::ReduceOp::kSum));
    const at::Tensor log_sum = sums[0].log();
    const at::Tensor lse = log_sum + max;
    const at::Tensor loss = (log_sum - sums[1]).masked_fill_(targets == ignore_index, 0.0);
    ctx->save_for_backward({logits, targets, lse});
    ctx->saved_data["vocab_start"] = vocab_start;
    ctx->saved_data["real"] = real;
    ctx->saved_data["ignore_index"] = ignore_index;
    ctx->saved_data["chunk_rows"] = chunk_rows;
    return loss;
  }

  // d loss[i] / d logits[i] = softmax(full logits[i]) - onehot(target[i]) on this rank's real
  // columns, times the incoming gradient of row i (0 for ignored rows); 0 on padding columns.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    return {base::ChunkedCrossEntropyBackward(
                saved[0], saved[1], saved[2], grads[0], ctx->saved_data["ignore_index"].toInt(),
                ctx->saved_data["vocab_start"].toInt(), ctx->saved_data["real"].toInt(),
                ctx->saved_data["chunk_rows"].toInt()),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor()};
  }
};

}  // namespace

at::Tensor CopyToRegion(const at::Tensor& x, parallel::GraphGroup& group) {
  return CopyToRegionFunction::apply(x, &group);
}

at::Tensor ReduceFromRegion(const at::Tensor& x, parallel::GraphGroup& group) {
  return ReduceFromRegionFunction::apply(x, &group);
}

at::Tensor GatherSequence(const at::Tensor& x, parallel::GraphGroup& group) {
  return GatherSequenceFunction::apply(x, &group);
}

at::Tensor ReduceScatterSequence(const at::Tensor& x, parallel::GraphGroup& group) {
  return ReduceScatterSequenceFunction::apply(x, &group);
}

at::Tensor VocabParallelCrossEntropy(const at::Tensor& logits, const at::Tensor& targets,
                                     int64_t vocab_start, int64_t real_columns,
                                     int64_t ignore_index, parallel::GraphGroup& group) {
  return VocabParallelCrossEntropy(
      logits, targets, vocab_start, real_columns, ignore_index, group,
      base::CrossEntropyChunkRows(real_columns, logits.scalar_type()));
}

at::Tensor VocabParallelCrossEntropy(const at::Tensor& logits, const at::Tensor& targets,
                                     int64_t vocab_start, int64_t real_columns,
                                     int64_t ignore_index, parallel::GraphGroup& group,
                                     int64_t chunk_rows) {
  return VocabParallelCrossEntropyFunction::apply(logits, targets, vocab_start, real_columns,
                                                  ignore_index, &group, chunk_rows);
}

}  // namespace plait::wrap::tp
