#include "parallel/nccl_communicator.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "ATen/core/Tensor.h"
#include "ATen/ops/allclose.h"
#include "ATen/ops/cat.h"
#include "ATen/ops/equal.h"
#include "ATen/ops/stack.h"
#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "torch/csrc/autograd/generated/variable_factories.h"
#include "torch/csrc/distributed/c10d/HashStore.hpp"

namespace plait::parallel {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::base::testing::StatusIs;
using ::testing::HasSubstr;

void CheckCuda(cudaError_t error, const char* call) {
  if (error != cudaSuccess) {
    throw std::runtime_error(absl::StrCat(call, " failed: ", cudaGetErrorString(error)));
  }
}

// A CUDA tensor on `device` holding a copy of the CPU tensor `host`. Its memory comes from
// cudaMalloc and is wrapped with at::for_blob, so the test needs no CUDA build of LibTorch:
// the communicator only reads a tensor's device, dtype, size and data pointer.
at::Tensor ToDevice(const at::Tensor& host, int device) {
  const at::Tensor source = host.contiguous();
  const size_t bytes = source.numel() * source.element_size();
  CheckCuda(cudaSetDevice(device), "cudaSetDevice");
  void* data = nullptr;
  CheckCuda(cudaMalloc(&data, std::max<size_t>(bytes, 1)), "cudaMalloc");
  at::Tensor tensor = at::for_blob(data, source.sizes())
                          .deleter([](void* memory) { EXPECT_EQ(cudaFree(memory), cudaSuccess); })
                          .options(source.options().device(at::kCUDA, device))
                          .target_device(at::Device(at::kCUDA, device))
                          .make_tensor();
  CheckCuda(cudaMemcpy(data, source.data_ptr(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
  return tensor;
}

// Elements [offset, offset + numel) of the 1-D CUDA tensor `base`, sharing its memory (a view,
// which a CPU-only LibTorch cannot make of a CUDA tensor). `base` must outlive it.
at::Tensor Alias(const at::Tensor& base, int64_t offset, int64_t numel) {
  return at::for_blob(static_cast<char*>(base.data_ptr()) + offset * base.element_size(), {numel})
      .options(base.options())
      .target_device(base.device())
      .make_tensor();
}

// A copy on the CPU, taken on the legacy default stream once Work::Wait() has ordered it after
// the collective.
at::Tensor ToHost(const at::Tensor& tensor) {
  at::Tensor host = torch::empty(tensor.sizes(), tensor.options().device(at::kCPU));
  CheckCuda(cudaSetDevice(tensor.get_device()), "cudaSetDevice");
  CheckCuda(cudaMemcpy(host.data_ptr(), tensor.data_ptr(), host.numel() * host.element_size(),
                       cudaMemcpyDeviceToHost),
            "cudaMemcpy");
  return host;
}

// Rank `rank`'s input: small integers, exact in every dtype, with the maximum held by
// different ranks at different elements.
at::Tensor RankInput(int rank, int64_t numel, at::ScalarType dtype) {
  at::Tensor index = torch::arange(numel, at::kLong);
  return ((index * (rank + 1)) % 11 - rank).to(dtype);
}

// The CPU reduction of every rank's RankInput, in float64.
at::Tensor Expected(int world_size, int64_t numel, at::ScalarType dtype, ReduceOp op) {
  std::vector<at::Tensor> inputs;
  for (int rank = 0; rank < world_size; ++rank) {
    inputs.push_back(RankInput(rank, numel, dtype).to(at::kDouble));
  }
  const at::Tensor stacked = at::stack(inputs);
  if (op == ReduceOp::kAverage) return stacked.mean(0);
  if (op == ReduceOp::kMax) return std::get<0>(stacked.max(0));
  return stacked.sum(0);
}

void ExpectClose(const at::Tensor& actual, const at::Tensor& expected) {
  const at::Tensor host = ToHost(actual).to(at::kDouble);
  EXPECT_TRUE(at::allclose(host, expected, /*rtol=*/1e-6, /*atol=*/1e-6))
      << "got " << host << "\nwant " << expected;
}

// Create checks its arguments and exchanges the NCCL unique id before touching CUDA, so these
// run on machines without a GPU too.
TEST(NcclCommunicatorCreateTest, RejectsBadArguments) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  EXPECT_THAT(NcclCommunicator::Create(c10::intrusive_ptr<c10d::Store>(), "dp", 0, 2, 0,
                                       CommunicatorOptions{}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("NCCL group 'dp' (rank 0 of 2, cuda:0): no store")));
  EXPECT_THAT(NcclCommunicator::Create(store, "dp", 2, 2, 0, CommunicatorOptions{}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank in [0, size)")));
  EXPECT_THAT(NcclCommunicator::Create(store, "dp", 0, 2, -1, CommunicatorOptions{}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("CUDA device")));
  CommunicatorOptions no_time;
  no_time.timeout = absl::ZeroDuration();
  EXPECT_THAT(NcclCommunicator::Create(store, "dp", 0, 2, 0, no_time),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("timeout must be positive")));
}

TEST(NcclCommunicatorCreateTest, TimesOutWhenRankZeroNeverPublishesTheId) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  CommunicatorOptions options;
  options.timeout = absl::Milliseconds(100);
  EXPECT_THAT(
      NcclCommunicator::Create(store, "lonely", 1, 2, 0, options),
      StatusIs(absl::StatusCode::kDeadlineExceeded,
               HasSubstr("connecting NCCL group 'lonely' (rank 1 of 2, cuda:0): rank 0 did not "
                         "publish the NCCL unique id under store key "
                         "'plait/nccl/lonely/unique_id' within 100ms")));
}

TEST(NcclCommunicatorCreateTest, RejectsAStoreValueThatIsNotAnId) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  store->set("plait/nccl/dp/unique_id", std::vector<uint8_t>{1, 2, 3});
  EXPECT_THAT(NcclCommunicator::Create(store, "dp", 1, 2, 0, CommunicatorOptions{}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("holds 3 bytes")));
}

TEST(NcclCommunicatorCreateTest, NamesTheFailingCudaCall) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  EXPECT_THAT(NcclCommunicator::Create(store, "solo", 0, 1, 1000, CommunicatorOptions{}),
              StatusIs(absl::StatusCode::kInternal,
                       HasSubstr("connecting NCCL group 'solo' (rank 0 of 1, cuda:1000): "
                                 "cudaSetDevice failed: ")));
}

class NcclCommunicatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const cudaError_t error = cudaGetDeviceCount(&world_size_);
    if (error != cudaSuccess) {
      GTEST_SKIP() << "CUDA sees no device: " << cudaGetErrorString(error);
    }
    if (world_size_ < 2) {
      GTEST_SKIP() << "needs at least 2 CUDA devices, one per rank; this machine has "
                   << world_size_;
    }
  }

  // Runs `body` as every rank of a new group `name`, each rank on its own thread and device.
  void RunRanks(const std::string& name, CommunicatorOptions options,
                const std::function<void(NcclCommunicator&)>& body) {
    auto store = c10::make_intrusive<c10d::HashStore>();
    std::vector<std::thread> threads;
    for (int rank = 0; rank < world_size_; ++rank) {
      threads.emplace_back([&, rank] {
        SCOPED_TRACE(absl::StrCat("rank ", rank));
        absl::StatusOr<std::unique_ptr<NcclCommunicator>> communicator =
            NcclCommunicator::Create(store, name, rank, world_size_, rank, options);
        ASSERT_THAT(communicator, IsOk());
        try {
          body(**communicator);
        } catch (const std::exception& error) {
          ADD_FAILURE() << error.what();
        }
      });
    }
    for (std::thread& thread : threads) thread.join();
  }

  void RunRanks(const std::string& name, const std::function<void(NcclCommunicator&)>& body) {
    CommunicatorOptions options;
    options.timeout = absl::Seconds(60);
    RunRanks(name, options, body);
  }

  int world_size_ = 0;
};

