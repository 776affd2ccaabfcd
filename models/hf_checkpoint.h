// Loading a Hugging Face model folder (config.json plus model.safetensors, or sharded files
// with model.safetensors.index.json) into a plait CausalLM, and exporting a CausalLM back
// to one, with Hugging Face's parameter names (`model.embed_tokens.weight`,
// `model.layers.{i}.self_attn.q_proj.weight`, ..., `model.norm.weight`, `lm_head.weight`).
//
//   PLAIT_ASSIGN_OR_RETURN(std::shared_ptr<CausalLM> model, LoadHfModel("/ckpt/Qwen2.5-0.5B"));
//   ... train ...
//   PLAIT_RETURN_IF_ERROR(SaveHfModel(*model, "/out/step1000", at::kBFloat16));
#ifndef PLAIT_MODELS_HF_CHECKPOINT_H_
#define PLAIT_MODELS_HF_CHECKPOINT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/own_output.h"
#include "base/violation.h"
#include "models/causal_lm.h"
#include "models/safetensors.h"

namespace plait::models {

// The part of one parameter that a rank holds, to be loaded from a checkpoint: the box at
// `offsets` spanning `lengths` (one of each per dimension) of the whole parameter `name` of
// shape `shape`, copied into `destination` (a tensor of the box's shape, or a view into this
// rank's parameter). A rank that holds a whole parameter asks for the whole box; a
// tensor-parallel or FSDP rank asks for its slice (parallel/tensor_slice.h's box). With
// `receive` set, `destination` only gives the dtype and device: the part is read into a fresh
// tensor of the box's shape, handed to `receive` and released before the next part is read
// (a frozen weight a wrapper stores quantized, so that no more than one is held whole).
struct HfParameterPart {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<int64_t> offsets;
  std::vector<int64_t> lengths;
  at::Tensor destination;
  std::function<void(const at::Tensor& values)> receive;
};

// Copies each of `parts` (the parts of the model's parameters this rank holds, each once: all
// of them whole for one process, a shard of each under FSDP, one stage's under a pipeline, one
// rank's experts under expert parallelism) from `checkpoint`, reading only each part's bytes
// and converting the stored dtype (F32, BF16, F16) to the destination's. The checkpoint is
// checked whole against the model `config` describes, whatever `parts` holds, so every rank
// finds the same problems in it. Errors name the file (or folder) and the tensor: NotFound
// when a parameter of the model is missing; InvalidArgument when one has another shape or a
// non-float dtype, a part holds NaN or infinity, or the checkpoint holds a tensor that is no
// parameter of the model. Two tensors are accepted and skipped because Hugging Face writes
// them without them being parameters: `lm_head.weight` in a tied model (it equals the
// embedding), and the precomputed `*.rotary_emb.inv_freq` buffers of older Llama checkpoints.
absl::Status LoadHfParts(const SafetensorsCheckpoint& checkpoint, const ModelConfig& config,
                         const std::vector<HfParameterPart>& parts);

// LoadHfParts with every parameter of `model`, whole.
absl::Status LoadHfWeights(const SafetensorsCheckpoint& checkpoint, CausalLM& model);

// Reads `dir`/config.json, builds the model in fp32 on the host without initialising it
// (CausalLM::CreateDeferred, then MaterializeParameters) and loads its weights.
absl::StatusOr<std::shared_ptr<CausalLM>> LoadHfModel(const std::string& dir);

// Writes config.json and the weights into the existing folder `dir`, in `dtype` (kFloat32
// or kBFloat16), sharded as WriteSafetensorsCheckpoint does when `max_shard_bytes` > 0.
absl::Status SaveHfModel(CausalLM& model, const std::string& dir, at::ScalarType dtype = at::kFloat,
                         uint64_t max_shard_bytes = 0);

// As SaveHfModel, for a model held elsewhere as whole tensors (a sharded model's, gathered):
// `config` and `parameters` (every parameter by its Hugging Face name, in the file's order).
// Creates `dir` when it is missing; refuses, before writing anything, a `dir` that holds
// anything but an earlier export's files (see CheckHfExportFolder).
absl::Status SaveHfParameters(const ModelConfig& config,
                              const std::vector<std::pair<std::string, at::Tensor>>& parameters,
                              const std::string& dir, at::ScalarType dtype = at::kFloat,
                              uint64_t max_shard_bytes = 0);

// Every reason the folder `dir` cannot receive an export of a job that reads `inputs` (the
// folders its weights come from, by field), found before the job trains (or a tool reads
// anything), so a trained model is never lost at its end and no file is overwritten that the
// export did not write: `dir` is one of the inputs, once links are followed
// (base::CheckOutputsApart), exists and is not a folder, holds anything but an earlier
// export's files (model safetensors files and index carrying plait's mark, see kWriterKey, and
// the config.json beside them: a downloaded model's folder is refused), or cannot be written
// (base/own_output.h). Errors name `field`.
std::vector<base::Violation> CheckHfExportFolder(const std::string& dir,
                                                 const std::vector<base::NamedPath>& inputs,
                                                 const std::string& field);

}  // namespace plait::models

#endif  // PLAIT_MODELS_HF_CHECKPOINT_H_
