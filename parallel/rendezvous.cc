#include "parallel/rendezvous.h"

#include <chrono>
#include <exception>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "base/status.h"
#include "parallel/tcp_store.h"
#include "torch/csrc/distributed/c10d/FileStore.hpp"

namespace plait::parallel {
namespace {

// How often a waiting rank looks for the ranks still missing.
constexpr absl::Duration kPollInterval = absl::Milliseconds(20);

// Connections rank 0's store admits at once: every rank's, as many again for attempts still
// closing and strays waiting out their hello timeout, and a margin for small jobs.
constexpr int kConnectionsPerRank = 2;
constexpr int kSpareConnections = 16;

// The store of `world`: a file its ranks share (World::store_file), which opens no port,
// or else the TCP store rank 0 hosts, which admits only ranks with the job's token.
absl::StatusOr<c10::intrusive_ptr<c10d::Store>> OpenStore(const World& world,
                                                          absl::Duration timeout,
                                                          const std::string& store_address) {
  if (!world.store_file.empty()) {
    try {
      auto store = c10::make_intrusive<c10d::FileStore>(world.store_file, world.world_size);
      store->setTimeout(std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout)));
      return c10::intrusive_ptr<c10d::Store>(store);
    } catch (const std::exception& error) {
      return absl::UnavailableError(absl::StrCat("rendezvous: rank ", world.rank,
                                                 " could not open the store at ", store_address,
                                                 ": ", error.what()));
    }
  }
  if (world.store_token.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("rendezvous: ", kStoreTokenVariable,
                     " is not set; the ranks meet through rank 0's TCP store at ", store_address,
                     ", which admits only ranks that show the job's token: ", kStoreTokenHowTo));
  }
  if (world.rank != 0) {
    absl::StatusOr<c10::intrusive_ptr<TcpStore>> store =
        TcpStore::Connect(world.master_addr, world.master_port, world.store_token, timeout);
    if (store.ok()) return c10::intrusive_ptr<c10d::Store>(*store);
    const std::string hint =
        absl::IsPermissionDenied(store.status())
            ? absl::StrCat(" (every rank needs the same ", kStoreTokenVariable, ")")
            : "";
    return absl::Status(store.status().code(), absl::StrCat("rendezvous: rank ", world.rank,
                                                            " could not reach rank 0's store: ",
                                                            store.status().message(), hint));
  }
  PLAIT_ASSIGN_OR_RETURN(
      c10::intrusive_ptr<TcpStore> store,
      base::Annotate(
          TcpStore::Host(world.master_addr, world.master_port, world.store_token,
                         kConnectionsPerRank * world.world_size + kSpareConnections, timeout),
          absl::StrCat("rendezvous: rank 0 could not open the store on port ", world.master_port,
                       " (", kStorePortVariable, " chooses another)")));
  if (world.world_size > world.local_world_size && store->server()->ListensOnLoopback()) {
    // Debian, for one, maps a machine's own host name to 127.0.1.1.
    return absl::FailedPreconditionError(absl::StrCat(
        "rendezvous: MASTER_ADDR=", world.master_addr,
        " is a loopback address on rank 0 (the store listens on ", store->server()->BoundAddress(),
        "), which the ranks on other nodes cannot reach; set MASTER_ADDR to an address of rank 0's "
        "node that they reach"));
  }
  return c10::intrusive_ptr<c10d::Store>(store);
}

// "ranks 2, 3 of 4 never arrived", and in a job of several nodes, which nodes they are on:
// ": all of node 1 (of 2 nodes; not started, or it cannot reach ADDRESS)". The ranks of a
// node are numbered together (node_rank x local_world_size onwards), as torchrun, tools/launch
// and SLURM's default block distribution number them.
std::string NeverArrived(const std::vector<int>& missing, const World& world,
                         const std::string& store_address) {
  std::string text =
      absl::StrCat("rank", missing.size() > 1 ? "s " : " ", absl::StrJoin(missing, ", "), " of ",
                   world.world_size, " never arrived");
  const int per_node = world.local_world_size;
  if (world.world_size == per_node || world.world_size % per_node != 0) return text;
  std::map<int, int> missing_by_node;
  for (int rank : missing) ++missing_by_node[rank / per_node];
  std::vector<std::string> nodes;
  bool whole_node = false;
  for (const auto& [node, count] : missing_by_node) {
    whole_node = whole_node || count == per_node;
    nodes.push_back(count == per_node ? absl::StrCat("all of node ", node)
                                      : absl::StrCat(count, " of node ", node, "'s ", per_node));
  }
  absl::StrAppend(&text, ": ", absl::StrJoin(nodes, ", "), " (of ", world.world_size / per_node,
                  " nodes",
                  whole_node ? absl::StrCat("; a node that never arrives was not started, "
                                            "or cannot reach ",
                                            store_address)
                             : "",
                  ")");
  return text;
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

  // The ranks still missing at the last whole look, for the errors below: a look cut short by
  // the store going down leaves the one before it.
  std::vector<int> missing;
  auto never_arrived = [&] { return NeverArrived(missing, world, store_address); };
  // A refused client (a wrong token) may be a rank started wrongly or a stray: rank 0 cannot
  // tell, so it waits for the ranks until its deadline all the same, and only then says whom
  // its store refused. A rank refused stops at once itself, saying why (OpenStore).
  const auto* tcp_store = dynamic_cast<const TcpStore*>(store.get());
  const TcpStoreServer* server = tcp_store != nullptr ? tcp_store->server() : nullptr;
  try {
    if (AwaitAllRanks(*store, "plait/rendezvous/arrived/", world.rank, world.world_size, deadline,
                      missing)) {
      return store;
    }
    const std::string refused = server != nullptr ? server->Refusals().Summary() : "";
    return absl::DeadlineExceededError(absl::StrCat(
        "rendezvous at ", store_address, " timed out after ", absl::FormatDuration(timeout), ": ",
        never_arrived(),
        refused.empty()
            ? ""
            : absl::StrCat("; rank 0's store: ", refused, "; a rank it refused needs the job's ",
                           kStoreTokenVariable)));
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

bool AwaitAllRanks(c10d::Store& store, absl::string_view key_prefix, int rank, int world_size,
                   absl::Time deadline, std::vector<int>& missing) {
  auto key = [key_prefix](int of) { return absl::StrCat(key_prefix, of); };
  store.set(key(rank), std::vector<uint8_t>{1});
  do {
    std::vector<int> absent;
    for (int other = 0; other < world_size; ++other) {
      if (!store.check({key(other)})) absent.push_back(other);
    }
    missing = std::move(absent);
    if (missing.empty()) return true;
    absl::SleepFor(kPollInterval);
  } while (absl::Now() < deadline);
  return false;
}

}  // namespace plait::parallel
