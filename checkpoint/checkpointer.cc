#include "checkpoint/checkpointer.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <system_error>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "base/file.h"
#include "base/json.h"
#include "base/status.h"
#include "models/safetensors.h"
#include "nlohmann/json.hpp"
#include "torch/csrc/autograd/generated/variable_factories.h"

namespace plait::checkpoint {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr char kTemporaryPrefix[] = ".tmp-";
// The rank files' __metadata__ key for the global shape, offsets and checksum of each slice.
constexpr char kSlicesKey[] = "slices";

std::string Shape(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::string MeshShape(const parallel::MeshLayout& layout) {
  std::vector<std::string> dims;
  for (int i = 0; i < layout.num_dims(); ++i) {
    dims.push_back(absl::StrCat(layout.dim_names()[i], "=", layout.dim_size(i)));
  }
  return absl::StrJoin(dims, " x ");
}

// What a tensor named `name` is, by the longest prefix of `run.kind_by_prefix` it has.
std::string Kind(const RunInfo& run, const std::string& name) {
  const std::string* kind = nullptr;
  size_t longest = 0;
  for (const auto& [prefix, what] : run.kind_by_prefix) {
    if (absl::StartsWith(name, prefix) && (kind == nullptr || prefix.size() > longest)) {
      kind = &what;
      longest = prefix.size();
    }
  }
  return kind == nullptr ? "tensor" : *kind;
}

absl::Status FileError(const std::string& field, const std::string& action, const std::string& path,
                       const std::error_code& error) {
  return absl::InvalidArgumentError(
      absl::StrCat(field, ".dir: cannot ", action, " \"", path, "\": ", error.message()));
}

// The lock file that marks a checkpoint folder as in use by a run.
constexpr char kLockName[] = ".lock";

// Rank 0's exclusive hold on `dir` (created if missing) for as long as the result lives:
// a second run on the same folder would overwrite and prune the first one's checkpoints.
// The holder's pid and host are written into the lock file for the other run's error; the
// kernel releases the lock when the process ends, however it ends.
absl::StatusOr<std::shared_ptr<const int>> LockFolder(const std::string& dir,
                                                      const std::string& field) {
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) return FileError(field, "create", dir, error);
  const std::string path = absl::StrCat(dir, "/", kLockName);
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".dir: cannot open \"", path, "\": ", std::strerror(errno)));
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    close(fd);
    const std::string holder(absl::StripAsciiWhitespace(base::ReadFile(path).value_or("")));
    return absl::FailedPreconditionError(absl::StrCat(
        field, ".dir: \"", dir, "\" is in use by another run (",
        holder.empty() ? "its lock names no holder" : holder,
        "); two runs on one folder would overwrite each other's checkpoints: wait for it to end, "
        "or choose another dir"));
  }
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  const std::string holder = absl::StrCat("pid ", getpid(), " on ", host, "\n");
  // Without the note the lock still holds; another run's error then names no holder. The note
  // is written over the old one and the file cut to it, never truncated to 0 first: ext4
  // flushes a file truncated to 0 when it is closed, and the next Open's truncation then
  // waits for that flush (a millisecond or more per Open).
  if (pwrite(fd, holder.data(), holder.size(), 0) == static_cast<ssize_t>(holder.size())) {
    (void)!ftruncate(fd, static_cast<off_t>(holder.size()));
  }
  return std::shared_ptr<const int>(new int(fd), [](const int* held) {
    close(*held);
    delete held;
  });
}

// The steps of the checkpoint folders in `dir`, ascending; none when `dir` does not exist.
absl::StatusOr<std::vector<int64_t>> ListCheckpoints(const std::string& dir,
                                                     const std::string& field) {
  std::vector<int64_t> steps;
  std::error_code error;
  if (!fs::exists(dir, error)) return steps;
  for (fs::directory_iterator it(dir, error), end; !error && it != end; it.increment(error)) {
    if (!it->is_directory()) continue;
    if (std::optional<int64_t> step = StepOfName(it->path().filename().string())) {
      steps.push_back(*step);
    }
  }
  if (error) return FileError(field, "list", dir, error);
  std::sort(steps.begin(), steps.end());
  return steps;
}

