// LoRA (low-rank adaptation) with PEFT's semantics, as a preparation strategy: each block
// projection a target pattern matches gets two adapter matrices, A [rank, in] and B [out, rank],
// registered as submodules of the projection and so named as PEFT names them
// (`model.layers.0.self_attn.q_proj.lora_A.weight`, `...lora_B.weight`), and computes
//   y = W x + b + scale * B A dropout(x),   scale = alpha / rank (alpha / sqrt(rank), rsLoRA),
// through the model's seams (seams.h). A is drawn as PEFT's default
// (kaiming_uniform_ with a = sqrt(5): uniform(-1/sqrt(in), 1/sqrt(in))) from a generator seeded
// by LoraConfig.seed and the adapter's name, B is zero, so the adapted model computes what the
// base did; or both start from a PEFT adapter folder (LoraConfig.initial_adapter_dir,
// starting_adapters.h), to continue training it. Every other parameter is frozen (requires_grad
// false): the optimizer owns only the adapters, FSDP shards and gathers the base without reducing
// gradients for it, DDP buckets only the adapters.
//
//   prepare { lora { rank: 8 alpha: 16 target: "*q_proj" target: "*v_proj" } }
//   prepare { tensor_parallel { mesh_dim: "tp" } }  // optional, after LoRA (lora_before_tp)
//   prepare { fsdp { mesh_dim: "dp" } }  // after LoRA (rules.textproto: lora_before_fsdp)
//
// Tensor parallelism, a later step, splits each adapter with its projection (TP-aware LoRA):
// a column-parallel projection's B by its output features, a row-parallel one's A by its input
// features, while the other matrix stays whole and has its gradient summed over the group;
// a row-parallel projection's adapter adds its part to the rank's partial product, which
// tensor parallelism sums; a projection it keeps whole (an expert's) keeps its adapter whole.
// Dropout acts in training mode only and draws its masks as PEFT's nn.Dropout does, from the
// thread's forward generator (base/forward_generator.h): the one the caller installed (the
// trainer's, seeded for each step and rank), else the device's default generator; activation
// checkpointing replays that generator's state when it recomputes a block, so its masks are
// drawn again as they were. Under tensor parallelism each rank draws
// its own masks: the same regularisation as one process, not the same masks.
//
// QLoRA (base_quantization NF4): each targeted projection's weight leaves the model's
// parameters and is held in NF4 (nf4.h) as buffers of the projection (`weight_nf4`,
// `weight_absmax`, or with double_quant `weight_absmax_codes`, `weight_absmax_scales`,
// `weight_absmax_offset`), which move with the module; the full-precision weight is freed.
// Lora::Weight (the weight seam) dequantizes it to the weight's dtype for each use. The dequantized
// weight the input's gradient needs is not kept until the backward, as bitsandbytes'
// MatMul4Bit does not keep it: once the projection has computed (Adapt), its memory is freed,
// and it is dequantized again into the same tensor when the projection's output gradient
// arrives and freed once the input's gradient is complete, so that a step holds one block's
// few dequantized weights at a time, not the whole base in the compute dtype. The weight is
// quantized from what it holds when Create runs, and again each time the preparation's caller
// stores values in it (HeldParameters' `store`: a run's base loaded from a Hugging Face folder
// after preparing), one weight at a time. The merged export (Merge) folds the adapters into the
// dequantized weight. FSDP, a later step, shards and gathers the held tensors' bytes with their
// blocks (HeldTensors), so that a rank keeps its share of the quantized base; tensor parallelism
// cannot split them: the rules refuse it (qlora_without_tp).
#ifndef PLAIT_WRAP_LORA_LORA_H_
#define PLAIT_WRAP_LORA_LORA_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/violation.h"
#include "parallel/device_mesh.h"
#include "parallel/mesh.pb.h"
#include "parallel/trainable_parameter.h"
#include "wrap/lora/nf4.h"
#include "wrap/strategy.h"
#include "wrap/wrap.pb.h"
#include "wrap/wrappable.h"

