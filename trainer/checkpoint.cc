#include "trainer/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "base/dtype.pb.h"
#include "base/file.h"
#include "base/hash.h"
#include "base/status.h"
#include "data/data_config.h"
#include "models/model_config.h"
#include "models/safetensors.h"
#include "nlohmann/json.hpp"
#include "trainer/plan.h"

namespace plait::trainer {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

// Written into every manifest and rank file, so a future layout can tell this one apart.
constexpr char kFormat[] = "plait-checkpoint-1";
constexpr char kTemporaryPrefix[] = ".tmp-";
constexpr char kParamPrefix[] = "param/";
constexpr char kOptimPrefix[] = "optim/";

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

// What a resume must not change, by plan field. The rest of the plan (steps, schedule,
// evaluation, logging) may change between a run and its resume.
absl::StatusOr<std::map<std::string, std::string>> Fingerprint(const Plan& plan) {
  PLAIT_ASSIGN_OR_RETURN(models::ModelConfig config,
                         models::ResolveModelSpec(plan.model(), "plan.model"));
  std::vector<std::string> steps;
  for (const wrap::PrepareStep& step : plan.prepare()) steps.push_back(step.ShortDebugString());
  const optim::OptimizerConfig& optimizer = plan.optimizer();
  const auto* algorithm = optimizer.GetReflection()->GetOneofFieldDescriptor(
      optimizer, optim::OptimizerConfig::descriptor()->FindOneofByName("algorithm"));
  const TrainingConfig& training = plan.training();
  return std::map<std::string, std::string>{
      {"plan.model", config.ShortDebugString()},
      {"plan.model.dtype", base::Dtype_Name(plan.model().dtype())},
      {"plan.prepare", absl::StrJoin(steps, "; ")},
      {"plan.optimizer", algorithm == nullptr ? "" : algorithm->name()},
      {"plan.training.micro_batch", absl::StrCat(training.micro_batch())},
      {"plan.training.grad_accumulation", absl::StrCat(GradAccumulation(training))},
      {"plan.training.seq_len", absl::StrCat(training.seq_len())},
      {"plan.data", data::ResolvedDataConfig(plan.data()).ShortDebugString()},
  };
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

// The steps of the checkpoint folders in `dir`, ascending; none when `dir` does not exist.
absl::StatusOr<std::vector<int64_t>> ListCheckpoints(const std::string& dir) {
  std::vector<int64_t> steps;
  std::error_code error;
  if (!fs::exists(dir, error)) return steps;
  for (fs::directory_iterator it(dir, error), end; !error && it != end; it.increment(error)) {
    if (!it->is_directory()) continue;
    if (std::optional<int64_t> step = StepOfName(it->path().filename().string())) {
      steps.push_back(*step);
    }
  }
  if (error) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan.training.checkpoint.dir: cannot list \"", dir, "\": ", error.message()));
  }
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
  return it->get<int64_t>();
}

absl::Status FileError(const std::string& action, const std::string& path,
                       const std::error_code& error) {
  return absl::InvalidArgumentError(absl::StrCat("plan.training.checkpoint.dir: cannot ", action,
                                                 " \"", path, "\": ", error.message()));
}

// The tensors of one rank's file: its trainable parameters and its optimizer state `state`.
std::map<std::string, torch::Tensor> RankTensors(const optim::Optimizer& optimizer,
                                                 const optim::OptimizerState& state) {
  std::map<std::string, torch::Tensor> tensors;
  for (const parallel::TrainableParameter& parameter : optimizer.parameters()) {
    tensors[kParamPrefix + parameter.name] = parameter.tensor.detach();
  }
  for (const auto& [key, tensor] : state.tensors) tensors[kOptimPrefix + key] = tensor;
  return tensors;
}

// Checks one rank's file against what this rank trains and loads it into `optimizer`.
absl::Status LoadRankFile(const std::string& path, int rank, int world_size, int64_t step,
                          optim::Optimizer& optimizer) {
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
  // What this rank would write: the names, shapes and dtypes the file must have.
  const std::map<std::string, torch::Tensor> expected =
      RankTensors(optimizer, optimizer.SaveState());
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
      problems.push_back(absl::StrCat(
          name, ": in the file, but this rank has no such ",
          absl::StartsWith(name, kParamPrefix) ? "trainable parameter" : "optimizer state"));
    }
  }
  if (!problems.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": does not fit this rank's model and optimizer:\n  ",
                     absl::StrJoin(problems, "\n  ")));
  }
  std::map<std::string, torch::Tensor> loaded;
  for (const auto& [name, entry] : file->entries()) {
    PLAIT_ASSIGN_OR_RETURN(loaded[name], file->Read(name));
  }
  const auto checksum = file->metadata().find("checksum");
  const std::string have = checksum == file->metadata().end() ? "(none)" : checksum->second;
  if (const std::string want = Checksum(loaded); have != want) {
    return absl::DataLossError(absl::StrCat(path, ": __metadata__.checksum: ", have,
                                            " in the file, ", want,
                                            " computed from its tensors; the file is corrupt"));
  }
  optim::OptimizerState state;
  const auto optimizer_step = file->metadata().find("optimizer_step");
  if (optimizer_step == file->metadata().end() ||
      !absl::SimpleAtoi(optimizer_step->second, &state.step)) {
    return absl::DataLossError(
        absl::StrCat(path, ": __metadata__.optimizer_step: missing or not an integer"));
  }
  {
    torch::NoGradGuard no_grad;
    for (const parallel::TrainableParameter& parameter : optimizer.parameters()) {
      parameter.tensor.copy_(loaded.at(kParamPrefix + parameter.name));
    }
  }
  for (auto& [name, tensor] : loaded) {
    absl::string_view key = name;
    if (absl::ConsumePrefix(&key, kOptimPrefix)) state.tensors[std::string(key)] = tensor;
  }
  absl::Status status = optimizer.LoadState(state);
  if (!status.ok()) return absl::Status(status.code(), absl::StrCat(path, ": ", status.message()));
  return absl::OkStatus();
}

}  // namespace

