// A rank's start in a training job: it meets the world's other ranks (Rendezvous: through a
// file store for a local job, rank 0's TcpStore, which checks PLAIT_STORE_TOKEN, otherwise;
// an in-process store when it is alone) and builds the device mesh of Gloo communicators that
// everything after communicates through. The result owns the store and the mesh:
//
//   PLAIT_ASSIGN_OR_RETURN(parallel::World world, WorldFromEnvironment(ProcessEnvironment()));
//   PLAIT_ASSIGN_OR_RETURN(auto group, ProcessGroup::Start(world, plan.mesh(), absl::Minutes(5)));
//   Train(plan, group->mesh(), options);
#ifndef PLAIT_PARALLEL_PROCESS_GROUP_H_
#define PLAIT_PARALLEL_PROCESS_GROUP_H_

#include <memory>

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
  // `config` describes on it (one rank without dimensions). Every rank of the world must call
  // it. Errors name the rendezvous address or the mesh field.
  static absl::StatusOr<std::unique_ptr<ProcessGroup>> Start(const World& world,
                                                             const MeshConfig& config,
                                                             absl::Duration rendezvous_timeout);

  const DeviceMesh& mesh() const { return mesh_; }

 private:
  ProcessGroup(c10::intrusive_ptr<c10d::Store> store, DeviceMesh mesh)
      : store_(std::move(store)), mesh_(std::move(mesh)) {}

  c10::intrusive_ptr<c10d::Store> store_;
  DeviceMesh mesh_;
};

}  // namespace plait::parallel

#endif  // PLAIT_PARALLEL_PROCESS_GROUP_H_
