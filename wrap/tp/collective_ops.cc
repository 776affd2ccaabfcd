#include "wrap/tp/collective_ops.h"

#include <cstdint>

namespace plait::wrap::tp {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// An autograd function's group travels in its context as an integer.
void SaveGroup(AutogradContext* ctx, TpGroup* group) {
  ctx->saved_data["group"] = reinterpret_cast<int64_t>(group);
}
TpGroup& SavedGroup(AutogradContext* ctx) {
  return *reinterpret_cast<TpGroup*>(ctx->saved_data["group"].toInt());
}

torch::Tensor AllReduced(const torch::Tensor& x, TpGroup& group) {
  torch::Tensor sum = x.contiguous().clone();
  group.Wait(group.communicator().AllReduce(sum, parallel::ReduceOp::kSum));
  return sum;
}

// The collectives split flat buffers into contiguous chunks: the sequence (dim 1 of
// [B, T, ...]) goes first for them.
torch::Tensor SequenceFirst(const torch::Tensor& x) { return x.transpose(0, 1).contiguous(); }

torch::Tensor AllGatheredSequence(const torch::Tensor& x, TpGroup& group) {
  const torch::Tensor input = SequenceFirst(x);
  std::vector<int64_t> sizes = input.sizes().vec();
  sizes[0] *= group.size();
  torch::Tensor output = torch::empty(sizes, input.options());
  group.Wait(group.communicator().AllGather(input, output));
  return output.transpose(0, 1);
}

torch::Tensor ReduceScatteredSequence(const torch::Tensor& x, TpGroup& group) {
  const torch::Tensor input = SequenceFirst(x);
  std::vector<int64_t> sizes = input.sizes().vec();
  sizes[0] /= group.size();
  torch::Tensor output = torch::empty(sizes, input.options());
  group.Wait(group.communicator().ReduceScatter(input, output, parallel::ReduceOp::kSum));
  return output.transpose(0, 1);
}

struct CopyToRegionFunction : torch::autograd::Function<CopyToRegionFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, TpGroup* group) {
    SaveGroup(ctx, group);
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {AllReduced(grads[0], SavedGroup(ctx)), torch::Tensor()};
  }
};

struct ReduceFromRegionFunction : torch::autograd::Function<ReduceFromRegionFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, TpGroup* group) {
    return AllReduced(x, *group);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {grads[0], torch::Tensor()};
  }
};

struct GatherSequenceFunction : torch::autograd::Function<GatherSequenceFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, TpGroup* group) {
    SaveGroup(ctx, group);
    return AllGatheredSequence(x, *group);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {ReduceScatteredSequence(grads[0], SavedGroup(ctx)), torch::Tensor()};
  }
};

struct ReduceScatterSequenceFunction : torch::autograd::Function<ReduceScatterSequenceFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, TpGroup* group) {
    SaveGroup(ctx, group);
    return ReduceScatteredSequence(x, *group);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {AllGatheredSequence(grads[0], SavedGroup(ctx)), torch::Tensor()};
  }
};

struct VocabParallelCrossEntropyFunction
    : torch::autograd::Function<VocabParallelCrossEntropyFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& logits,
                               const torch::Tensor& targets, int64_t vocab_start,
                               int64_t ignore_index, TpGroup* group) {
    const int64_t columns = logits.size(1);
    torch::Tensor max = std::get<0>(logits.max(/*dim=*/1)).contiguous();
    group->Wait(group->communicator().AllReduce(max, parallel::ReduceOp::kMax));
    torch::Tensor exp = (logits - max.unsqueeze(1)).exp_();
    const torch::Tensor local = targets - vocab_start;
    const torch::Tensor mine = (local >= 0) & (local < columns);
    const torch::Tensor column = torch::where(mine, local, torch::zeros_like(local));
    // Of the shifted logits: this rank's sum of exponentials and its target's value, if any
    // (selected, not multiplied by `mine`: a padding column's -inf times 0 would be NaN).
    const torch::Tensor picked = torch::where(
        mine, logits.gather(1, column.unsqueeze(1)).squeeze(1) - max, torch::zeros_like(max));
    torch::Tensor sums = torch::stack({exp.sum(1), picked});
    group->Wait(group->communicator().AllReduce(sums, parallel::ReduceOp::kSum));
    const torch::Tensor kept = (targets != ignore_index).to(logits.scalar_type());
    const torch::Tensor loss = (sums[0].log() - sums[1]) * kept;
    exp.div_(sums[0].unsqueeze(1));  // the softmax, this rank's columns
    ctx->save_for_backward({exp, column, mine, kept});
    return loss;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor& softmax = saved[0];
    const torch::Tensor& column = saved[1];
    const torch::Tensor& mine = saved[2];
    const torch::Tensor& kept = saved[3];
    torch::Tensor grad = softmax.clone();
    grad.scatter_add_(1, column.unsqueeze(1), -mine.to(grad.scalar_type()).unsqueeze(1));
    grad.mul_((grads[0] * kept).unsqueeze(1));
    return {grad, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

void TpGroup::Wait(const std::shared_ptr<parallel::Work>& work) {
  absl::Status status = work->Wait();
  if (status.ok()) return;
  absl::MutexLock lock(&mutex_);
  if (status_.ok()) status_ = std::move(status);
}

absl::Status TpGroup::status() const {
  absl::MutexLock lock(&mutex_);
  return status_;
}

torch::Tensor CopyToRegion(const torch::Tensor& x, TpGroup& group) {
  return CopyToRegionFunction::apply(x, &group);
}

torch::Tensor ReduceFromRegion(const torch::Tensor& x, TpGroup& group) {
  return ReduceFromRegionFunction::apply(x, &group);
}

torch::Tensor GatherSequence(const torch::Tensor& x, TpGroup& group) {
  return GatherSequenceFunction::apply(x, &group);
}

torch::Tensor ReduceScatterSequence(const torch::Tensor& x, TpGroup& group) {
  return ReduceScatterSequenceFunction::apply(x, &group);
}

torch::Tensor VocabParallelCrossEntropy(const torch::Tensor& logits, const torch::Tensor& targets,
                                        int64_t vocab_start, int64_t ignore_index, TpGroup& group) {
  return VocabParallelCrossEntropyFunction::apply(logits, targets, vocab_start, ignore_index,
                                                  &group);
}

}  // namespace plait::wrap::tp