TEST_F(NcclCommunicatorTest, AllReduceMatchesTheCpuReduction) {
  constexpr int64_t kNumel = 1000;
  RunRanks("all_reduce", [&](NcclCommunicator& communicator) {
    const int rank = communicator.rank();
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMax}) {
      SCOPED_TRACE(static_cast<int>(op));
      at::Tensor tensor = ToDevice(RankInput(rank, kNumel, at::kFloat), rank);
      ASSERT_THAT(communicator.AllReduce(tensor, op)->Wait(), IsOk());
      ExpectClose(tensor, Expected(world_size_, kNumel, at::kFloat, op));
    }
    for (at::ScalarType dtype : {at::kLong, at::kBFloat16, at::kHalf}) {
      SCOPED_TRACE(c10::toString(dtype));
      at::Tensor tensor = ToDevice(RankInput(rank, kNumel, dtype), rank);
      ASSERT_THAT(communicator.AllReduce(tensor, ReduceOp::kSum)->Wait(), IsOk());
      ExpectClose(tensor, Expected(world_size_, kNumel, dtype, ReduceOp::kSum));
    }
  });
}

TEST_F(NcclCommunicatorTest, AllGatherWithAndWithoutPadding) {
  RunRanks("all_gather", [&](NcclCommunicator& communicator) {
    const int rank = communicator.rank();
    // Divisible by the world size; not divisible; fewer elements than ranks.
    for (int64_t total : {int64_t{world_size_} * 5, int64_t{world_size_} * 5 + 1, int64_t{1}}) {
      SCOPED_TRACE(absl::StrCat(total, " elements"));
      const at::Tensor full = torch::arange(total, at::kFloat) * 1.5;
      const Chunk chunk = ChunkOf(total, world_size_, rank);
      const at::Tensor input = ToDevice(full.narrow(0, chunk.offset, chunk.numel), rank);
      at::Tensor output = ToDevice(torch::zeros({total}), rank);
      ASSERT_THAT(communicator.AllGather(input, output)->Wait(), IsOk());
      ExpectClose(output, full.to(at::kDouble));

      // In place: the input is this rank's chunk of the output.
      at::Tensor in_place = ToDevice(torch::zeros({total}), rank);
      const at::Tensor own_chunk = Alias(in_place, chunk.offset, chunk.numel);
      CheckCuda(cudaMemcpy(own_chunk.data_ptr(), input.data_ptr(),
                           chunk.numel * input.element_size(), cudaMemcpyDeviceToDevice),
                "cudaMemcpy");
      ASSERT_THAT(communicator.AllGather(own_chunk, in_place)->Wait(), IsOk());
      ExpectClose(in_place, full.to(at::kDouble));
    }
    const Traffic traffic = communicator.traffic(Collective::kAllGather);
    EXPECT_EQ(traffic.calls, 6);
  });
}

