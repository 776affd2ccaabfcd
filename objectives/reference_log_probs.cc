#include "objectives/reference_log_probs.h"

#include "absl/strings/str_cat.h"
#include "base/hash.h"
#include "torch/utils.h"

namespace plait::objectives {
namespace {

// `batch` in host memory, where its rows are hashed (a no-op for a batch on the CPU).
data::Batch OnHost(const data::Batch& batch) { return {batch.inputs.cpu(), batch.targets.cpu()}; }

}  // namespace

torch::Tensor ReferenceLogProbs::Compute(models::CausalLM& reference, const data::Batch& batch) {
  torch::NoGradGuard no_grad;
  return reference.SequenceLogProbs(batch.inputs, batch.targets, data::kIgnoreTarget);
}

ReferenceLogProbs::Key ReferenceLogProbs::RowKey(const data::Batch& batch, int64_t row) {
  const torch::Tensor inputs = batch.inputs[row].contiguous();
  const torch::Tensor targets = batch.targets[row].contiguous();
  const size_t bytes = inputs.numel() * sizeof(int64_t);
  const uint64_t tokens =
      base::Fnv1a64Words(base::kFnv1a64OffsetBasis, inputs.data_ptr<int64_t>(), bytes);
  // The second hash starts from the first, mixed, so the two are not the same function.
  return {tokens, base::Fnv1a64Words(base::SplitMix64(tokens), targets.data_ptr<int64_t>(), bytes)};
}

void ReferenceLogProbs::Add(models::CausalLM& reference, const data::Batch& batch) {
  const torch::Tensor log_probs =
      Compute(reference, batch).to(torch::kCPU, torch::kFloat32).contiguous();
  const float* values = log_probs.data_ptr<float>();
  const data::Batch host = OnHost(batch);
  for (int64_t row = 0; row < host.inputs.size(0); ++row) {
    log_probs_.emplace(RowKey(host, row), values[row]);
  }
}

absl::StatusOr<torch::Tensor> ReferenceLogProbs::Find(const data::Batch& batch) const {
  const data::Batch host = OnHost(batch);
  const int64_t rows = host.inputs.size(0);
  torch::Tensor found = torch::empty({rows}, torch::kFloat32);
  float* values = found.data_ptr<float>();
  for (int64_t row = 0; row < rows; ++row) {
    const auto it = log_probs_.find(RowKey(host, row));
    if (it == log_probs_.end()) {
      return absl::NotFoundError(
          absl::StrCat("row ", row, " of the batch has no precomputed reference log-probability (",
                       this->rows(), " rows were precomputed)"));
    }
    values[row] = it->second;
  }
  return found.to(batch.inputs.device());
}

}  // namespace plait::objectives
