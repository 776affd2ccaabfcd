// A model after the plan's preparation steps, and the only way to its trainable parameters:
// PreparedModel builds the model itself, applies each step in the plan's order through a
// wrap::Preparation, and keeps both, so no code holds an unprepared model from
// which an optimizer could be built. A frozen model (a reference model that is prepared but
// never trained) gets the same steps and no trainable parameters:
//
//   PLAIT_ASSIGN_OR_RETURN(auto prepared,
//                          PreparedModel::Prepare(plan.model(), resolved.model, "", plan.prepare(),
//                                                 mesh, Role::kTrained, "plan"));
//   PLAIT_ASSIGN_OR_RETURN(auto optimizer, BuildOptimizer(*prepared, plan.optimizer()));
//   at::Tensor loss = prepared->model().Loss(inputs, targets);
#ifndef PLAIT_PREPARED_PREPARED_MODEL_H_
#define PLAIT_PREPARED_PREPARED_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "google/protobuf/repeated_ptr_field.h"
#include "models/causal_lm.h"
#include "models/model.pb.h"
#include "optim/optimizer.h"
#include "parallel/device_mesh.h"
#include "parallel/trainable_parameter.h"
#include "wrap/preparation.h"

namespace plait::prepared {

// What the model is prepared for: training; training resumed from a checkpoint, which then
// restores every trainable parameter (a run's checkpoint, trainer/run_checkpoints.h), so Prepare
// gives them no values (no seeded draw, no Hugging Face read), only to the base a step froze
// (LoRA's), which the checkpoint does not hold; or use without training.
enum class Role { kTrained, kResumed, kFrozen };

class PreparedModel {
 public:
  // Builds the model `spec` names, whose resolved config is `config`, on the mesh's device
  // for deferred initialisation (CausalLM::CreateDeferred), applies `steps` in order on
  // `mesh` (which must outlive the result), and then gives each prepared parameter the values
  // of the slice of it this rank holds: those of the model's initialisation or, when
  // `hf_weights_dir` is not empty, those of its tensor in that Hugging Face folder, reading no
  // other bytes of it and drawing no seeded value; for Role::kResumed only to the parameters a
  // step froze. Parameters a step added (LoRA's adapters) keep the values it gave them. The
  // frozen base computing in 16 bits is held in that dtype, with no fp32 copy. So a rank never
  // holds more of the model than its preparation leaves it, and one whole parameter while its
  // slice is written. Errors name `field_path`.model,
  // .hf_weights_dir or .prepare[i] and come from the model, the checkpoint (its slices of
  // NaN or infinity included) or the wrapper (the plan's validation catches the rule
  // violations first); a rank that fails to load its slices fails every rank.
  static absl::StatusOr<std::unique_ptr<PreparedModel>> Prepare(
      const models::ModelSpec& spec, const models::ModelConfig& config,
      const std::string& hf_weights_dir,
      const google::protobuf::RepeatedPtrField<wrap::PrepareStep>& steps,
      const parallel::DeviceMesh& mesh, Role role, const std::string& field_path);

  PreparedModel(const PreparedModel&) = delete;
  PreparedModel& operator=(const PreparedModel&) = delete;

  models::CausalLM& model() { return *model_; }
  Role role() const { return role_; }

  // What the optimizer must own: FSDP's local shards, or the whole parameters. Empty for a
  // frozen model, whose parameters do not require gradients.
  const std::vector<parallel::TrainableParameter>& trainable_parameters() const {
    return trainable_;
  }

  // The preparation: its no-sync scope for gradient accumulation, the wrappers'
  // communication errors, the data-parallel dimensions and the whole parameters.
  wrap::Preparation& preparation() { return *preparation_; }

  // Writes the whole model to `dir` (created if missing) as a Hugging Face folder: the
  // model's own parameters, with the ones a step added merged into them (LoRA's adapters:
  // W + scale * B A), so that it loads as a plain model. Every rank must call it; rank
  // `writer` writes.
  absl::Status SaveHf(const std::string& dir, int rank, int writer);

  // Writes the adapters a step added to `dir` as that step saves them (wrap::AdapterExport:
  // LoRA's as a PEFT adapter folder), naming `base_model` as the model they adapt. Every rank must
  // call it; rank `writer` writes. FailedPrecondition when no step added adapters.
  absl::Status SaveAdapters(const std::string& dir, const std::string& base_model, int rank,
                            int writer);

 private:
  PreparedModel(std::shared_ptr<models::CausalLM> model, Role role)
      : model_(std::move(model)), role_(role) {}

  // Declared before the preparation, whose hooks refer to it, so it is destroyed after.
  std::shared_ptr<models::CausalLM> model_;
  std::unique_ptr<wrap::Preparation> preparation_;
  Role role_;
  // The model's own parameters, in its order, without those a step added.
  std::vector<std::string> parameter_names_;
  std::vector<parallel::TrainableParameter> trainable_;
};

// OK when each of `parameters` has a gradient after the backward of optimizer step `step`
// (1-based); otherwise InternalError naming those that have none: a parameter the optimizer
// owns but no loss reaches would silently stay as it began (an adapter on a projection the
// forward skips, a parameter a step froze by mistake). The trainer checks its first step.
absl::Status CheckEveryParameterHasGradient(
    const std::vector<parallel::TrainableParameter>& parameters, int64_t step);

// The optimizer over `prepared`'s trainable parameters. FailedPrecondition for a frozen model.
absl::StatusOr<std::unique_ptr<optim::Optimizer>> BuildOptimizer(
    const PreparedModel& prepared, const optim::OptimizerConfig& config);

}  // namespace plait::prepared

#endif  // PLAIT_PREPARED_PREPARED_MODEL_H_
