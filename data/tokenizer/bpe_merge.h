// BPE's merge loop over token ids, shared by the BPE tokenizers: Hugging Face's (bpe_tokenizer.h,
// ranks from tokenizer.json's merges) and SentencePiece's (sentencepiece_tokenizer.h, ranks from
// the pieces' scores). The tokenizer fills a MergeTable as it loads, then cuts each piece of text
// into the ids merging starts from and calls Merge:
//
//   MergeTable merges;
//   merges.Add(id_of("a"), id_of("b"), /*rank=*/0, id_of("ab"));
//   merges.Merge({id_of("a"), id_of("b"), id_of("c")}, ids);  // appends id_of("ab"), id_of("c")
#ifndef PLAIT_DATA_TOKENIZER_BPE_MERGE_H_
#define PLAIT_DATA_TOKENIZER_BPE_MERGE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"

namespace plait::data::tokenizer {

class MergeTable {
 public:
  void Reserve(size_t merges) { merges_.reserve(merges); }

  // That the adjacent ids `left`, `right` merge into `result`, before any merge of higher
  // rank. A pair added twice keeps its first rank, as in Hugging Face's BPE.
  void Add(int32_t left, int32_t right, int32_t rank, int32_t result) {
    merges_.emplace(Key(left, right), Result{rank, result});
  }

  // Appends to `ids` the merge of `initial`: while some adjacent pair has a merge, the pair of
  // lowest rank (the leftmost of equal ranks) becomes its result.
  void Merge(absl::Span<const int32_t> initial, std::vector<int32_t>& ids) const;

 private:
  struct Result {
    int32_t rank;
    int32_t id;
  };
  static uint64_t Key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }

  absl::flat_hash_map<uint64_t, Result> merges_;
};

}  // namespace plait::data::tokenizer

#endif  // PLAIT_DATA_TOKENIZER_BPE_MERGE_H_