// Checks that `slice` fits `tensor` (a local tensor holding at least the box's elements) and
// returns the box's data, contiguous in host memory.
absl::StatusOr<at::Tensor> SavedData(const std::string& name, const SlicedTensor& tensor) {
  const parallel::TensorSlice& slice = tensor.slice;
  bool fits = slice.box.offsets.size() == slice.global_shape.size() &&
              slice.box.lengths.size() == slice.global_shape.size() &&
              slice.box.numel() <= tensor.tensor.numel();
  for (size_t d = 0; fits && d < slice.global_shape.size(); ++d) {
    fits = slice.box.offsets[d] >= 0 && slice.box.lengths[d] >= 0 &&
           slice.box.offsets[d] + slice.box.lengths[d] <= slice.global_shape[d];
  }
  if (!fits) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": the slice ", slice.DebugString(),
                                                   " does not fit its local tensor of shape ",
                                                   Shape(tensor.tensor.sizes().vec())));
  }
  return slice.DataOf(tensor.tensor.detach()).cpu().contiguous();
}

// Rank 0's manifest of a saved checkpoint in `folder`: the tensors' dtypes and global shapes
// from rank 0's `state`, or, for a tensor rank 0 does not hold (another pipeline stage's),
// from the file of the first rank that saved it; their slices from every rank file's header.
absl::StatusOr<Manifest> CollectManifest(const std::string& folder, int world_size,
                                         const RankState& state) {
  Manifest manifest;
  for (const auto& [name, tensor] : state.tensors) {
    manifest.tensors[name] = {tensor.tensor.scalar_type(), tensor.slice.global_shape, {}};
  }
  for (int rank = 0; rank < world_size; ++rank) {
    const std::string file = RankFileName(rank, world_size);
    const std::string path = absl::StrCat(folder, "/", file);
    PLAIT_ASSIGN_OR_RETURN(std::unique_ptr<models::SafetensorsFile> opened,
                           models::SafetensorsFile::Open(path));
    const auto slices = opened->metadata().find(kSlicesKey);
    Json json;  // null when the file describes no slices: each tensor below is then refused
    if (slices != opened->metadata().end()) {
      PLAIT_ASSIGN_OR_RETURN(
          json, base::ParseJson(absl::StrCat(path, ": metadata ", kSlicesKey), slices->second));
    }
    for (const auto& [name, entry] : opened->entries()) {
      const auto saved = json.is_object() ? json.find(name) : json.end();
      if (saved == json.end() || !saved->is_object()) {
        return absl::InternalError(
            absl::StrCat(path, ": ", name, ": saved by rank ", rank, " but not described by it"));
      }
      auto it = manifest.tensors.find(name);
      if (it == manifest.tensors.end()) {
        it = manifest.tensors
                 .emplace(
                     name,
                     StoredTensor{entry.dtype, saved->value("shape", std::vector<int64_t>{}), {}})
                 .first;
      }
      it->second.slices.push_back({file,
                                   {saved->value("offsets", std::vector<int64_t>{}), entry.shape},
                                   saved->value("checksum", "")});
    }
  }
  return manifest;
}

}  // namespace

SlicedTensor Whole(at::Tensor tensor) {
  parallel::TensorSlice slice = parallel::TensorSlice::Whole(tensor.sizes());
  return {std::move(tensor), std::move(slice)};
}

std::string CheckpointName(int64_t step) { return absl::StrFormat("step-%08d", step); }

std::optional<int64_t> StepOfName(const std::string& name) {
  absl::string_view rest = name;
  int64_t step = 0;
  if (!absl::ConsumePrefix(&rest, "step-") || rest.empty() ||
      rest.find_first_not_of("0123456789") != absl::string_view::npos ||
      !absl::SimpleAtoi(rest, &step)) {
    return std::nullopt;
  }
  return step;
}

