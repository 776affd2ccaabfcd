#include "parallel/device_mesh.h"

#include <algorithm>
#include <set>
#include <tuple>
#include <utility>

#include "ATen/core/Tensor.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"
#include "base/violation.h"
#include "torch/csrc/autograd/generated/variable_factories.h"

namespace plait::parallel {

std::vector<base::Violation> CheckMeshConfig(const MeshConfig& config, int world_size,
                                             const std::string& field) {
  std::vector<base::Violation> violations;
  auto add = [&](std::string where, std::string message) {
    violations.push_back({std::move(where), std::move(message), ""});
  };
  absl::flat_hash_set<std::string> names;
  std::vector<std::string> shape;
  for (int i = 0; i < config.dims_size(); ++i) {
    const MeshConfig::Dimension& dim = config.dims(i);
    const std::string dim_field = absl::StrCat(field, ".dims[", i, "]");
    if (dim.name().empty()) add(dim_field + ".name", "is empty; name every mesh dimension");
    if (!names.insert(dim.name()).second) {
      add(dim_field + ".name", absl::StrCat("\"", dim.name(), "\" appears twice"));
    }
    if (dim.size() < 1) add(dim_field + ".size", absl::StrCat(dim.size(), "; must be >= 1"));
    shape.push_back(absl::StrCat(dim.name(), "=", dim.size()));
  }
  for (const auto& [name, seconds, default_timeout] :
       {std::tuple{"collective_timeout_seconds", config.collective_timeout_seconds(),
                   kDefaultCollectiveTimeout},
        std::tuple{"rendezvous_timeout_seconds", config.rendezvous_timeout_seconds(),
                   kDefaultRendezvousTimeout}}) {
    if (seconds < 0 || seconds > kMaxCollectiveTimeoutSeconds) {
      add(absl::StrCat(field, ".", name),
          absl::StrCat(seconds, "; must be between 0 (the default, ",
                       absl::FormatDuration(default_timeout), ") and ",
                       kMaxCollectiveTimeoutSeconds, " (a day)"));
    }
  }
  const int64_t ranks = MeshRanks(config);
  if (ranks > kMaxMeshRanks) {
    add(field,
        absl::StrCat(absl::StrJoin(shape, " x "), " makes more than ", kMaxMeshRanks, " ranks"));
  } else if (ranks != world_size) {
    add(field,
        absl::StrCat(shape.empty() ? "no dimensions (one rank)" : absl::StrJoin(shape, " x "),
                     " makes ", ranks, " ranks, but the world has ", world_size,
                     "; the mesh's sizes must multiply to the world size"));
  }
  return violations;
}

absl::Duration CollectiveTimeout(const MeshConfig& config) {
  return config.collective_timeout_seconds() > 0
             ? absl::Seconds(config.collective_timeout_seconds())
             : kDefaultCollectiveTimeout;
}

absl::Duration RendezvousTimeout(const MeshConfig& config) {
  return config.rendezvous_timeout_seconds() > 0
             ? absl::Seconds(config.rendezvous_timeout_seconds())
             : kDefaultRendezvousTimeout;
}

absl::StatusOr<MeshLayout> MeshLayout::Create(const MeshConfig& config, int world_size) {
  PLAIT_RETURN_IF_ERROR(base::ViolationsToStatus(CheckMeshConfig(config, world_size, "mesh")));
  if (config.dims().empty()) return MeshLayout({"world"}, {1}, 1);
  std::vector<std::string> names;
  std::vector<int> sizes;
  for (const MeshConfig::Dimension& dim : config.dims()) {
    names.push_back(dim.name());
    sizes.push_back(dim.size());
  }
  return MeshLayout(std::move(names), std::move(sizes), world_size);
}

MeshLayout::MeshLayout(std::vector<std::string> names, std::vector<int> sizes, int world_size)
    : names_(std::move(names)), sizes_(std::move(sizes)), world_size_(world_size) {}

absl::StatusOr<int> MeshLayout::DimIndex(absl::string_view name) const {
  for (int dim = 0; dim < num_dims(); ++dim) {
    if (names_[dim] == name) return dim;
  }
  return absl::NotFoundError(absl::StrCat("the mesh has no dimension \"", name,
                                          "\"; its dimensions are ", absl::StrJoin(names_, ", ")));
}

int MeshLayout::Stride(int dim) const {
  int stride = 1;
  for (int later = dim + 1; later < num_dims(); ++later) stride *= sizes_[later];
  return stride;
}

int MeshLayout::Coordinate(int rank, int dim) const { return (rank / Stride(dim)) % sizes_[dim]; }

std::vector<int> MeshLayout::SubgridRanks(int rank, const std::vector<int>& dims) const {
  int first = rank;
  for (int dim : dims) first -= Coordinate(rank, dim) * Stride(dim);
  std::vector<int> ranks = {first};
  // Row-major: the last dimension's coordinate varies fastest.
  for (int dim : dims) {
    std::vector<int> grown;
    for (int base : ranks) {
      for (int i = 0; i < sizes_[dim]; ++i) grown.push_back(base + i * Stride(dim));
    }
    ranks = std::move(grown);
  }
  return ranks;
}

int MeshLayout::SubgridIndex(int rank, const std::vector<int>& dims) const {
  int index = 0;
  for (int dim : dims) index = index * sizes_[dim] + Coordinate(rank, dim);
  return index;
}

std::string MeshLayout::SubgridName(int rank, const std::vector<int>& dims) const {
  std::vector<std::string> spanned;
  std::vector<std::string> others;
  for (int dim = 0; dim < num_dims(); ++dim) {
    if (std::find(dims.begin(), dims.end(), dim) != dims.end()) {
      spanned.push_back(names_[dim]);
    } else {
      others.push_back(absl::StrCat(names_[dim], "=", Coordinate(rank, dim)));
    }
  }
  const std::string name = absl::StrJoin(spanned, ",");
  if (others.empty()) return name;
  return absl::StrCat(name, "[", absl::StrJoin(others, ","), "]");
}

absl::StatusOr<DeviceMesh> DeviceMesh::Create(const MeshLayout& layout, int rank,
                                              const CommunicatorFactory& factory) {
  if (rank < 0 || rank >= layout.world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is not in the mesh's world of ", layout.world_size()));
  }
  std::vector<std::unique_ptr<Communicator>> groups;
  for (int dim = 0; dim < layout.num_dims(); ++dim) {
    PLAIT_ASSIGN_OR_RETURN(
        std::unique_ptr<Communicator> group,
        factory(layout.GroupName(rank, dim), layout.Coordinate(rank, dim), layout.dim_size(dim)));
    groups.push_back(std::move(group));
  }
  return DeviceMesh(layout, rank, std::move(groups), factory);
}

DeviceMesh::DeviceMesh(MeshLayout layout, int rank,
                       std::vector<std::unique_ptr<Communicator>> groups,
                       CommunicatorFactory factory)
    : layout_(std::move(layout)),
      rank_(rank),
      groups_(std::move(groups)),
      factory_(std::move(factory)) {}

absl::StatusOr<Communicator*> DeviceMesh::communicator(absl::string_view name) const {
  PLAIT_ASSIGN_OR_RETURN(int dim, layout_.DimIndex(name));
  return groups_[dim].get();
}

absl::StatusOr<Communicator*> DeviceMesh::SubgridCommunicator(
    const std::vector<std::string>& names) const {
  PLAIT_ASSIGN_OR_RETURN(const std::vector<int> spanned, DimIndices(names));
  if (spanned.size() == 1) return groups_[spanned.front()].get();
  const std::string name = layout_.SubgridName(rank_, spanned);
  std::unique_ptr<Communicator>& group = subgrids_[name];
  if (group == nullptr) {
    absl::StatusOr<std::unique_ptr<Communicator>> created =
        factory_(name, layout_.SubgridIndex(rank_, spanned),
                 static_cast<int>(layout_.SubgridRanks(rank_, spanned).size()));
    if (!created.ok()) {
      subgrids_.erase(name);
      return created.status();
    }
    group = *std::move(created);
  }
  return group.get();
}

std::vector<Communicator*> DeviceMesh::communicators() const {
  std::vector<Communicator*> all;
  for (const std::unique_ptr<Communicator>& group : groups_) all.push_back(group.get());
  for (const auto& [name, group] : subgrids_) all.push_back(group.get());
  return all;
}

absl::StatusOr<int> DeviceMesh::coordinate(absl::string_view name) const {
  PLAIT_ASSIGN_OR_RETURN(int dim, layout_.DimIndex(name));
  return layout_.Coordinate(rank_, dim);
}

int64_t MeshRanks(const MeshConfig& config) {
  int64_t ranks = 1;
  for (const MeshConfig::Dimension& dim : config.dims()) {
    if (dim.size() < 1) return 0;  // an invalid size; CheckMeshConfig names it
    ranks *= dim.size();
    if (ranks > kMaxMeshRanks) return kMaxMeshRanks + 1;
  }
  return ranks;
}

int64_t SubmeshRanks(const MeshConfig& config, const std::set<std::string>& dims) {
  int64_t ranks = 1;
  for (const MeshConfig::Dimension& dim : config.dims()) {
    // An invalid size counts as 1; CheckMeshConfig names it.
    if (dims.count(dim.name()) == 0 || dim.size() < 1) continue;
    ranks *= dim.size();
    if (ranks > kMaxMeshRanks) return kMaxMeshRanks + 1;
  }
  return ranks;
}

absl::StatusOr<std::pair<int, int>> DeviceMesh::SubgridRankAndSize(
    const std::vector<std::string>& names) const {
  PLAIT_ASSIGN_OR_RETURN(const std::vector<int> dims, DimIndices(names));
  return std::make_pair(layout_.SubgridIndex(rank_, dims),
                        static_cast<int>(layout_.SubgridRanks(rank_, dims).size()));
}

absl::StatusOr<std::vector<int>> DeviceMesh::DimIndices(
    const std::vector<std::string>& names) const {
  std::set<int> dims;
  for (const std::string& name : names) {
    PLAIT_ASSIGN_OR_RETURN(int dim, layout_.DimIndex(name));
    dims.insert(dim);
  }
  return std::vector<int>(dims.begin(), dims.end());
}

absl::Status DeviceMesh::AllReduce(at::Tensor& tensor, ReduceOp op) const {
  for (int dim = 0; dim < layout_.num_dims(); ++dim) {
    if (layout_.dim_size(dim) == 1) continue;
    absl::Status status = groups_[dim]->AllReduce(tensor, op)->Wait();
    if (!status.ok()) {
      return base::Annotate(status,
                            absl::StrCat("reducing over \"", layout_.dim_names()[dim], "\""));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> DeviceMesh::PerRank(int64_t value) const {
  at::Tensor one_hot = torch::zeros({layout_.world_size()}, at::TensorOptions(at::kLong));
  one_hot.data_ptr<int64_t>()[rank()] = value;
  at::Tensor gathered = one_hot.to(device());
  PLAIT_RETURN_IF_ERROR(AllReduce(gathered, ReduceOp::kSum));
  gathered = gathered.cpu();
  const int64_t* const values = gathered.data_ptr<int64_t>();
  return std::vector<int64_t>(values, values + gathered.numel());
}

void DeviceMesh::BeginStep(int64_t step) const {
  for (Communicator* group : communicators()) group->BeginStep(step);
}

absl::Status DeviceMesh::Agree(const absl::Status& own, absl::string_view what) const {
  // A one-hot vector of the failed ranks, summed over the mesh.
  at::Tensor failed =
      torch::zeros({layout_.world_size()}, at::TensorOptions(at::kFloat).device(device()));
  if (!own.ok()) failed[rank_] = 1.0f;
  PLAIT_RETURN_IF_ERROR(base::Annotate(AllReduce(failed, ReduceOp::kSum), what));
  if (!own.ok()) return own;
  failed = failed.cpu();
  std::vector<int> ranks;
  for (int r = 0; r < layout_.world_size(); ++r) {
    if (failed[r].item<float>() != 0.0f) ranks.push_back(r);
  }
  if (ranks.empty()) return absl::OkStatus();
  return absl::AbortedError(absl::StrCat(what, ": rank", ranks.size() > 1 ? "s " : " ",
                                         absl::StrJoin(ranks, ", "),
                                         " failed (see their errors); this rank stops too"));
}

}  // namespace plait::parallel
