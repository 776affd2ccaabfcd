// Pipeline parallelism as a preparation strategy ("pipeline" in plans and rules): the model's
// blocks cut into consecutive stages, stage s kept by rank s % p of the mesh dimension's p
// ranks (Wrappable::KeepStages: the first stage with the input layers, the last with the
// output layers; with stages_per_rank v > 1, rank r keeps stages r, r + p, ..., as Megatron's
// interleaved schedule places them), and each step's micro-batches run by the schedule's
// action lists (schedule.h): forwards and backwards of the rank's stages, hidden states sent
// to the next rank and their gradients back over the dimension's communicator (Send/Receive).
// Every rank of the dimension reads the same micro-batches; only the last stage's forward
// computes the loss.
//
//   prepare { pipeline { mesh_dim: "pp" schedule: "1F1B" } }   // first, before FSDP/DDP/TP
//   prepare { pipeline { mesh_dim: "pp" schedule: "INTERLEAVED_1F1B" stages_per_rank: 2 } }
//   PLAIT_RETURN_IF_ERROR(preparation->TrainMicroBatches(micro_batches, forward));
//
// A message between stages is a fixed header (the tensor's dtype and shape) then the tensor,
// so that a stage receives whatever its predecessor computes (a sequence-parallel slice, a
// packed row) without being told its shape; a gradient goes back in the shape of the output it
// belongs to, with no header.
//
// A tied embedding (the output projection is the embedding matrix) is held by the first and
// the last stage, which add each other's gradient of it after each step's backward, as
// Megatron does, so that both keep one value.
#ifndef PLAIT_WRAP_PP_PIPELINE_H_
#define PLAIT_WRAP_PP_PIPELINE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "wrap/micro_batch_executor.h"
#include "wrap/pp/schedule.h"
#include "wrap/strategy.h"
#include "wrap/wrap.pb.h"

namespace plait::wrap::pp {

// The blocks [begin, end) of each of `num_stages` stages of a model of `num_blocks` blocks,
// as `config` cuts it (its stage_starts, or equal stages); InvalidArgument naming `field`'s
// stage_starts when they are not num_stages - 1 increasing blocks inside the model, or when
// the blocks do not divide into equal stages.
absl::StatusOr<std::vector<std::pair<int64_t, int64_t>>> StageBlocks(const PipelineConfig& config,
                                                                     int64_t num_blocks,
                                                                     int num_stages,
                                                                     const std::string& field);

class PipelineStrategy final : public Strategy,
                               public ParameterLayout,
                               public Gradients,
                               public MicroBatchRunner {
 public:
  explicit PipelineStrategy(PipelineConfig config);
  ~PipelineStrategy() override;

  absl::string_view name() const override { return "pipeline"; }
  const std::string& mesh_dim() const override { return config_.mesh_dim(); }
  std::vector<base::Violation> Check(const std::optional<ModelShape>& shape,
                                     const parallel::MeshConfig& mesh,
                                     const std::string& field) const override;
  StepEstimate Estimate(const ModelShape& shape, const parallel::MeshConfig& mesh) const override;
  absl::Status Apply(Wrappable& model, const parallel::DeviceMesh& mesh) override;
  // Each part is the rank's alone over the dimension: the gradient norm sums over it.
  void UpdateParameters(std::vector<parallel::TrainableParameter>& parameters) override;
  // Every stage's parameters, broadcast over the dimension from the rank that holds them.
  absl::Status GatherFullParameters(std::map<std::string, at::Tensor>& parameters) override;
  // A parameter several stages hold (a tied embedding) gets the sum of their gradients.
  absl::Status FinishGradients(const std::vector<parallel::TrainableParameter>& trainable) override;
  MicroBatchExecutor& executor() override;

 private:
  class Executor;

  // A parameter of the whole model, as every rank lists it before the cut.
  struct WholeParameter {
    std::string name;
    std::vector<int64_t> shape;
    // The ranks of the dimension whose stages hold it, ascending: one, or the first and the
    // last for a tied embedding.
    std::vector<int> holders;
  };

  PipelineConfig config_;
  ScheduleKind kind_ = ScheduleKind::k1F1B;
  parallel::Communicator* group_ = nullptr;
  at::Device device_ = at::kCPU;
  std::vector<WholeParameter> whole_;
  std::map<std::string, std::vector<int>> shared_;  // the holders of those held by several
  std::unique_ptr<Executor> executor_;
};

}  // namespace plait::wrap::pp

#endif  // PLAIT_WRAP_PP_PIPELINE_H_
