// The ids of recently encoded pieces (pre-tokenized words), shared by the BPE tokenizers
// (bpe_tokenizer.cc, sentencepiece_tokenizer.cc): most words of a text recur, and a lookup is
// much cheaper than the merges. Sharded, so that threads encoding documents in parallel rarely
// wait on each other; a full shard is emptied, which keeps memory bounded without the
// bookkeeping of an LRU. A tokenizer owns one and uses it from const methods:
//
//   cache_.AppendOrMerge(piece, ids, [&](absl::string_view piece, std::vector<int32_t>& ids) {
//     ... append the merge of piece to ids ...
//   });
#ifndef PLAIT_DATA_TOKENIZER_PIECE_CACHE_H_
#define PLAIT_DATA_TOKENIZER_PIECE_CACHE_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/hash/hash.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"

namespace plait::data::tokenizer {

// Pieces longer than this are not cached (they are rare, and would crowd the cache).
inline constexpr size_t kMaxCachedPiece = 64;

class PieceCache {
 public:
  // Appends the ids of `piece` to `ids` when they are cached; whether they were.
  bool Append(absl::string_view piece, std::vector<int32_t>& ids) const {
    Shard& shard = ShardOf(piece);
    absl::MutexLock lock(&shard.mutex);
    const auto it = shard.ids.find(piece);
    if (it == shard.ids.end()) return false;
    ids.insert(ids.end(), it->second.begin(), it->second.end());
    return true;
  }
  void Insert(absl::string_view piece, absl::Span<const int32_t> ids) const {
    Shard& shard = ShardOf(piece);
    absl::MutexLock lock(&shard.mutex);
    if (shard.ids.size() >= kShardCapacity) shard.ids.clear();
    shard.ids.emplace(piece, std::vector<int32_t>(ids.begin(), ids.end()));
  }

  // Appends the ids of `piece` to `ids`: the cached ones, or those `merge(piece, ids)` appends,
  // then cached when the piece is no longer than kMaxCachedPiece.
  template <typename MergeFn>
  void AppendOrMerge(absl::string_view piece, std::vector<int32_t>& ids,
                     const MergeFn& merge) const {
    if (piece.size() > kMaxCachedPiece) {
      merge(piece, ids);
      return;
    }
    if (Append(piece, ids)) return;
    const size_t first = ids.size();
    merge(piece, ids);
    Insert(piece, absl::MakeConstSpan(ids).subspan(first));
  }

 private:
  static constexpr int kShards = 64;
  static constexpr size_t kShardCapacity = 4096;
  struct Shard {
    absl::Mutex mutex;
    absl::flat_hash_map<std::string, std::vector<int32_t>> ids;
  };
  Shard& ShardOf(absl::string_view piece) const {
    return shards_[absl::Hash<absl::string_view>()(piece) % kShards];
  }
  mutable std::array<Shard, kShards> shards_;
};

}  // namespace plait::data::tokenizer

#endif  // PLAIT_DATA_TOKENIZER_PIECE_CACHE_H_
