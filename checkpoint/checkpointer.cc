#include "checkpoint/checkpointer.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "base/file.h"
#include "base/hash.h"
#include "base/json.h"
#include "base/status.h"
#include "models/safetensors.h"
#include "nlohmann/json.hpp"

namespace plait::checkpoint {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

// Written into every manifest and rank file, so a future layout can tell this one apart.
constexpr char kFormat[] = "plait-checkpoint-1";
constexpr char kTemporaryPrefix[] = ".tmp-";
// The metadata keys of a rank file that are the checkpoint's own, not the caller's.
constexpr const char* kOwnMetadata[] = {"format", "rank", "world_size", "step", "checksum"};

bool IsOwnMetadata(const std::string& key) {
  return std::find(std::begin(kOwnMetadata), std::end(kOwnMetadata), key) != std::end(kOwnMetadata);
}

std::string Shape(const torch::Tensor& tensor) {
  return absl::StrCat("[", absl::StrJoin(tensor.sizes(), ", "), "]");
}

// A 64-bit FNV-1a over the bytes of `tensors` in name order, 8 bytes at a time: cheap next
// to writing the file, and it catches bytes changed after the header was checked.
std::string Checksum(const std::map<std::string, torch::Tensor>& tensors) {
  uint64_t hash = base::kFnv1a64OffsetBasis;
  for (const auto& [name, tensor] : tensors) {
    const torch::Tensor bytes = tensor.contiguous();
    hash = base::Fnv1a64Words(hash, bytes.data_ptr(), bytes.numel() * bytes.element_size());
  }
  return absl::StrFormat("%016x", hash);
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

// The step of a checkpoint folder's name; nullopt for any other name (temporary folders).
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

absl::StatusOr<Json> ReadJson(const std::string& path) {
  absl::StatusOr<std::string> text = base::ReadFile(path);
  if (!text.ok()) return absl::NotFoundError(absl::StrCat(path, ": missing or unreadable"));
  Json json = Json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) {
    return absl::DataLossError(absl::StrCat(path, ": not a JSON object; the file is corrupt"));
  }
  return json;
}

absl::StatusOr<int64_t> IntField(const Json& json, const char* field, const std::string& path) {
  const auto it = json.find(field);
  if (it == json.end() || !it->is_number_integer()) {
    return absl::DataLossError(
        absl::StrCat(path, ": ", field, ": missing or not an integer; the file is corrupt"));
  }
  // nlohmann reads integers past INT64_MAX as unsigned; get<int64_t> would wrap them.
  if (it->is_number_unsigned() &&
      it->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return absl::DataLossError(absl::StrCat(path, ": ", field, ": ", it->get<uint64_t>(),
                                            " is past 2^63 - 1; the file is corrupt"));
  }
  return it->get<int64_t>();
}

// Checks one rank's file against the tensors this rank would save and reads it.
absl::StatusOr<RankState> ReadRankFile(const std::string& path, int rank, int world_size,
                                       int64_t step,
                                       const std::map<std::string, torch::Tensor>& expected,
                                       const RunInfo& run) {
  std::error_code error;
  if (!fs::exists(path, error)) {
    return absl::NotFoundError(absl::StrCat(path, ": missing; the checkpoint of step ", step,
                                            " was written by ", world_size,
                                            " ranks, each into its own file"));
  }
  PLAIT_ASSIGN_OR_RETURN(std::unique_ptr<models::SafetensorsFile> file,
                         models::SafetensorsFile::Open(path));
  const std::map<std::string, std::string> expected_metadata = {
      {"format", kFormat},
      {"rank", absl::StrCat(rank)},
      {"world_size", absl::StrCat(world_size)},
      {"step", absl::StrCat(step)}};
  for (const auto& [field, want] : expected_metadata) {
    const auto it = file->metadata().find(field);
    const std::string have = it == file->metadata().end() ? "(none)" : it->second;
    if (have != want) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": __metadata__.", field, ": ", have,
                                                     " in the file, ", want, " expected here"));
    }
  }
  std::vector<std::string> problems;
  for (const auto& [name, tensor] : expected) {
    const auto it = file->entries().find(name);
    if (it == file->entries().end()) {
      problems.push_back(
          absl::StrCat(name, ": missing; this rank has it with shape ", Shape(tensor)));
    } else if (it->second.shape != tensor.sizes().vec()) {
      problems.push_back(absl::StrCat(name, ": shape [", absl::StrJoin(it->second.shape, ", "),
                                      "] in the file, ", Shape(tensor), " here"));
    } else if (it->second.dtype != tensor.scalar_type()) {
      problems.push_back(absl::StrCat(name, ": dtype ", c10::toString(it->second.dtype),
                                      " in the file, ", c10::toString(tensor.scalar_type()),
                                      " here"));
    }
  }
  for (const auto& [name, entry] : file->entries()) {
    if (expected.count(name) == 0) {
      problems.push_back(
          absl::StrCat(name, ": in the file, but this rank has no such ", Kind(run, name)));
    }
  }
  if (!problems.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": does not fit this rank's ",
                                                   run.contents, ":\n  ",
                                                   absl::StrJoin(problems, "\n  ")));
  }
  RankState state;
  for (const auto& [name, entry] : file->entries()) {
    PLAIT_ASSIGN_OR_RETURN(state.tensors[name], file->Read(name));
  }
  const auto checksum = file->metadata().find("checksum");
  const std::string have = checksum == file->metadata().end() ? "(none)" : checksum->second;
  if (const std::string want = Checksum(state.tensors); have != want) {
    return absl::DataLossError(absl::StrCat(path, ": __metadata__.checksum: ", have,
                                            " in the file, ", want,
                                            " computed from its tensors; the file is corrupt"));
  }
  for (const auto& [key, value] : file->metadata()) {
    if (!IsOwnMetadata(key)) state.metadata[key] = value;
  }
  return state;
}

}  // namespace

