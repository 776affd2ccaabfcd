// The reference model's log-probabilities of preference rows, computed once and kept, for
// DPO's precompute_reference: before the first step the trainer runs the reference over every
// batch the run will read (training and evaluation), keeps each sequence's log-probability
// here (a row's, or each of a packed row's sequences'), and releases the model; DPO then looks
// its batches' sequences up by their tokens instead of running the reference:
//
//   auto table = std::make_shared<ReferenceLogProbs>();
//   for (...) table->Add(reference, loader.Next().value());
//   std::unique_ptr<Objective> dpo = MakePrecomputedDpo(config, table);
#ifndef PLAIT_OBJECTIVES_REFERENCE_LOG_PROBS_H_
#define PLAIT_OBJECTIVES_REFERENCE_LOG_PROBS_H_

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/statusor.h"
#include "data/batch.h"
#include "models/causal_lm.h"

namespace plait::objectives {

// Each sequence's log-probability of its scored targets under `model`: fp32 [sequences],
// differentiable; a packed row's sequences each (data::SequenceSums), and under context
// parallelism the whole sequences', the ranks' slices summed (CausalLM::SequenceLogProbs).
at::Tensor SequenceLogProbs(models::CausalLM& model, const data::Batch& batch);

class ReferenceLogProbs {
 public:
  // `reference`'s log-probabilities (fp32 [data::Sequences(batch)]) of `batch`'s sequences,
  // summed over the scored targets, computed under no-grad; how DPO scores its reference,
  // precomputed or not.
  static at::Tensor Compute(models::CausalLM& reference, const data::Batch& batch);

  // Computes and keeps the log-probabilities of `batch`'s sequences (one kept already is kept
  // once). Every rank of a sharded reference must call it for the same number of batches.
  void Add(models::CausalLM& reference, const data::Batch& batch);

  // The kept log-probabilities of `batch`'s sequences, bit for bit as Compute gave them, on
  // `batch`'s device (read on the host: give a batch in host memory where there is one);
  // NotFound naming the first sequence never added.
  absl::StatusOr<at::Tensor> Find(const data::Batch& batch) const;

  // How many distinct sequences are kept.
  int64_t rows() const { return static_cast<int64_t>(log_probs_.size()); }

 private:
  // A sequence by its tokens and targets (its row's, or for a packed row its span up to the
  // next sequence: packing is deterministic, so it recurs with the same span): two 64-bit
  // hashes (a collision among a million sequences has a probability of about 3e-8 for each,
  // and both would have to collide). SequenceKeys reads `batch` in host memory and keys its
  // sequences in data::SequenceSums' order.
  using Key = std::pair<uint64_t, uint64_t>;
  static std::vector<Key> SequenceKeys(const data::Batch& batch);

  std::map<Key, float> log_probs_;
};

}  // namespace plait::objectives

#endif  // PLAIT_OBJECTIVES_REFERENCE_LOG_PROBS_H_