TEST_F(NcclCommunicatorTest, ReduceScatterWithAndWithoutPadding) {
  RunRanks("reduce_scatter", [&](NcclCommunicator& communicator) {
    const int rank = communicator.rank();
    for (int64_t total : {int64_t{world_size_} * 5, int64_t{world_size_} * 5 + 1, int64_t{1}}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMax}) {
        SCOPED_TRACE(absl::StrCat(total, " elements, op ", static_cast<int>(op)));
        const Chunk chunk = ChunkOf(total, world_size_, rank);
        const at::Tensor input = ToDevice(RankInput(rank, total, at::kFloat), rank);
        at::Tensor output = ToDevice(torch::zeros({chunk.numel}), rank);
        ASSERT_THAT(communicator.ReduceScatter(input, output, op)->Wait(), IsOk());
        ExpectClose(
            output,
            Expected(world_size_, total, at::kFloat, op).narrow(0, chunk.offset, chunk.numel));
      }
    }
  });
}

TEST_F(NcclCommunicatorTest, BroadcastCopiesTheRootsTensor) {
  constexpr int64_t kNumel = 257;
  RunRanks("broadcast", [&](NcclCommunicator& communicator) {
    const int rank = communicator.rank();
    const int root = world_size_ - 1;
    at::Tensor tensor = ToDevice(RankInput(rank, kNumel, at::kFloat), rank);
    ASSERT_THAT(communicator.Broadcast(tensor, root)->Wait(), IsOk());
    ExpectClose(tensor, RankInput(root, kNumel, at::kDouble));

    const Traffic traffic = communicator.traffic(Collective::kBroadcast);
    const int64_t bytes = kNumel * static_cast<int64_t>(sizeof(float));
    EXPECT_EQ(traffic.bytes_sent, rank == root ? bytes : 0);
    EXPECT_EQ(traffic.bytes_received, rank == root ? 0 : bytes);
  });
}

TEST_F(NcclCommunicatorTest, BarrierAndRingTraffic) {
  constexpr int64_t kNumel = 1024;
  RunRanks("traffic", [&](NcclCommunicator& communicator) {
    const int rank = communicator.rank();
    ASSERT_THAT(communicator.Barrier()->Wait(), IsOk());
    EXPECT_EQ(communicator.traffic(Collective::kBarrier).calls, 1);

    at::Tensor tensor = ToDevice(RankInput(rank, kNumel, at::kFloat), rank);
    ASSERT_THAT(communicator.AllReduce(tensor, ReduceOp::kSum)->Wait(), IsOk());
    const Traffic traffic = communicator.traffic(Collective::kAllReduce);
    const int64_t ring_bytes = 2 * (world_size_ - 1) * kNumel * 4 / world_size_;
    EXPECT_EQ(traffic.calls, 1);
    EXPECT_EQ(traffic.bytes_sent, ring_bytes);
    EXPECT_EQ(traffic.bytes_received, ring_bytes);
  });
}

