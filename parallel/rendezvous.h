// Rendezvous: connects the processes of a job through a key-value store and waits until
// every rank has arrived. The store is a file the ranks share when the world names one (the
// local launcher's jobs: nothing listens on the network), else rank 0's TcpStore
// (tcp_store.h), which listens on MASTER_ADDR:MASTER_PORT only and admits only ranks that
// show the job's PLAIT_STORE_TOKEN: a job launched by torchrun, SLURM or mpirun needs
//
//   export PLAIT_STORE_TOKEN=$(openssl rand -hex 16)  # the same value on every node
//
// (without one Rendezvous fails, saying so). Communicators are then created over the store:
//
//   PLAIT_ASSIGN_OR_RETURN(World world, WorldFromEnvironment(ProcessEnvironment()));
//   PLAIT_ASSIGN_OR_RETURN(auto store, Rendezvous(world, absl::Minutes(5)));
//   PLAIT_ASSIGN_OR_RETURN(auto comm, RingCommunicator::Create(*store, "world", ...));
//
// When the timeout passes first, the error names the ranks that never arrived and, on rank 0,
// the clients its store refused: a client with a wrong token never ends the wait, since it may
// be a stray rather than a rank. A multi-node job whose MASTER_ADDR is a loopback address on
// rank 0 fails at once, naming it.
#ifndef PLAIT_PARALLEL_RENDEZVOUS_H_
#define PLAIT_PARALLEL_RENDEZVOUS_H_

#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "parallel/world.h"
#include "torch/csrc/distributed/c10d/Store.hpp"

namespace plait::parallel {

absl::StatusOr<c10::intrusive_ptr<c10d::Store>> Rendezvous(const World& world,
                                                           absl::Duration timeout);

// Marks `rank` present under `key_prefix` in `store`, then looks every few milliseconds until
// each of the `world_size` ranks has marked itself or `deadline` passes. Returns whether all
// did; `missing` holds the ranks absent at the last whole look. Throws what the store throws
// (a rank that lost the store), leaving `missing` as the look before found it.
bool AwaitAllRanks(c10d::Store& store, absl::string_view key_prefix, int rank, int world_size,
                   absl::Time deadline, std::vector<int>& missing);

}  // namespace plait::parallel

#endif  // PLAIT_PARALLEL_RENDEZVOUS_H_
