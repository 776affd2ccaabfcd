// A preparation strategy (FSDP, DDP, tensor parallel) as one named object: built from a
// plan's step (MakeStrategy, strategies.h), it says which mesh dimensions it uses, checks its
// options against the model's shape and the mesh, and says what it would cost before any model
// exists (Check, Estimate: what a plan's validation, explanation and memory estimate ask,
// never naming a strategy), then is applied once to a model. That core is Strategy; what only
// some strategies do is a facet they implement beside it, which the preparation, the plan's
// checks and the loop discover (FacetOf): splitting the data (DataSplit), changing which
// parameters a rank holds or trains (ParameterLayout), communicating or completing gradients
// (Gradients), running a step's micro-batches (MicroBatchRunner), holding gathered parameters
// (GatheredMemory), saving added adapters (AdapterExport), knowing its versions that keep
// less on a rank (SmallerVersions). wrap::Preparation (preparation.h)
// applies strategies in a plan's order under the rules of rules.textproto; nothing outside
// wrap/ names a concrete strategy:
//
//   PLAIT_ASSIGN_OR_RETURN(std::unique_ptr<Strategy> fsdp, MakeStrategy(step));
//   std::vector<base::Violation> problems = fsdp->Check(shape, plan.mesh(), "plan.prepare[0]");
//   StepEstimate estimate = fsdp->Estimate(shape, plan.mesh());  // for plan_check
//   PLAIT_RETURN_IF_ERROR(fsdp->Apply(model, mesh));
//
// A strategy that only changes how each rank computes (activation checkpointing) uses no mesh
// dimension: uses_mesh_dim() is false, it names none, and its Apply uses no group of the mesh.
//
// A strategy that adds parameters and freezes the model's own (LoRA) says so in its
// estimate (added_parameters, trainable_parameters), which the later steps' estimates see in
// ModelShape; what it holds beyond the model's parameters it names in its memory terms.
//
// Adding a strategy: a class implementing this interface and the facets it needs in its own
// folder of wrap/ (and a SeamLayer, seams.h, if it changes what the model computes), a field in
// PrepareStep (wrap.proto), its case in MakeStrategy (strategies.h) and an entry in
// rules.textproto; nothing outside wrap/ changes.
#ifndef PLAIT_WRAP_STRATEGY_H_
#define PLAIT_WRAP_STRATEGY_H_

#include <cstdint>
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
#include "base/violation.h"
#include "parallel/communicator.h"
#include "parallel/device_mesh.h"
#include "parallel/mesh.pb.h"
#include "parallel/trainable_parameter.h"
#include "wrap/micro_batch_executor.h"
#include "wrap/wrap.pb.h"
#include "wrap/wrappable.h"

