// Distributed data parallel on one mesh dimension: every rank holds the whole model, and
// after backward every gradient is the average over the dimension's ranks. Gradients are
// grouped into buckets in reverse registration order (the order backward produces them);
// each bucket's all-reduce starts, asynchronously, as soon as its last gradient has been
// accumulated, in bucket order on every rank, and all are waited for when backward ends.
// A parameter that no rank produced a gradient for gets none, so the optimizer skips it as
// it would in one process. Parameters are broadcast from the group's rank 0 when wrapping.
// DdpStrategy is
// its preparation strategy (strategy.h), applied through wrap::Preparation (preparation.h);
// SetGradientSync(false) skips synchronisation for the micro-steps of gradient accumulation.
#ifndef PLAIT_WRAP_DDP_DDP_H_
#define PLAIT_WRAP_DDP_DDP_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/statusor.h"
#include "parallel/communicator.h"
#include "wrap/internal/torch_internals.h"
#include "wrap/strategy.h"
#include "wrap/wrap.pb.h"
#include "wrap/wrappable.h"

namespace plait::wrap::ddp {

// OK when `config`'s bucket caps (bucket_cap_mb, first_bucket_cap_mb, set or default) are
// positive and finite; else InvalidArgument naming the field ("ddp.bucket_cap_mb: -1 must be
// > 0 and finite"). Checked by MakeStrategy, so a plan check catches it, and by Ddp::Create.
absl::Status ValidateDdpConfig(const DdpConfig& config);

class Ddp {
 public:
  // Broadcasts the parameters from `communicator`'s rank 0 and installs the gradient hooks.
  static absl::StatusOr<std::unique_ptr<Ddp>> Create(Wrappable& model,
                                                     parallel::Communicator& communicator,
                                                     const DdpConfig& config);
  ~Ddp();

  // While false, backward accumulates gradients locally and communicates nothing.
  void set_sync(bool sync) { sync_ = sync; }

  // The buckets, as the parameter indices (into Wrappable::NamedParameters) each holds.
  const std::vector<std::vector<int>>& bucket_members() const { return bucket_members_; }

  // The first synchronisation error since wrapping (a failed all-reduce, which a hook cannot
  // return, or a backward that never finished). It stays: the ranks are out of step after it.
  const absl::Status& last_sync_status() const { return last_sync_status_; }

 private:
  struct Bucket;

  Ddp(Wrappable& model, std::vector<at::Tensor> parameters, parallel::Communicator& communicator);

  void OnForwardStart();
  void OnGradientReady(int bucket);
  void LaunchReadyBuckets();
  void FinishBackward();

  Wrappable& model_;
  std::vector<at::Tensor> parameters_;
  parallel::Communicator& communicator_;
  std::vector<std::vector<int>> bucket_members_;
  std::vector<Bucket> buckets_;
  std::vector<internal::HookHandle> hooks_;
  bool sync_ = true;
  bool backward_started_ = false;
  int next_to_launch_ = 0;
  // One flag per bucketed parameter, in bucket order, set where this rank produced a
  // gradient in this backward: the tail of the last bucket's buffer, so that the all-reduce
  // that bucket runs anyway sums them over the ranks, with no collective of its own.
  at::Tensor used_;
  // Whether this rank produced every bucketed gradient in this backward: then every flag of
  // used_ is set and need not be read back from the device.
  bool every_gradient_here_ = true;
  absl::Status last_sync_status_;
};

// DDP as a preparation strategy: "ddp" in plans and rules.
class DdpStrategy final : public Strategy,
                          public DataSplit,
                          public ParameterLayout,
                          public Gradients,
                          public SmallerVersions {
 public:
  explicit DdpStrategy(DdpConfig config) : config_(std::move(config)) {}

  absl::string_view name() const override { return "ddp"; }
  const std::string& mesh_dim() const override { return config_.mesh_dim(); }
  bool splits_batch() const override { return true; }
  StepEstimate Estimate(const ModelShape& shape, const parallel::MeshConfig& mesh) const override;
  absl::Status Apply(Wrappable& model, const parallel::DeviceMesh& mesh) override;
  // Every parameter is whole on every rank of the group: replicas of one another.
  void UpdateParameters(std::vector<parallel::TrainableParameter>& parameters) override;
  void SetGradientSync(bool sync) override { ddp_->set_sync(sync); }
  absl::Status BackwardStatus() const override { return ddp_->last_sync_status(); }
  Saves saves() const override { return Saves::kParameters; }
  // FSDP over its dimension: each rank keeps a shard in place of a replica.
  std::vector<PrepareStep> Replacements() const override;

 private:
  DdpConfig config_;
  std::unique_ptr<Ddp> ddp_;
  const parallel::Communicator* communicator_ = nullptr;  // set by Apply
};

}  // namespace plait::wrap::ddp

#endif  // PLAIT_WRAP_DDP_DDP_H_
