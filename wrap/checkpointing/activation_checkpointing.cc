#include "wrap/checkpointing/activation_checkpointing.h"

#include <algorithm>
#include <mutex>
#include <utility>

#include "ATen/core/Tensor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/forward_generator.h"
#include "base/human.h"
#include "base/status.h"
#include "torch/csrc/autograd/autograd.h"
#include "torch/csrc/autograd/custom_function.h"
#include "wrap/internal/torch_internals.h"

namespace plait::wrap::checkpointing {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What a checkpointed block's backward needs besides its input: the block's forward and, with
// SELECTIVE, its projections' outputs in the order the forward computed them. Held by the
// autograd node (as a capsule in its context), so it lives exactly as long as the graph.
struct ActivationCheckpointing::Recomputation : torch::CustomClassHolder {
  ActivationCheckpointing* owner;
  BlockForward forward;
  std::vector<at::Tensor> parameters;
  std::vector<at::Tensor> kept;     // SELECTIVE: the projections' outputs
  size_t next_kept = 0;             // the next one the recomputation reads
  // Whether the block's input and each of its parameters required a gradient in the forward:
  // a backward that computes the gradients of fewer (a zero-bubble pipeline's backward of the
  // inputs, whose backward of the weights comes later) leaves the kept outputs for the next.
  std::vector<bool> requires_grad;
  // The forward generator of the block's device (base::ForwardGenerator) and its state when
  // the forward started, which the recomputation starts from: a random op (an adapter's
  // dropout) draws what the forward drew, as torch.utils.checkpoint's preserve_rng_state does.
  at::Generator generator;
  at::Tensor rng_state;
};

bool ActivationCheckpointing::selective() const {
  return policy_ == ActivationCheckpointingConfig::SELECTIVE;
}

namespace {

// Sets `slot` to `value` while it lives.
template <typename T>
class ScopedSet {
 public:
  ScopedSet(T& slot, T value) : slot_(slot), old_(slot) { slot_ = value; }
  ~ScopedSet() { slot_ = old_; }
  ScopedSet(const ScopedSet&) = delete;
  ScopedSet& operator=(const ScopedSet&) = delete;

 private:
  T& slot_;
  const T old_;
};

// A projection whose output the forward kept: returns it without computing the matmul again,
// and back-propagates as LibTorch's linear does (the same products on the same operands, so
// the same gradients bit for bit: mm's backward computes grad.mm(weight) for the input and,
// weight being transposed in x.mm(weight.t()), grad^T.mm(x) for the weight).
struct KeptLinearFunction : torch::autograd::Function<KeptLinearFunction> {
  // `bias` is optional rather than undefined: autograd takes an undefined tensor argument
  // for an input and fails on its missing device.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const c10::optional<at::Tensor>& bias, const at::Tensor& kept) {
    ctx->save_for_backward({x, weight});
    ctx->saved_data["has_bias"] = bias.has_value();
    // An alias, so that the kept tensor itself never holds this node (and through it the
    // recomputed graph) while it waits for another recomputation.
    return kept.detach();
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor grad = grads[0].reshape({-1, weight.size(0)});
    at::Tensor grad_x, grad_weight, grad_bias;
    if (ctx->needs_input_grad(0)) grad_x = grad.mm(weight).view(x.sizes());
    if (ctx->needs_input_grad(1)) grad_weight = grad.t().mm(x.reshape({-1, weight.size(1)}));
    if (ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(2)) grad_bias = grad.sum(0);
    return {grad_x, grad_weight, grad_bias, at::Tensor()};
  }
};

}  // namespace