namespace plait::wrap {

// The sizes of a model that a strategy's checks and estimate need, in parameters (elements)
// where not said otherwise.
struct ModelShape {
  double parameters = 0;        // all of them
  // Those the optimizer trains, when an earlier step changed which (LoRA: its adapters);
  // nullopt: all of them.
  std::optional<double> trainable_parameters;
  double TrainableParameters() const { return trainable_parameters.value_or(parameters); }
  // One block's: their average, where mixture-of-experts and dense blocks mix.
  double block_parameters = 0;
  double root_parameters = 0;   // outside the blocks (embeddings, final norm, output head)
  int64_t num_blocks = 0;       // those a rank holds (a pipeline's rank: its stages')
  // The blocks' activations of one micro-batch a rank keeps at the peak of a step, counted in
  // blocks, where that is not num_blocks (a pipeline's rank: its stages' blocks for each
  // micro-batch in flight).
  std::optional<int64_t> kept_block_activations;
  int64_t KeptBlockActivations() const { return kept_block_activations.value_or(num_blocks); }
  // Whether the output projection is the embedding matrix (tied), counted once in the root.
  bool tied_embeddings = false;
  double parameter_bytes = 4;  // bytes per element of the model's parameters
  // For the activations tensor parallelism communicates: their width, and the tokens
  // (sequences x sequence length) of one micro-batch.
  double hidden_size = 0;
  double micro_batch_tokens = 0;
  // The micro-batches of one optimizer step on one rank (its gradient accumulation): those a
  // pipeline's schedule runs.
  int64_t micro_batches_per_step = 1;
  // Bytes of the activations one block keeps for its backward in one micro-batch (without
  // activation checkpointing), of its input, and of the outputs of its projections (its
  // matmuls: q/k/v/o, gate/up/down), on one rank: tensor parallelism's share of them.
  double block_activation_bytes = 0;
  // Bytes of the activations outside the blocks in one micro-batch, on one rank: the final
  // norm's and the loss's (the logits and their gradient), the output layers'.
  double output_activation_bytes = 0;
  double block_input_bytes = 0;
  double block_projection_output_bytes = 0;
  // What tensor parallelism's key/value reductions carry: the key/value head count, and one
  // block's key/value projections (k_proj and v_proj, weights and biases), whose gradients
  // are summed when fewer heads than ranks share them. (Those of the parameters it keeps
  // whole, it counts from parameter_list.)
  int64_t num_key_value_heads = 0;
  // The ranks tensor parallelism splits the heads over (1: none), each computing
  // num_key_value_heads / head_ranks of the key/value heads (at least one).
  int64_t head_ranks = 1;
  double block_key_value_parameters = 0;
  // What a strategy splits into equal parts, counted whole: attention and key/value heads,
  // MLP columns, vocabulary rows, and the tokens of one sequence.
  int64_t num_attention_heads = 0;
  int64_t head_dim = 0;  // each head's width (Qwen3's differ from hidden_size / heads)
  int64_t intermediate_size = 0;
  int64_t num_experts = 0;  // a mixture of experts' in each of its MoE layers; 0: dense
  int64_t experts_per_token = 0;  // those each token's row goes to
  int64_t num_moe_blocks = 0;     // the blocks that are mixtures of experts
  int64_t vocab_size = 0;
  int64_t seq_len = 0;
  // Whether the model computes on the CPU, where plait's fused kernels serve (a strategy's own
  // attention takes them too), and with how many threads a rank (1 where the plan leaves it
  // to the machine).
  bool on_cpu = false;
  int compute_threads = 1;
  // Every parameter by its (Hugging Face) name, with its shape and how the model says tensor
  // parallelism splits it, for a strategy that describes what each rank keeps.
  struct Parameter {
    std::string name;
    std::vector<int64_t> shape;
    Wrappable::Split split = Wrappable::Split::kReplicated;
    double numel() const {
      double count = 1;
      for (int64_t size : shape) count *= static_cast<double>(size);
      return count;
    }
  };
  std::vector<Parameter> parameter_list;
};

// How a strategy splits the activations of a micro-batch over the ranks of its dimension:
// tensor parallelism's heads, MLP columns and vocabulary, and with sequence parallelism the
// sequence between them; context parallelism's slices of each sequence, over its own
// dimension. Default: not at all.
struct ActivationSplit {
  int64_t ranks = 1;
  bool sequence = false;
  int64_t context_ranks = 1;  // each rank computes 1 / context_ranks of each sequence
};

// What a strategy's collectives send from one rank over one mesh dimension: bytes once per
// optimizer step and again for every micro-batch (ring algorithms: (n-1)/n of the data per
// all-gather or reduce-scatter, twice that per all-reduce), and whether the compute goes on
// while they run (FSDP's prefetched gathers and its reduce-scatters behind the backward, DDP's
// bucketed all-reduces) or waits for them (tensor parallelism's, between its matmuls).
struct Transfer {
  // The dimension, or for a group spanning several (FSDP's dense parts with
  // shard_dense_over_mesh_dim) their names in mesh order joined by commas: "dp,ep".
  std::string mesh_dim;
  double bytes_per_step = 0.0;
  double bytes_per_micro_batch = 0.0;
  bool overlaps_compute = true;

