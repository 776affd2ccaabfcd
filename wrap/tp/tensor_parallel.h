// Tensor parallelism on one mesh dimension, Megatron's layout (Shoeybi et al. 2019; with
// Korthikanti et al. 2022's sequence parallelism): every parameter the model's
// Wrappable::SplitOf names as split is replaced, in place, by this rank's slice
// (the parameter keeps its identity; the full tensor's memory is released), attention runs
// with the local head counts, and the model's forward runs this object at its seams
// (seams.h) where the layout communicates: the conjugate all-reduces around column- and
// row-parallel projections (or, with sequence_parallel, all-gathers and reduce-scatters along the
// sequence), the vocabulary-parallel embedding, and the cross-entropy of vocabulary-sharded
// logits. Gradients that the layout leaves partial are summed over the group: those of
// key/value heads shared by several ranks (fewer heads than ranks) among those ranks in
// backward, before they are accumulated; once a step's backward passes are over
// (SumPartialGradients: one sum a step, not one a micro-batch, of the parts the optimizer
// trains, FSDP's shards too), those of the replicated parameters each rank computes only part
// of (Split::kReplicatedPartialGradient: Qwen3's per-head norms, an adapter's matrix beside a
// split projection), and with sequence parallelism those of every replicated parameter (norms,
// row-parallel biases, a mixture of experts' routers and experts). The optimizer trains the
// slices (UpdateParameters); FSDP on another dimension shards them further.
// TensorParallelStrategy is its preparation strategy (strategy.h), applied through
// wrap::Preparation (preparation.h) before FSDP or DDP.
#ifndef PLAIT_WRAP_TP_TENSOR_PARALLEL_H_
#define PLAIT_WRAP_TP_TENSOR_PARALLEL_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "parallel/communicator.h"
#include "parallel/trainable_parameter.h"
#include "wrap/strategy.h"
#include "wrap/tp/collective_ops.h"
#include "wrap/wrap.pb.h"
#include "wrap/wrappable.h"

namespace plait::wrap::tp {

// The problems of splitting a model's `num_heads` attention heads and `num_kv_heads`
// key/value heads over `tp` ranks, one sentence each naming the count ("num_attention_heads
// (6) does not divide by the tensor-parallel size 4"); empty when they split: heads divide by
// tp, and kv heads divide by tp or tp by them (then shared).
std::vector<std::string> HeadSplitProblems(int64_t num_heads, int64_t num_kv_heads, int tp);

class TensorParallel final : public SeamLayer {
 public:
  // Replaces the model's split parameters by this rank's slices (the model must be the
  // same on every rank, e.g. initialised from one seed; a padded vocabulary's slices end in
  // zero rows) and adds itself to the model's seams, and its hooks. InvalidArgument naming the
  // count or parameter that does not divide by the group's size.
  static absl::StatusOr<std::unique_ptr<TensorParallel>> Create(
      Wrappable& model, parallel::Communicator& communicator, const TensorParallelConfig& config);
  ~TensorParallel() override;

  // SeamLayer: the input of column-split projections is the whole activations (all-gathered
  // along the sequence with sequence parallelism), and their gradient is summed over the
  // group (reduce-scattered); a row-split projection's partial products, with what the layers
  // below add to them, are summed over the group (reduce-scattered along the sequence) before
  // its bias is added, once; the embedding looks up this rank's vocabulary rows (zeros for
  // the tokens outside them) and sums the ranks' lookups; and the token losses are computed
  // from this rank's vocabulary slice of the logits [N, vocab / tp] (any floating dtype, kept
  // as it is; scored in fp32 for 16-bit logits) without gathering them: a vocabulary padded to
  // a multiple of tp has padding columns at its end, which get no probability and a zero
  // gradient. A sampler's whole logits are the ranks' slices gathered, the padding columns
  // left out. Sequence parallelism splits each forward's tokens over the ranks, so such a
  // model does not decode a token at a time.
  std::vector<Seam> changes() const override {
    return {Seam::kEmbedding, Seam::kColumnInput, Seam::kProjection, Seam::kTokenLoss,
            Seam::kLogits};
  }
  at::Tensor Embed(const at::Tensor& tokens, const at::Tensor& weight, EmbedNext next) override;
  at::Tensor ColumnInput(const at::Tensor& x, TensorNext next) override;
  at::Tensor Project(const ProjectionSite& site, const at::Tensor& input,
                     ProjectNext next) override;
  at::Tensor TokenLosses(const at::Tensor& logits, const at::Tensor& targets, int64_t ignore_index,
                         TokenLossNext next) override;
  at::Tensor WholeLogits(const at::Tensor& logits, TensorNext next) override;
  std::string DecodeRefusal() const override;

