#include "wrap/lora/starting_adapters.h"

#include <functional>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "base/status.h"
#include "wrap/lora/peft_adapter.h"

namespace plait::wrap::lora {
namespace {

constexpr absl::string_view kAdapterA = ".lora_A.weight";

// "[2, 3]"
std::string Shape(const std::vector<int64_t>& sizes) {
  return absl::StrCat("[", absl::StrJoin(sizes, ", "), "]");
}

// The first of `names` that `others` lacks, or "".
std::string FirstMissing(const std::set<std::string>& names, const std::set<std::string>& others) {
  for (const std::string& name : names) {
    if (others.count(name) == 0) return name;
  }
  return "";
}

}  // namespace

std::array<AdapterMatrixShape, 2> AdapterMatricesOf(const AdaptedProjection& projection,
                                                    int64_t rank) {
  return {AdapterMatrixShape{absl::StrCat(projection.module, kAdapterA), {rank, projection.in}},
          AdapterMatrixShape{absl::StrCat(projection.module, ".lora_B.weight"),
                             {projection.out, rank}}};
}

std::optional<std::string> ModuleOfAdapterA(absl::string_view name) {
  if (!absl::ConsumeSuffix(&name, kAdapterA)) return std::nullopt;
  return std::string(name);
}

absl::StatusOr<std::map<std::string, at::Tensor>> ReadStartingAdapters(
    const LoraConfig& config, const std::vector<AdaptedProjection>& projections,
    const std::function<bool(const std::string& module)>& holds_module) {
  const std::string& dir = config.initial_adapter_dir();
  const auto error = [&](const std::string& message) {
    return absl::InvalidArgumentError(absl::StrCat(dir, ": ", message));
  };
  absl::StatusOr<wrap::lora::PeftAdapter> adapter = wrap::lora::ReadPeftAdapter(dir);
  if (!adapter.ok()) return absl::InvalidArgumentError(adapter.status().message());
  const LoraConfig& saved = adapter->config;
  if (saved.rank() != config.rank()) {
    return error(absl::StrCat("its adapters have rank (r) ", saved.rank(), ", the step's rank is ",
                              config.rank()));
  }
  if (saved.alpha() != config.alpha()) {
    return error(absl::StrCat("its lora_alpha is ", saved.alpha(), ", the step's alpha is ",
                              config.alpha()));
  }
  if (saved.use_rslora() != config.use_rslora()) {
    return error(absl::StrCat("its use_rslora is ", saved.use_rslora() ? "true" : "false",
                              ", the step's ", config.use_rslora() ? "true" : "false"));
  }
  std::set<std::string> in_folder;
  for (const std::string& module : saved.target()) {
    if (holds_module(module)) in_folder.insert(module);
  }
  std::set<std::string> targeted;
  for (const AdaptedProjection& projection : projections) targeted.insert(projection.module);
  if (const std::string extra = FirstMissing(in_folder, targeted); !extra.empty()) {
    return error(absl::StrCat("it adapts ", extra, ", which the step's targets (",
                              absl::StrJoin(config.target(), ", "), ") do not match"));
  }
  if (const std::string missing = FirstMissing(targeted, in_folder); !missing.empty()) {
    return error(absl::StrCat("it has no adapters for ", missing, ", which the step's targets (",
                              absl::StrJoin(config.target(), ", "), ") match"));
  }
  std::map<std::string, at::Tensor> stored(std::make_move_iterator(adapter->tensors.begin()),
                                           std::make_move_iterator(adapter->tensors.end()));
  std::map<std::string, at::Tensor> values;  // the held projections' alone
  for (const AdaptedProjection& projection : projections) {
    for (const auto& [name, shape] : AdapterMatricesOf(projection, config.rank())) {
      at::Tensor& tensor = stored.at(name);
      if (tensor.sizes().vec() != shape) {
        return error(absl::StrCat(name, " is ", Shape(tensor.sizes().vec()),
                                  "; the projection's weight [out, in] = ",
                                  Shape({projection.out, projection.in}), " needs ", Shape(shape)));
      }
      values.emplace(name, std::move(tensor));
    }
  }
  return values;
}

}  // namespace plait::wrap::lora
