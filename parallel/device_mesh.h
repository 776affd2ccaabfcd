// The world arranged as a grid of named dimensions (mesh.proto), and the communicator of each
// dimension for the calling rank: the group of ranks that differ from it along that dimension
// only. On 4 ranks with dims dp=2, tp=2, rank 3 sits at (dp 1, tp 1); its tp group is {2, 3}
// and its dp group {1, 3}.
//
//   PLAIT_ASSIGN_OR_RETURN(MeshLayout layout, MeshLayout::Create(config, world.world_size));
//   PLAIT_ASSIGN_OR_RETURN(DeviceMesh mesh, DeviceMesh::Create(layout, world.rank,
//       [&](const std::string& name, int rank, int size) {
//         return RingCommunicator::Create(*store, name, rank, size, address);
//       }));
//   PLAIT_ASSIGN_OR_RETURN(Communicator* dp, mesh.communicator("dp"));
//   PLAIT_RETURN_IF_ERROR(mesh.AllReduce(loss, ReduceOp::kAverage));  // over every rank
//
// A config without dimensions describes one rank (a plan that names no mesh).
#ifndef PLAIT_PARALLEL_DEVICE_MESH_H_
#define PLAIT_PARALLEL_DEVICE_MESH_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "base/violation.h"
#include "parallel/communicator.h"
#include "parallel/mesh.pb.h"

namespace plait::parallel {

// The most ranks a mesh may have: far beyond any job, and small enough that rank arithmetic
// in `int` never overflows.
inline constexpr int64_t kMaxMeshRanks = int64_t{1} << 24;

// How long a collective, and the rendezvous at start-up, wait for the other ranks unless
// MeshConfig says otherwise, and the longest either may say.
inline constexpr absl::Duration kDefaultCollectiveTimeout = absl::Minutes(5);
inline constexpr absl::Duration kDefaultRendezvousTimeout = absl::Minutes(5);
inline constexpr int kMaxCollectiveTimeoutSeconds = 24 * 60 * 60;

// MeshConfig::collective_timeout_seconds, with 0 read as kDefaultCollectiveTimeout.
absl::Duration CollectiveTimeout(const MeshConfig& config);

// MeshConfig::rendezvous_timeout_seconds, with 0 read as kDefaultRendezvousTimeout.
absl::Duration RendezvousTimeout(const MeshConfig& config);

// The number of ranks `config` describes: the product of its sizes, 1 without dimensions;
// kMaxMeshRanks + 1 for any product above kMaxMeshRanks (so it never overflows), 0 when a
// size is below 1.
int64_t MeshRanks(const MeshConfig& config);

// The number of ranks in the sub-grid of `config` spanned by the dimensions named `dims`
// (those `config` has): the product of their sizes, 1 for none. Always in
// [1, kMaxMeshRanks + 1], so callers may divide by it and multiply it: a size below 1 counts
// as 1 and a product above kMaxMeshRanks is kMaxMeshRanks + 1 (CheckMeshConfig names both).
int64_t SubmeshRanks(const MeshConfig& config, const std::set<std::string>& dims);

// Every problem of `config` on a world of `world_size` ranks (a dimension without a name, a
// name twice, a size below 1, sizes that do not multiply to the world size, a collective
// timeout out of range), fields named
// from `field` ("plan.mesh"); empty when it is valid.
std::vector<base::Violation> CheckMeshConfig(const MeshConfig& config, int world_size,
                                             const std::string& field);

// The shape of a mesh: which ranks share a group along each dimension. Pure arithmetic,
// no communication.
class MeshLayout {
 public:
  // Checks `config` against the world size (CheckMeshConfig); errors name the field
  // (mesh.dims[i].size, ...).
  // Without dimensions, a one-rank world gets one dimension "world" of size 1, so that
  // wrappers find a dimension all the same.
  static absl::StatusOr<MeshLayout> Create(const MeshConfig& config, int world_size);

  int world_size() const { return world_size_; }
  int num_dims() const { return static_cast<int>(names_.size()); }
  const std::vector<std::string>& dim_names() const { return names_; }
  int dim_size(int dim) const { return sizes_[dim]; }

  // The index of dimension `name`; NotFound naming the dimensions there are.
  absl::StatusOr<int> DimIndex(absl::string_view name) const;

  // The coordinate of `rank` along `dim`, which is also its rank in that dimension's group.
  int Coordinate(int rank, int dim) const;

  // The ranks of the group of `rank` along `dim`, in order of their coordinate.
  std::vector<int> GroupRanks(int rank, int dim) const { return SubgridRanks(rank, {dim}); }

