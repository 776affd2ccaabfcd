#include "wrap/lora/peft_adapter.h"

#include <cmath>
#include <filesystem>
#include <map>
#include <optional>

#include "ATen/core/Tensor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "base/file.h"
#include "base/json.h"
#include "base/own_output.h"
#include "base/status.h"
#include "models/safetensors.h"
#include "nlohmann/json.hpp"

namespace plait::wrap::lora {

using models::CheckFinite;
using models::kWriterKey;
using models::kWriterPlait;

namespace {

using Json = nlohmann::json;

constexpr char kConfigFile[] = "adapter_config.json";
constexpr char kWeightsFile[] = "adapter_model.safetensors";
// What PEFT puts before a module's name in a saved adapter of a causal language model.
constexpr char kPeftPrefix[] = "base_model.model.";
constexpr char kSuffixA[] = ".lora_A.weight";
constexpr char kSuffixB[] = ".lora_B.weight";

// Whether `path` is a file SavePeftAdapter wrote: the adapter's safetensors file carrying
// plait's mark, or the config beside one.
bool IsEarlierAdapterFile(const std::string& path) {
  const std::filesystem::path file(path);
  const std::filesystem::path weights = file.parent_path() / kWeightsFile;
  if (file.filename() != kWeightsFile && file.filename() != kConfigFile) return false;
  absl::StatusOr<std::unique_ptr<models::SafetensorsFile>> opened =
      models::SafetensorsFile::Open(weights.string());
  if (!opened.ok()) return false;
  const auto writer = (*opened)->metadata().find(kWriterKey);
  return writer != (*opened)->metadata().end() && writer->second == kWriterPlait;
}

// One adapted module's two matrices.
struct ModuleAdapters {
  at::Tensor a;  // [r, in]
  at::Tensor b;  // [out, r]
};

// `tensors` (plait's names) grouped by module, in the order modules first appear; `where` and
// the tensor's name in errors. Each module needs both matrices, 2-D, with A's rows and B's
// columns equal to `rank`.
absl::StatusOr<std::vector<std::pair<std::string, ModuleAdapters>>> GroupByModule(
    const std::vector<std::pair<std::string, at::Tensor>>& tensors, int64_t rank,
    const std::string& where) {
  std::vector<std::pair<std::string, ModuleAdapters>> modules;
  std::map<std::string, size_t> index;
  for (const auto& [name, tensor] : tensors) {
    absl::string_view module = name;
    const bool is_a = absl::ConsumeSuffix(&module, kSuffixA);
    if (!is_a && !absl::ConsumeSuffix(&module, kSuffixB)) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": ", name, " is not a LoRA matrix (<module>", kSuffixA, " or ", kSuffixB, ")"));
    }
    if (tensor.dim() != 2 || tensor.size(is_a ? 0 : 1) != rank) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": ", name, " is ", c10::str(tensor.sizes()), "; LoRA's ",
                       is_a ? "A is [r, in]" : "B is [out, r]", " with r = ", rank));
    }
    const auto [it, inserted] = index.emplace(std::string(module), modules.size());
    if (inserted) modules.emplace_back(std::string(module), ModuleAdapters());
    at::Tensor& slot = is_a ? modules[it->second].second.a : modules[it->second].second.b;
    if (slot.defined()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", name, " appears twice"));
    }
    slot = tensor;
  }
  for (const auto& [module, adapters] : modules) {
    if (!adapters.a.defined() || !adapters.b.defined()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": the module ", module, " has ",
                                                     adapters.a.defined() ? "A" : "B", " but not ",
                                                     adapters.a.defined() ? "B" : "A"));
    }
  }
  if (modules.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": no LoRA matrices"));
  }
  return modules;
}

// Refuses what adapter_config.json may ask for that plait's LoRA does not compute as PEFT
// would: `field`'s value must be absent, null or `allowed` (false, "none", an empty object or
// list).
absl::Status RequireDefault(const Json& config, const std::string& where, const char* field,
                            const Json& allowed, absl::string_view meaning) {
  const auto it = config.find(field);
  if (it == config.end() || it->is_null() || *it == allowed) return absl::OkStatus();
  if (allowed.is_structured() && it->is_structured() && it->empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", field, ": ", base::DescribeJson(*it),
                                                 " (", meaning, ") is not supported"));
}

}  // namespace

