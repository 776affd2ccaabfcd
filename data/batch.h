// One micro-batch of token rows, what every data source hands the objective: a model reads
// `inputs` and is scored on `targets`, the token that follows each input, where a target is
// not kIgnoreTarget. Language-model batches score every position; preference batches
// (pairs.h) hold B chosen rows and then the B rejected rows of the same prompts, and, like SFT
// batches, score only completion tokens. Packed rows (data.proto's PackingStrategy and
// TokenFiles.document_start_token) hold several sequences each, told apart by `positions`.
#ifndef PLAIT_DATA_BATCH_H_
#define PLAIT_DATA_BATCH_H_

#include <cstdint>

#include "ATen/core/Tensor.h"
#include "torch/csrc/autograd/generated/variable_factories.h"

namespace plait::data {

// The target of a position that is not scored (a prompt or padding token): PyTorch's and
// Hugging Face's ignore index.
inline constexpr int64_t kIgnoreTarget = -100;

struct Batch {
  at::Tensor inputs;   // int64 [rows, T]
  at::Tensor targets;  // int64 [rows, T]: inputs shifted by one token, or kIgnoreTarget
  // Packed rows only, else undefined: int64 [rows, T], each token's position in its own
  // sequence, 0 at the sequence's first token (Hugging Face's position_ids). A token attends
  // only to the tokens of its sequence (models::CausalLM::Forward).
  at::Tensor positions;
};

// How many sequences `batch` holds: its rows, or, for packed rows, the tokens at position 0. On
// the host for a batch in host memory (a packed batch elsewhere is read back to count).
inline int64_t Sequences(const Batch& batch) {
  if (!batch.positions.defined()) return batch.inputs.size(0);
  return (batch.positions == 0).sum().item<int64_t>();
}

// Per sequence of `batch`, the sum of `per_token` ([rows, T], on the batch's device) over the
// sequence's tokens: [Sequences(batch)], the sequences in row order, each row's in their order
// (a row's trailing padding counts with its last sequence). Differentiable.
inline at::Tensor SequenceSums(const Batch& batch, const at::Tensor& per_token) {
  if (!batch.positions.defined()) return per_token.sum(-1);
  const at::Tensor sequence = (batch.positions == 0).flatten().cumsum(0) - 1;
  return torch::zeros({Sequences(batch)}, per_token.options())
      .index_add(0, sequence, per_token.flatten());
}

// `tensor`, in host memory, on `device` (itself for the CPU). To a GPU it goes from pinned
// memory without blocking the host, so the copy queues behind the work already queued instead
// of waiting for it; LibTorch's pinned allocator keeps the pinned copy until the transfer has
// run, so `tensor` and the copy may be dropped at once.
inline at::Tensor ToDevice(const at::Tensor& tensor, const at::Device& device) {
  if (device.is_cpu()) return tensor;
  return tensor.pin_memory().to(device, /*non_blocking=*/true);
}

// The tensors of `batch`, in host memory, on `device` (ToDevice).
inline Batch ToDevice(const Batch& batch, const at::Device& device) {
  return Batch{ToDevice(batch.inputs, device), ToDevice(batch.targets, device),
               batch.positions.defined() ? ToDevice(batch.positions, device) : at::Tensor()};
}

}  // namespace plait::data

#endif  // PLAIT_DATA_BATCH_H_
