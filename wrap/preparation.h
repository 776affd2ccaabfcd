// The preparation of one model for parallel training: the plan's steps (wrap.proto's
// PrepareStep: FSDP, DDP, ...) applied in order, each a Strategy (strategy.h) on one
// dimension of the device mesh, and then the parameters the optimizer must own. The optimizer
// can only be built from TakeTrainableParameters(), after the last step:
//
//   PLAIT_ASSIGN_OR_RETURN(auto preparation, Preparation::Begin(*model, mesh, "plan.prepare"));
//   for (const PrepareStep& step : plan.prepare()) {
//     PLAIT_RETURN_IF_ERROR(preparation->Apply(step));
//   }
//   PLAIT_ASSIGN_OR_RETURN(auto parameters, preparation->TakeTrainableParameters());
//   PLAIT_ASSIGN_OR_RETURN(auto optimizer, optim::Optimizer::Create(parameters, config));
//   ... loss.backward(); PLAIT_RETURN_IF_ERROR(preparation->BackwardStatus()); ...
//
// Every step is checked against the preparation rules (rules.textproto, the same ones the
// plan validator reads) before it is applied, so a wrong order, a step applied twice, two
// strategies sharing a mesh dimension or a dimension the mesh lacks is an error naming the
// step and the rule. Further guard rails: a second Preparation of a model that has one, and
// any step after the parameters were taken. The Preparation must live as long as the model
// trains: the strategies' hooks belong to it.
#ifndef PLAIT_WRAP_PREPARATION_H_
#define PLAIT_WRAP_PREPARATION_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "google/protobuf/repeated_ptr_field.h"
#include "parallel/device_mesh.h"
#include "parallel/trainable_parameter.h"
#include "wrap/micro_batch_executor.h"
#include "wrap/strategies.h"
#include "wrap/wrap.pb.h"
#include "wrap/wrappable.h"

namespace plait::wrap {

class Preparation {
 public:
  // Starts preparing `model` on `mesh` (both must outlive the result). Errors of Apply name
  // steps from `field` ("plan.prepare" gives "plan.prepare[1].fsdp.mesh_dim: ...").
  static absl::StatusOr<std::unique_ptr<Preparation>> Begin(Wrappable& model,
                                                            const parallel::DeviceMesh& mesh,
                                                            std::string field = "prepare");
  ~Preparation();
  Preparation(const Preparation&) = delete;
  Preparation& operator=(const Preparation&) = delete;

  // Applies the next step, after checking the steps so far, this one included, against the
  // preparation rules.
  absl::Status Apply(const PrepareStep& step);

  // Ends the preparation: the parameters the optimizer must own (FSDP's shards, or the
  // model's whole parameters; those a step froze left out), with the groups they are
  // sharded over.
  absl::StatusOr<std::vector<parallel::TrainableParameter>> TakeTrainableParameters();

  // After TakeTrainableParameters: this rank's parts of the parameters a step froze (LoRA's
  // base), laid out as the strategies hold them (FSDP's fp32 shards, or the whole
  // parameters), each with its slice, and those a step holds in a form of its own (QLoRA's
  // NF4 base, each with a `store`): what the caller gives their values to. They require no
  // gradient and are never an optimizer's. FailedPrecondition before the trainable ones were
  // taken, while a step may still change them.
  absl::StatusOr<std::vector<parallel::TrainableParameter>> FrozenParameters();

  // The mesh dimensions whose ranks train on different data: those of the steps that split
  // the batch (FSDP, DDP), in mesh order.
  std::vector<std::string> DataParallelDims() const;

  // The mesh dimensions whose ranks run the blocks' feed-forward on different tokens
  // (RoutingDimsOf), in mesh order: over which a mixture of experts' routing is summed.
  std::vector<std::string> RoutingDims() const;

  // This rank's part of `x` [B, T, ...], whose dimension 1 is the whole sequence (a batch's
  // targets): what its model computes and scores, its slice of the sequence under context
  // parallelism (DataSplit::OwnSlice).
  at::Tensor OwnSlice(const at::Tensor& x) const;