absl::Status SavePeftAdapter(const std::string& dir, const wrap::LoraConfig& config,
                             const std::vector<std::pair<std::string, at::Tensor>>& adapters,
                             const std::string& base_model) {
  PLAIT_ASSIGN_OR_RETURN(const auto modules, GroupByModule(adapters, config.rank(), dir));
  // Checked again when writing: a run lasts long, and its folder may have changed since.
  PLAIT_RETURN_IF_ERROR(
      base::CheckOutputFolder(dir, IsEarlierAdapterFile, "a plait adapter").status());
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot create \"", dir, "\": ", error.message()));
  }
  std::vector<std::string> targets;
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& [module, matrices] : modules) {
    targets.push_back(module);
    tensors.emplace_back(absl::StrCat(kPeftPrefix, module, kSuffixA), matrices.a);
    tensors.emplace_back(absl::StrCat(kPeftPrefix, module, kSuffixB), matrices.b);
  }
  // The fields PEFT's LoraConfig writes that decide what the adapter computes, with the
  // values plait's LoRA has (no DoRA, no bias, PEFT's default initialisation).
  const Json json = {
      {"peft_type", "LORA"},
      {"task_type", "CAUSAL_LM"},
      {"base_model_name_or_path", base_model},
      {"r", config.rank()},
      {"lora_alpha", config.alpha()},
      {"lora_dropout", config.dropout()},
      {"use_rslora", config.use_rslora()},
      {"target_modules", targets},
      {"bias", "none"},
      {"fan_in_fan_out", false},
      {"use_dora", false},
      {"init_lora_weights", true},
      {"inference_mode", true},
      {"modules_to_save", nullptr},
      {"rank_pattern", Json::object()},
      {"alpha_pattern", Json::object()},
  };
  PLAIT_RETURN_IF_ERROR(
      base::WriteFileAtomically(absl::StrCat(dir, "/", kConfigFile), json.dump(2) + "\n"));
  return models::WriteSafetensors(absl::StrCat(dir, "/", kWeightsFile), tensors,
                                  {{"format", "pt"}, {kWriterKey, kWriterPlait}});
}

std::vector<base::Violation> CheckPeftAdapterFolder(const std::string& dir,
                                                    const std::string& field) {
  if (dir.empty()) return {};
  const absl::Status status =
      base::CheckOutputFolder(dir, IsEarlierAdapterFile, "a plait adapter").status();
  if (status.ok()) return {};
  return {{field, std::string(status.message()), ""}};
}

absl::StatusOr<PeftAdapter> ReadPeftAdapter(const std::string& dir) {
  const std::string config_path = absl::StrCat(dir, "/", kConfigFile);
  PLAIT_ASSIGN_OR_RETURN(const std::string text, base::ReadFile(config_path));
  PLAIT_ASSIGN_OR_RETURN(const Json json, base::ParseJson(config_path, text));
  if (!json.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(config_path, ": expected an object, got ", base::DescribeJson(json)));
  }
  const base::JsonFields fields(json, config_path);
  PLAIT_ASSIGN_OR_RETURN(const std::string type, fields.String("peft_type"));
  if (type != "LORA") {
    return fields.Error("peft_type", absl::StrCat("\"", type, "\" is not a LoRA adapter"));
  }
  PLAIT_RETURN_IF_ERROR(RequireDefault(json, config_path, "use_dora", false, "DoRA"));
  PLAIT_RETURN_IF_ERROR(RequireDefault(json, config_path, "bias", "none", "trained biases"));
  PLAIT_RETURN_IF_ERROR(
      RequireDefault(json, config_path, "fan_in_fan_out", false, "transposed weights"));
  PLAIT_RETURN_IF_ERROR(
      RequireDefault(json, config_path, "rank_pattern", Json::object(), "per-module ranks"));
  PLAIT_RETURN_IF_ERROR(
      RequireDefault(json, config_path, "alpha_pattern", Json::object(), "per-module alphas"));
  PLAIT_RETURN_IF_ERROR(
      RequireDefault(json, config_path, "modules_to_save", Json::array(), "fully trained modules"));
  PLAIT_ASSIGN_OR_RETURN(const int64_t rank, fields.Int("r"));
  PLAIT_ASSIGN_OR_RETURN(const double alpha, fields.Double("lora_alpha"));
  PLAIT_ASSIGN_OR_RETURN(const double dropout, fields.Double("lora_dropout", 0.0));
  PLAIT_ASSIGN_OR_RETURN(const bool use_rslora, fields.Bool("use_rslora", false));
  if (rank <= 0 || rank > (int64_t{1} << 30)) {
    return fields.Error("r", absl::StrCat(rank, " is not a positive rank"));
  }
  if (!(alpha > 0) || !std::isfinite(alpha)) {
    return fields.Error("lora_alpha", absl::StrCat(alpha, " is not positive"));
  }

  const std::string weights_path = absl::StrCat(dir, "/", kWeightsFile);
  PLAIT_ASSIGN_OR_RETURN(std::unique_ptr<models::SafetensorsFile> file,
                         models::SafetensorsFile::Open(weights_path));
  PeftAdapter adapter;
  for (const auto& entry : file->entries()) {
    const std::string& name = entry.first;
    absl::string_view plait_name = name;
    if (!absl::ConsumePrefix(&plait_name, kPeftPrefix)) {
      return absl::InvalidArgumentError(absl::StrCat(
          weights_path, ": ", name, " is not named as PEFT saves a causal LM's adapters (",
          kPeftPrefix, "<module>", kSuffixA, ")"));
    }
    PLAIT_ASSIGN_OR_RETURN(at::Tensor tensor, file->Read(name));
    PLAIT_RETURN_IF_ERROR(CheckFinite(tensor, weights_path, name));
    adapter.tensors.emplace_back(std::string(plait_name), std::move(tensor));
  }
  PLAIT_ASSIGN_OR_RETURN(const auto modules, GroupByModule(adapter.tensors, rank, weights_path));
  for (const auto& [module, matrices] : modules) adapter.config.add_target(module);
  adapter.config.set_rank(static_cast<int32_t>(rank));
  adapter.config.set_alpha(alpha);
  adapter.config.set_dropout(dropout);
  adapter.config.set_use_rslora(use_rslora);
  return adapter;
}

}  // namespace plait::wrap::lora