  // Bytes sent in an optimizer step of `micro_batches` micro-batches.
  double BytesPerStep(int64_t micro_batches) const {
    return bytes_per_step + static_cast<double>(micro_batches) * bytes_per_micro_batch;
  }
};

// A named part of the memory a step adds to a rank (negative: what it saves), and where in
// the estimate it counts. The plan's estimate (plan/memory_estimate.h) adds a step's terms to
// the model's own parameters, gradients, optimizer state and activations, and its explanation
// lists them by name: what a strategy holds enters as terms, not as fields of its own.
struct MemoryTerm {
  enum class Part {
    kParameters,   // with the parameters a rank keeps, between steps
    kBuffers,      // beside them, between steps
    kGathered,     // at the peak of every step, beside whatever else it holds
    kActivations,  // with a micro-batch's activations when its backward starts
    // Inside one op of a block's backward, beyond the activations the forward saved: the peak
    // holds the largest of these or the output layers' activations (the loss's backward).
    kWorking,
    // While the strategies keep what they gather (a generation phase between steps:
    // GatheredMemory::KeepGathered), in place of kGathered.
    kKeptGathered,
  };
  std::string name;  // what it is: "gathered units", "gradient buckets"
  Part part = Part::kBuffers;
  double bytes = 0.0;
};

// What a rank holds after every step of its preparation, for the terms that scale with it.
struct RankHolding {
  double parameter_fraction = 1.0;       // the share of each parameter it keeps
  double parameter_element_bytes = 0.0;  // the bytes it stores each parameter it keeps in
  double gradient_bytes = 0.0;           // its gradients of the parameters the optimizer trains
};

// What a strategy would do to one rank, estimated from the model's shape and the size of its
// mesh dimension: what it sends, how it changes the model a rank holds (which the later steps
// see in their ModelShape), and the memory it adds, as named terms.
struct StepEstimate {
  std::string description;           // one line for plan explanations
  std::vector<std::string> details;  // lines below it there (each collective, with its bytes)
  // What a rank sends, over each mesh dimension it sends over.
  std::vector<Transfer> transfers;

  // How it changes what a rank holds.
  double parameter_fraction = 1.0;  // the share of each parameter a rank keeps (1/n when sharded)
  // What the rank that keeps the most activations holds at the peak of a step, when the
  // strategy changes it (one that runs a stage's blocks for several micro-batches in flight):
  // blocks' activations of one micro-batch, counted in blocks, and the micro-batches whose
  // output layers' activations it holds (0 where it computes no output). nullopt: every
  // block of one micro-batch, and its output layers. The steps after it see `held_blocks` as
  // the model's num_blocks, and `blocks` as its kept_block_activations.
  struct KeptActivations {
    int64_t blocks = 0;
    int64_t outputs = 0;
    int64_t held_blocks = 0;  // the blocks the rank holds
    // Whether the rank computed a backward, and so holds gradients, before that peak.
    bool after_a_backward = false;
  };
  std::optional<KeptActivations> kept_activations;
  // Where the ranks of its dimension keep different shares (a pipeline's stages): each one's,
  // in the order of its coordinate on that dimension. parameter_fraction and kept_activations
  // above are then the largest of them. Empty: every rank keeps the same.
  struct RankShare {
    std::string description;  // what it holds: "stages 0 and 2"
    double parameter_fraction = 1.0;
    std::optional<KeptActivations> kept_activations;
  };
  std::vector<RankShare> rank_shares;
  // Bytes per element of the parameters a rank keeps and of their gradients, where the
  // strategy stores them in a dtype of its own (fp32 shards, gradients in a reduce dtype);
  // 0: the model's dtype.
  double kept_parameter_bytes = 0.0;
  double kept_gradient_bytes = 0.0;
  // Parameters it adds to the blocks, counted whole (the later steps see them in each block's
  // share), and, when it changes which parameters train, those that do after it, whole
  // (nullopt: unchanged).
  double added_parameters = 0.0;
  std::optional<std::vector<ModelShape::Parameter>> trainable_parameters;
  // When it drops some of the parameters it saw from a rank, those the first rank keeps, which
  // the steps after it see (ModelShape::parameter_list); nullopt: all of them.
  std::optional<std::vector<ModelShape::Parameter>> kept_parameter_list;

