#include "parallel/rendezvous.h"

#include <chrono>
#include <exception>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "base/status.h"
#include "torch/csrc/distributed/c10d/FileStore.hpp"
#include "torch/csrc/distributed/c10d/TCPStore.hpp"

namespace plait::parallel {
namespace {

// How often a waiting rank looks for the ranks still missing.
constexpr absl::Duration kPollInterval = absl::Milliseconds(20);

std::string ArrivalKey(int rank) { return absl::StrCat("plait/rendezvous/arrived/", rank); }

// The store of `world`: a file its ranks share (World::store_file), which opens no port,
// or else the TCP store rank 0 hosts.
absl::StatusOr<c10::intrusive_ptr<c10d::Store>> OpenStore(const World& world,
                                                          absl::Duration timeout,
                                                          const std::string& store_address) {
  const auto timeout_ms = std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout));
  try {
    if (!world.store_file.empty()) {
      auto store = c10::make_intrusive<c10d::FileStore>(world.store_file, world.world_size);
      store->setTimeout(timeout_ms);
      return c10::intrusive_ptr<c10d::Store>(store);
    }
    c10d::TCPStoreOptions options;
    options.port = static_cast<uint16_t>(world.master_port);
    options.isServer = world.rank == 0;
    options.numWorkers = world.world_size;
    options.waitWorkers = false;  // arrivals are checked below, to name the missing ranks
    options.timeout = timeout_ms;
    return c10::intrusive_ptr<c10d::Store>(
        c10::make_intrusive<c10d::TCPStore>(world.master_addr, options));
  } catch (const std::exception& error) {
    if (world.rank == 0 || !world.store_file.empty()) {
      return absl::UnavailableError(absl::StrCat("rendezvous: rank ", world.rank,
                                                 " could not open the store at ", store_address,
                                                 ": ", error.what()));
    }
    return absl::DeadlineExceededError(
        absl::StrCat("rendezvous: rank ", world.rank, " could not reach rank 0's store at ",
                     store_address, " within ", absl::FormatDuration(timeout), ": ", error.what()));
  }
}

}  // namespace

absl::StatusOr<c10::intrusive_ptr<c10d::Store>> Rendezvous(const World& world,
                                                           absl::Duration timeout) {
  PLAIT_RETURN_IF_ERROR(ValidateWorld(world));
  const absl::Time deadline = absl::Now() + timeout;
  const std::string store_address = world.store_file.empty()
                                        ? absl::StrCat(world.master_addr, ":", world.master_port)
                                        : absl::StrCat("file ", world.store_file);
  PLAIT_ASSIGN_OR_RETURN(c10::intrusive_ptr<c10d::Store> store,
                         OpenStore(world, timeout, store_address));

  // The ranks still missing at the last look, for the errors below.
  std::vector<int> missing;
  auto never_arrived = [&] {
    return absl::StrCat("rank", missing.size() > 1 ? "s " : " ", absl::StrJoin(missing, ", "),
                        " of ", world.world_size, " never arrived");
  };
  try {
    store->set(ArrivalKey(world.rank), std::vector<uint8_t>{1});
    do {
      missing.clear();
      for (int rank = 0; rank < world.world_size; ++rank) {
        if (!store->check({ArrivalKey(rank)})) missing.push_back(rank);
      }
      if (missing.empty()) return store;
      absl::SleepFor(kPollInterval);
    } while (absl::Now() < deadline);
    return absl::DeadlineExceededError(
        absl::StrCat("rendezvous at ", store_address, " timed out after ",
                     absl::FormatDuration(timeout), ": ", never_arrived()));
  } catch (const std::exception& error) {
    if (!missing.empty()) {
      // Rank 0 reached its own deadline first (it started waiting earlier) and took the
      // store down: the same timeout, seen from here.
      return absl::DeadlineExceededError(
          absl::StrCat("rendezvous at ", store_address,
                       " timed out (rank 0, which hosts the store, gave up): ", never_arrived()));
    }
    return absl::UnavailableError(absl::StrCat(
        "rendezvous: rank ", world.rank, " lost the store at ", store_address, ": ", error.what()));
  }
}

}  // namespace plait::parallel