  // A name for that group, the same on every member and different for every group:
  // "tp" for the only group of a one-dimensional mesh, else e.g. "tp[dp=1]".
  std::string GroupName(int rank, int dim) const { return SubgridName(rank, {dim}); }

  // The same for the group of `rank` spanning the dimensions `dims` (indices, ascending): the
  // ranks that differ from it along those only, in row-major order of their coordinates on
  // them; `rank`'s index among them; and the group's name, e.g. "dp,ep[tp=1]".
  std::vector<int> SubgridRanks(int rank, const std::vector<int>& dims) const;
  int SubgridIndex(int rank, const std::vector<int>& dims) const;
  std::string SubgridName(int rank, const std::vector<int>& dims) const;

 private:
  MeshLayout(std::vector<std::string> names, std::vector<int> sizes, int world_size);

  int Stride(int dim) const;

  std::vector<std::string> names_;
  std::vector<int> sizes_;
  int world_size_;
};

// Creates the communicator of one group: its name, the caller's rank in it, and its size.
using CommunicatorFactory = std::function<absl::StatusOr<std::unique_ptr<Communicator>>(
    const std::string& name, int rank, int size)>;

// A MeshLayout with the calling rank's communicator along every dimension.
class DeviceMesh {
 public:
  // Creates the calling rank's group along every dimension, in dimension order (every rank
  // of the world must call it with the same layout).
  static absl::StatusOr<DeviceMesh> Create(const MeshLayout& layout, int rank,
                                           const CommunicatorFactory& factory);

  const MeshLayout& layout() const { return layout_; }
  int rank() const { return rank_; }

  // The device its communicators reach: where this rank computes.
  at::Device device() const { return groups_.front()->device(); }

  // The calling rank's communicator along dimension `name`; NotFound if there is none.
  absl::StatusOr<Communicator*> communicator(absl::string_view name) const;

  // The calling rank's communicator over the sub-grid spanned by dimensions `names` (FSDP's
  // parts that it shards over two dimensions), its rank there the caller's SubgridRankAndSize;
  // for one dimension, that dimension's. Created by the factory the first time it is asked
  // for, when every rank of the group must ask for it too (as every rank applies a plan's
  // steps), and kept. NotFound for a dimension the mesh lacks.
  absl::StatusOr<Communicator*> SubgridCommunicator(const std::vector<std::string>& names) const;

  // Every communicator it has created: each dimension's, then the sub-grids'.
  std::vector<Communicator*> communicators() const;

  // The calling rank's coordinate along dimension `name`.
  absl::StatusOr<int> coordinate(absl::string_view name) const;

  // The calling rank's index and the number of ranks in the sub-grid spanned by dimensions
  // `names` (row-major in mesh order): e.g. its data-parallel rank and width when `names` are
  // the dimensions over which the batch is split. NotFound for a dimension the mesh lacks.
  absl::StatusOr<std::pair<int, int>> SubgridRankAndSize(
      const std::vector<std::string>& names) const;

  // Starts training step `step` (from 1) on every communicator (Communicator::BeginStep), so
  // that a collective's error names the step and its index in it. Every rank calls it.
  void BeginStep(int64_t step) const;

  // Reduces `tensor` in place over every rank of the mesh, one dimension after another (for
  // a sum or an average, the same as over the world at once). Every rank must call it.
  absl::Status AllReduce(at::Tensor& tensor, ReduceOp op) const;

  // Each rank's `value`, in rank order, on every rank (a sum over the mesh of one-hot rows).
  // Every rank must call it.
  absl::StatusOr<std::vector<int64_t>> PerRank(int64_t value) const;

  // Whether every rank's `own` is OK, known to every rank: `own` when it is an error, Aborted
  // naming the ranks that failed when another rank's is, OK when all are. Also a barrier.
  // `what` ("saving step-00000100") starts the errors.
  absl::Status Agree(const absl::Status& own, absl::string_view what) const;

 private:
  DeviceMesh(MeshLayout layout, int rank, std::vector<std::unique_ptr<Communicator>> groups,
             CommunicatorFactory factory);

  // The indices of dimensions `names`, ascending and each once; NotFound for one it lacks.
  absl::StatusOr<std::vector<int>> DimIndices(const std::vector<std::string>& names) const;

  MeshLayout layout_;
  int rank_;
  std::vector<std::unique_ptr<Communicator>> groups_;  // one per dimension
  CommunicatorFactory factory_;
  // The sub-grids' communicators created so far, by group name: a cache SubgridCommunicator
  // fills on demand.
  mutable std::map<std::string, std::unique_ptr<Communicator>> subgrids_;
};

}  // namespace plait::parallel

#endif  // PLAIT_PARALLEL_DEVICE_MESH_H_