std::vector<std::string> SavedStepProblems(const Manifest& manifest, int64_t folder_step,
                                           int64_t position_per_step) {
  std::vector<std::string> problems;
  const int64_t step = manifest.step;
  if (step != folder_step) {
    problems.push_back(
        absl::StrCat("step: ", step, " in the file, ", folder_step, " in the folder's name"));
  }
  if (step < 1) problems.push_back(absl::StrCat("step: ", step, " in the file; must be >= 1"));
  const int64_t position = manifest.data_position;
  if (position_per_step > 0 && step >= 1) {
    int64_t expected = 0;
    const bool overflow = __builtin_mul_overflow(step, position_per_step, &expected);
    if (overflow || position != expected) {
      problems.push_back(absl::StrCat("data_position: ", position, " in the file, ",
                                      overflow ? "more than 2^63 - 1" : absl::StrCat(expected),
                                      " expected after step ", step, " (", position_per_step,
                                      " per step)"));
    }
  } else if (position < 0) {
    // A count of what the caller has read, even where the run does not check it.
    problems.push_back(absl::StrCat("data_position: ", position, " in the file; must be >= 0"));
  }
  return problems;
}

std::string RankFileName(int rank, int world_size) {
  return absl::StrFormat("rank-%05d-of-%05d.safetensors", rank, world_size);
}

absl::StatusOr<Checkpointer> Checkpointer::Open(const CheckpointConfig& config,
                                                const std::string& dir, RunInfo run,
                                                const parallel::DeviceMesh& mesh) {
  Checkpointer checkpointer(mesh);
  if (dir.empty()) return checkpointer;
  checkpointer.dir_ = dir;
  checkpointer.config_ = config;
  checkpointer.run_ = std::move(run);
  checkpointer.mesh_shape_ = MeshShape(mesh.layout());
  const RunInfo& r = checkpointer.run_;
  if (mesh.rank() == 0) {
    PLAIT_ASSIGN_OR_RETURN(checkpointer.lock_, LockFolder(dir, r.config_field));
  }

  PLAIT_ASSIGN_OR_RETURN(const std::vector<int64_t> steps, ListCheckpoints(dir, r.config_field));
  if (steps.empty()) return checkpointer;
  const std::string newest = absl::StrCat(dir, "/", CheckpointName(steps.back()));
  if (!config.resume()) {
    return absl::FailedPreconditionError(absl::StrCat(
        r.config_field, ".dir: \"", dir, "\" already holds checkpoints (newest ", newest, "); set ",
        r.config_field, ".resume to continue from it, or choose another dir"));
  }
  const std::string path = absl::StrCat(newest, "/", kManifest);
  PLAIT_ASSIGN_OR_RETURN(Manifest manifest, ReadManifest(path));
  const int64_t step = manifest.step;
  checkpointer.resume_position_ = manifest.data_position;
  std::vector<std::string> problems =
      SavedStepProblems(manifest, steps.back(), r.position_per_step);
  for (const auto& [field, value] : r.fingerprint) {
    const auto it = manifest.fingerprint.find(field);
    const std::string saved = it == manifest.fingerprint.end() ? "(none)" : it->second;
    if (saved != value) {
      problems.push_back(absl::StrCat("fingerprint.", field, ": \"", saved,
                                      "\" in the checkpoint, \"", value,
                                      "\" in this plan; a resume must not change it"));
    }
  }
  if (step > r.steps) {
    problems.push_back(absl::StrCat("step: ", step, " in the checkpoint, past ", r.steps_field,
                                    " (", r.steps, ")"));
  }
  if (!problems.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": cannot resume from it:\n  ", absl::StrJoin(problems, "\n  ")));
  }
  checkpointer.resume_step_ = step;
  checkpointer.manifest_ = std::make_shared<const Manifest>(std::move(manifest));
  return checkpointer;
}

