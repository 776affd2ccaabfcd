// Activation checkpointing of a model's blocks: a checkpointed block runs its forward without
// recording it for autograd and keeps only what its policy says (its input; with SELECTIVE
// also its projections' outputs); when its backward comes, it runs its forward again from the
// kept input, with autograd on, and back-propagates the incoming gradient through that. One
// autograd node per block stands for the whole block, with the block's input and parameters as
// its inputs, so every parameter's gradient still arrives once, through its own accumulator:
// DDP's and FSDP's gradient hooks fire as without checkpointing, and FSDP's pre-backward
// gather (a hook on the block's output) runs before the recomputation reads the parameters.
// LibTorch's C++ API has no torch.utils.checkpoint; this is the non-reentrant kind.
//
//   PrepareStep step;  // in a plan: prepare { activation_checkpointing { policy: FULL } }
//   step.mutable_activation_checkpointing()->set_policy(ActivationCheckpointingConfig::FULL);
//   PLAIT_RETURN_IF_ERROR(preparation->Apply(step));  // before FSDP (rules.textproto)
//
// The recomputation must give the forward's values again: it starts from the state the
// forward's random generator (base::ForwardGenerator) had when the forward started (as
// PyTorch's preserve_rng_state), and draws from it again whatever thread the backward runs on,
// so a random op in a block (an adapter's dropout) draws the same again,
// and gradients equal those without checkpointing bit for bit with FULL; SELECTIVE
// replaces each kept projection's matmul by its kept output and computes the same gradient
// products as LibTorch's linear backward.
#ifndef PLAIT_WRAP_CHECKPOINTING_ACTIVATION_CHECKPOINTING_H_
#define PLAIT_WRAP_CHECKPOINTING_ACTIVATION_CHECKPOINTING_H_

#include <memory>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "parallel/communicator.h"
#include "wrap/strategy.h"
#include "wrap/wrap.pb.h"
#include "wrap/wrappable.h"

namespace plait::wrap::checkpointing {

class ActivationCheckpointing final : public SeamLayer {
 public:
  using Policy = ActivationCheckpointingConfig::Policy;

  // Adds itself to `model`'s seams (`model` must outlive it); `policy` is FULL or SELECTIVE.
  ActivationCheckpointing(Wrappable& model, Policy policy);
  ~ActivationCheckpointing() override;
  ActivationCheckpointing(const ActivationCheckpointing&) = delete;
  ActivationCheckpointing& operator=(const ActivationCheckpointing&) = delete;

  // SeamLayer: each block runs checkpointed, and, inside it, each projection's product is
  // kept (SELECTIVE) and handed back in its recomputation.
  std::vector<Seam> changes() const override { return {Seam::kBlock, Seam::kProduct}; }
  at::Tensor Block(int unit, const at::Tensor& input, BlockForward forward) override;
  at::Tensor Product(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                     ProductNext next) override;

 private:
  struct Recomputation;
  friend struct CheckpointFunction;

  bool selective() const;

  Wrappable& model_;
  const Policy policy_;
  std::vector<std::shared_ptr<torch::nn::Module>> blocks_;
  // While a checkpointed block's forward runs: the recomputation whose kept projection
  // outputs Product records (the first forward) or hands back (the recomputation).
  Recomputation* recording_ = nullptr;
  Recomputation* replaying_ = nullptr;
};

// Activation checkpointing as a preparation strategy: "activation_checkpointing" in plans and
// rules. It uses no mesh dimension.
class ActivationCheckpointingStrategy final : public Strategy, public SmallerVersions {
 public:
  explicit ActivationCheckpointingStrategy(ActivationCheckpointingConfig config)
      : config_(std::move(config)) {}

  absl::string_view name() const override { return "activation_checkpointing"; }
  const std::string& mesh_dim() const override { return no_dim_; }
  bool uses_mesh_dim() const override { return false; }
  StepEstimate Estimate(const ModelShape& shape, const parallel::MeshConfig& mesh) const override;
  absl::Status Apply(Wrappable& model, const parallel::DeviceMesh& mesh) override;
  Saves saves() const override { return Saves::kActivations; }
  // FULL in place of SELECTIVE; none for FULL, which keeps the least there is.
  std::vector<PrepareStep> Replacements() const override;

 private:
  ActivationCheckpointingConfig config_;
  const std::string no_dim_;
  std::unique_ptr<ActivationCheckpointing> checkpointing_;
};

// InvalidArgument naming `activation_checkpointing.policy` when it is unset.
absl::Status ValidateActivationCheckpointingConfig(const ActivationCheckpointingConfig& config);

}  // namespace plait::wrap::checkpointing

#endif  // PLAIT_WRAP_CHECKPOINTING_ACTIVATION_CHECKPOINTING_H_