namespace plait::wrap::lora {

// The adapters of one model, a layer of its seams: the weight of a projection it holds in NF4,
// and the adapters added to the projections' outputs.
class Lora final : public SeamLayer {
 public:
  // Freezes every parameter of `model`, adds adapters to the block projections `config`'s
  // targets match and makes the model's forward use them; `model` must outlive the result.
  // InvalidArgument naming `lora.<field>` for an invalid config, a target that matches no
  // projection or a starting folder that does not fit (ReadStartingAdapters).
  static absl::StatusOr<std::unique_ptr<Lora>> Create(Wrappable& model, const LoraConfig& config);
  ~Lora() override;
  Lora(const Lora&) = delete;
  Lora& operator=(const Lora&) = delete;

  // SeamLayer. With NF4, a targeted projection computes with its weight dequantized, and
  // holds it in its NF4 tensors (its buffers).
  std::vector<Seam> changes() const override { return {Seam::kWeight, Seam::kProjection}; }
  bool is_adapter() const override { return true; }
  at::Tensor Weight(const torch::nn::Module& projection, const at::Tensor& weight,
                    WeightNext next) override;
  std::vector<at::Tensor> HeldTensors(const torch::nn::Module& projection) const override;
  // What the layers below compute, with the adapter's output added where it adapts the
  // projection (Adapt).
  at::Tensor Project(const ProjectionSite& site, const at::Tensor& input,
                     ProjectNext next) override;
  // An adapter splits with its projection where their dimensions meet: B with a
  // column-split projection's output features, A with a row-split one's input features; the
  // other matrix is whole on every rank, its gradient summed over the group.
  std::optional<Wrappable::Split> AddedParameterSplit(const std::string& name) const override;

  // `output`, what `projection` computed from `input`, with its adapter's output added
  // (scale * B A dropout(input)); `output` itself for a projection it does not adapt.
  at::Tensor Adapt(const torch::nn::Module& projection, const at::Tensor& input, at::Tensor output);

  // The module names of the adapted projections, in the model's parameter order.
  const std::vector<std::string>& adapted() const { return adapted_; }

  // Folds each adapter pair of `parameters` (whole, by name: its own projections', and the
  // others' there, a pipeline's other stages') into its projection's weight as
  // PEFT's merge_and_unload does, W + scale * B A (computed in fp32, stored in W's dtype), and
  // removes the pair. InternalError naming the tensor when one is missing.
  absl::Status Merge(std::map<std::string, at::Tensor>& parameters) const;

  // With NF4: the weights it holds, whole, each a frozen part whose `store` quantizes the
  // values given into its buffers (ParameterLayout::HeldParameters); none otherwise.
  std::vector<parallel::TrainableParameter> HeldParameters();

  // With NF4: adds each weight it holds to `parameters`, by name, dequantized (a whole
  // model's parameters, as ParameterLayout::GatherFullParameters gives them), but for those already
  // there: a later step that shards the held tensors (FSDP) gathered those.
  void AddHeldWeights(std::map<std::string, at::Tensor>& parameters) const;

 private:
  struct Adapter {
    at::Tensor a;  // lora_A.weight [rank, in]
    at::Tensor b;  // lora_B.weight [out, rank]
  };
  // A projection's weight held in NF4; its tensors are the projection's buffers.
  struct Held {
    std::string name;              // the weight's parameter name, "...q_proj.weight"
    at::TensorOptions options;     // the weight's dtype and device
    Nf4Tensor nf4;
    // Weight's last dequantized values under grad mode, until Adapt takes them.
    at::Tensor dequantized;

    // The weight's values, dequantized to its dtype.
    at::Tensor Dequantize() const { return Nf4Dequantize(nf4, options.dtype().toScalarType()); }
  };

  // Quantizes `values` into `held`'s buffers, in place.
  void Store(Held& held, const at::Tensor& values) const;