absl::Status Checkpointer::Restore(const std::map<std::string, SlicedTensor>& expected,
                                   const std::function<absl::Status(RankState)>& load) const {
  if (resume_step_ == 0) return absl::OkStatus();
  const std::string folder = absl::StrCat(dir_, "/", CheckpointName(resume_step_));
  const Manifest& manifest = *manifest_;
  // Which of the checkpoint's tensors some rank holds (a pipeline's ranks hold only their
  // stage's): one that none does is no part of this run.
  at::Tensor held = torch::zeros({static_cast<int64_t>(manifest.tensors.size())});
  {
    int64_t i = 0;
    for (const auto& [name, stored] : manifest.tensors) held[i++] = expected.count(name) > 0;
  }
  held = held.to(mesh_->device());
  PLAIT_RETURN_IF_ERROR(base::Annotate(mesh_->AllReduce(held, parallel::ReduceOp::kSum),
                                       absl::StrCat("resuming from ", folder)));
  held = held.cpu();
  absl::Status loaded = [&]() -> absl::Status {
    std::vector<std::string> problems;
    for (const auto& [name, tensor] : expected) {
      const auto it = manifest.tensors.find(name);
      const std::vector<int64_t>& shape = tensor.slice.global_shape;
      if (it == manifest.tensors.end()) {
        problems.push_back(
            absl::StrCat(name, ": missing; this rank has it with shape ", Shape(shape)));
      } else if (it->second.shape != shape) {
        problems.push_back(absl::StrCat(name, ": shape ", Shape(it->second.shape),
                                        " in the checkpoint, ", Shape(shape), " here"));
      } else if (it->second.dtype != tensor.tensor.scalar_type()) {
        problems.push_back(absl::StrCat(name, ": dtype ", c10::toString(it->second.dtype),
                                        " in the checkpoint, ",
                                        c10::toString(tensor.tensor.scalar_type()), " here"));
      }
    }
    int64_t i = 0;
    for (const auto& [name, stored] : manifest.tensors) {
      if (held[i++].item<float>() == 0) {
        problems.push_back(
            absl::StrCat(name, ": in the checkpoint, but no rank has such ", Kind(run_, name)));
      }
    }
    if (!problems.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(manifest.path, ": does not fit this rank's ",
                                                     run_.contents, ":\n  ",
                                                     absl::StrJoin(problems, "\n  ")));
    }
    RankState state;
    state.metadata = manifest.metadata;
    SliceReader reader(folder, manifest);
    for (const auto& [name, tensor] : expected) {
      at::Tensor filled = torch::zeros(tensor.tensor.sizes(),
                                       at::TensorOptions().dtype(tensor.tensor.scalar_type()));
      PLAIT_RETURN_IF_ERROR(reader.Read(name, tensor.slice.box, tensor.slice.DataOf(filled)));
      state.tensors[name] = {std::move(filled), tensor.slice};
    }
    return base::Annotate(load(std::move(state)), folder);
  }();
  return mesh_->Agree(loaded, absl::StrCat("resuming from ", folder));
}

bool Checkpointer::IsDue(int64_t step) const {
  if (dir_.empty()) return false;
  return step == run_.steps || (config_.every() > 0 && step % config_.every() == 0);
}

