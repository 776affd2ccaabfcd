#include "parallel/process_group.h"

#include <unistd.h>

#include <algorithm>
#include <exception>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
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

// Where a failed rank publishes the places of its groups' first failed collectives.
constexpr absl::string_view kFailedAtPrefix = "plait/failed_at/";

// Communicator::FirstFailure of each of `mesh`'s groups that has one, one a line.
std::string FailurePlaces(const DeviceMesh& mesh) {
  std::vector<std::string> places;
  for (const Communicator* group : mesh.communicators()) {
    std::string place = group->FirstFailure();
    if (!place.empty()) places.push_back(std::move(place));
  }
  return absl::StrJoin(places, "\n");
}

}  // namespace

absl::StatusOr<std::unique_ptr<ProcessGroup>> ProcessGroup::Start(
    const World& world, const MeshConfig& config, const at::Device& device,
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
  // A rank still inside a collective fails within a timeout of the collective's start; one
  // more leaves a loaded machine's ranks time to report where (fsdp_hang_test's rank 1, which
  // fails at once, waits for rank 0's timeout).
  const absl::Duration grace = std::min(2 * collective_timeout_, kMaxReportingWait);
  auto with = [&failure](absl::string_view finding) {
    return absl::Status(failure.code(), absl::StrCat(failure.message(), "; ", finding));
  };
  auto ranks = [this](const std::vector<int>& which) {
    return absl::StrCat(which.size() > 1 ? "ranks " : "rank ", absl::StrJoin(which, ", "), " of ",
                        world_.world_size);
  };
  const std::string own_places = FailurePlaces(mesh_);
  std::vector<int> silent;
  // The ranks that failed at other collectives than this one, by where they failed.
  std::map<std::string, std::vector<int>> elsewhere;
  try {
    store_->set(absl::StrCat(kFailedAtPrefix, world_.rank),
                std::vector<uint8_t>(own_places.begin(), own_places.end()));
    AwaitAllRanks(*store_, "plait/failed/", world_.rank, world_.world_size, absl::Now() + grace,
                  silent);
    for (int rank = 0; rank < world_.world_size; ++rank) {
      if (rank == world_.rank || std::find(silent.begin(), silent.end(), rank) != silent.end()) {
        continue;
      }
      const std::vector<uint8_t> value = store_->get(absl::StrCat(kFailedAtPrefix, rank));
      std::string places(value.begin(), value.end());
      if (!places.empty() && places != own_places) elsewhere[std::move(places)].push_back(rank);
    }
  } catch (const std::exception& error) {
    return with(absl::StrCat("the rendezvous store did not answer either (", error.what(),
                             "): rank 0, which hosts it, may have stopped"));
  }
  std::vector<std::string> findings;
  for (const auto& [places, at] : elsewhere) {
    findings.push_back(absl::StrCat(ranks(at), " did not reach it: ", at.size() > 1 ? "they" : "it",
                                    " failed at ", absl::StrReplaceAll(places, {{"\n", " and "}})));
  }
  if (!silent.empty()) {
    findings.push_back(absl::StrCat(ranks(silent), " did not answer within ",
                                    absl::FormatDuration(grace), ": stopped, hung or dead"));
  }
  // With no finding, every rank is alive and failed at the same collective.
  return findings.empty() ? failure : with(absl::StrJoin(findings, "; "));
}

}  // namespace plait::parallel
