#include "wrap/internal/torch_internals.h"

#include <utility>

#include "ATen/core/Tensor.h"
#include "c10/core/DeviceGuard.h"
#include "c10/core/StorageImpl.h"
#include "torch/csrc/autograd/engine.h"
#include "torch/csrc/autograd/function.h"
#include "torch/csrc/autograd/function_hook.h"
#include "torch/csrc/autograd/generated/variable_factories.h"
#include "torch/csrc/autograd/variable.h"
#include "torch/nn/module.h"

namespace plait::wrap::internal {
namespace {

class LambdaPostHook final : public torch::autograd::FunctionPostHook {
 public:
  explicit LambdaPostHook(std::function<void()> hook) : hook_(std::move(hook)) {}

  torch::autograd::variable_list operator()(
      const torch::autograd::variable_list& outputs,
      const torch::autograd::variable_list& /*inputs*/) override {
    hook_();
    return outputs;
  }

 private:
  std::function<void()> hook_;
};

}  // namespace

HookHandle AddPostAccumulateHook(const at::Tensor& parameter, std::function<void()> hook) {
  // The variable holds its accumulator weakly: the handle keeps it, and so the hook, alive.
  base::AutogradNodePtr accumulator = torch::autograd::impl::grad_accumulator(parameter);
  accumulator->add_post_hook(std::make_unique<LambdaPostHook>(std::move(hook)));
  return accumulator;
}

void QueueEndOfBackwardCallback(std::function<void()> callback) {
  torch::autograd::Engine::get_default_engine().queue_callback(std::move(callback));
}

void FreeStorage(const at::Tensor& tensor) {
  c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(at::DataPtr(nullptr, tensor.device()));
  storage->set_nbytes(0);
}

namespace {

// Reaches torch::nn::Module's protected parameter list, which derived classes may name.
struct ModuleParameters : torch::nn::Module {
  static torch::OrderedDict<std::string, at::Tensor>& Of(torch::nn::Module& module) {
    return module.*(&ModuleParameters::parameters_);
  }
};

}  // namespace

void UnregisterParameter(torch::nn::Module& module, const std::string& name) {
  ModuleParameters::Of(module).erase(name);
}

at::Tensor RestoreStorage(const at::Tensor& tensor) {
  c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
  const size_t nbytes = (tensor.storage_offset() + tensor.numel()) * tensor.element_size();
  if (storage->nbytes() < nbytes) {
    // The allocator allocates on the calling thread's current device (CUDA's caching
    // allocator does), which ATen's own ops set for each call and this one must set too.
    const c10::DeviceGuard on_device(tensor.device());
    storage->set_data_ptr_noswap(storage->allocator()->allocate(nbytes));
    storage->set_nbytes(nbytes);
  }
  // A fresh alias of the memory has its own version counter.
  return torch::from_blob(tensor.data_ptr(), tensor.sizes(), tensor.strides(),
                          tensor.options().requires_grad(false));
}

SuspendedTensorHooks::SuspendedTensorHooks(const std::vector<at::Tensor>& leaves) {
  for (const at::Tensor& leaf : leaves) {
    base::TensorPreHooks* hooks = base::CapturedLeafHooks(leaf);
    if (hooks == nullptr || hooks->empty()) continue;
    suspended_.emplace_back(hooks, std::move(*hooks));
    hooks->clear();
  }
}

SuspendedTensorHooks::~SuspendedTensorHooks() {
  for (auto& [hooks, suspended] : suspended_) *hooks = std::move(suspended);
}

}  // namespace plait::wrap::internal
