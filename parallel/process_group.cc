#include "parallel/process_group.h"

#include <unistd.h>

#include <algorithm>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "base/status.h"
#include "parallel/device.h"
#include "parallel/rendezvous.h"
#include "parallel/ring_communicator.h"
#include "torch/csrc/distributed/c10d/HashStore.hpp"

namespace plait::parallel {
namespace {

// The address other ranks reach this one at.
std::string OwnAddress(const World& world) {
  if (world.master_addr == "127.0.0.1" || world.master_addr == "localhost") {
    return RingCommunicator::kLoopback;
  }
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return host;
}

// After a failed collective, how long at most a rank waits for the others to report in.
constexpr absl::Duration kMaxReportingWait = absl::Seconds(30);

}  // namespace

absl::StatusOr<std::unique_ptr<ProcessGroup>> ProcessGroup::Start(
    const World& world, const MeshConfig& config, const torch::Device& device,
    absl::Duration rendezvous_timeout) {
  c10::intrusive_ptr<c10d::Store> store;
  if (world.world_size > 1) {
    PLAIT_ASSIGN_OR_RETURN(store, Rendezvous(world, rendezvous_timeout));
  } else {
    store = c10::make_intrusive<c10d::HashStore>();
  }
  PLAIT_ASSIGN_OR_RETURN(MeshLayout layout, MeshLayout::Create(config, world.world_size));
  const absl::Duration timeout = CollectiveTimeout(config);
  PLAIT_ASSIGN_OR_RETURN(DeviceMesh mesh, DeviceMesh::Create(layout, world.rank,
                                                             DeviceCommunicatorFactory(
                                                                 device, *store, OwnAddress(world),
                                                                 CommunicatorOptions{timeout})));
  return std::unique_ptr<ProcessGroup>(
      new ProcessGroup(world, timeout, std::move(store), std::move(mesh)));
}

absl::Status ProcessGroup::ExplainFailure(absl::Status failure) const {
  if (world_.world_size == 1 ||
      !(absl::IsDeadlineExceeded(failure) || absl::IsUnavailable(failure))) {
    return failure;
  }
  const absl::Duration grace = std::min(collective_timeout_, kMaxReportingWait);
  auto with = [&failure](absl::string_view finding) {
    return absl::Status(failure.code(), absl::StrCat(failure.message(), "; ", finding));
  };
  std::vector<int> silent;
  try {
    if (AwaitAllRanks(*store_, "plait/failed/", world_.rank, world_.world_size, absl::Now() + grace,
                      silent)) {
      return failure;  // every rank is alive and failed the same way
    }
  } catch (const std::exception& error) {
    return with(absl::StrCat("the rendezvous store did not answer either (", error.what(),
                             "): rank 0, which hosts it, may have stopped"));
  }
  return with(absl::StrCat(silent.size() > 1 ? "ranks " : "rank ", absl::StrJoin(silent, ", "),
                           " of ", world_.world_size, " did not answer within ",
                           absl::FormatDuration(grace), ": stopped, hung or dead"));
}

}  // namespace plait::parallel
