// Wrappable is what a preparation step (FSDP, tensor parallel, DDP, LoRA, ...) sees of a
// model: its ordered repeated blocks, which are the natural FSDP units; the parameters outside
// those blocks (embeddings, final norm, output head), which form the root unit; every
// parameter's fully qualified name and how Megatron's layout splits it; the structural cuts a
// step may make (a pipeline stage's blocks, a rank's experts, the heads a sharded attention
// holds); and the seams of its forward pass (seams.h), where a step adds what it computes.
// Steps depend on this interface only, never on a concrete model.
//
//   Wrappable& model = ...;  // e.g. a plait::models::CausalLM
//   for (const Wrappable::Unit& block : model.Blocks()) {
//     // block.name is "model.layers.3"; block.module->named_parameters() are relative to it.
//   }
//   // Tensor parallel over 4 ranks: shard q/k/v column-wise, then
//   model.SetLocalHeads(model.NumHeads() / 4, model.NumKeyValueHeads() / 4);
//   model.seams().Add(&layer);  // the forward now runs the layer at the seams it changes
//
// Names are the ones checkpoints use (Hugging Face names for plait's models), so wrapper
// plans keyed by name patterns and checkpoint files agree.
#ifndef PLAIT_WRAP_WRAPPABLE_H_
#define PLAIT_WRAP_WRAPPABLE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "wrap/seams.h"

namespace torch::nn {
class Module;  // torch/nn/module.h, included by the sources that call a module
}  // namespace torch::nn

namespace plait::wrap {

// A mixture-of-experts layer's experts are named "<layer's block>.experts.<index>.<rest>"
// ("model.layers.3.mlp.experts.5.up_proj.weight", their adapters' too).
inline constexpr char kExpertsInName[] = ".experts.";

// Whether `name` is a parameter of one of a mixture-of-experts layer's experts.
inline bool IsExpertParameter(const std::string& name) {
  return name.find(kExpertsInName) != std::string::npos;
}

// The index in its layer of the expert whose parameter `name` is; -1 for a parameter that is
// not an expert's.
inline int64_t ExpertIndexOf(const std::string& name) {
  const size_t experts = name.find(kExpertsInName);
  if (experts == std::string::npos) return -1;
  const size_t at = experts + sizeof(kExpertsInName) - 1;
  int64_t index = -1;
  return absl::SimpleAtoi(name.substr(at, name.find('.', at) - at), &index) ? index : -1;
}

class Wrappable {
 public:
  // One repeated block: its module and the fully qualified name of that module, so the
  // block's parameter `p` has the full name `name + "." + p`.
  struct Unit {
    std::string name;
    std::shared_ptr<torch::nn::Module> module;
    // Which of the stages the model keeps (KeepStages) runs it: 0 unless a pipeline rank
    // keeps several, whose forwards each run one stage's units (SelectStage).
    int stage = 0;
  };

  // A parameter with its fully qualified name.
  struct NamedParameter {
    std::string name;
    at::Tensor parameter;
  };

  // Callbacks a wrapper has the model run around its units' forward passes (FSDP gathers a
  // unit's parameters just before it computes and frees them after). `before_forward(u)` runs
  // just before unit u computes; `after_forward(u, output)` receives the unit's output and
  // returns the tensor the model continues with (the same values; a wrapper may attach an
  // autograd hook to it). Units are the blocks, 0 .. Blocks().size() - 1 in order, and
  // kRootUnit for the whole forward pass: its before_forward runs first and its
  // after_forward receives the model's final output. An empty function is not called.
  // FSDP frees the root's parameters while the blocks run, forward and backward, so a model
  // may use them before the first block only in ops whose backward reads no more than their
  // shape (an embedding lookup: LibTorch 1.13's EmbeddingBackward0 keeps the weight but reads
  // only its size), and after the last block only in ops computed from its output.
  static constexpr int kRootUnit = -1;
  struct UnitHooks {
    std::function<void(int unit)> before_forward;
    std::function<at::Tensor(int unit, at::Tensor output)> after_forward;
  };

  virtual ~Wrappable() = default;

  // The module owning every parameter, blocks included.
  virtual torch::nn::Module& RootModule() = 0;

  // The repeated blocks in execution order (first block runs first in the forward pass).
  virtual std::vector<Unit> Blocks() = 0;

  // The parameters that belong to no block, in a fixed order.
  virtual std::vector<NamedParameter> RootParameters() = 0;

  // Every parameter (blocks and root), each once, with its fully qualified name.
  virtual std::vector<NamedParameter> NamedParameters() = 0;

  // The global attention head counts of the model's config.
  virtual int64_t NumHeads() const = 0;
  virtual int64_t NumKeyValueHeads() const = 0;

  // Tells every block's attention the head counts its (sharded) projections hold after
  // tensor-parallel sharding over s = NumHeads() / num_heads ranks: num_kv_heads is
  // NumKeyValueHeads() / s, or 1 when s is a multiple of NumKeyValueHeads() (replicated
  // key/value heads). InvalidArgument for any other counts.
  virtual absl::Status SetLocalHeads(int64_t num_heads, int64_t num_kv_heads) = 0;

  // Installs `hooks`, replacing any installed before.
  virtual void SetUnitHooks(UnitHooks hooks) = 0;

  // Pipeline parallelism: keeps the blocks of `stages`, each [begin, end) of Blocks(), ascending
  // and disjoint (a rank of an interleaved pipeline holds several stages), and drops the others;
  // with block 0 the input layers (the embedding), with the last block the output layers (the
  // final norm and the output projection; and the embedding too where the output projection is
  // the embedding matrix, tied). What is kept keeps its name, so NamedParameters, Blocks and
  // RootParameters list the stages' parameters under the whole model's names, and checkpoints
  // stay layout-free. For a model built deferred, before any wrapper and before any value
  // (dropping is then free); once. InvalidArgument naming the stages when one is empty,
  // outside the blocks or not after the one before, FailedPrecondition when the model was cut
  // before.
  virtual absl::Status KeepStages(const std::vector<std::pair<int64_t, int64_t>>& stages) = 0;
  // Which of the kept stages the next forwards run (the first until changed): its blocks, from
  // the embedding where it starts at block 0 (else from the hidden state the stage before
  // produced), to the output layers where it ends at the last block. InvalidArgument naming
  // the index when the model holds no such stage.
  virtual absl::Status SelectStage(int index) = 0;
  // Whether the selected stage starts with the input layers (the whole model, or the first
  // stage), and whether it ends with the output layers (the whole model, or the last stage).
  virtual bool HoldsInputLayers() const = 0;
  virtual bool HoldsOutputLayers() const = 0;

  // How a step that splits the model's layers over ranks splits a parameter (seams.h). A
  // parameter a step added (SeamLayer::AddedParameterSplit) splits as that step says.
  using Split = ParameterSplit;
  virtual Split SplitOf(const std::string& name) const = 0;

  // Keeps only experts [first, first + count) of each mixture-of-experts layer (a rank's share
  // under expert parallelism): the others' parameters leave the model, and the layers compute
  // the others' rows through the experts seam.
  virtual void KeepExperts(int64_t first, int64_t count) = 0;

  // The seams of its forward pass, where the preparation's steps add their layers.
  virtual Seams& seams() = 0;
};

}  // namespace plait::wrap

#endif  // PLAIT_WRAP_WRAPPABLE_H_