absl::Status Checkpointer::Save(int64_t step, int64_t position, const RankState& state) const {
  const int rank = mesh_->rank();
  const int world_size = mesh_->layout().world_size();
  const std::string name = CheckpointName(step);
  const std::string folder = absl::StrCat(dir_, "/", name);
  const std::string temporary = absl::StrCat(dir_, "/", kTemporaryPrefix, name);
  const std::string what = absl::StrCat("saving ", folder);
  const std::string& field = run_.config_field;

  // Rank 0 makes a clean temporary folder (removing any a killed save left behind).
  absl::Status prepared;
  if (rank == 0) {
    prepared = [&]() -> absl::Status {
      std::error_code error;
      fs::create_directories(dir_, error);
      if (error) return FileError(field, "create", dir_, error);
      for (fs::directory_iterator it(dir_, error), end; !error && it != end; it.increment(error)) {
        if (absl::StartsWith(it->path().filename().string(), kTemporaryPrefix)) {
          fs::remove_all(it->path(), error);
          if (error) return FileError(field, "remove", it->path().string(), error);
        }
      }
      if (error) return FileError(field, "list", dir_, error);
      if (fs::exists(folder, error)) {
        return absl::FailedPreconditionError(
            absl::StrCat(folder, ": already exists; checkpoints are never overwritten"));
      }
      fs::create_directory(temporary, error);
      if (error) return FileError(field, "create", temporary, error);
      return absl::OkStatus();
    }();
  }
  PLAIT_RETURN_IF_ERROR(mesh_->Agree(prepared, what));

  // Every rank writes its file: the slices it is the first holder of.
  absl::Status written = [&]() -> absl::Status {
    std::vector<std::pair<std::string, at::Tensor>> entries;
    Json slices = Json::object();
    for (const auto& [name, tensor] : state.tensors) {
      PLAIT_ASSIGN_OR_RETURN(at::Tensor data, SavedData(name, tensor));
      if (tensor.slice.replica != 0 || data.numel() == 0) continue;
      const absl::string_view bytes(static_cast<const char*>(data.data_ptr()), data.nbytes());
      slices[name] = {{"shape", tensor.slice.global_shape},
                      {"offsets", tensor.slice.box.offsets},
                      {"checksum", Checksum(bytes)}};
      entries.emplace_back(name, std::move(data));
    }
    const std::map<std::string, std::string> metadata = {{"format", kFormat},
                                                         {"rank", absl::StrCat(rank)},
                                                         {"world_size", absl::StrCat(world_size)},
                                                         {"step", absl::StrCat(step)},
                                                         {kSlicesKey, slices.dump()}};
    const std::string file = absl::StrCat(temporary, "/", RankFileName(rank, world_size));
    PLAIT_RETURN_IF_ERROR(models::WriteSafetensors(file, entries, metadata));
    return base::SyncToDisk(file);
  }();
  if (absl::Status agreed = mesh_->Agree(written, what); !agreed.ok()) {
    // A failed save leaves nothing behind: its partial files go with the temporary folder.
    std::error_code ignored;
    if (rank == 0) fs::remove_all(temporary, ignored);
    return agreed;
  }

  // Every file is there: rank 0 writes the manifest, publishes the folder and drops the
  // oldest.
  absl::Status published;
  if (rank == 0) {
    published = [&]() -> absl::Status {
      PLAIT_ASSIGN_OR_RETURN(Manifest manifest, CollectManifest(temporary, world_size, state));
      manifest.step = step;
      manifest.world_size = world_size;
      manifest.mesh = mesh_shape_;
      manifest.layout = run_.layout;
      manifest.data_position = position;
      manifest.fingerprint = run_.fingerprint;
      manifest.metadata = state.metadata;
      const std::string path = absl::StrCat(temporary, "/", kManifest);
      PLAIT_RETURN_IF_ERROR(base::WriteFileAtomically(path, ManifestJson(manifest).dump(2) + "\n"));
      // Read back as a resume would: the ranks' slices must tile every tensor.
      PLAIT_RETURN_IF_ERROR(base::Annotate(ReadManifest(path).status(),
                                           "the slices the ranks saved do not tile the tensors"));
      PLAIT_RETURN_IF_ERROR(base::SyncToDisk(temporary));
      std::error_code error;
      fs::rename(temporary, folder, error);
      if (error) return FileError(field, "rename into place", temporary, error);
      PLAIT_RETURN_IF_ERROR(base::SyncToDisk(dir_));
      if (config_.keep_last() <= 0) return absl::OkStatus();
      PLAIT_ASSIGN_OR_RETURN(const std::vector<int64_t> steps, ListCheckpoints(dir_, field));
      for (size_t i = 0; i + config_.keep_last() < steps.size(); ++i) {
        const std::string old = absl::StrCat(dir_, "/", CheckpointName(steps[i]));
        fs::remove_all(old, error);
        if (error) return FileError(field, "remove", old, error);
      }
      return absl::OkStatus();
    }();
    std::error_code ignored;
    if (!published.ok()) fs::remove_all(temporary, ignored);
  }
  return mesh_->Agree(published, what);
}

}  // namespace plait::checkpoint