  // Runs the forward (MicroBatchForward) and backward passes of `num_micro` micro-batches, one
  // optimizer step's, in the order a strategy decides (a pipeline's schedule; else one after
  // another), gradients synchronised in the rank's last backward only, then checks
  // BackwardStatus and has the strategies finish the gradients of the trainable parameters
  // (Gradients::FinishGradients). An error names the micro-batch; every rank of the mesh must
  // call it, after TakeTrainableParameters.
  absl::Status TrainMicroBatches(int num_micro, const MicroBatchForward& forward);

  // The forwards alone, as TrainMicroBatches orders them (an evaluation, under no-grad).
  absl::Status EvaluateMicroBatches(int num_micro, const MicroBatchForward& forward);

  // The executor those two run: the one of the strategy that orders the micro-batches, or
  // the sequential one.
  MicroBatchExecutor& Executor();

  // The first communication error of the strategies' hooks, which cannot return one (a
  // failed collective, a backward that never finished); it stays, since the ranks are out of
  // step after it. Check after backward, before the optimizer step.
  absl::Status BackwardStatus() const;

  // The whole parameters by name, on every rank: the strategies that split them gather them
  // (every rank of the mesh must call it). Fresh tensors, in the parameters' dtype (fp32 for
  // FSDP's shards). Hold the result in a variable before iterating it: a range-for over
  // `FullParameters().value()` runs over a map already destroyed with its temporary StatusOr.
  absl::StatusOr<std::map<std::string, at::Tensor>> FullParameters();

  // FullParameters with the parameters steps added folded into the model's own and left out
  // (LoRA's adapters merged: W + scale * B A): the model's parameters alone, as a Hugging Face
  // export writes them. Every rank of the mesh must call it.
  absl::StatusOr<std::map<std::string, at::Tensor>> MergedParameters();

  // The step that added adapters a run can save on their own (AdapterExport: LoRA's), or
  // nullptr.
  const AdapterExport* Adapters() const;

  // Bytes of whole parameters the strategies hold beyond their shares now, and the most at
  // once since ResetPeak (FSDP's gathered units).
  int64_t gathered_bytes() const;
  int64_t peak_gathered_bytes() const;
  void ResetPeak();

  // While it lives, the whole parameters the strategies gather for a forward stay gathered
  // (GatheredMemory::KeepGathered): a generation phase's forwards, under no-grad, gather each
  // once, not once a decoded token. Every rank of the mesh keeps its own.
  class KeepGathered {
   public:
    explicit KeepGathered(Preparation& preparation);
    ~KeepGathered();
    KeepGathered(const KeepGathered&) = delete;
    KeepGathered& operator=(const KeepGathered&) = delete;

   private:
    Preparation& preparation_;
  };

 private:
  Preparation(Wrappable& model, const parallel::DeviceMesh& mesh, std::string field);

  // This rank's parts of the parameters that require a gradient (`trainable`) or of the
  // others, as the strategies left them.
  std::vector<parallel::TrainableParameter> PartsOf(bool trainable);

  // The facet `Facet` of each strategy that has it, in the steps' order.
  template <typename Facet>
  std::vector<Facet*> Facets() const {
    std::vector<Facet*> facets;
    for (const std::unique_ptr<Strategy>& strategy : strategies_) {
      if (Facet* facet = FacetOf<Facet>(*strategy); facet != nullptr) facets.push_back(facet);
    }
    return facets;
  }

  Wrappable& model_;
  const parallel::DeviceMesh& mesh_;
  const std::string field_;
  google::protobuf::RepeatedPtrField<PrepareStep> steps_;  // applied so far
  std::vector<std::unique_ptr<Strategy>> strategies_;      // one per step
  bool parameters_taken_ = false;
  std::vector<parallel::TrainableParameter> trainable_;  // as TakeTrainableParameters gave them
  SequentialExecutor sequential_;
};

}  // namespace plait::wrap

#endif  // PLAIT_WRAP_PREPARATION_H_
