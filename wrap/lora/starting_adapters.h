// The adapters a LoRA step starts from when its config names a PEFT adapter folder
// (LoraConfig.initial_adapter_dir), to continue training an adapter PEFT or plait saved:
// the folder's rank, alpha and rsLoRA choice must be the step's (they define what the adapters
// compute; dropout is the step's own), and its modules exactly the projections the step's
// targets adapt, each with matrices of the projection's shape.
//
//   PLAIT_ASSIGN_OR_RETURN(auto values, ReadStartingAdapters(config, projections));
//   // values["model.layers.0.self_attn.q_proj.lora_A.weight"]: [rank, in]
#ifndef PLAIT_WRAP_LORA_STARTING_ADAPTERS_H_
#define PLAIT_WRAP_LORA_STARTING_ADAPTERS_H_

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "wrap/wrap.pb.h"

namespace plait::wrap::lora {

// A projection a LoRA step adapts: its module name and its weight's [out, in].
struct AdaptedProjection {
  std::string module;
  int64_t out = 0;
  int64_t in = 0;
};

// One adapter matrix of a projection, by plait's (PEFT's) name, and its shape.
struct AdapterMatrixShape {
  std::string name;
  std::vector<int64_t> shape;
};

// The adapters LoRA gives `projection` at `rank`: A, `<module>.lora_A.weight` [rank, in], then
// B, `<module>.lora_B.weight` [out, rank].
std::array<AdapterMatrixShape, 2> AdapterMatricesOf(const AdaptedProjection& projection,
                                                    int64_t rank);

// The module whose adapter A `name` is (`<module>.lora_A.weight`), or nullopt.
std::optional<std::string> ModuleOfAdapterA(absl::string_view name);

// The A and B of every projection in `projections`, by plait's names
// (`<module>.lora_A.weight`), read from the folder config.initial_adapter_dir, as stored
// there. `projections` are those a rank's model holds: a module of the folder that
// `holds_module` says the rank's model lacks is another rank's (a pipeline's other stages)
// and left to it; the plan's check reads the folder against the whole model, with every
// module held, so a module no rank holds is still refused. InvalidArgument, naming the folder
// and the file, field or tensor, for a folder that cannot be read (wrap::lora::ReadPeftAdapter's
// errors), that disagrees with `config`'s rank, alpha or use_rslora, that adapts another set
// of the held modules (naming the first one either side lacks), or whose matrices do not fit
// their projection.
absl::StatusOr<std::map<std::string, at::Tensor>> ReadStartingAdapters(
    const LoraConfig& config, const std::vector<AdaptedProjection>& projections,
    const std::function<bool(const std::string& module)>& holds_module);

}  // namespace plait::wrap::lora

#endif  // PLAIT_WRAP_LORA_STARTING_ADAPTERS_H_
