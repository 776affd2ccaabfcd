// Context parallelism as a preparation strategy ("context_parallel" in plans and rules): the
// ranks of a mesh dimension read the same sequences, and each computes and scores its slice of
// every sequence (ChunkLayout's two chunks of 2n) through the model's seams (RingContext),
// attending over the whole sequence by ring attention (ring_attention.h). The parameters are
// whole on every rank; after each step's backward the gradients, each rank's of its own
// tokens, are averaged over the dimension, as the step's items are counted over it
// (objectives/step_items.h), so the step is one process's.
//
//   prepare { context_parallel { mesh_dim: "cp" } }   // FSDP, DDP or TP on other dimensions
#ifndef PLAIT_WRAP_CP_CONTEXT_PARALLEL_H_
#define PLAIT_WRAP_CP_CONTEXT_PARALLEL_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "parallel/graph_group.h"
#include "wrap/cp/ring_attention.h"
#include "wrap/strategy.h"
#include "wrap/wrap.pb.h"
#include "wrap/wrappable.h"

namespace plait::wrap::cp {

class ContextParallelStrategy final : public Strategy,
                                      public DataSplit,
                                      public ParameterLayout,
                                      public Gradients {
 public:
  explicit ContextParallelStrategy(ContextParallelConfig config) : config_(std::move(config)) {}
  ~ContextParallelStrategy() override;

  absl::string_view name() const override { return "context_parallel"; }
  const std::string& mesh_dim() const override { return config_.mesh_dim(); }
  bool splits_batch() const override { return false; }
  bool splits_sequence() const override { return true; }
  // The sequence length must divide into 2n chunks (`<field>.context_parallel`, naming
  // training.seq_len).
  std::vector<base::Violation> Check(const std::optional<ModelShape>& shape,
                                     const parallel::MeshConfig& mesh,
                                     const std::string& field) const override;
  // Each rank's share of the activations, and the ring's bytes per block.
  StepEstimate Estimate(const ModelShape& shape, const parallel::MeshConfig& mesh) const override;
  ActivationSplit SplitsActivations(const parallel::MeshConfig& mesh) const override;
  absl::Status Apply(Wrappable& model, const parallel::DeviceMesh& mesh) override;
  // Its parts are replicated over the dimension: numbered for checkpoints, one writes.
  void UpdateParameters(std::vector<parallel::TrainableParameter>& parameters) override;
  at::Tensor OwnSlice(const at::Tensor& x) const override;
  // The average over the dimension of each gradient, one all-reduce each.
  absl::Status FinishGradients(const std::vector<parallel::TrainableParameter>& trainable) override;
  absl::Status BackwardStatus() const override;

 private:
  ContextParallelConfig config_;
  Wrappable* model_ = nullptr;
  std::unique_ptr<parallel::GraphGroup> group_;
  std::unique_ptr<RingContext> ring_;
};

}  // namespace plait::wrap::cp

#endif  // PLAIT_WRAP_CP_CONTEXT_PARALLEL_H_
