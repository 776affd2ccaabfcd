// The memory one rank of a plan needs, estimated from the plan alone (nothing is built), and
// the check that the ranks a machine runs fit in the memory it has. Between steps a rank
// holds the trained model's share of parameters (in its dtype, or the one a step stores them
// in), fp32 optimizer state (with fp32 masters of 16-bit parameters); at the peak of a step,
// either the activations of one micro-batch at the start of its backward or, where that is
// larger, the gradients and one block's activations at its end (under tensor parallelism, the
// rank's share of the activations: models::ActivationBytes); and the frozen models' shares.
// What each step adds to these, or holds beside them, it names in its memory terms
// (wrap::MemoryTerm: gathered units, gradient buckets, activations it recomputes), which the
// estimate sums where they count and DescribeMemory lists by name.
// trainer/memory_measured_test.cc checks it against what the trainer's ranks hold:
//
//   PLAIT_ASSIGN_OR_RETURN(MemoryEstimate estimate, EstimateMemory(resolved));
//   PLAIT_RETURN_IF_ERROR(CheckMemoryFits(estimate, local_ranks, available_bytes));
#ifndef PLAIT_PLAN_MEMORY_ESTIMATE_H_
#define PLAIT_PLAN_MEMORY_ESTIMATE_H_

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/estimates.h"
#include "models/model.pb.h"
#include "parallel/device.pb.h"
#include "plan/plan.pb.h"
#include "plan/resolved_plan.h"
#include "wrap/strategy.h"

namespace plait::plan {

// What a model's preparation steps leave on each rank: each step's own estimate (with its
// memory terms), the share of the parameters a rank owns after all of them, the parameters
// they add (adapters) and, when they change which train, how many do, both counted whole.
struct PreparationEstimate {
  std::vector<wrap::StepEstimate> steps;
  double parameter_fraction = 1.0;
  // The bytes of the steps' memory terms of `part`, in step order; their sum; the largest
  // (0 where there are none).
  std::vector<double> Bytes(wrap::MemoryTerm::Part part) const;
  double Sum(wrap::MemoryTerm::Part part) const;
  double Largest(wrap::MemoryTerm::Part part) const;
  // The activations of the rank that keeps the most, when a step changed them (a pipeline's
  // stage: wrap::StepEstimate::kept_activations); nullopt: one micro-batch of the whole model.
  std::optional<wrap::StepEstimate::KeptActivations> kept_activations;
  double added_parameters = 0.0;
  // Those the optimizer trains, whole, when a step changed which (nullopt: all of them).
  std::optional<std::vector<wrap::ModelShape::Parameter>> trainable_parameters;
  // Where a step leaves the ranks of its mesh dimension different shares (a pipeline's
  // stages: wrap::StepEstimate::rank_shares): that dimension, how many shares there are, and
  // which one this estimate is of (its coordinate there) and what it holds ("stage 1").
  // share_dim empty: every rank holds alike.
  std::string share_dim;
  int shares = 0;
  int share = 0;
  std::string share_description;
};

// A frozen model's share on each rank: its parameters and the units it gathers at once.
struct FrozenEstimate {
  PreparationEstimate preparation;
  double parameter_bytes = 0;
  double total_bytes() const {
    return parameter_bytes + preparation.Sum(wrap::MemoryTerm::Part::kGathered);
  }
};

struct MemoryEstimate {
  PreparationEstimate preparation;  // of the trained model
  double optimizer_slots = 0;       // fp32 state buffers per parameter
  bool fp32_masters = false;        // the optimizer keeps fp32 copies of 16-bit parameters
  // Between steps: the parameters a rank keeps (with its steps' terms of them), the
  // optimizer's state (and masters), and the buffers its steps keep (their terms).
  double parameter_bytes = 0;
  double optimizer_state_bytes = 0;
  double buffer_bytes = 0;
  // In a step: the gradients of the parameters a rank keeps (ZeroGrad frees them), the
  // activations of one micro-batch when its backward starts, and one block's, which the last
  // block backward holds (recomputed, under activation checkpointing) when the other
  // gradients are done.
  double gradient_bytes = 0;
  double activation_bytes = 0;
  double block_activation_bytes = 0;
  // Whether the gradients are held while the activations are at their peak: a step of several
  // micro-batches runs the later ones' forward and backward beside the earlier ones' gradients
  // (and a pipeline's 1F1B its micro-batches in flight after its first backward).
  bool gradients_beside_activations = false;
  // A tied embedding's weight gets two gradients, the output projection's and the lookup's,
  // which autograd holds together with their sum when the backward ends: two [vocab, hidden]
  // tensors (this rank's rows under tensor parallelism) beyond the weight's gradient. With
  // Qwen2.5-0.5B's 151,936-token vocabulary that is 1.1 GB in fp32, more than a step's
  // activations at 512 tokens (memory_measured_test).
  double tied_embedding_gradient_bytes = 0;
  double frozen_bytes = 0;             // the frozen models' parameters and gathered units
  std::vector<FrozenEstimate> frozen;  // each frozen model's, in plan order