// The node standing for a whole checkpointed block: inputs the block's input and parameters,
// forward without autograd, backward by recomputation.
struct CheckpointFunction : torch::autograd::Function<CheckpointFunction> {
  using Recomputation = ActivationCheckpointing::Recomputation;

  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input,
                            at::TensorList parameters,
                            c10::intrusive_ptr<Recomputation> recomputation) {
    ActivationCheckpointing& owner = *recomputation->owner;
    at::Tensor output;
    {
      ScopedSet<Recomputation*> recording(owner.recording_,
                                          owner.selective() ? recomputation.get() : nullptr);
      output = recomputation->forward(input);
    }
    ctx->save_for_backward({input});
    ctx->saved_data["recomputation"] = c10::IValue::make_capsule(std::move(recomputation));
    return output;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto recomputation = c10::static_intrusive_pointer_cast<Recomputation>(
        ctx->saved_data["recomputation"].toCapsule());
    ActivationCheckpointing& owner = *recomputation->owner;
    const size_t count = recomputation->parameters.size();
    // The recomputed block's own leaves: its input, and the parameters as they are now (FSDP
    // gathered them again before this backward).
    const bool input_grad = ctx->needs_input_grad(0);
    bool every_gradient = true;  // this backward computes all the block's gradients
    for (size_t i = 0; i <= count; ++i) {
      if (recomputation->requires_grad[i] && !ctx->needs_input_grad(i)) every_gradient = false;
    }
    const at::Tensor input = ctx->get_saved_variables()[0].detach().requires_grad_(input_grad);
    std::vector<at::Tensor> leaves;
    if (input_grad) leaves.push_back(input);
    for (size_t i = 0; i < count; ++i) {
      if (ctx->needs_input_grad(i + 1)) leaves.push_back(recomputation->parameters[i]);
    }
    variable_list result(count + 2);
    if (leaves.empty()) return result;
    at::Tensor output;
    {
      at::AutoGradMode grad_mode(true);
      recomputation->next_kept = 0;
      ScopedSet<Recomputation*> replaying(owner.replaying_,
                                          owner.selective() ? recomputation.get() : nullptr);
      at::Generator& generator = recomputation->generator;
      // The backward may run on another thread than the forward (CUDA's autograd threads).
      const base::ScopedForwardGenerator drawing(generator);
      at::Tensor resume;
      {
        std::lock_guard<std::mutex> lock(generator.mutex());
        resume = generator.get_state();
        generator.set_state(recomputation->rng_state);
      }
      output = recomputation->forward(input);
      std::lock_guard<std::mutex> lock(generator.mutex());
      generator.set_state(resume);
    }
    variable_list leaf_grads;
    {
      // The parameters' hooks run when their gradients reach them through this node's outputs.
      internal::SuspendedTensorHooks suspended(recomputation->parameters);
      leaf_grads = torch::autograd::grad({output}, leaves, {grads[0]}, /*retain_graph=*/false,
                                         /*create_graph=*/false, /*allow_unused=*/true);
    }
    // Once every gradient is computed the kept outputs serve no other backward and are freed:
    // a second backward through this block (retain_graph) finds none and says so. A backward
    // of some of them (a zero-bubble pipeline's of the inputs) leaves them to the next one.
    if (every_gradient) recomputation->kept.clear();
    size_t next = 0;
    if (input_grad) result[0] = leaf_grads[next++];
    for (size_t i = 0; i < count; ++i) {
      if (ctx->needs_input_grad(i + 1)) result[i + 1] = leaf_grads[next++];
    }
    return result;
  }
};

ActivationCheckpointing::ActivationCheckpointing(Wrappable& model, Policy policy)
    : model_(model), policy_(policy) {
  for (const Wrappable::Unit& block : model.Blocks()) blocks_.push_back(block.module);
  model_.seams().Add(this);
}

ActivationCheckpointing::~ActivationCheckpointing() { model_.seams().Remove(this); }

