#include "objectives/reference_log_probs.h"

#include "ATen/core/Tensor.h"
#include "absl/strings/str_cat.h"
#include "base/hash.h"
#include "torch/csrc/autograd/generated/variable_factories.h"

namespace plait::objectives {
namespace {

// `batch` in host memory, where its rows are hashed (a no-op for a batch on the CPU).
data::Batch OnHost(const data::Batch& batch) {
  return {batch.inputs.cpu(), batch.targets.cpu(),
          batch.positions.defined() ? batch.positions.cpu() : at::Tensor()};
}

}  // namespace

at::Tensor SequenceLogProbs(models::CausalLM& model, const data::Batch& batch) {
  if (!batch.positions.defined()) {
    return model.SequenceLogProbs(batch.inputs, batch.targets, data::kIgnoreTarget);
  }
  return data::SequenceSums(batch, model.TokenLogProbs(batch.inputs, batch.targets,
                                                       data::kIgnoreTarget, batch.positions));
}

at::Tensor ReferenceLogProbs::Compute(models::CausalLM& reference, const data::Batch& batch) {
  at::NoGradGuard no_grad;
  return SequenceLogProbs(reference, batch);
}

std::vector<ReferenceLogProbs::Key> ReferenceLogProbs::SequenceKeys(const data::Batch& batch) {
  const at::Tensor inputs = batch.inputs.contiguous();
  const at::Tensor targets = batch.targets.contiguous();
  const at::Tensor positions =
      batch.positions.defined() ? batch.positions.contiguous() : at::Tensor();
  const int64_t T = inputs.size(1);
  const auto key = [&](int64_t row, int64_t start, int64_t end) -> Key {
    const size_t bytes = (end - start) * sizeof(int64_t);
    const uint64_t tokens = base::Fnv1a64Words(base::kFnv1a64OffsetBasis,
                                               inputs.data_ptr<int64_t>() + row * T + start, bytes);
    // The second hash starts from the first, mixed, so the two are not the same function.
    return {tokens, base::Fnv1a64Words(base::SplitMix64(tokens),
                                       targets.data_ptr<int64_t>() + row * T + start, bytes)};
  };
  std::vector<Key> keys;
  for (int64_t row = 0; row < inputs.size(0); ++row) {
    if (!positions.defined()) {
      keys.push_back(key(row, 0, T));
      continue;
    }
    // A packed row's sequences, each from its position 0 to the next (the last to the row's end).
    const int64_t* position = positions.data_ptr<int64_t>() + row * T;
    for (int64_t start = 0; start < T;) {
      int64_t end = start + 1;
      while (end < T && position[end] != 0) ++end;
      keys.push_back(key(row, start, end));
      start = end;
    }
  }
  return keys;
}

void ReferenceLogProbs::Add(models::CausalLM& reference, const data::Batch& batch) {
  const at::Tensor log_probs = Compute(reference, batch).to(at::kCPU, at::kFloat).contiguous();
  const float* values = log_probs.data_ptr<float>();
  const std::vector<Key> keys = SequenceKeys(OnHost(batch));
  for (size_t sequence = 0; sequence < keys.size(); ++sequence) {
    log_probs_.emplace(keys[sequence], values[sequence]);
  }
}

absl::StatusOr<at::Tensor> ReferenceLogProbs::Find(const data::Batch& batch) const {
  const std::vector<Key> keys = SequenceKeys(OnHost(batch));
  const int64_t sequences = static_cast<int64_t>(keys.size());
  at::Tensor found = torch::empty({sequences}, at::kFloat);
  float* values = found.data_ptr<float>();
  for (int64_t sequence = 0; sequence < sequences; ++sequence) {
    const auto it = log_probs_.find(keys[sequence]);
    if (it == log_probs_.end()) {
      return absl::NotFoundError(absl::StrCat(
          "sequence ", sequence, " of the batch has no precomputed reference log-probability (",
          rows(), " sequences were precomputed)"));
    }
    values[sequence] = it->second;
  }
  return found.to(batch.inputs.device());
}

}  // namespace plait::objectives
