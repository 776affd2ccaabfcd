// Wrappable is what a parallelism wrapper (FSDP, tensor parallel, DDP) sees of a model: its
// ordered repeated blocks, which are the natural FSDP units; the parameters outside those
// blocks (embeddings, final norm, output head), which form the root unit; every parameter's
// fully qualified name; and the one model-specific change tensor parallelism needs, telling
// attention how many heads its sharded projections now hold. Wrappers depend on this
// interface only, never on a concrete model.
//
//   Wrappable& model = ...;  // e.g. a plait::models::CausalLM
//   for (const Wrappable::Unit& block : model.Blocks()) {
//     // block.name is "model.layers.3"; block.module->named_parameters() are relative to it.
//   }
//   // Tensor parallel over 4 ranks: shard q/k/v column-wise, then
//   model.SetLocalHeads(model.NumHeads() / 4, model.NumKeyValueHeads() / 4);
//
// Names are the ones checkpoints use (Hugging Face names for plait's models), so wrapper
// plans keyed by name patterns and checkpoint files agree.
#ifndef PLAIT_WRAP_WRAPPABLE_H_
#define PLAIT_WRAP_WRAPPABLE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "torch/torch.h"

namespace plait::wrap {

class Wrappable {
 public:
  // One repeated block: its module and the fully qualified name of that module, so the
  // block's parameter `p` has the full name `name + "." + p`.
  struct Unit {
    std::string name;
    std::shared_ptr<torch::nn::Module> module;
  };

  // A parameter with its fully qualified name.
  struct NamedParameter {
    std::string name;
    torch::Tensor parameter;
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
    std::function<torch::Tensor(int unit, torch::Tensor output)> after_forward;
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
  // tensor-parallel sharding. InvalidArgument when the counts are not positive, do not divide
  // the global counts, or `num_heads` is not a multiple of `num_kv_heads`.
  virtual absl::Status SetLocalHeads(int64_t num_heads, int64_t num_kv_heads) = 0;

  // Installs `hooks`, replacing any installed before.
  virtual void SetUnitHooks(UnitHooks hooks) = 0;
};

}  // namespace plait::wrap

#endif  // PLAIT_WRAP_WRAPPABLE_H_