at::Tensor ActivationCheckpointing::Block(int unit, const at::Tensor& input, BlockForward forward) {
  if (!at::GradMode::is_enabled()) return forward(input);  // nothing to keep
  auto recomputation = c10::make_intrusive<Recomputation>();
  recomputation->owner = this;
  recomputation->forward = std::move(forward);
  recomputation->generator = base::ForwardGenerator(input.device());
  {
    std::lock_guard<std::mutex> lock(recomputation->generator.mutex());
    recomputation->rng_state = recomputation->generator.get_state();
  }
  // Read at every forward: tensor parallelism may have replaced the parameters since.
  recomputation->parameters = blocks_[unit]->parameters();
  recomputation->requires_grad.push_back(input.requires_grad());
  for (const at::Tensor& parameter : recomputation->parameters) {
    recomputation->requires_grad.push_back(parameter.requires_grad());
  }
  const std::vector<at::Tensor> parameters = recomputation->parameters;
  return CheckpointFunction::apply(input, at::TensorList(parameters), std::move(recomputation));
}

at::Tensor ActivationCheckpointing::Product(const at::Tensor& x, const at::Tensor& weight,
                                            const at::Tensor& bias, ProductNext next) {
  if (replaying_ != nullptr) {
    // A recomputation that finds no kept output left is a backward through the block after
    // one that computed all its gradients (which freed them), or a forward that did not
    // repeat itself.
    TORCH_CHECK(replaying_->next_kept < replaying_->kept.size(),
                "selective activation checkpointing: a block's recomputation asked for more "
                "projection outputs than its forward kept (a second backward through the same "
                "forward is not supported)");
    return KeptLinearFunction::apply(
        x, weight, bias.defined() ? c10::optional<at::Tensor>(bias) : c10::nullopt,
        replaying_->kept[replaying_->next_kept++]);
  }
  at::Tensor output = next(x, weight, bias);
  if (recording_ != nullptr) recording_->kept.push_back(output);
  return output;
}

absl::Status ValidateActivationCheckpointingConfig(const ActivationCheckpointingConfig& config) {
  if (config.policy() == ActivationCheckpointingConfig::POLICY_UNSPECIFIED) {
    return absl::InvalidArgumentError(
        "activation_checkpointing.policy is not set; set FULL or SELECTIVE");
  }
  return absl::OkStatus();
}

StepEstimate ActivationCheckpointingStrategy::Estimate(const ModelShape& shape,
                                                       const parallel::MeshConfig& /*mesh*/) const {
  const bool selective = config_.policy() == ActivationCheckpointingConfig::SELECTIVE;
  const double kept =
      shape.block_input_bytes + (selective ? shape.block_projection_output_bytes : 0.0);
  StepEstimate estimate;
  estimate.description = absl::StrFormat(
      "activation checkpointing (%s): each of %d blocks keeps %s of activations instead of %s, "
      "and one block at a time recomputes the rest in backward",
      ActivationCheckpointingConfig::Policy_Name(config_.policy()), shape.KeptBlockActivations(),
      base::HumanBytes(kept), base::HumanBytes(shape.block_activation_bytes));
  // At the peak of backward, every block holds what it kept and one block its recomputed rest.
  estimate.memory.push_back({.name = "of activations recomputed in backward",
                             .part = MemoryTerm::Part::kActivations,
                             .bytes = -std::max(0.0, (shape.KeptBlockActivations() - 1) *
                                                         (shape.block_activation_bytes - kept))});
  return estimate;
}

absl::Status ActivationCheckpointingStrategy::Apply(Wrappable& model,
                                                    const parallel::DeviceMesh& /*mesh*/) {
  PLAIT_RETURN_IF_ERROR(ValidateActivationCheckpointingConfig(config_));
  checkpointing_ = std::make_unique<ActivationCheckpointing>(model, config_.policy());
  return absl::OkStatus();
}

std::vector<PrepareStep> ActivationCheckpointingStrategy::Replacements() const {
  if (config_.policy() != ActivationCheckpointingConfig::SELECTIVE) return {};
  PrepareStep full;
  full.mutable_activation_checkpointing()->set_policy(ActivationCheckpointingConfig::FULL);
  return {full};
}

}  // namespace plait::wrap::checkpointing
