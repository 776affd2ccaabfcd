#include "parallel/test_ranks.h"

#include <thread>
#include <vector>

#include "ATen/core/Tensor.h"
#include "gtest/gtest.h"
#include "parallel/device.h"
#include "parallel/ring_communicator.h"
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

void RunOnRingGroup(const std::string& name, int size,
                    const std::function<void(int rank, RingCommunicator& communicator)>& body,
                    absl::Duration timeout) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  RunRanks(size, [&](int rank) {
    absl::StatusOr<std::unique_ptr<RingCommunicator>> communicator =
        RingCommunicator::Create(*store, name, rank, size, RingCommunicator::kLoopback, {timeout});
    ASSERT_TRUE(communicator.ok()) << communicator.status();
    body(rank, **communicator);
  });
}

void RunOnRingMesh(const MeshLayout& layout,
                   const std::function<void(int rank, DeviceMesh& mesh)>& body) {
  RunOnMesh(layout, at::kCPU, body);
}

void RunOnMesh(const MeshLayout& layout, at::DeviceType device_type,
               const std::function<void(int rank, DeviceMesh& mesh)>& body) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  RunRanks(layout.world_size(), [&](int rank) {
    const at::Device device = RankDevice(device_type, rank);
    const absl::Status bound = BindDevice(device);
    ASSERT_TRUE(bound.ok()) << bound;
    absl::StatusOr<DeviceMesh> mesh = DeviceMesh::Create(
        layout, rank, DeviceCommunicatorFactory(device, *store, RingCommunicator::kLoopback));
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    body(rank, *mesh);
  });
}

World LocalWorld(int rank, int world_size, const std::string& store_file) {
  World world;
  world.rank = rank;
  world.world_size = world_size;
  world.local_rank = rank;
  world.local_world_size = world_size;
  world.master_port = 1;  // unused: the ranks meet through the file
  world.store_file = store_file;
  return world;
}

bool EnoughDevices(at::DeviceType device_type, int ranks) {
  return device_type == at::kCPU || CudaDeviceCount() >= ranks;
}

at::Device RankDevice(at::DeviceType device_type, int rank) {
  if (device_type == at::kCPU) return at::kCPU;
  return at::Device(device_type, static_cast<c10::DeviceIndex>(rank));
}

}  // namespace plait::parallel::testing
