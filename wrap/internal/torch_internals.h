// The few LibTorch internals FSDP, DDP and activation checkpointing need, in one place so
// that a LibTorch upgrade touches only this file: hooks that run after a leaf's gradient was
// accumulated and at the end of a backward pass (what PyTorch's own DDP reducer uses),
// freeing and refilling a tensor's storage in place (what PyTorch's FSDP2 does with
// untyped_storage().resize_()), suspending a leaf's tensor hooks, and taking a parameter out
// of its module (what Python's `del module.weight` does).
// Checked against LibTorch 1.13 and 2.13 (the pointer type of a node differs between them:
// base/torch_compat.h).
#ifndef PLAIT_WRAP_INTERNAL_TORCH_INTERNALS_H_
#define PLAIT_WRAP_INTERNAL_TORCH_INTERNALS_H_

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "base/torch_compat.h"

namespace torch::nn {
class Module;  // torch/nn/module.h, included by the sources that call a module
}  // namespace torch::nn

namespace plait::wrap::internal {

// Keeps the hook of AddPostAccumulateHook registered; the hook lives as long as this.
using HookHandle = base::AutogradNodePtr;

// Runs `hook` each time autograd has accumulated a gradient into leaf `parameter`'s .grad.
HookHandle AddPostAccumulateHook(const at::Tensor& parameter, std::function<void()> hook);

// Runs `callback` once, when the backward pass running on this thread ends. Call it only
// from inside a backward pass (a hook).
void QueueEndOfBackwardCallback(std::function<void()> callback);

// Releases `tensor`'s memory, leaving its storage empty; the tensor keeps its shape and its
// autograd identity (saved tensors and views refer to the same storage).
void FreeStorage(const at::Tensor& tensor);

// Gives the storage of `tensor` (and of its views) memory for its full size again and returns
// an alias of `tensor` to write its values through: writes to the alias leave `tensor`'s
// autograd version counter alone, so tensors autograd saved before the storage was freed
// read the new values as if nothing had happened.
at::Tensor RestoreStorage(const at::Tensor& tensor);

// Removes parameter `name` (registered directly on `module`) from the parameters `module`
// lists; LibTorch has no public call for it. The module's own member for it, if it keeps one,
// still refers to the tensor.
void UnregisterParameter(torch::nn::Module& module, const std::string& name);

// While it lives, the tensor hooks (Tensor::register_hook) of `leaves` do not run. For
// gradients torch::autograd::grad captures at leaves, which LibTorch 2.x passes through their
// tensor hooks (1.13 does not): activation checkpointing captures a block's parameters'
// gradients from its recomputation and hands them on to the parameters' accumulators, where
// the hooks (tensor parallelism's) must run once, as without checkpointing.
class SuspendedTensorHooks {
 public:
  explicit SuspendedTensorHooks(const std::vector<at::Tensor>& leaves);
  ~SuspendedTensorHooks();
  SuspendedTensorHooks(const SuspendedTensorHooks&) = delete;
  SuspendedTensorHooks& operator=(const SuspendedTensorHooks&) = delete;

 private:
  std::vector<std::pair<base::TensorPreHooks*, base::TensorPreHooks>> suspended_;
};

}  // namespace plait::wrap::internal

#endif  // PLAIT_WRAP_INTERNAL_TORCH_INTERNALS_H_
