// Collectives between 2 ranks over loopback (two threads of this process, each with its own
// RingCommunicator and TCP connections; LibTorch on one thread, as each rank of a multi-rank
// run has), 1 KiB to 64 MiB of fp32:
//   bytes_per_second: algorithm bandwidth, buffer bytes / time;
//   bus_bw: algorithm bandwidth x 2(N-1)/N for all_reduce, x (N-1)/N for all_gather and
//     reduce_scatter (NCCL's convention: comparable across operations and group sizes);
//   sent_vs_min: bytes rank 0 really sent per call (its traffic counters) / the theoretical
//     minimum per rank, 2(N-1)/N x S for all_reduce and (N-1)/N x S for the others.
//
//   bazel run --config=opt //benchmarks:comm_bench
#include <memory>
#include <thread>
#include <utility>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "benchmark/benchmark.h"
#include "benchmarks/bench_setup.h"
#include "parallel/communicator.h"
#include "parallel/ring_communicator.h"
#include "torch/csrc/autograd/generated/variable_factories.h"
#include "torch/csrc/distributed/c10d/HashStore.hpp"

namespace plait::parallel {
namespace {

constexpr int kRanks = 2;

// The two ranks' communicators, connected once for the whole run.
std::array<std::unique_ptr<RingCommunicator>, kRanks>& Communicators() {
  static auto* communicators = [] {
    auto* result = new std::array<std::unique_ptr<RingCommunicator>, kRanks>();
    auto store = c10::make_intrusive<c10d::HashStore>();
    std::array<std::thread, kRanks> threads;
    for (int rank = 0; rank < kRanks; ++rank) {
      threads[rank] = std::thread([&, rank] {
        (*result)[rank] =
            RingCommunicator::Create(*store, "bench", rank, kRanks, RingCommunicator::kLoopback)
                .value();
      });
    }
    for (std::thread& thread : threads) thread.join();
    return result;
  }();
  return *communicators;
}

// The buffers one rank uses for one collective of `numel` elements.
struct Buffers {
  Buffers(int64_t numel, int rank)
      : full(torch::ones({numel})), shard(torch::ones({ChunkOf(numel, kRanks, rank).numel})) {}
  at::Tensor full;
  at::Tensor shard;
};

std::shared_ptr<Work> Run(Collective collective, Communicator& comm, Buffers& buffers) {
  switch (collective) {
    case Collective::kAllReduce:
      return comm.AllReduce(buffers.full, ReduceOp::kSum);
    case Collective::kAllGather:
      return comm.AllGather(buffers.shard, buffers.full);
    default:
      return comm.ReduceScatter(buffers.full, buffers.shard, ReduceOp::kSum);
  }
}

template <Collective kCollective>
void BM_Collective(benchmark::State& state) {
  const int64_t bytes = state.range(0);
  const int64_t numel = bytes / 4;
  auto& communicators = Communicators();
  const double bus_factor =
      (kCollective == Collective::kAllReduce ? 2.0 : 1.0) * (kRanks - 1) / kRanks;

  // Rank 1 runs the same number of collectives as this (rank 0's) loop, on its own thread.
  const int64_t iterations = static_cast<int64_t>(state.max_iterations);
  std::thread peer([&] {
    Buffers buffers(numel, 1);
    for (int64_t i = 0; i < iterations; ++i) {
      if (!Run(kCollective, *communicators[1], buffers)->Wait().ok()) std::abort();
    }
  });
  Buffers buffers(numel, 0);
  const int64_t sent_before = communicators[0]->traffic(kCollective).bytes_sent;
  for (auto _ : state) {
    absl::Status status = Run(kCollective, *communicators[0], buffers)->Wait();
    if (!status.ok()) state.SkipWithError(std::string(status.message()).c_str());
  }
  peer.join();
  const int64_t sent = communicators[0]->traffic(kCollective).bytes_sent - sent_before;

  state.SetBytesProcessed(state.iterations() * bytes);
  state.counters["bus_bw"] =
      benchmark::Counter(bytes * bus_factor, benchmark::Counter::kIsIterationInvariantRate,
                         benchmark::Counter::kIs1024);
  state.counters["sent_vs_min"] =
      static_cast<double>(sent) / (static_cast<double>(state.iterations()) * bytes * bus_factor);
}

void Sizes(benchmark::internal::Benchmark* benchmark) {
  benchmark->RangeMultiplier(4)->Range(1 << 10, 64 << 20)->UseRealTime();
}

BENCHMARK_TEMPLATE(BM_Collective, Collective::kAllReduce)->Apply(Sizes);
BENCHMARK_TEMPLATE(BM_Collective, Collective::kAllGather)->Apply(Sizes);
BENCHMARK_TEMPLATE(BM_Collective, Collective::kReduceScatter)->Apply(Sizes);

}  // namespace
}  // namespace plait::parallel

int main(int argc, char** argv) { return plait::benchmarks::BenchmarkMain(argc, argv); }
