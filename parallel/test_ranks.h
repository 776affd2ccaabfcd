// Test helpers for running several ranks of a group inside one test process, one thread
// per rank, as the correctness tests of plait's parallel code do.
#ifndef PLAIT_PARALLEL_TEST_RANKS_H_
#define PLAIT_PARALLEL_TEST_RANKS_H_

#include <functional>
#include <string>

#include "ATen/core/Tensor.h"
#include "absl/time/time.h"
#include "parallel/device_mesh.h"
#include "parallel/ring_communicator.h"
#include "parallel/world.h"

namespace plait::parallel::testing {

// Runs `body(rank)` for every rank in [0, num_ranks) on its own thread and waits for all.
void RunRanks(int num_ranks, const std::function<void(int rank)>& body);

// Runs `body(rank, communicator)` for every rank of a fresh group `name` of `size` ring
// communicators on loopback (a store shared in memory), each on its own thread, with
// `timeout` for each operation.
void RunOnRingGroup(const std::string& name, int size,
                    const std::function<void(int rank, RingCommunicator& communicator)>& body,
                    absl::Duration timeout = absl::Seconds(30));

// Runs `body(rank, mesh)` for every rank of `layout` on its own thread, each with its
// DeviceMesh of ring communicators on loopback (a store shared in memory).
void RunOnRingMesh(const MeshLayout& layout,
                   const std::function<void(int rank, DeviceMesh& mesh)>& body);

// The same on `device_type`: on CUDA, rank r computes on cuda:r (bound on its thread) over
// NCCL (device.h); a test checks EnoughDevices first.
void RunOnMesh(const MeshLayout& layout, at::DeviceType device_type,
               const std::function<void(int rank, DeviceMesh& mesh)>& body);

// Rank `rank` of a local job of `world_size` ranks that meet through the file `store_file`
// (ProcessGroup::Start, with the ranks as threads of one test).
World LocalWorld(int rank, int world_size, const std::string& store_file);

// Whether `ranks` ranks on `device_type` have a device each; on CUDA, that many GPUs.
bool EnoughDevices(at::DeviceType device_type, int ranks);

// Where rank `rank` computes on `device_type`: the CPU, or cuda:rank.
at::Device RankDevice(at::DeviceType device_type, int rank);

}  // namespace plait::parallel::testing

#endif  // PLAIT_PARALLEL_TEST_RANKS_H_
