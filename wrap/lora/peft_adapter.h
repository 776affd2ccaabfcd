// A LoRA adapter folder as PEFT writes and reads one (`save_pretrained` /
// `PeftModel.from_pretrained`): `adapter_config.json` (peft_type "LORA", r, lora_alpha,
// lora_dropout, use_rslora, target_modules) and `adapter_model.safetensors`, whose tensors
// are named `base_model.model.<module>.lora_A.weight` [r, in] and `...lora_B.weight` [out, r]
// for every adapted projection `<module>` (plait's own names are `<module>.lora_A.weight`,
// wrap/lora/lora.h). So an adapter trained by plait loads in PEFT on the same base folder,
// and one PEFT trained continues training in plait.
//
//   PLAIT_RETURN_IF_ERROR(SavePeftAdapter("/out/adapter", config, adapters, "/ckpt/Qwen2.5-0.5B"));
//   PLAIT_ASSIGN_OR_RETURN(PeftAdapter adapter, ReadPeftAdapter("/out/adapter"));
//
// Written by hand because no C++ library reads PEFT's format: it is two files in formats
// plait already reads (safetensors, JSON) with PEFT's names and fields.
#ifndef PLAIT_WRAP_LORA_PEFT_ADAPTER_H_
#define PLAIT_WRAP_LORA_PEFT_ADAPTER_H_

#include <string>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/violation.h"
#include "wrap/wrap.pb.h"

namespace plait::wrap::lora {

// An adapter folder's contents in plait's terms.
struct PeftAdapter {
  // rank, alpha, dropout and use_rslora from adapter_config.json; `target` holds the adapted
  // projections' module names, exactly (PEFT's target_modules may be suffixes or a regular
  // expression; the tensors say which modules it adapted).
  wrap::LoraConfig config;
  // Every adapter tensor by plait's name, A and B of each module, in the file's order.
  std::vector<std::pair<std::string, at::Tensor>> tensors;
};

// Writes `adapters` (plait's names, `<module>.lora_A.weight` and `<module>.lora_B.weight` of
// each adapted module, as Lora's trainable parameters are named) into the folder `dir`
// (created if missing) as PEFT does, with `config`'s rank, alpha, dropout and use_rslora, the
// adapted modules as target_modules and `base_model` as base_model_name_or_path; the
// safetensors file carries plait's mark (safetensors.h's kWriterKey). InvalidArgument naming
// the tensor for a name that is not an adapter's or a module without both matrices;
// FailedPrecondition when `dir` holds anything but an earlier adapter plait wrote
// (CheckPeftAdapterFolder).
absl::Status SavePeftAdapter(const std::string& dir, const wrap::LoraConfig& config,
                             const std::vector<std::pair<std::string, at::Tensor>>& adapters,
                             const std::string& base_model);

// Every reason the folder `dir` cannot receive SavePeftAdapter's files, found before a run
// trains: it exists and is not a folder, cannot be written, or holds anything but an earlier
// adapter plait wrote (its marked adapter_model.safetensors and the adapter_config.json
// beside it), so no file of the user's (a downloaded adapter) is replaced. Errors name
// `field`; none for an empty `dir`.
std::vector<base::Violation> CheckPeftAdapterFolder(const std::string& dir,
                                                    const std::string& field);

// Reads the adapter folder `dir`. Errors name the file and the field or tensor: NotFound for
// a missing file; InvalidArgument for a config plait cannot apply as PEFT would (a peft_type
// other than LORA, DoRA, bias other than "none", fan_in_fan_out, per-module rank_pattern or
// alpha_pattern, modules_to_save), a tensor that is not a LoRA matrix, a module without both
// matrices, or matrices whose shapes disagree with r or with each other.
absl::StatusOr<PeftAdapter> ReadPeftAdapter(const std::string& dir);

}  // namespace plait::wrap::lora

#endif  // PLAIT_WRAP_LORA_PEFT_ADAPTER_H_
