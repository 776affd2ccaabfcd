// A training objective: one micro-batch in, its loss and named metrics out. The plan's
// `objective` (objective.proto) chooses one and the trainer calls it where it computes the
// loss, for training and for evaluation alike; the trainer knows nothing of what it computes.
// Causal-LM and SFT are the model's cross-entropy over the batch's scored targets (the data
// decides which: every token, or completion tokens only); DPO scores preference pairs against
// a frozen reference model, or the policy itself with its adapters off (a LoRA policy's
// base), either run under no-grad in eval mode, or against the reference's log-probabilities
// precomputed once (reference_log_probs.h):
//
//   PLAIT_ASSIGN_OR_RETURN(std::unique_ptr<Objective> objective,
//                          MakeObjective(plan.objective(), {{"ref", &reference}},
//                                        "plan.objective"));
//   PLAIT_ASSIGN_OR_RETURN(ObjectiveOutput out, objective->Compute(policy, batch));
//   out.loss.backward();  // out.metrics: {"rewards/chosen", ...} for DPO
//
// A loss is a mean over the batch's items (ScoredItems): its scored tokens for the
// cross-entropy objectives, its pairs for DPO. A step of several micro-batches and ranks
// weighs each micro-batch by its items (step_items.h), so that the step's loss is the mean
// over all of the step's items, as in one process.
#ifndef PLAIT_OBJECTIVES_OBJECTIVE_H_
#define PLAIT_OBJECTIVES_OBJECTIVE_H_

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "data/batch.h"
#include "data/data_loader.h"
#include "models/causal_lm.h"
#include "objectives/objective.pb.h"
#include "objectives/reference_log_probs.h"

namespace plait::objectives {

class StepItems;  // step_items.h

// Named values in the order an objective reports them, by TRL's names.
using Metrics = std::vector<std::pair<std::string, double>>;
// The same as fp32 scalars on the loss's device, detached: a step reads them on the host
// once, with its loss (metric_means.h), not once per micro-batch.
using TensorMetrics = std::vector<std::pair<std::string, at::Tensor>>;

struct ObjectiveOutput {
  // fp32 scalar, the mean over the micro-batch's items; 0, with a zero gradient, when it has
  // none
  at::Tensor loss;
  TensorMetrics metrics;  // besides the loss; empty for the cross-entropy objectives
};

// What a run offers an objective once, before its first step (Objective::Start): the batches
// it will train on from where it stands and its held-out batches, to read ahead, the model it
// trains, and the means to release a frozen model the objective no longer needs and to report
// what it did.
struct RunStart {
  data::DataLoader train;              // a copy of the run's training loader, where the run stands
  int64_t train_batches = 0;           // the micro-batches this rank will read from it
  data::DataLoader eval;               // a copy of its held-out loader, reset
  int64_t eval_batches = 0;            // the micro-batches this rank reads in each evaluation
  at::Device device = at::kCPU;        // where the run computes
  models::CausalLM* policy = nullptr;  // the trained model, prepared
  // Frees the frozen model of that name, after checking that its wrappers' communication did
  // not fail (an error names it); the objective must not touch it afterwards.
  std::function<absl::Status(const std::string& frozen_name)> release_frozen;
  // Prints a line of the run's progress (on rank 0; nothing elsewhere).
  std::function<void(const std::string& line)> print;
};

class Objective {
 public:
  virtual ~Objective() = default;

  // Called once before the first step (of a fresh or a resumed run), on every rank. Default:
  // nothing. DPO with precompute_reference computes its reference's log-probabilities of
  // every batch `run` offers, then releases the reference (a frozen one).
  virtual absl::Status Start(RunStart& run) { return absl::OkStatus(); }

  // The frozen model, by its name, that Compute runs forward on each batch (DPO's reference
  // while it computes live); nullopt when none. A run may compute that model's part of Compute
  // itself, before the trained model's passes, with ReadFrozen, and hand it to Compute: a
  // pipelined run does, through the frozen model's own stages.
  virtual std::optional<std::string> FrozenRead() const { return std::nullopt; }

  // What Compute reads from the frozen model FrozenRead names, for `batch`, computed by
  // `frozen` under no-grad (DPO: the reference's log-probabilities of the batch's sequences),
  // on a pipeline's last stage from the stage input it was given. FailedPrecondition for an
  // objective that reads no frozen model.
  virtual absl::StatusOr<at::Tensor> ReadFrozen(models::CausalLM& frozen,
                                                const data::Batch& batch) const;

  // The loss of the trained model `policy` on `batch` (data/batch.h; for DPO its 2B chosen
  // then rejected sequences, a row each or packed, go through the policy in one forward).
  // `host` is the same batch in host memory (what the trainer copied to the device), where an
  // objective reads what it looks up on the host (a precomputed reference's sequences)
  // without a transfer back from the device. `frozen_read` is ReadFrozen's result for `batch`,
  // or undefined, and then the objective runs its frozen model itself. `step` counts the
  // items of the optimizer step `batch` is micro-batch `micro` of (step_items.h), for a loss
  // that weighs its gradient in the step itself (a mixture of experts' load-balancing loss,
  // model_losses.h); null in an evaluation, which trains nothing. An error only for a
  // precomputed reference that lacks a sequence of `batch`, for DPO against the policy
  // without its adapters when it has none, and for a collective that failed.
  virtual absl::StatusOr<ObjectiveOutput> Compute(models::CausalLM& policy,
                                                  const data::Batch& batch, const data::Batch& host,
                                                  const at::Tensor& frozen_read,
                                                  const StepItems* step, int micro) = 0;

  // The same for a batch in host memory, running the frozen model itself, outside a step.
  absl::StatusOr<ObjectiveOutput> Compute(models::CausalLM& policy, const data::Batch& batch) {
    return Compute(policy, batch, batch, at::Tensor(), /*step=*/nullptr, /*micro=*/0);
  }

  // The names of the metrics Compute reports besides the loss, in its order (DPO's
  // "rewards/chosen", ...); none by default.
  virtual std::vector<std::string> MetricNames() const { return {}; }

  // How many items Compute's loss of `batch` is a mean over, read from the batch alone (no
  // model runs), so that a step can count its items before any backward: the targets that
  // are not data::kIgnoreTarget for causal LM and SFT (TRL's num_items_in_batch), the pairs
  // for DPO. On the host for a batch on the CPU.
  virtual int64_t ScoredItems(const data::Batch& batch) const = 0;
};

// The objective `config` chooses (causal_lm when none). `frozen` holds the plan's frozen
// models by name; DPO keeps the one it names as its reference (it must outlive the
// objective), or, with policy_without_adapters, computes its reference with the policy it is
// given, its adapters off. An unknown reference is an InvalidArgument error naming
// `field_path`.dpo.reference (plan::Resolve reports it first).
absl::StatusOr<std::unique_ptr<Objective>> MakeObjective(
    const ObjectiveConfig& config, const std::map<std::string, models::CausalLM*>& frozen,
    absl::string_view field_path);

// DPO as `config` says, against the reference log-probabilities of `reference`, which must
// hold every row the objective is given (Dpo.precompute_reference).
std::unique_ptr<Objective> MakePrecomputedDpo(const Dpo& config,
                                              std::shared_ptr<const ReferenceLogProbs> reference);

}  // namespace plait::objectives

#endif  // PLAIT_OBJECTIVES_OBJECTIVE_H_
