// Fully sharded data parallel on one mesh dimension, per parameter as PyTorch's FSDP2: every
// parameter is split along dim 0 into one shard per rank (the last ones zero-padded), and
// the optimizer trains only the shards. Each block of the model, and the root (the
// parameters outside blocks), is a unit with one collective each way (on each group its
// parameters are sharded over: with FsdpConfig.shard_dense_over_mesh_dim, what the earlier
// step on that dimension keeps whole (a mixture of experts' dense parameters, under expert
// parallelism) over mesh_dim and that dimension, what it splits (the experts) over mesh_dim
// alone):
//   before a block's forward its parameters are all-gathered (the next block's gather is
//   started right away, so it overlaps this block's compute); after its forward they are
//   freed (reshard_after_forward) and gathered again before its backward (again
//   prefetching the block before it); after its backward its gradients are reduce-scattered
//   into the shards' gradients (accumulating over micro-steps) and freed.
// The root unit computes before the first block (embedding) and after the last (final
// norm, output projection): with reshard_after_forward it is freed while the blocks run,
// gathered again (prefetched) for the end of the forward, and freed once the last block's
// backward starts, so at most the two largest units are gathered at once.
// Freeing keeps each parameter's identity for autograd (internal/torch_internals.h), so no
// forward is recomputed. With FsdpConfig.param_dtype the full parameters are gathered and
// computed in that dtype (bf16), gradients are reduced in reduce_dtype, and shards, their
// gradients and the optimizer state stay fp32. With a replicate group (hybrid sharding,
// FsdpConfig.replicate_mesh_dim) every rank of it holds the same shards, and each unit's
// reduced gradient shards are averaged across it by an all-reduce, started once that unit's
// reduce-scatter has had the next unit's backward to finish in (as PyTorch's HSDP), so it too
// overlaps the backward; the optimizer and clipping see the shards. Frozen parameters
// (requires_grad false: a reference model's, or a base under adapters) are sharded and
// gathered but get no gradient, take no place in the reduce-scatters and are not trained; so
// does a parameter that no rank used in the step's backward (a flag per parameter rides on
// each unit's reduce-scatter), as in one process, where AdamW would otherwise decay it.
// The tensors the model's seams hold a projection's weight in (Seams::HeldTensors: QLoRA's
// NF4 codes and scales) are sharded by rows of their bytes with the
// projection's block, gathered beside its parameters in a collective of their own and freed
// with them; they are never cast nor trained.
// FsdpStrategy is its preparation strategy (strategy.h), applied through wrap::Preparation
// (preparation.h). On CUDA (an NcclCommunicator) the gathers, reduce-scatters and all-reduces
// across replicas run on their communicator's stream, after the work queued on the compute
// stream and overlapping what is queued next; waiting for one makes the compute stream wait
// for it (nccl_communicator.h). Freed parameter memory goes back to LibTorch's caching
// allocator from the compute stream, the only stream that touches a parameter's storage
// (gathered values are copied in on it after the wait); a collective's own buffers stay in
// its Work until it has been waited for, which returns once the collective has ended and
// makes the compute stream wait for it, so the allocator never hands out memory NCCL still
// uses. Hence each unit's reduce-scatter is waited for when the next unit's starts: its input
// (the unit's whole gradient) lives one unit longer than its backward, not until the end of
// the backward pass.
#ifndef PLAIT_WRAP_FSDP_FSDP_H_
#define PLAIT_WRAP_FSDP_FSDP_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/statusor.h"
#include "parallel/communicator.h"
#include "parallel/trainable_parameter.h"
#include "wrap/internal/torch_internals.h"
#include "wrap/strategy.h"
#include "wrap/wrap.pb.h"
#include "wrap/wrappable.h"

