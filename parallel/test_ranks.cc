#include "parallel/test_ranks.h"

#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "parallel/gloo_communicator.h"
#include "torch/csrc/distributed/c10d/HashStore.hpp"

namespace plait::parallel::testing {

void RunRanks(int num_ranks, const std::function<void(int rank)>& body) {
  std::vector<std::thread> threads;
  threads.reserve(num_ranks);
  for (int rank = 0; rank < num_ranks; ++rank) {
    threads.emplace_back([&body, rank] {
      SCOPED_TRACE(::testing::Message() << "rank " << rank);
      body(rank);
    });
  }
  for (std::thread& thread : threads) thread.join();
}

void RunOnGlooMesh(const MeshLayout& layout,
                   const std::function<void(int rank, DeviceMesh& mesh)>& body) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  RunRanks(layout.world_size(), [&](int rank) {
    absl::StatusOr<DeviceMesh> mesh = DeviceMesh::Create(
        layout, rank, GlooCommunicatorFactory(*store, GlooCommunicator::kLoopback));
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    body(rank, *mesh);
  });
}

}  // namespace plait::parallel::testing
