// A rank's start in a training job: it meets the world's other ranks (Rendezvous: through a
// file store for a local job, rank 0's TcpStore, which checks PLAIT_STORE_TOKEN, otherwise;
// an in-process store when it is alone) and builds the device mesh that everything after
// communicates through (NCCL communicators on CUDA, ring ones on the CPU: device.h), whose
// collectives fail after the mesh's collective timeout. The result owns the store and the mesh, and
// after a failed collective names the ranks that stopped answering:
//
//   PLAIT_ASSIGN_OR_RETURN(parallel::World world, WorldFromEnvironment(ProcessEnvironment()));
//   PLAIT_ASSIGN_OR_RETURN(auto group,
//                          ProcessGroup::Start(world, plan.mesh(), device, absl::Minutes(5)));
//   absl::Status status = Train(resolved, group->mesh(), options);
//   if (!status.ok()) status = group->ExplainFailure(status);  // "...; rank 3 of 4 did not answer"
//   // or "...; rank 1 of 2 did not reach it: it failed at step 12, block 6 backward, ..."
#ifndef PLAIT_PARALLEL_PROCESS_GROUP_H_
#define PLAIT_PARALLEL_PROCESS_GROUP_H_

#include <memory>

#include "ATen/core/Tensor.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "parallel/device_mesh.h"
#include "parallel/mesh.pb.h"
#include "parallel/world.h"
#include "torch/csrc/distributed/c10d/Store.hpp"

namespace plait::parallel {

class ProcessGroup {
 public:
  // Joins `world` (rank 0 waits up to `rendezvous_timeout` for the others) and creates the mesh
  // `config` describes on it (one rank without dimensions), with communicators for `device`
  // (ResolveDevice's, bound by the caller). Every rank of the world must call it. Errors name
  // the rendezvous address or the mesh field.
  static absl::StatusOr<std::unique_ptr<ProcessGroup>> Start(const World& world,
                                                             const MeshConfig& config,
                                                             const at::Device& device,
                                                             absl::Duration rendezvous_timeout);

  const DeviceMesh& mesh() const { return mesh_; }

  // `failure` with the ranks to blame when it is a collective that timed out or lost a peer
  // (DeadlineExceeded, Unavailable): this rank reports in through the store, with where its
  // groups' first collectives failed (Communicator::FirstFailure), and waits a short while
  // (the collective timeout, at most 30 s) for the others to do the same. The ranks that do
  // not are named as stopped, hung or dead; those that failed at another collective (one that
  // skipped a collective, or is behind) are named with the place where they failed. Every
  // rank whose work fails calls it.
  absl::Status ExplainFailure(absl::Status failure) const;

 private:
  ProcessGroup(World world, absl::Duration collective_timeout,
               c10::intrusive_ptr<c10d::Store> store, DeviceMesh mesh)
      : world_(std::move(world)),
        collective_timeout_(collective_timeout),
        store_(std::move(store)),
        mesh_(std::move(mesh)) {}

  World world_;
  absl::Duration collective_timeout_;
  c10::intrusive_ptr<c10d::Store> store_;
  DeviceMesh mesh_;
};

}  // namespace plait::parallel

#endif  // PLAIT_PARALLEL_PROCESS_GROUP_H_
