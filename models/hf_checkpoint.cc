#include "models/hf_checkpoint.h"

#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/file.h"
#include "base/json.h"
#include "base/own_output.h"
#include "base/status.h"
#include "models/model_config.h"
#include "models/parameter_shapes.h"
#include "nlohmann/json.hpp"
#include "torch/csrc/autograd/generated/variable_factories.h"
#include "torch/nn/module.h"

namespace plait::models {
namespace {

std::string ShapeString(at::IntArrayRef shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

bool IsModelSafetensorsName(const std::string& name) {
  return name == kSafetensorsFileName ||
         (absl::StartsWith(name, "model-") && absl::EndsWith(name, ".safetensors"));
}

// Whether the file `path` carries WriteSafetensorsCheckpoint's mark: a safetensors file's
// "__metadata__", or the index's "metadata".
bool IsMarkedByPlait(const std::filesystem::path& path) {
  if (path.filename() == kSafetensorsIndexName) {
    const absl::StatusOr<std::string> text = base::ReadFile(path.string());
    if (!text.ok()) return false;
    const absl::StatusOr<nlohmann::json> index = base::ParseJson(path.string(), *text);
    if (!index.ok() || !index->is_object()) return false;
    const auto metadata = index->find("metadata");
    return metadata != index->end() && metadata->is_object() &&
           metadata->value(kWriterKey, "") == kWriterPlait;
  }
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(path.string());
  if (!file.ok()) return false;
  const auto writer = (*file)->metadata().find(kWriterKey);
  return writer != (*file)->metadata().end() && writer->second == kWriterPlait;
}

// Whether `path` is a file an earlier export wrote: a model safetensors file or index that
// carries plait's mark, or the config.json beside one. A folder a model was downloaded into
// holds the same names, unmarked.
bool IsEarlierExportFile(const std::string& path) {
  const std::filesystem::path file(path);
  const std::string name = file.filename().string();
  if (name == "config.json") {
    const std::filesystem::path dir = file.parent_path();
    return IsMarkedByPlait(dir / kSafetensorsFileName) ||
           IsMarkedByPlait(dir / kSafetensorsIndexName);
  }
  return (IsModelSafetensorsName(name) || name == kSafetensorsIndexName) && IsMarkedByPlait(file);
}

// Tensors Hugging Face writes that are not parameters of the model (see the header).
bool IsSkippable(const std::string& name, const ModelConfig& config) {
  return (name == "lm_head.weight" && config.tie_word_embeddings()) ||
         absl::EndsWith(name, ".rotary_emb.inv_freq");
}

}  // namespace

absl::Status LoadHfParts(const SafetensorsCheckpoint& checkpoint, const ModelConfig& config,
                         const std::vector<HfParameterPart>& parts) {
  // The file is checked whole, against every parameter of the model `config` describes, also
  // those other ranks hold (a pipeline's other stages, expert parallelism's other experts):
  // each rank reads its own parts and finds the same problems in the rest of the file.
  std::map<std::string, std::vector<int64_t>> model;
  for (ParameterShape& parameter : ParameterShapes(config)) {
    model.emplace(std::move(parameter.name), std::move(parameter.shape));
  }
  for (const auto& [name, shape] : model) {
    PLAIT_ASSIGN_OR_RETURN(auto found, checkpoint.Find(name));
    const auto& [entry, file] = found;
    if (entry->shape != shape) {
      return absl::InvalidArgumentError(absl::StrCat(file->path(), ": tensor \"", name,
                                                     "\" has shape ", ShapeString(entry->shape),
                                                     ", the model expects ", ShapeString(shape)));
    }
    if (!at::isFloatingType(entry->dtype)) {
      return absl::InvalidArgumentError(absl::StrCat(file->path(), ": tensor \"", name,
                                                     "\" has dtype ", c10::toString(entry->dtype),
                                                     ", expected a floating-point dtype"));
    }
  }
  for (const std::string& name : checkpoint.Names()) {
    if (model.count(name) == 0 && !IsSkippable(name, config)) {
      PLAIT_ASSIGN_OR_RETURN(auto found, checkpoint.Find(name));
      return absl::InvalidArgumentError(absl::StrCat(found.second->path(), ": unexpected tensor \"",
                                                     name, "\": the model has no such parameter"));
    }
  }
  for (const HfParameterPart& part : parts) {
    const auto in_model = model.find(part.name);
    if (in_model == model.end() || in_model->second != part.shape) {
      return absl::InternalError(absl::StrCat("loading ", part.name, " of shape ",
                                              ShapeString(part.shape),
                                              ": the model of this config has no such parameter"));
    }
    PLAIT_ASSIGN_OR_RETURN(auto found, checkpoint.Find(part.name));
    const at::Tensor destination =
        part.receive ? torch::empty(part.lengths, part.destination.options()) : part.destination;
    PLAIT_RETURN_IF_ERROR(
        found.second->ReadBox(part.name, part.offsets, part.lengths, destination));
    if (part.receive) part.receive(destination);
  }
  return absl::OkStatus();
}

absl::Status LoadHfWeights(const SafetensorsCheckpoint& checkpoint, CausalLM& model) {
  std::vector<HfParameterPart> parts;
  for (const auto& item : model.named_parameters()) {
    const std::vector<int64_t> shape = item.value().sizes().vec();
    parts.push_back(
        {item.key(), shape, std::vector<int64_t>(shape.size(), 0), shape, item.value().detach()});
  }
  return LoadHfParts(checkpoint, model.config(), parts);
}

absl::StatusOr<std::shared_ptr<CausalLM>> LoadHfModel(const std::string& dir) {
  PLAIT_ASSIGN_OR_RETURN(ModelConfig config, ReadHfConfig(absl::StrCat(dir, "/config.json")));
  PLAIT_ASSIGN_OR_RETURN(SafetensorsCheckpoint checkpoint, SafetensorsCheckpoint::Open(dir));
  PLAIT_ASSIGN_OR_RETURN(std::shared_ptr<CausalLM> model,
                         CausalLM::CreateDeferred(config, at::TensorOptions()));
  model->MaterializeParameters();  // each then read whole (LoadHfParts fails on a missing one)
  PLAIT_RETURN_IF_ERROR(LoadHfWeights(checkpoint, *model));
  return model;
}

absl::Status SaveHfModel(CausalLM& model, const std::string& dir, at::ScalarType dtype,
                         uint64_t max_shard_bytes) {
  std::vector<std::pair<std::string, at::Tensor>> parameters;
  for (const auto& item : model.named_parameters())
    parameters.emplace_back(item.key(), item.value());
  return SaveHfParameters(model.config(), parameters, dir, dtype, max_shard_bytes);
}

absl::Status SaveHfParameters(const ModelConfig& config,
                              const std::vector<std::pair<std::string, at::Tensor>>& parameters,
                              const std::string& dir, at::ScalarType dtype,
                              uint64_t max_shard_bytes) {
  if (dtype != at::kFloat && dtype != at::kBFloat16) {
    return absl::InvalidArgumentError(absl::StrCat("SaveHfModel(", dir, "): dtype ",
                                                   c10::toString(dtype),
                                                   " is not supported; use float32 or bfloat16"));
  }
  // Checked again when writing: a run lasts long, and its folder may have changed since.
  PLAIT_RETURN_IF_ERROR(
      base::CheckOutputFolder(dir, IsEarlierExportFile, "a plait export").status());
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot create \"", dir, "\": ", error.message()));
  }
  PLAIT_RETURN_IF_ERROR(base::WriteFileAtomically(
      absl::StrCat(dir, "/config.json"),
      ToHfConfigJson(config, dtype == at::kFloat ? "float32" : "bfloat16") + "\n"));
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& [name, tensor] : parameters) {
    tensors.emplace_back(name, tensor.detach().to(at::kCPU, dtype));
  }
  return WriteSafetensorsCheckpoint(dir, tensors, max_shard_bytes);
}

std::vector<base::Violation> CheckHfExportFolder(const std::string& dir,
                                                 const std::vector<base::NamedPath>& inputs,
                                                 const std::string& field) {
  if (dir.empty()) return {};
  std::vector<base::Violation> violations =
      base::CheckOutputsApart({{field, dir, /*whole_folder=*/true}}, inputs);
  if (!violations.empty()) return violations;
  const absl::StatusOr<std::vector<std::string>> earlier =
      base::CheckOutputFolder(dir, IsEarlierExportFile, "a plait export");
  if (!earlier.ok()) violations.push_back({field, std::string(earlier.status().message()), ""});
  return violations;
}

}  // namespace plait::models
