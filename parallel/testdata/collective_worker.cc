// One rank of a real multi-process job, for //parallel:multiprocess_test: reads the world
// from the environment the launcher set, meets the others through the TCP store, and runs
// ring collectives whose results it checks.
//
//   collective_worker                 all_reduce, all_gather, reduce_scatter; exits 0 if right
//   collective_worker depart RANK     rank RANK leaves after connecting; the others must fail
//                                     their all_reduce promptly instead of hanging
#include <cstdlib>
#include <iostream>
#include <string>

#include "ATen/Parallel.h"
#include "ATen/core/Tensor.h"
#include "ATen/ops/equal.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/time/time.h"
#include "parallel/rendezvous.h"
#include "parallel/ring_communicator.h"
#include "parallel/world.h"
#include "torch/csrc/autograd/generated/variable_factories.h"

namespace plait::parallel {
namespace {

int Fail(const absl::Status& status) {
  std::cerr << status << std::endl;
  return 3;
}

int Run(int argc, char** argv) {
  absl::StatusOr<World> world = WorldFromEnvironment(ProcessEnvironment());
  if (!world.ok()) return Fail(world.status());
  auto store = Rendezvous(*world, absl::Seconds(30));
  if (!store.ok()) return Fail(store.status());
  auto comm = RingCommunicator::Create(**store, "world", world->rank, world->world_size,
                                       RingCommunicator::kLoopback, {absl::Seconds(30)});
  if (!comm.ok()) return Fail(comm.status());
  const int rank = world->rank;
  const int size = world->world_size;

  int departing = -1;
  if (argc == 3 && std::string(argv[1]) == "depart" && !absl::SimpleAtoi(argv[2], &departing)) {
    return Fail(absl::InvalidArgumentError("usage: collective_worker [depart RANK]"));
  }
  if (rank == departing) {
    std::cout << "leaving without a word" << std::endl;
    return 0;
  }

  at::Tensor values = torch::full({1001}, rank, at::kFloat);
  if (absl::Status status = (*comm)->AllReduce(values, ReduceOp::kSum)->Wait(); !status.ok()) {
    return Fail(status);
  }
  const float expected_sum = size * (size - 1) / 2.0f;
  if (!values.eq(expected_sum).all().item<bool>()) {
    return Fail(absl::InternalError("all_reduce gave a wrong sum"));
  }

  const Chunk own = ChunkOf(1001, size, rank);
  at::Tensor full = torch::empty({1001}, at::kLong);
  at::Tensor shard = torch::arange(own.offset, own.offset + own.numel, at::kLong);
  if (absl::Status status = (*comm)->AllGather(shard, full)->Wait(); !status.ok()) {
    return Fail(status);
  }
  if (!at::equal(full, torch::arange(1001, at::kLong))) {
    return Fail(absl::InternalError("all_gather gave a wrong buffer"));
  }

  at::Tensor reduced = torch::empty({own.numel}, at::kLong);
  if (absl::Status status = (*comm)->ReduceScatter(full, reduced, ReduceOp::kMax)->Wait();
      !status.ok()) {
    return Fail(status);
  }
  if (!at::equal(reduced, shard)) {
    return Fail(absl::InternalError("reduce_scatter gave a wrong shard"));
  }
  // Rank 0 hosts the store: nobody leaves before everyone is done.
  if (absl::Status status = (*comm)->Barrier()->Wait(); !status.ok()) return Fail(status);
  std::cout << "collectives correct on " << size << " ranks" << std::endl;
  return 0;
}

}  // namespace
}  // namespace plait::parallel

int main(int argc, char** argv) {
  at::set_num_threads(1);
  return plait::parallel::Run(argc, argv);
}