  // The memory it adds to a rank, and the terms that scale with what the rank holds after
  // every step (copies of its gradients, some parameters in a form of their own).
  std::vector<MemoryTerm> memory;
  std::function<std::vector<MemoryTerm>(const RankHolding&)> memory_on_rank;
};

// The core of every strategy: its name and dimensions, its checks and estimate, and Apply.
// What only some strategies do is in the facets below, which a strategy implements beside
// this class and the preparation, the plan's checks and the loop discover (FacetOf).
class Strategy {
 public:
  virtual ~Strategy() = default;

  // The name plans and rules use: the PrepareStep field ("fsdp").
  virtual absl::string_view name() const = 0;

  // The mesh dimension it runs on, when it uses one.
  virtual const std::string& mesh_dim() const = 0;
  virtual bool uses_mesh_dim() const { return true; }

  // A second mesh dimension, across which it replicates what it holds over mesh_dim(): FSDP's
  // hybrid sharding (FsdpConfig.replicate_mesh_dim, the field the rules name). Its ranks
  // train on different data too. Default: none ("").
  virtual std::string replicate_dim() const { return ""; }

  // A dimension an earlier step runs on that it shards over too, taking over what that step
  // keeps whole on each of its ranks (FSDP's shard_dense_over_mesh_dim: the parameters expert
  // parallelism does not split). The two are introduced (wrap::HandOver): that step is told
  // (ParameterLayout::HandOverReplicated), and this one is handed its layout
  // (ParameterLayout::Borrow). Default: none.
  virtual std::string borrowed_dim() const { return ""; }

  // Further names the rules (rules.textproto) know it by, for options that change what it may
  // be combined with (LoRA with an NF4 base: "qlora"). Default: none.
  virtual std::vector<std::string> rule_aliases() const { return {}; }

  // The files and folders its options name that it reads (a starting adapter folder), each
  // with its field below the step's ("lora.initial_adapter_dir"): a run must not write them.
  // Default: none.
  struct InputFile {
    std::string field;
    std::string path;
  };
  virtual std::vector<InputFile> InputFiles() const { return {}; }

  // Every problem of its options for a model of `shape` (nullopt when the model's config is
  // invalid and reported elsewhere) on a mesh of `mesh`'s dimensions, each under `field` (its
  // step's path, "plan.prepare[1]") or below it. The rules (rules.textproto) check the order
  // and the mesh dimensions first; this checks what only the strategy knows (dtypes it can
  // keep, counts that must divide by its dimension's size). Default: none.
  virtual std::vector<base::Violation> Check(const std::optional<ModelShape>& shape,
                                             const parallel::MeshConfig& mesh,
                                             const std::string& field) const {
    return {};
  }

  // Its cost on a model of `shape` on a mesh of `mesh`'s dimensions.
  virtual StepEstimate Estimate(const ModelShape& shape,
                                const parallel::MeshConfig& mesh) const = 0;

  // Applies it to `model` over `mesh`'s groups along its dimensions; both must outlive it.
  // Called once, by Preparation.
  virtual absl::Status Apply(Wrappable& model, const parallel::DeviceMesh& mesh) = 0;
};

// `strategy`'s facet `Facet`, or nullptr where it does not have it.
template <typename Facet>
Facet* FacetOf(Strategy& strategy) {
  return dynamic_cast<Facet*>(&strategy);
}
template <typename Facet>
const Facet* FacetOf(const Strategy& strategy) {
  return dynamic_cast<const Facet*>(&strategy);
}

// A strategy whose ranks divide the work of a step: they train on different data, or each
// computes part of every sequence, or part of each activation. Without it a strategy's ranks
// all compute the same.
class DataSplit {
 public:
  virtual ~DataSplit() = default;

  // Whether the ranks of its dimension train on different data (FSDP, DDP) rather than on the
  // same batch (tensor parallelism): the data-parallel width is the product of such dimensions.
  virtual bool splits_batch() const { return false; }