// counts[q][r] rows of shape [3, 5] from rank q to rank r: uneven, rank 0 sends nothing and
// the last rank receives nothing from the others.
TEST_F(NcclCommunicatorTest, AllToAllWithUnevenCountsAndZeros) {
  const int n = world_size_;
  std::vector<std::vector<int64_t>> counts(n, std::vector<int64_t>(n, 0));
  for (int q = 1; q < n; ++q) {
    for (int r = 0; r < n; ++r) counts[q][r] = r == n - 1 && q != r ? 0 : 1 + (q + 2 * r) % 4;
  }
  const auto sum = [](const std::vector<int64_t>& rows) {
    return std::accumulate(rows.begin(), rows.end(), int64_t{0});
  };
  // Rank q's rows: values below 251, exact in bf16, different for every sender.
  const auto input = [&](int q, at::ScalarType dtype) {
    const int64_t rows = sum(counts[q]);
    return (torch::arange(rows * 15, at::kLong) * 7 + 1000 * q)
        .remainder(251)
        .reshape({rows, 3, 5})
        .to(dtype);
  };
  RunRanks("all_to_all", [&](NcclCommunicator& communicator) {
    const int rank = communicator.rank();
    std::vector<int64_t> receive_rows;
    for (int q = 0; q < n; ++q) receive_rows.push_back(counts[q][rank]);
    int64_t bytes_sent = 0;
    int64_t bytes_received = 0;
    for (at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kLong}) {
      SCOPED_TRACE(c10::toString(dtype));
      std::vector<at::Tensor> expected;
      for (int q = 0; q < n; ++q) {
        const int64_t offset = sum({counts[q].begin(), counts[q].begin() + rank});
        expected.push_back(input(q, dtype).narrow(0, offset, counts[q][rank]));
      }
      const at::Tensor sent = ToDevice(input(rank, dtype), rank);
      at::Tensor output = ToDevice(torch::full({sum(receive_rows), 3, 5}, -1, dtype), rank);
      ASSERT_THAT(communicator.AllToAll(sent, output, counts[rank], receive_rows)->Wait(), IsOk());
      EXPECT_TRUE(at::equal(ToHost(output), at::cat(expected)));
      const int64_t row_bytes = 15 * c10::elementSize(dtype);
      bytes_sent += (sum(counts[rank]) - counts[rank][rank]) * row_bytes;
      bytes_received += (sum(receive_rows) - counts[rank][rank]) * row_bytes;
    }
    const Traffic traffic = communicator.traffic(Collective::kAllToAll);
    EXPECT_EQ(traffic.calls, 3);
    EXPECT_EQ(traffic.bytes_sent, bytes_sent);
    EXPECT_EQ(traffic.bytes_received, bytes_received);
  });
}

TEST_F(NcclCommunicatorTest, RejectsCpuTensorsAndStaysUsable) {
  RunRanks("cpu", [&](NcclCommunicator& communicator) {
    const int rank = communicator.rank();
    EXPECT_THAT(communicator.AllReduce(torch::ones({4}), ReduceOp::kSum)->Wait(),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr(absl::StrCat("all_reduce on group 'cpu' (rank ", rank, " of ",
                                                world_size_, "): tensor is on cpu"))));
    at::Tensor tensor = ToDevice(torch::ones({4}), rank);
    ASSERT_THAT(communicator.AllReduce(tensor, ReduceOp::kSum)->Wait(), IsOk());
    ExpectClose(tensor, torch::full({4}, static_cast<double>(world_size_), at::kDouble));
  });
}

TEST_F(NcclCommunicatorTest, TimesOutAbortsAndKeepsTheFirstError) {
  CommunicatorOptions options;
  options.timeout = absl::Seconds(10);
  absl::Notification rank0_done;
  RunRanks("timeout", options, [&](NcclCommunicator& communicator) {
    if (communicator.rank() != 0) {
      // Joins no collective, and keeps its communicator until rank 0 has timed out, so that
      // rank 0 sees a timeout rather than a peer that left.
      rank0_done.WaitForNotification();
      return;
    }
    const absl::Cleanup release_peers = [&] { rank0_done.Notify(); };
    at::Tensor tensor = ToDevice(torch::ones({16}), 0);
    const absl::Status status = communicator.AllReduce(tensor, ReduceOp::kSum)->Wait();
    EXPECT_THAT(status, StatusIs(absl::StatusCode::kDeadlineExceeded,
                                 HasSubstr(absl::StrCat("all_reduce on group 'timeout' (rank 0 of ",
                                                        world_size_, ")"))));
    EXPECT_THAT(status, StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("aborted")));
    EXPECT_EQ(communicator.Broadcast(tensor, 0)->Wait(), status);
  });
}

}  // namespace
}  // namespace plait::parallel