std::string CheckpointName(int64_t step) { return absl::StrFormat("step-%08d", step); }

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
  PLAIT_ASSIGN_OR_RETURN(const Json manifest, ReadJson(path));
  const auto format = manifest.find("format");
  if (format == manifest.end() || *format != kFormat) {
    return absl::DataLossError(absl::StrCat(
        path, ": format: ", format == manifest.end() ? "(none)" : base::DescribeJson(*format),
        " in the file, \"", kFormat, "\" expected"));
  }
  PLAIT_ASSIGN_OR_RETURN(const int64_t step, IntField(manifest, "step", path));
  PLAIT_ASSIGN_OR_RETURN(const int64_t world_size, IntField(manifest, "world_size", path));
  PLAIT_ASSIGN_OR_RETURN(checkpointer.resume_position_, IntField(manifest, "data_position", path));
  std::vector<std::string> problems;
  if (step != steps.back()) {
    problems.push_back(
        absl::StrCat("step: ", step, " in the file, ", steps.back(), " in the folder's name"));
  }
  if (world_size != mesh.layout().world_size()) {
    problems.push_back(absl::StrCat("world_size: ", world_size, " in the checkpoint, ",
                                    mesh.layout().world_size(),
                                    " in this run; a checkpoint resumes on the world that "
                                    "wrote it"));
  }
  // The manifest's values are read where they are, never copied or written out whole: a
  // corrupt one can be nested deep enough that either would overflow the stack.
  const auto mesh_shape = manifest.find("mesh");
  if (mesh_shape == manifest.end() || *mesh_shape != checkpointer.mesh_shape_) {
    problems.push_back(absl::StrCat(
        "mesh: ", mesh_shape == manifest.end() ? "(none)" : base::DescribeJson(*mesh_shape),
        " in the checkpoint, \"", checkpointer.mesh_shape_, "\" in this run"));
  }
  const auto fingerprint = manifest.find("fingerprint");
  for (const auto& [field, value] : r.fingerprint) {
    const Json* saved_value = nullptr;
    if (fingerprint != manifest.end() && fingerprint->is_object()) {
      const auto it = fingerprint->find(field);
      if (it != fingerprint->end()) saved_value = &*it;
    }
    const std::string saved = saved_value != nullptr && saved_value->is_string()
                                  ? saved_value->get<std::string>()
                                  : "(none)";
    if (saved != value) {
      problems.push_back(absl::StrCat("fingerprint.", field, ": \"", saved,
                                      "\" in the checkpoint, \"", value,
                                      "\" in this plan; a resume must not change it"));
    }
  }
  if (step < 1) problems.push_back(absl::StrCat("step: ", step, " in the file; must be >= 1"));
  const int64_t position = checkpointer.resume_position_;
  if (r.position_per_step > 0 && step >= 1) {
    int64_t expected = 0;
    const bool overflow = __builtin_mul_overflow(step, r.position_per_step, &expected);
    if (overflow || position != expected) {
      problems.push_back(absl::StrCat("data_position: ", position, " in the file, ",
                                      overflow ? "more than 2^63 - 1" : absl::StrCat(expected),
                                      " expected after step ", step, " (", r.position_per_step,
                                      " per step)"));
    }
  } else if (position < 0) {
    // A count of what the caller has read, even where the run does not check it.
    problems.push_back(absl::StrCat("data_position: ", position, " in the file; must be >= 0"));
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
  return checkpointer;
}

