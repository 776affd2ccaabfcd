// The preparation of one model for parallel training: the wrappers applied to it, each on
// one dimension of the device mesh, and then the parameters the optimizer must own. The
// optimizer can only be built from TakeTrainableParameters(), after the last wrapper:
//
//   PLAIT_ASSIGN_OR_RETURN(auto preparation, Preparation::Begin(*model, mesh));
//   PLAIT_RETURN_IF_ERROR(preparation->ApplyFsdp(fsdp_config));   // or ApplyDdp
//   PLAIT_ASSIGN_OR_RETURN(auto parameters, preparation->TakeTrainableParameters());
//   PLAIT_ASSIGN_OR_RETURN(auto optimizer, optim::Optimizer::Create(parameters, config));
//   ... loss.backward(); PLAIT_RETURN_IF_ERROR(preparation->BackwardStatus()); ...
//
// Guard rails, each an error naming what was wrong: a second Preparation of a model that has
// one; the same wrapper twice; DDP and FSDP on one mesh dimension; any wrapper after the
// parameters were taken; a mesh dimension the mesh does not have. The Preparation must live
// as long as the model trains: the wrappers' hooks belong to it.
#ifndef PLAIT_WRAP_PREPARATION_H_
#define PLAIT_WRAP_PREPARATION_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "optim/trainable_parameter.h"
#include "parallel/device_mesh.h"
#include "wrap/ddp/ddp.h"
#include "wrap/fsdp/fsdp.h"
#include "wrap/wrap.pb.h"
#include "wrap/wrappable.h"

namespace plait::wrap {

class Preparation {
 public:
  static absl::StatusOr<std::unique_ptr<Preparation>> Begin(Wrappable& model,
                                                            const parallel::DeviceMesh& mesh);
  ~Preparation();
  Preparation(const Preparation&) = delete;
  Preparation& operator=(const Preparation&) = delete;

  absl::Status ApplyDdp(const DdpConfig& config);
  absl::Status ApplyFsdp(const FsdpConfig& config);

  // Ends the preparation: the parameters the optimizer must own (FSDP's shards, or the
  // model's whole parameters), with the groups they are sharded over.
  absl::StatusOr<std::vector<optim::TrainableParameter>> TakeTrainableParameters();

  // While the returned object lives, backward passes accumulate gradients without
  // communicating (DDP); the backward after it synchronises the accumulated gradients.
  // FSDP reduces every micro-step into its sharded gradients, so it needs no such scope.
  class NoSyncScope {
   public:
    explicit NoSyncScope(ddp::Ddp* ddp) : ddp_(ddp) {
      if (ddp_ != nullptr) ddp_->set_sync(false);
    }
    ~NoSyncScope() {
      if (ddp_ != nullptr) ddp_->set_sync(true);
    }
    NoSyncScope(const NoSyncScope&) = delete;
    NoSyncScope& operator=(const NoSyncScope&) = delete;

   private:
    ddp::Ddp* ddp_;
  };
  NoSyncScope NoSync() { return NoSyncScope(ddp_.get()); }

  // The first communication error of the wrappers' hooks, which cannot return one (a failed
  // collective, a backward that never finished); it stays, since the ranks are out of step
  // after it. Check after backward, before the optimizer step.
  absl::Status BackwardStatus() const;

  ddp::Ddp* ddp() { return ddp_.get(); }
  fsdp::Fsdp* fsdp() { return fsdp_.get(); }

 private:
  Preparation(Wrappable& model, const parallel::DeviceMesh& mesh);

  // The communicator of `field`'s mesh dimension, after the checks every wrapper shares.
  absl::StatusOr<parallel::Communicator*> Dimension(const std::string& strategy,
                                                    const std::string& mesh_dim);

  Wrappable& model_;
  const parallel::DeviceMesh& mesh_;
  std::unique_ptr<ddp::Ddp> ddp_;
  std::string ddp_dim_;
  std::unique_ptr<fsdp::Fsdp> fsdp_;
  std::string fsdp_dim_;
  bool parameters_taken_ = false;
};

}  // namespace plait::wrap

#endif  // PLAIT_WRAP_PREPARATION_H_
