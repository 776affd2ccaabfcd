// The few LibTorch internals FSDP and DDP need, in one place so that a LibTorch upgrade
// touches only this file: hooks that run after a leaf's gradient was accumulated and at the
// end of a backward pass (what PyTorch's own DDP reducer uses), and freeing and refilling a
// tensor's storage in place (what PyTorch's FSDP2 does with untyped_storage().resize_()).
// Checked against LibTorch 1.13 and 2.13 (the pointer type of a node differs between them:
// base/torch_compat.h).
#ifndef PLAIT_WRAP_INTERNAL_TORCH_INTERNALS_H_
#define PLAIT_WRAP_INTERNAL_TORCH_INTERNALS_H_

#include <functional>
#include <memory>

#include "base/torch_compat.h"
#include "torch/torch.h"

namespace plait::wrap::internal {

// Keeps the hook of AddPostAccumulateHook registered; the hook lives as long as this.
using HookHandle = base::AutogradNodePtr;

// Runs `hook` each time autograd has accumulated a gradient into leaf `parameter`'s .grad.
HookHandle AddPostAccumulateHook(const torch::Tensor& parameter, std::function<void()> hook);

// Runs `callback` once, when the backward pass running on this thread ends. Call it only
// from inside a backward pass (a hook).
void QueueEndOfBackwardCallback(std::function<void()> callback);

// Releases `tensor`'s memory, leaving its storage empty; the tensor keeps its shape and its
// autograd identity (saved tensors and views refer to the same storage).
void FreeStorage(const torch::Tensor& tensor);

// Gives the storage of `tensor` (and of its views) memory for its full size again and returns
// an alias of `tensor` to write its values through: writes to the alias leave `tensor`'s
// autograd version counter alone, so tensors autograd saved before the storage was freed
// read the new values as if nothing had happened.
torch::Tensor RestoreStorage(const torch::Tensor& tensor);

}  // namespace plait::wrap::internal

#endif  // PLAIT_WRAP_INTERNAL_TORCH_INTERNALS_H_