absl::Status Checkpointer::Restore(const std::map<std::string, torch::Tensor>& expected,
                                   const std::function<absl::Status(RankState)>& load) const {
  if (resume_step_ == 0) return absl::OkStatus();
  const int rank = mesh_->rank();
  const int world_size = mesh_->layout().world_size();
  const std::string folder = absl::StrCat(dir_, "/", CheckpointName(resume_step_));
  const std::string path = absl::StrCat(folder, "/", RankFileName(rank, world_size));
  absl::StatusOr<RankState> state =
      ReadRankFile(path, rank, world_size, resume_step_, expected, run_);
  const absl::Status loaded =
      state.ok() ? base::Annotate(load(*std::move(state)), path) : state.status();
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

  // Every rank writes its file; rank 0 the manifest too.
  absl::Status written = [&]() -> absl::Status {
    std::map<std::string, std::string> metadata = {{"format", kFormat},
                                                   {"rank", absl::StrCat(rank)},
                                                   {"world_size", absl::StrCat(world_size)},
                                                   {"step", absl::StrCat(step)},
                                                   {"checksum", Checksum(state.tensors)}};
    for (const auto& [key, value] : state.metadata) {
      if (IsOwnMetadata(key)) {
        return absl::InvalidArgumentError(
            absl::StrCat("__metadata__.", key, ": the checkpoint's own key; name it otherwise"));
      }
      metadata[key] = value;
    }
    const std::string file = absl::StrCat(temporary, "/", RankFileName(rank, world_size));
    PLAIT_RETURN_IF_ERROR(
        models::WriteSafetensors(file,
                                 std::vector<std::pair<std::string, torch::Tensor>>(
                                     state.tensors.begin(), state.tensors.end()),
                                 metadata));
    PLAIT_RETURN_IF_ERROR(base::SyncToDisk(file));
    if (rank != 0) return absl::OkStatus();
    const Json manifest = {{"format", kFormat},         {"step", step},
                           {"world_size", world_size},  {"mesh", mesh_shape_},
                           {"data_position", position}, {"fingerprint", run_.fingerprint}};
    const std::string path = absl::StrCat(temporary, "/", kManifest);
    return base::WriteFileAtomically(path, manifest.dump(2) + "\n");
  }();
  if (absl::Status agreed = mesh_->Agree(written, what); !agreed.ok()) {
    // A failed save leaves nothing behind: its partial files go with the temporary folder.
    std::error_code ignored;
    if (rank == 0) fs::remove_all(temporary, ignored);
    return agreed;
  }

  // Every file is there: rank 0 publishes the folder and drops the oldest.
  absl::Status published;
  if (rank == 0) {
    published = [&]() -> absl::Status {
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
  }
  return mesh_->Agree(published, what);
}

}  // namespace plait::checkpoint