namespace plait::wrap::fsdp {

class Fsdp {
 public:
  // Shards the model's parameters (which must be the same on every rank, e.g. initialised
  // from one seed) over `communicator`, frees the full ones, and installs the unit hooks.
  // `replicate`, when not null, is the group across which the shards are replicated. `dense`,
  // when not null, is the group the parameters `lender` does not split (all, without one) are
  // sharded over instead (FsdpConfig.shard_dense_over_mesh_dim: mesh_dim's and the lender's
  // dimensions), what it splits staying sharded over `communicator`: each unit then has a
  // collective each way on each group.
  static absl::StatusOr<std::unique_ptr<Fsdp>> Create(Wrappable& model,
                                                      parallel::Communicator& communicator,
                                                      parallel::Communicator* replicate,
                                                      const FsdpConfig& config,
                                                      parallel::Communicator* dense = nullptr,
                                                      const ParameterLayout* lender = nullptr);
  ~Fsdp();

  // The shards the optimizer trains, named as the full parameters, sharded over the
  // communicator's group, each with the rows of the full parameter it holds (its padding
  // left out; a scalar is rank 0's, the other ranks' padding marked as replicas) and, under
  // hybrid sharding, numbered among the replicate group's copies of the same rows.
  std::vector<parallel::TrainableParameter> TrainableParameters();

  // Every parameter's shard as TrainableParameters describes them, the frozen ones' (whose
  // tensors require no gradient) included: what a caller gives values to.
  std::vector<parallel::TrainableParameter> Shards();

  // How many ranks hold the box of `shard`'s slice (one of Shards()), at most: its shard
  // group's size (a scalar's copies) times the replicate group's.
  int64_t replica_count(const parallel::TrainableParameter& shard) const;

  // The first communication error since wrapping (a hook cannot return one). It stays: after
  // a failed collective the group is unusable (see Communicator).
  const absl::Status& last_status() const { return status_; }

  // Bytes of full (gathered) parameters alive now, a unit counting from the start of its
  // gather (prefetched ones included) until it is freed, and the most alive at once since
  // the last ResetPeak.
  int64_t unsharded_bytes() const { return unsharded_bytes_; }
  int64_t peak_unsharded_bytes() const { return peak_unsharded_bytes_; }
  void ResetPeak() { peak_unsharded_bytes_ = unsharded_bytes_; }

  // With `keep`, the units a forward gathers stay gathered after it (under no-grad: a
  // generation phase's forwards read the same weights every token), until a call without
  // `keep` frees them all.
  void KeepGathered(bool keep);

  // The full parameters, gathered from the shards (every rank takes part; every rank gets
  // them), in fp32, by name; and the weights the seams hold, as their Weight computes with
  // them, by the weights' names.
  absl::StatusOr<std::map<std::string, at::Tensor>> FullStateDict();

  // `store`, which quantizes (or otherwise writes) the values of the held weight `name` into
  // the tensors it is held in, made to keep this rank's shards of them: each rank gives the
  // whole values, which the tensors take for a moment. `store` itself when FSDP holds no
  // weight of that name.
  std::function<void(const at::Tensor&)> StoreIntoShards(
      const std::string& name, std::function<void(const at::Tensor&)> store);

  // Sets the shards from full parameters by name; InvalidArgument naming a missing or
  // misshapen parameter.
  absl::Status LoadFullStateDict(const std::map<std::string, at::Tensor>& state);

 private:
  struct Part;
  struct Unit;

  Fsdp(Wrappable& model, parallel::Communicator* replicate, const FsdpConfig& config);

  // What of the root one forward computes with: a pipeline stage may hold the embedding, the
  // output layers, both (the whole model) or neither.
  struct RootUse {
    bool embeds = true;
    bool outputs = true;
  };

  void BeforeForward(int unit);
  at::Tensor AfterForward(int unit, at::Tensor output);
  // `root_use` and `last_unit` (-1: none) are the forward's whose output's gradient starts
  // this backward.
  void BeforeBackward(int unit, RootUse root_use, int last_unit);
  void OnGradientAccumulated(int unit);
  void FinishBackward();