  // Marks the split parameters among `parameters` as sharded over this group (and shared
  // key/value heads as replicated `replicas` times in it), narrowing each one's slice to
  // this rank's part of the whole parameter (a padded vocabulary's padding rows are in no
  // slice); the others are whole on every rank of the group, replicas of one another.
  void MarkSharded(std::vector<parallel::TrainableParameter>& parameters) const;

  // Replaces the split parameters' entries of `parameters` (this rank's slices) by the
  // whole tensors, gathered from the group, without vocabulary padding; every rank of the
  // group must call it.
  absl::Status GatherFull(std::map<std::string, at::Tensor>& parameters);

  // Sums over the group the gradients of the parts of `trainable` (as the optimizer owns them,
  // after every strategy's reductions) that each rank computed only part of; every rank of the
  // group must call it, after the step's backward passes. The error is the failed
  // all-reduce's.
  absl::Status SumPartialGradients(const std::vector<parallel::TrainableParameter>& trainable);

  // The first error of a collective since wrapping.
  absl::Status status() const { return group_.status(); }

 private:
  // A split parameter: its slice `part` of `parts` along `dim`, held by `replicas` ranks;
  // the whole parameter has `length` entries along `dim`, followed by padding (a
  // vocabulary padded to a multiple of the parts) up to `parts` slices' worth.
  struct Slice {
    std::string name;
    at::Tensor parameter;
    int64_t dim;
    int64_t parts;
    int64_t part;
    int64_t replicas;
    int64_t length;
  };

  TensorParallel(Wrappable& model, parallel::Communicator& communicator, bool sequence_parallel);

  // A row-split projection's output: the ranks' partial products summed (reduce-scattered
  // along the sequence with sequence parallelism); backward passes the gradient on
  // (all-gathers it).
  at::Tensor ExitRowParallel(const at::Tensor& partial);

  // The vocabulary columns of this rank's `columns`-wide logits slice that are padding.
  int64_t PaddedColumns(int64_t columns) const;

  // Registers `hook` on `parameter`'s gradient, removed when this object goes.
  void AddGradientHook(at::Tensor parameter, std::function<at::Tensor(at::Tensor)> hook);

  Wrappable& model_;
  parallel::GraphGroup group_;
  const bool sequence_parallel_;
  // The vocabulary's size (its rows before padding) when pad_vocab_to_multiple padded it,
  // else 0.
  int64_t vocab_size_ = 0;
  std::vector<Slice> slices_;
  std::vector<std::pair<at::Tensor, unsigned>> hooks_;  // parameter and hook position
};

// Tensor parallelism as a preparation strategy: "tensor_parallel" in plans and rules.
class TensorParallelStrategy final : public Strategy,
                                     public DataSplit,
                                     public ParameterLayout,
                                     public Gradients {
 public:
  explicit TensorParallelStrategy(TensorParallelConfig config) : config_(std::move(config)) {}

  absl::string_view name() const override { return "tensor_parallel"; }
  const std::string& mesh_dim() const override { return config_.mesh_dim(); }
  bool splits_batch() const override { return false; }
  // Under sequence parallelism: each rank computes the feed-forward on its slice.
  bool splits_tokens() const override { return config_.sequence_parallel(); }
  // The heads, MLP columns and vocabulary (unless padded) must divide by its dimension's size,
  // and with sequence parallelism the sequence too.
  std::vector<base::Violation> Check(const std::optional<ModelShape>& shape,
                                     const parallel::MeshConfig& mesh,
                                     const std::string& field) const override;
  // Its collectives, and the shape of each kind of parameter on a rank.
  StepEstimate Estimate(const ModelShape& shape, const parallel::MeshConfig& mesh) const override;
  ActivationSplit SplitsActivations(const parallel::MeshConfig& mesh) const override;
  absl::Status Apply(Wrappable& model, const parallel::DeviceMesh& mesh) override;
  void UpdateParameters(std::vector<parallel::TrainableParameter>& parameters) override {
    tp_->MarkSharded(parameters);
  }
  absl::Status FinishGradients(
      const std::vector<parallel::TrainableParameter>& trainable) override {
    return tp_->SumPartialGradients(trainable);
  }
  absl::Status BackwardStatus() const override { return tp_->status(); }
  absl::Status GatherFullParameters(std::map<std::string, at::Tensor>& parameters) override {
    return tp_->GatherFull(parameters);
  }

 private:
  TensorParallelConfig config_;
  std::unique_ptr<TensorParallel> tp_;
};

}  // namespace plait::wrap::tp

#endif  // PLAIT_WRAP_TP_TENSOR_PARALLEL_H_