  // Whether the ranks of its dimension each compute and score a slice of every sequence
  // (context parallelism): they read the same batch, but the step's items are counted over
  // the dimension too (objectives/step_items.h).
  virtual bool splits_sequence() const { return false; }

  // Whether the ranks of its dimension each run the blocks' feed-forward on different tokens
  // (data and context parallelism, and tensor parallelism's sequence parallelism): a mixture
  // of experts' routing is summed over such dimensions (objectives/model_losses.h). Default:
  // when it splits the batch or the sequence.
  virtual bool splits_tokens() const { return splits_batch() || splits_sequence(); }

  // How it splits a micro-batch's activations over its dimension of `mesh`. Default: not at
  // all.
  virtual ActivationSplit SplitsActivations(const parallel::MeshConfig& mesh) const { return {}; }

  // After Apply: this rank's part of `x` [B, T, ...], whose dimension 1 is the whole
  // sequence (a batch's targets): what it computes and scores, its slice under context
  // parallelism. Default: all of it.
  virtual at::Tensor OwnSlice(const at::Tensor& x) const { return x; }
};

// A strategy that changes which parameters a rank holds, trains or keeps whole: it shards or
// slices them, freezes them, adds its own or holds some in a form of its own.
class ParameterLayout {
 public:
  virtual ~ParameterLayout() = default;

  // Whether Apply freezes the model's own parameters (LoRA: only its adapters train), so
  // that a run's checkpoints hold no values of them and a resume must take them from where
  // the run did. Default: it freezes none.
  virtual bool freezes_model_parameters() const { return false; }

  // A later step borrows its dimension (Strategy::borrowed_dim) and shards the parameters this
  // one keeps whole on each of its ranks: averaging their gradients over the dimension and
  // numbering their copies are that step's now, and this one leaves both, in
  // UpdateParameters, Gradients::FinishGradients and Estimate, which run after this. The rules
  // say which strategies lend their dimension (rules.proto's lenders). Default: nothing to
  // leave.
  virtual void HandOverReplicated() {}

  // Whether it splits the model's parameter `name` over its dimension, each of its ranks
  // keeping a different part or none (expert parallelism: an expert's); what it does not
  // split, each rank keeps whole. Default: it splits none.
  virtual bool SplitsParameter(const std::string& name) const { return false; }

  // This step borrows the dimension of the earlier step whose layout is `lender` (its
  // Strategy::borrowed_dim), which outlives it: it shards over both dimensions what `lender`
  // does not split (SplitsParameter). Called before Estimate and Apply. Default: it borrows
  // none.
  virtual void Borrow(const ParameterLayout& lender) {}

  // After Apply: rewrites `parameters` (this rank's parts of some of the model's parameters,
  // as earlier strategies left them: the ones the optimizer trains, or the ones a step froze)
  // into what this rank holds of them after this strategy (FSDP: its shards). Default:
  // unchanged.
  virtual void UpdateParameters(std::vector<parallel::TrainableParameter>& parameters) {}

  // After Apply: the parts of the model's parameters it took out of the model and holds in a
  // form of its own (QLoRA's NF4 base), frozen and whole, each with a `store` that takes its
  // values: what the model no longer lists, for the caller to give values to as to the other
  // frozen parameters. Default: none.
  virtual std::vector<parallel::TrainableParameter> HeldParameters() { return {}; }

  // After Apply: rewrites `held` (what an earlier strategy's HeldParameters gave) for what this
  // strategy did to the tensors they are held in: FSDP, which shards them, makes each `store`
  // keep this rank's share. Default: unchanged.
  virtual void UpdateHeldParameters(std::vector<parallel::TrainableParameter>& held) {}

  // After Apply, on every rank of its group together: replaces the entries of `parameters`
  // (every parameter by name, as the strategies applied after it left them) with the whole
  // tensors this strategy splits. Default: nothing to gather.
  virtual absl::Status GatherFullParameters(std::map<std::string, at::Tensor>& parameters) {
    return absl::OkStatus();
  }