  // Generating samples between steps (training.samples): the KV cache of a rank's rows and
  // the weights the steps gather meanwhile: all of them, once for the phase, where those and
  // the cache fit in what a step adds at its peak (step_bytes: memory the run needs anyway),
  // else as a step gathers them, a block at a time. nullopt: the plan draws no samples.
  struct Generation {
    double kv_cache_bytes = 0;
    double gathered_bytes = 0;
    bool keep_gathered = false;
    double bytes() const { return kv_cache_bytes + gathered_bytes; }
  };
  std::optional<Generation> generation;

  double between_steps_bytes() const {
    return parameter_bytes + optimizer_state_bytes + buffer_bytes + frozen_bytes;
  }
  // What a step adds at its peak: what the steps gather, and the activations when its backward
  // starts (with the gradients, when they are held then) or the gradients with one block's
  // activations (and a tied embedding's gradients) when it ends, whichever is larger (a
  // backward frees a block's activations as it makes that block's gradients).
  double step_bytes() const {
    return preparation.Sum(wrap::MemoryTerm::Part::kGathered) +
           std::max(activation_bytes + (gradients_beside_activations ? gradient_bytes : 0.0),
                    gradient_bytes + block_activation_bytes + tied_embedding_gradient_bytes);
  }
  // Between steps, and the larger of a step's peak and a generation phase.
  double total_bytes() const {
    return between_steps_bytes() +
           std::max(step_bytes(), generation.has_value() ? generation->bytes() : 0.0);
  }
};

// The estimate for the rank of `resolved` that needs the most, whose activations are those of
// the ops this build's LibTorch runs, or `kernels`' (a plan checked for a GPU cluster: its
// LibTorch 2.x).
absl::StatusOr<MemoryEstimate> EstimateMemory(const ResolvedPlan& resolved,
                                              const models::LibTorchKernels& kernels = {});

// One estimate for each share the ranks of `resolved` hold (PreparationEstimate::share_dim):
// those of a pipeline's ranks, in the order of their coordinate; one when every rank holds
// alike.
absl::StatusOr<std::vector<MemoryEstimate>> EstimateMemoryOfEachShare(
    const ResolvedPlan& resolved, const models::LibTorchKernels& kernels = {});

// The one of `estimates` (at least one) with the largest total: the rank that needs the most.
const MemoryEstimate& LargestOf(const std::vector<MemoryEstimate>& estimates);

// Each rank's estimate, in rank order (world_size of them).
absl::StatusOr<std::vector<MemoryEstimate>> EstimateMemoryOfEachRank(
    const ResolvedPlan& resolved, const models::LibTorchKernels& kernels = {});

// The model `config` (whose plan entry is `spec`) as the strategies' checks and estimates see
// it on `device`: its blocks, what lies outside them (the embeddings, the final norm, an untied
// output head), every parameter with its tensor-parallel split, its element size, and the
// activations of one micro-batch of `training` on one rank of `split` (with `kernels`).
wrap::ModelShape ShapeOf(const models::ModelConfig& config, const models::ModelSpec& spec,
                         parallel::Device device, const TrainingConfig& training,
                         const wrap::ActivationSplit& split,
                         const models::LibTorchKernels& kernels = {});

// OK when `local_ranks` ranks, each needing `estimate`, fit in `available_bytes`; else
// ResourceExhausted giving the estimate, its parts and the limit, and what to change.
absl::Status CheckMemoryFits(const MemoryEstimate& estimate, int local_ranks,
                             int64_t available_bytes);

// Whom an estimate is for: "every rank", or "the ranks at pp=1, stage 1".
std::string DescribeShare(const MemoryEstimate& estimate);

// The steps' terms of `part` that hold bytes, each as ", 3.0 MiB gathered units".
std::string DescribeTerms(const PreparationEstimate& preparation, wrap::MemoryTerm::Part part);

// One term, and where it counts: "3.0 MiB gathered units, at the peak of each step", "saves
// 1.5 MiB of activations recomputed in backward, when a micro-batch's backward starts".
std::string DescribeTerm(const wrap::MemoryTerm& term);

// One line on the estimate: "… parameters, … optimizer state (2 slots), … gradients, …".
std::string DescribeMemory(const MemoryEstimate& estimate);

// When a rank's measured peak of tensor bytes (`measured`, in rank order: LibTorch's CPU
// allocator's count or CUDA's caching allocator's, what the estimate counts) differs from its
// estimate's total (`estimates`, in rank order: EstimateMemoryOfEachRank) by more than
// `tolerance`, a line naming those ranks, what they held, and the first one's estimate and its
// largest term; nullopt when every rank is within it.
std::optional<std::string> CompareWithMeasured(const std::vector<MemoryEstimate>& estimates,
                                               const std::vector<int64_t>& measured,
                                               double tolerance = 0.15);

}  // namespace plait::plan

#endif  // PLAIT_PLAN_MEMORY_ESTIMATE_H_
