// One micro-batch of token rows, what every data source hands the objective: a model reads
// `inputs` and is scored on `targets`, the token that follows each input, where a target is
// not kIgnoreTarget. Language-model batches score every position; preference batches
// (pairs.h) hold B chosen rows and then the B rejected rows of the same prompts, and, like SFT
// batches, score only completion tokens.
#ifndef PLAIT_DATA_BATCH_H_
#define PLAIT_DATA_BATCH_H_

#include <cstdint>

#include "torch/torch.h"

namespace plait::data {

// The target of a position that is not scored (a prompt or padding token): PyTorch's and
// Hugging Face's ignore index.
inline constexpr int64_t kIgnoreTarget = -100;

struct Batch {
  torch::Tensor inputs;   // int64 [rows, T]
  torch::Tensor targets;  // int64 [rows, T]: inputs shifted by one token, or kIgnoreTarget
};

}  // namespace plait::data

#endif  // PLAIT_DATA_BATCH_H_