  // After GatherFullParameters: folds the parameters this strategy added into the model's own
  // in `parameters` (every parameter by name, whole) and removes them, so that what is left is
  // a model without the strategy (LoRA: W + scale * B A). Default: it added none.
  virtual absl::Status MergeAddedParameters(std::map<std::string, at::Tensor>& parameters) {
    return absl::OkStatus();
  }
};

// A strategy whose hooks communicate gradients, or that completes them after a step's
// backward passes.
class Gradients {
 public:
  virtual ~Gradients() = default;

  // After Apply: whether the next backward passes synchronise gradients. Gradient
  // accumulation turns it off for all micro-batches but the last. Default: nothing to skip.
  virtual void SetGradientSync(bool sync) {}

  // After each step's backward passes and every strategy's reductions: completes the
  // gradients of `trainable` (this rank's parts, as the optimizer owns them) where this
  // strategy must (a pipeline sums the gradient of a parameter two stages hold, a tied
  // embedding). Default: nothing to do.
  virtual absl::Status FinishGradients(const std::vector<parallel::TrainableParameter>& trainable) {
    return absl::OkStatus();
  }

  // After Apply: the first communication error of its hooks, which cannot return one; it
  // stays, since the ranks are out of step after it.
  virtual absl::Status BackwardStatus() const { return absl::OkStatus(); }
};

// A strategy that decides the order of a step's micro-batches and where they flow (a
// pipeline's schedule).
class MicroBatchRunner {
 public:
  virtual ~MicroBatchRunner() = default;

  // After Apply: the executor that runs a step's micro-batches.
  virtual MicroBatchExecutor& executor() = 0;
};

// A strategy that holds whole parameters beyond a rank's share for a while (FSDP's gathered
// units), for the memory a step measures.
class GatheredMemory {
 public:
  virtual ~GatheredMemory() = default;

  // After Apply: bytes of whole parameters it holds beyond its share now, and the most at once
  // since ResetPeak.
  virtual int64_t gathered_bytes() const = 0;
  virtual int64_t peak_gathered_bytes() const = 0;
  virtual void ResetPeak() = 0;

  // After Apply: with `keep`, whole parameters it gathers stay gathered after their forward,
  // until a call without `keep` frees them: a phase of forwards under no-grad that read the
  // same weights again and again (decoding, a token at a time) gathers each once.
  virtual void KeepGathered(bool keep) = 0;
};

// A strategy that is there to keep less on each rank, and knows the versions of itself that
// keep less still: what a plan that does not fit its machine is offered
// (plan/target_check.cc).
class SmallerVersions {
 public:
  virtual ~SmallerVersions() = default;

  // What it keeps less of: the forward's activations (activation checkpointing), or the
  // parameters with their gradients and optimizer state (DDP's replicas, FSDP's shards).
  enum class Saves { kActivations, kParameters };
  virtual Saves saves() const = 0;

  // The steps that may take its place and keep less, smallest change first (DDP: FSDP over
  // its dimension); none where it keeps the least there is. Default: none.
  virtual std::vector<PrepareStep> Replacements() const { return {}; }

  // Whether it keeps less over more ranks of its dimension (FSDP: a smaller shard each).
  // Default: no.
  virtual bool keeps_less_over_more_ranks() const { return false; }
};

// A strategy that adds adapters a run can save on their own (LoRA's, as a PEFT adapter folder).
class AdapterExport {
 public:
  virtual ~AdapterExport() = default;

  // Writes `adapters` (the tensors it added, whole, by name, in the model's order) to the
  // folder `dir` as adapters of the base model `base_model` (a name or a folder, recorded).
  virtual absl::Status SaveAdapters(const std::string& dir,
                                    const std::vector<std::pair<std::string, at::Tensor>>& adapters,
                                    const std::string& base_model) const = 0;

  // Every reason SaveAdapters could not write to `dir`, found before a run trains (it would
  // replace a file of the user's, or cannot write there), each naming `field`.
  virtual std::vector<base::Violation> CheckAdapterFolder(const std::string& dir,
                                                          const std::string& field) const = 0;
};

}  // namespace plait::wrap

#endif  // PLAIT_WRAP_STRATEGY_H_
