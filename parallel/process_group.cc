#include "parallel/process_group.h"

#include <unistd.h>

#include <string>
#include <utility>

#include "base/status.h"
#include "parallel/gloo_communicator.h"
#include "parallel/rendezvous.h"
#include "torch/csrc/distributed/c10d/HashStore.hpp"

namespace plait::parallel {
namespace {

// The address other ranks reach this one at.
std::string OwnAddress(const World& world) {
  if (world.master_addr == "127.0.0.1" || world.master_addr == "localhost") {
    return GlooCommunicator::kLoopback;
  }
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return host;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ProcessGroup>> ProcessGroup::Start(
    const World& world, const MeshConfig& config, absl::Duration rendezvous_timeout) {
  c10::intrusive_ptr<c10d::Store> store;
  if (world.world_size > 1) {
    PLAIT_ASSIGN_OR_RETURN(store, Rendezvous(world, rendezvous_timeout));
  } else {
    store = c10::make_intrusive<c10d::HashStore>();
  }
  PLAIT_ASSIGN_OR_RETURN(MeshLayout layout, MeshLayout::Create(config, world.world_size));
  PLAIT_ASSIGN_OR_RETURN(
      DeviceMesh mesh,
      DeviceMesh::Create(layout, world.rank, GlooCommunicatorFactory(*store, OwnAddress(world))));
  return std::unique_ptr<ProcessGroup>(new ProcessGroup(std::move(store), std::move(mesh)));
}

}  // namespace plait::parallel