  // Frees `weight` (held's dequantized values, from which `output` was computed from `input`)
  // until the gradient of `output` arrives, then dequantizes into it again for the backward
  // of the product, and frees it once the gradient of `input` is complete.
  static void KeepOnlyForBackward(const Held& held, const at::Tensor& weight,
                                  const at::Tensor& input, const at::Tensor& output);

  Lora(Wrappable& model, const LoraConfig& config);

  Wrappable& model_;
  const double scale_;
  const double dropout_;
  const bool double_quant_;
  std::map<const torch::nn::Module*, Adapter> adapters_;
  std::map<const torch::nn::Module*, Held> held_;
  std::vector<const torch::nn::Module*> held_order_;  // held_'s keys, as adapted_
  std::vector<std::string> adapted_;
  std::map<std::string, Wrappable::Split> splits_;  // AddedParameterSplit's, by adapter name
};

// alpha / rank, or alpha / sqrt(rank) with use_rslora.
double Scale(const LoraConfig& config);

// The values Lora gives adapter A of a projection whose weight is [out, in]: fp32, [rank, in],
// drawn from a generator seeded by `seed` and `name` (the adapter's parameter name).
at::Tensor InitialA(uint64_t seed, const std::string& name, int64_t rank, int64_t in);

// InvalidArgument naming `lora.<field>` for a rank or alpha not above 0, a dropout outside
// [0, 1), no target or an empty one, or double_quant without NF4.
absl::Status ValidateLoraConfig(const LoraConfig& config);

// LoRA as a preparation strategy: "lora" in plans and rules. It uses no mesh dimension.
class LoraStrategy final : public Strategy, public ParameterLayout, public AdapterExport {
 public:
  explicit LoraStrategy(LoraConfig config) : config_(std::move(config)) {}

  absl::string_view name() const override { return "lora"; }
  const std::string& mesh_dim() const override { return no_dim_; }
  bool uses_mesh_dim() const override { return false; }
  bool freezes_model_parameters() const override { return true; }
  // "qlora" with an NF4 base (rules.textproto: qlora_without_tp).
  std::vector<std::string> rule_aliases() const override;
  // Each target pattern must match a projection of the model's blocks
  // (`<field>.lora.target[i]`), and a starting folder must fit them
  // (`<field>.lora.initial_adapter_dir`).
  std::vector<base::Violation> Check(const std::optional<ModelShape>& shape,
                                     const parallel::MeshConfig& mesh,
                                     const std::string& field) const override;
  // The adapters' parameters, which become the only trainable ones.
  StepEstimate Estimate(const ModelShape& shape, const parallel::MeshConfig& mesh) const override;
  absl::Status Apply(Wrappable& model, const parallel::DeviceMesh& mesh) override;
  // The starting adapter folder, when it has one.
  std::vector<InputFile> InputFiles() const override;
  // As a PEFT adapter folder (peft_adapter.h).
  absl::Status SaveAdapters(const std::string& dir,
                            const std::vector<std::pair<std::string, at::Tensor>>& adapters,
                            const std::string& base_model) const override;
  std::vector<base::Violation> CheckAdapterFolder(const std::string& dir,
                                                  const std::string& field) const override;
  std::vector<parallel::TrainableParameter> HeldParameters() override {
    return lora_->HeldParameters();
  }
  // The NF4 weights it holds that no later step gathered, dequantized.
  absl::Status GatherFullParameters(std::map<std::string, at::Tensor>& parameters) override {
    lora_->AddHeldWeights(parameters);
    return absl::OkStatus();
  }
  // The adapters merged into the base (Lora::Merge).
  absl::Status MergeAddedParameters(std::map<std::string, at::Tensor>& parameters) override {
    return lora_->Merge(parameters);
  }

 private:
  LoraConfig config_;
  const std::string no_dim_;
  std::unique_ptr<Lora> lora_;
};

}  // namespace plait::wrap::lora

#endif  // PLAIT_WRAP_LORA_LORA_H_
