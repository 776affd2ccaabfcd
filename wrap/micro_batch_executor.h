// How the forward and backward passes of one optimizer step's micro-batches (its gradient
// accumulation) run on a prepared model: one after another on the whole model, or, under a
// pipeline, in the order of its schedule, each rank computing its stage and the hidden states
// and their gradients passing between the ranks. The caller says what a micro-batch's forward
// is; the executor decides when it runs, from what input, and what its backward starts from.
// Preparation::TrainMicroBatches runs the executor of the strategy that has one (strategy.h),
// else SequentialExecutor:
//
//   PLAIT_RETURN_IF_ERROR(preparation->TrainMicroBatches(
//       micro_batches, [&](int micro, const at::Tensor& input) -> absl::StatusOr<at::Tensor>
//       {
//         if (input.defined()) model.SetStageInput(input);  // a later pipeline stage
//         if (!model.HoldsOutputLayers()) return model.StageOutput(tokens[micro]);
//         return model.Loss(tokens[micro], targets[micro]) / micro_batches;
//       }));
#ifndef PLAIT_WRAP_MICRO_BATCH_EXECUTOR_H_
#define PLAIT_WRAP_MICRO_BATCH_EXECUTOR_H_

#include <functional>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace plait::wrap {

// Micro-batch `micro`'s forward on this rank's model. `input` is undefined where the model
// holds its input layers (it embeds the micro-batch's tokens), else the hidden state the stage
// before produced (a leaf requiring a gradient while training). Returns, where the model holds
// its output layers, the loss its backward starts from (scaled for the step; ignored in an
// evaluation), else the stage's output hidden state.
using MicroBatchForward =
    std::function<absl::StatusOr<at::Tensor>(int micro, const at::Tensor& input)>;

class MicroBatchExecutor {
 public:
  virtual ~MicroBatchExecutor() = default;

  // Runs the forward and backward of micro-batches 0 .. num_micro - 1, calling
  // `sync_gradients(true)` before the rank's last backward and `sync_gradients(false)` before
  // the others (DDP and FSDP reduce the step's gradients once). An error names the micro-batch,
  // and, for a transfer between ranks, the peer.
  virtual absl::Status Train(int num_micro, const MicroBatchForward& forward,
                             const std::function<void(bool)>& sync_gradients) = 0;

  // Runs the forwards only (an evaluation, under no-grad).
  virtual absl::Status Evaluate(int num_micro, const MicroBatchForward& forward) = 0;

  // The seconds the last Train or Evaluate spent waiting for other ranks' tensors (a
  // pipeline's receives: its bubble and its transfers); 0 for an executor that never waits.
  virtual double last_wait_seconds() const { return 0.0; }
};

// The micro-batches one after another on a model that holds its input and output layers:
// each forward from no input, then the backward of its loss.
class SequentialExecutor final : public MicroBatchExecutor {
 public:
  absl::Status Train(int num_micro, const MicroBatchForward& forward,
                     const std::function<void(bool)>& sync_gradients) override {
    for (int micro = 0; micro < num_micro; ++micro) {
      sync_gradients(micro + 1 == num_micro);
      absl::StatusOr<at::Tensor> loss = forward(micro, at::Tensor());
      if (!loss.ok()) return loss.status();
      loss->backward();
    }
    return absl::OkStatus();
  }

  absl::Status Evaluate(int num_micro, const MicroBatchForward& forward) override {
    for (int micro = 0; micro < num_micro; ++micro) {
      if (absl::StatusOr<at::Tensor> loss = forward(micro, at::Tensor()); !loss.ok()) {
        return loss.status();
      }
    }
    return absl::OkStatus();
  }
};

}  // namespace plait::wrap

#endif  // PLAIT_WRAP_MICRO_BATCH_EXECUTOR_H_
