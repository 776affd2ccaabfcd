// One micro-batch of token rows, what every data source hands the objective: a model reads
// `inputs` and is scored on `targets`, the token that follows each input, where a target is
// not kIgnoreTarget. Language-model batches score every position; preference batches
// (pairs.h) hold B chosen rows and then the B rejected rows of the same prompts, and, like SFT
// batches, score only completion tokens. Packed rows (data.proto's PACKING_BFD and
// document_start_token) hold several sequences each, told apart by `positions`.
#ifndef PLAIT_DATA_BATCH_H_
#define PLAIT_DATA_BATCH_H_

#include <cstdint>

#include "torch/types.h"

namespace plait::data {

// The target of a position that is not scored (a prompt or padding token): PyTorch's and
// Hugging Face's ignore index.
inline constexpr int64_t kIgnoreTarget = -100;

struct Batch {
  torch::Tensor inputs;   // int64 [rows, T]
  torch::Tensor targets;  // int64 [rows, T]: inputs shifted by one token, or kIgnoreTarget
  // Packed rows only, else undefined: int64 [rows, T], each token's position in its own
  // sequence, 0 at the sequence's first token (Hugging Face's position_ids). A token attends
  // only to the tokens of its sequence (models::CausalLM::Forward).
  torch::Tensor positions;
};

// `tensor`, in host memory, on `device` (itself for the CPU). To a GPU it goes from pinned
// memory without blocking the host, so the copy queues behind the work already queued instead
// of waiting for it; LibTorch's pinned allocator keeps the pinned copy until the transfer has
// run, so `tensor` and the copy may be dropped at once.
inline torch::Tensor ToDevice(const torch::Tensor& tensor, const torch::Device& device) {
  if (device.is_cpu()) return tensor;
  return tensor.pin_memory().to(device, /*non_blocking=*/true);
}

// The tensors of `batch`, in host memory, on `device` (ToDevice).
inline Batch ToDevice(const Batch& batch, const torch::Device& device) {
  return Batch{ToDevice(batch.inputs, device), ToDevice(batch.targets, device),
               batch.positions.defined() ? ToDevice(batch.positions, device) : torch::Tensor()};
}

}  // namespace plait::data

#endif  // PLAIT_DATA_BATCH_H_
