#include "wrap/cp/context_parallel.h"

#include <algorithm>
#include <utility>

#include "ATen/core/Tensor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/human.h"
#include "base/status.h"
#include "parallel/device_mesh.h"
#include "wrap/gradient_reduce.h"

namespace plait::wrap::cp {
ContextParallelStrategy::~ContextParallelStrategy() {
  if (model_ != nullptr) model_->seams().Remove(ring_.get());
}

std::vector<base::Violation> ContextParallelStrategy::Check(const std::optional<ModelShape>& shape,
                                                            const parallel::MeshConfig& mesh,
                                                            const std::string& field) const {
  // 1 for an unknown dimension, which the rules report.
  const int64_t ranks = parallel::SubmeshRanks(mesh, {config_.mesh_dim()});
  if (!shape.has_value()) return {};
  if (shape->seq_len % (2 * ranks) == 0) return {};
  return {
      {field + ".context_parallel.mesh_dim",
       absl::StrCat("\"", config_.mesh_dim(), "\" (", ranks, " ranks) cuts each sequence into ",
                    2 * ranks,
                    " equal chunks, two a rank, for causal load balance; plan.training.seq_len (",
                    shape->seq_len, ") must be a multiple of ", 2 * ranks),
       ""}};
}

ActivationSplit ContextParallelStrategy::SplitsActivations(const parallel::MeshConfig& mesh) const {
  ActivationSplit split;
  split.context_ranks = parallel::SubmeshRanks(mesh, {config_.mesh_dim()});
  return split;
}

StepEstimate ContextParallelStrategy::Estimate(const ModelShape& shape,
                                               const parallel::MeshConfig& mesh) const {
  const int64_t ranks = parallel::SubmeshRanks(mesh, {config_.mesh_dim()});
  StepEstimate estimate;
  // One rank's keys and values of one block, in the model's dtype (`shape` counts the
  // rank's tokens): what each hop of the ring sends forward, and again backward beside their
  // gradients in fp32.
  const auto head_dim = static_cast<double>(shape.head_dim);
  const int64_t head_ranks = std::max<int64_t>(1, shape.head_ranks);
  const int64_t kv_heads = (shape.num_key_value_heads + head_ranks - 1) / head_ranks;
  const int64_t heads = std::max<int64_t>(1, shape.num_attention_heads / head_ranks);
  const double block_bytes = 2.0 * shape.micro_batch_tokens * static_cast<double>(kv_heads) *
                             head_dim * shape.parameter_bytes;
  const double gradient_bytes = block_bytes / shape.parameter_bytes * 4.0;
  const double hops = ranks - 1;
  estimate.description = absl::StrFormat(
      "context_parallel over %s (%d ranks): each rank computes 2 of the %d chunks of every "
      "sequence (%s tokens of a micro-batch) and attends over the whole sequence by ring "
      "attention; gradients averaged over %s after each step",
      config_.mesh_dim(), ranks, 2 * ranks, base::HumanCount(shape.micro_batch_tokens),
      config_.mesh_dim());
  if (ranks > 1) {
    const auto hops_of = [](int count) {
      return absl::StrCat(count, count == 1 ? " hop" : " hops");
    };
    estimate.details.push_back(absl::StrFormat(
        "per block, forward: %s of the rank's keys and values (%s) around the ring, each sent "
        "while the block before it computes",
        hops_of(ranks - 1), base::HumanBytesAnySize(block_bytes)));
    estimate.details.push_back(absl::StrFormat(
        "per block, backward: %s of keys and values again and %s of their fp32 gradients (%s), "
        "which arrive back at their rank",
        hops_of(ranks - 1), hops_of(ranks), base::HumanBytesAnySize(gradient_bytes)));
    Transfer transfer;
    transfer.mesh_dim = config_.mesh_dim();
    transfer.bytes_per_micro_batch =
        static_cast<double>(shape.num_blocks) * (2.0 * hops * block_bytes + ranks * gradient_bytes);
    estimate.transfers.push_back(transfer);
    // The gradients' average after each step: one all-reduce of the trainable parameters.
    Transfer gradients;
    gradients.mesh_dim = config_.mesh_dim();
    gradients.bytes_per_step = 2.0 * hops / ranks * shape.TrainableParameters() * 4.0;
    gradients.overlaps_compute = false;
    estimate.transfers.push_back(gradients);
  }
  const int64_t chunk_len = shape.seq_len / (2 * ranks);
  if (chunk_len > 0) {
    const auto batch = static_cast<int64_t>(shape.micro_batch_tokens) / (2 * chunk_len);
    const RingShape ring{batch, heads, kv_heads, shape.head_dim, chunk_len};
    const double working_bytes = RingWorkingBytes(ring, shape.on_cpu, shape.compute_threads);
    estimate.memory.push_back({.name = "of ring attention's working memory",
                               .part = MemoryTerm::Part::kWorking,
                               .bytes = working_bytes});
    estimate.details.push_back(
        shape.on_cpu
            ? absl::StrFormat(
                  "ring attention in the fused CPU kernels: %s at once beside what the "
                  "backward keeps (a block's fp32 gradients and the rows of scores of %d "
                  "thread%s)",
                  base::HumanBytesAnySize(working_bytes), shape.compute_threads,
                  shape.compute_threads == 1 ? "" : "s")
            : absl::StrFormat(
                  "ring attention in tiles of %d of a chunk's %d query rows: %s at once beside "
                  "what the backward keeps (two tiles of fp32 scores, a block's fp32 copies "
                  "and gradients)",
                  ScoreTileRows(batch, kv_heads, chunk_len), chunk_len,
                  base::HumanBytesAnySize(working_bytes)));
  }
  return estimate;
}

absl::Status ContextParallelStrategy::Apply(Wrappable& model, const parallel::DeviceMesh& mesh) {
  PLAIT_ASSIGN_OR_RETURN(parallel::Communicator* const communicator,
                         mesh.communicator(config_.mesh_dim()));
  group_ = std::make_unique<parallel::GraphGroup>(*communicator);
  ring_ = std::make_unique<RingContext>(*group_);
  model.seams().Add(ring_.get());
  model_ = &model;
  return absl::OkStatus();
}

void ContextParallelStrategy::UpdateParameters(
    std::vector<parallel::TrainableParameter>& parameters) {
  for (parallel::TrainableParameter& parameter : parameters) {
    parameter.slice.replica = parameter.slice.replica * group_->size() + group_->rank();
  }
}

at::Tensor ContextParallelStrategy::OwnSlice(const at::Tensor& x) const { return ring_->Slice(x); }

absl::Status ContextParallelStrategy::FinishGradients(
    const std::vector<parallel::TrainableParameter>& trainable) {
  if (group_->size() == 1) return absl::OkStatus();
  const parallel::ScopedPlace place =
      group_->Place(parallel::Pass::kNone, "context-parallel gradients");
  for (const parallel::TrainableParameter& parameter : trainable) {
    PLAIT_RETURN_IF_ERROR(
        ReduceGradient(parameter, group_->communicator(), parallel::ReduceOp::kAverage));
  }
  return absl::OkStatus();
}

absl::Status ContextParallelStrategy::BackwardStatus() const {
  return group_ == nullptr ? absl::OkStatus() : group_->status();
}

}  // namespace plait::wrap::cp
