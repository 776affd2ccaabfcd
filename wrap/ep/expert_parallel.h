// Expert parallelism as a preparation strategy ("expert_parallel" in plans and rules): the
// ranks of a mesh dimension read different batches and each keeps num_experts / n of every
// mixture-of-experts layer's experts (rank r the r-th share); the rows a rank routes to another
// rank's experts travel there and back through the model's experts seam (ExpertDispatch,
// expert_dispatch.h). The other parameters are whole on every rank. After each step's
// backward, their gradients (each rank's of its own batch) are averaged over the dimension, and
// the experts' gradients (each already summed over every rank's rows) divided by its size: the
// step is one process's on the whole batch, as the step's items are counted over the dimension
// (objectives/step_items.h). A later FSDP step may take the other parameters over
// (fsdp.shard_dense_over_mesh_dim, HandOverReplicated): it shards them over its dimension and
// this one, and its reduce-scatters average their gradients, which this step then leaves.
//
//   prepare { expert_parallel { mesh_dim: "ep" } }   // then FSDP or DDP on another dimension
//   prepare { fsdp { mesh_dim: "dp" shard_dense_over_mesh_dim: "ep" } }  // torchtitan's layout
#ifndef PLAIT_WRAP_EP_EXPERT_PARALLEL_H_
#define PLAIT_WRAP_EP_EXPERT_PARALLEL_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "parallel/graph_group.h"
#include "wrap/ep/expert_dispatch.h"
#include "wrap/strategy.h"
#include "wrap/wrap.pb.h"

namespace plait::wrap::ep {

class ExpertParallelStrategy final : public Strategy,
                                     public DataSplit,
                                     public ParameterLayout,
                                     public Gradients {
 public:
  explicit ExpertParallelStrategy(ExpertParallelConfig config) : config_(std::move(config)) {}
  ~ExpertParallelStrategy() override;

  absl::string_view name() const override { return "expert_parallel"; }
  const std::string& mesh_dim() const override { return config_.mesh_dim(); }
  bool splits_batch() const override { return true; }
  // The model must be a mixture of experts whose experts divide by the dimension's ranks
  // (`<field>.expert_parallel.mesh_dim`).
  std::vector<base::Violation> Check(const std::optional<ModelShape>& shape,
                                     const parallel::MeshConfig& mesh,
                                     const std::string& field) const override;
  // The share of the parameters a rank keeps, the all-to-alls' bytes (routing spread evenly
  // over the experts) and the gradients' average.
  StepEstimate Estimate(const ModelShape& shape, const parallel::MeshConfig& mesh) const override;
  absl::Status Apply(Wrappable& model, const parallel::DeviceMesh& mesh) override;
  void HandOverReplicated() override { others_handed_over_ = true; }
  // The experts' parameters (their adapters' too).
  bool SplitsParameter(const std::string& name) const override { return IsExpertParameter(name); }
  // The experts are split over the dimension; the other parts are replicated over it,
  // numbered for checkpoints (one writes), unless handed over.
  void UpdateParameters(std::vector<parallel::TrainableParameter>& parameters) override;
  absl::Status FinishGradients(const std::vector<parallel::TrainableParameter>& trainable) override;
  absl::Status BackwardStatus() const override;
  // Every expert, broadcast by the rank that keeps it.
  absl::Status GatherFullParameters(std::map<std::string, at::Tensor>& parameters) override;

 private:
  struct Expert {
    std::string name;  // of one of its parameters
    std::vector<int64_t> shape;
    int64_t index;  // of the expert in its layer
  };

  // The rank of the dimension that keeps `expert`.
  int HolderOf(const Expert& expert) const {
    return static_cast<int>(expert.index / experts_per_rank_);
  }

  ExpertParallelConfig config_;
  Wrappable* model_ = nullptr;  // once applied
  std::unique_ptr<parallel::GraphGroup> group_;
  std::unique_ptr<ExpertDispatch> dispatch_;
  std::vector<Expert> experts_;  // every expert's parameters, in the model's order
  int64_t experts_per_rank_ = 1;
  // Whether a later step shards the parameters that are not experts over this dimension.
  bool others_handed_over_ = false;
};

}  // namespace plait::wrap::ep

#endif  // PLAIT_WRAP_EP_EXPERT_PARALLEL_H_