std::string CheckpointName(int64_t step) { return absl::StrFormat("step-%08d", step); }

std::string RankFileName(int rank, int world_size) {
  return absl::StrFormat("rank-%05d-of-%05d.safetensors", rank, world_size);
}

absl::StatusOr<Checkpointer> Checkpointer::Open(const Plan& plan, const std::string& dir,
                                                const parallel::DeviceMesh& mesh) {
  Checkpointer checkpointer(mesh);
  if (dir.empty()) return checkpointer;
  checkpointer.dir_ = dir;
  checkpointer.config_ = plan.training().checkpoint();
  checkpointer.steps_ = plan.training().steps();
  checkpointer.accumulation_ = GradAccumulation(plan.training());
  checkpointer.mesh_shape_ = MeshShape(mesh.layout());
  PLAIT_ASSIGN_OR_RETURN(checkpointer.fingerprint_, Fingerprint(plan));

  PLAIT_ASSIGN_OR_RETURN(const std::vector<int64_t> steps, ListCheckpoints(dir));
  if (steps.empty()) return checkpointer;
  const std::string newest = absl::StrCat(dir, "/", CheckpointName(steps.back()));
  if (!checkpointer.config_.resume()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "plan.training.checkpoint.dir: \"", dir, "\" already holds checkpoints (newest ", newest,
        "); set plan.training.checkpoint.resume to continue from it, or choose another dir"));
  }
  const std::string path = absl::StrCat(newest, "/", kCheckpointManifest);
  PLAIT_ASSIGN_OR_RETURN(const Json manifest, ReadJson(path));
  const auto format = manifest.find("format");
  if (format == manifest.end() || *format != kFormat) {
    return absl::DataLossError(
        absl::StrCat(path, ": format: ", format == manifest.end() ? "(none)" : format->dump(),
                     " in the file, \"", kFormat, "\" expected"));
  }
  PLAIT_ASSIGN_OR_RETURN(const int64_t step, IntField(manifest, "step", path));
  PLAIT_ASSIGN_OR_RETURN(const int64_t world_size, IntField(manifest, "world_size", path));
  PLAIT_ASSIGN_OR_RETURN(checkpointer.resume_data_position_,
                         IntField(manifest, "data_position", path));
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
  const std::string mesh_shape = manifest.value("mesh", std::string("(none)"));
  if (mesh_shape != checkpointer.mesh_shape_) {
    problems.push_back(absl::StrCat("mesh: \"", mesh_shape, "\" in the checkpoint, \"",
                                    checkpointer.mesh_shape_, "\" in this run"));
  }
  const Json fingerprint = manifest.value("fingerprint", Json::object());
  for (const auto& [field, value] : checkpointer.fingerprint_) {
    const auto it = fingerprint.find(field);
    const std::string saved =
        it != fingerprint.end() && it->is_string() ? it->get<std::string>() : "(none)";
    if (saved != value) {
      problems.push_back(absl::StrCat("fingerprint.", field, ": \"", saved,
                                      "\" in the checkpoint, \"", value,
                                      "\" in this plan; a resume must not change it"));
    }
  }
  if (step > checkpointer.steps_) {
    problems.push_back(absl::StrCat("step: ", step,
                                    " in the checkpoint, past plan.training.steps (",
                                    checkpointer.steps_, ")"));
  }
  if (!problems.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": cannot resume from it:\n  ", absl::StrJoin(problems, "\n  ")));
  }
  checkpointer.resume_step_ = step;
  return checkpointer;
}

absl::Status Checkpointer::Restore(optim::Optimizer& optimizer, data::DataLoader& train) const {
  if (resume_step_ == 0) return absl::OkStatus();
  const int rank = mesh_->rank();
  const int world_size = mesh_->layout().world_size();
  const std::string folder = absl::StrCat(dir_, "/", CheckpointName(resume_step_));
  PLAIT_RETURN_IF_ERROR(
      mesh_->Agree(LoadRankFile(absl::StrCat(folder, "/", RankFileName(rank, world_size)), rank,
                                world_size, resume_step_, optimizer),
                   absl::StrCat("resuming from ", folder)));
  train.Seek(resume_data_position_);
  return absl::OkStatus();
}