  // Where `unit`'s collectives are in the step, for their errors: its block (or the root) in
  // the pass under way.
  parallel::StepPlace PlaceOf(const Unit& unit, const char* purpose) const;
  void StartGather(Unit& unit);
  void Unshard(Unit& unit);
  // The all-gather of `part`'s held tensors' bytes, a part of StartGather, and waiting for it
  // and refilling the tensors with them, a part of Unshard; nothing for a part without any.
  void StartHeldGather(Part& part);
  void FinishHeldGather(Part& part);
  void Reshard(Unit& unit);
  void StartReduceScatter(Unit& unit);
  void SettleEarlierReduces();
  void AccumulateShardGradients(Part& part);
  void Fail(const absl::Status& status);

  int num_blocks() const;
  Unit& root();
  // Whether block unit `unit` is the first, or the last, of its stage's (Wrappable::Unit::stage):
  // the forward that runs it starts, or ends, there.
  bool FirstOfStage(int unit) const;
  bool LastOfStage(int unit) const;

  Wrappable& model_;
  parallel::Communicator* replicate_;  // null without hybrid sharding
  bool reshard_after_forward_;
  bool keep_gathered_ = false;
  at::ScalarType param_dtype_ = at::kFloat;  // set per model in Create
  at::ScalarType reduce_dtype_ = at::kFloat;
  std::vector<Unit> units_;  // the blocks in order, then the root
  std::vector<internal::HookHandle> hooks_;
  // The units whose reduce-scatter has started and has not been waited for (nor, with a
  // replicate group, their all-reduce across the replicas started), in the order they started.
  std::vector<Unit*> reducing_;
  bool backward_started_ = false;
  RootUse forward_root_use_;  // the forward under way's
  int forward_last_unit_ = -1;
  absl::Status status_;
  int64_t unsharded_bytes_ = 0;
  int64_t peak_unsharded_bytes_ = 0;
};

// FSDP as a preparation strategy: "fsdp" in plans and rules.
class FsdpStrategy final : public Strategy,
                           public DataSplit,
                           public ParameterLayout,
                           public Gradients,
                           public GatheredMemory,
                           public SmallerVersions {
 public:
  explicit FsdpStrategy(FsdpConfig config) : config_(std::move(config)) {}

  absl::string_view name() const override { return "fsdp"; }
  const std::string& mesh_dim() const override { return config_.mesh_dim(); }
  std::string replicate_dim() const override { return config_.replicate_mesh_dim(); }
  std::string borrowed_dim() const override { return config_.shard_dense_over_mesh_dim(); }
  void Borrow(const ParameterLayout& lender) override { lender_ = &lender; }
  Saves saves() const override { return Saves::kParameters; }
  bool keeps_less_over_more_ranks() const override { return true; }
  bool splits_batch() const override { return true; }
  // Its dtypes: fp16 has no CPU matmul, and DTYPE_AUTO is for the model's dtype only.
  std::vector<base::Violation> Check(const std::optional<ModelShape>& shape,
                                     const parallel::MeshConfig& mesh,
                                     const std::string& field) const override;
  StepEstimate Estimate(const ModelShape& shape, const parallel::MeshConfig& mesh) const override;
  absl::Status Apply(Wrappable& model, const parallel::DeviceMesh& mesh) override;
  void UpdateParameters(std::vector<parallel::TrainableParameter>& parameters) override;
  // Each held weight's `store` keeps this rank's shards (Fsdp::StoreIntoShards).
  void UpdateHeldParameters(std::vector<parallel::TrainableParameter>& held) override;
  absl::Status BackwardStatus() const override { return fsdp_->last_status(); }
  absl::Status GatherFullParameters(std::map<std::string, at::Tensor>& parameters) override;
  int64_t gathered_bytes() const override { return fsdp_->unsharded_bytes(); }
  int64_t peak_gathered_bytes() const override { return fsdp_->peak_unsharded_bytes(); }
  void ResetPeak() override { fsdp_->ResetPeak(); }
  void KeepGathered(bool keep) override { fsdp_->KeepGathered(keep); }

 private:
  FsdpConfig config_;
  // The layout of the earlier step whose dimension it borrows (borrowed_dim); null before
  // Borrow.
  const ParameterLayout* lender_ = nullptr;
  std::unique_ptr<Fsdp> fsdp_;
};

}  // namespace plait::wrap::fsdp

#endif  // PLAIT_WRAP_FSDP_FSDP_H_