absl::Status Checkpointer::SaveIfDue(int64_t step, const optim::Optimizer& optimizer) const {
  if (dir_.empty()) return absl::OkStatus();
  const bool due = step == steps_ || (config_.every() > 0 && step % config_.every() == 0);
  return due ? Save(step, optimizer) : absl::OkStatus();
}

absl::Status Checkpointer::Save(int64_t step, const optim::Optimizer& optimizer) const {
  const int rank = mesh_->rank();
  const int world_size = mesh_->layout().world_size();
  const std::string name = CheckpointName(step);
  const std::string folder = absl::StrCat(dir_, "/", name);
  const std::string temporary = absl::StrCat(dir_, "/", kTemporaryPrefix, name);
  const std::string what = absl::StrCat("saving ", folder);

  // Rank 0 makes a clean temporary folder (removing any a killed save left behind).
  absl::Status prepared;
  if (rank == 0) {
    prepared = [&]() -> absl::Status {
      std::error_code error;
      fs::create_directories(dir_, error);
      if (error) return FileError("create", dir_, error);
      for (fs::directory_iterator it(dir_, error), end; !error && it != end; it.increment(error)) {
        if (absl::StartsWith(it->path().filename().string(), kTemporaryPrefix)) {
          fs::remove_all(it->path(), error);
          if (error) return FileError("remove", it->path().string(), error);
        }
      }
      if (error) return FileError("list", dir_, error);
      if (fs::exists(folder, error)) {
        return absl::FailedPreconditionError(
            absl::StrCat(folder, ": already exists; checkpoints are never overwritten"));
      }
      fs::create_directory(temporary, error);
      if (error) return FileError("create", temporary, error);
      return absl::OkStatus();
    }();
  }
  PLAIT_RETURN_IF_ERROR(mesh_->Agree(prepared, what));

  // Every rank writes its file; rank 0 the manifest too.
  absl::Status written = [&]() -> absl::Status {
    const optim::OptimizerState state = optimizer.SaveState();
    const std::map<std::string, torch::Tensor> tensors = RankTensors(optimizer, state);
    const std::map<std::string, std::string> metadata = {
        {"format", kFormat},
        {"rank", absl::StrCat(rank)},
        {"world_size", absl::StrCat(world_size)},
        {"step", absl::StrCat(step)},
        {"optimizer_step", absl::StrCat(state.step)},
        {"checksum", Checksum(tensors)}};
    const std::string file = absl::StrCat(temporary, "/", RankFileName(rank, world_size));
    PLAIT_RETURN_IF_ERROR(models::WriteSafetensors(
        file, std::vector<std::pair<std::string, torch::Tensor>>(tensors.begin(), tensors.end()),
        metadata));
    PLAIT_RETURN_IF_ERROR(base::SyncToDisk(file));
    if (rank != 0) return absl::OkStatus();
    const Json manifest = {{"format", kFormat},
                           {"step", step},
                           {"world_size", world_size},
                           {"mesh", mesh_shape_},
                           {"data_position", step * accumulation_},
                           {"fingerprint", fingerprint_}};
    const std::string path = absl::StrCat(temporary, "/", kCheckpointManifest);
    return base::WriteFileAtomically(path, manifest.dump(2) + "\n");
  }();
  PLAIT_RETURN_IF_ERROR(mesh_->Agree(written, what));

  // Every file is there: rank 0 publishes the folder and drops the oldest.
  absl::Status published;
  if (rank == 0) {
    published = [&]() -> absl::Status {
      PLAIT_RETURN_IF_ERROR(base::SyncToDisk(temporary));
      std::error_code error;
      fs::rename(temporary, folder, error);
      if (error) return FileError("rename into place", temporary, error);
      PLAIT_RETURN_IF_ERROR(base::SyncToDisk(dir_));
      if (config_.keep_last() <= 0) return absl::OkStatus();
      PLAIT_ASSIGN_OR_RETURN(const std::vector<int64_t> steps, ListCheckpoints(dir_));
      for (size_t i = 0; i + config_.keep_last() < steps.size(); ++i) {
        const std::string old = absl::StrCat(dir_, "/", CheckpointName(steps[i]));
        fs::remove_all(old, error);
        if (error) return FileError("remove", old, error);
      }
      return absl::OkStatus();
    }();
  }
  return mesh_->Agree(published, what);
}

absl::Status KeepMetricsUpTo(const std::string& path, int64_t step) {
  std::error_code error;
  if (!fs::exists(path, error)) return absl::OkStatus();
  std::ifstream in(path);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(path, ": cannot read"));
  std::string kept;
  for (std::string line; std::getline(in, line);) {
    const Json row = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    // A row cut short by a kill is not valid JSON: dropped with the steps after the resume.
    if (row.is_discarded() || !row.is_object()) continue;
    const auto it = row.find("step");
    if (it != row.end() && it->is_number_integer() && it->get<int64_t>() <= step) {
      absl::StrAppend(&kept, line, "\n");
    }
  }
  in.close();
  return base::WriteFileAtomically(path, kept);
}

}  // namespace plait::trainer
