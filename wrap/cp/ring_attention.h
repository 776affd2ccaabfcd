// Context parallelism's attention: the n ranks of a group each hold a slice of every sequence
// and compute causal attention of their queries over the whole sequence's keys and values
// without gathering them, as ring attention does (Liu et al.; torchtitan and Megatron-core's
// context parallelism). Each rank's keys and values pass once around the ring; at each hop a
// rank computes its queries against the block it holds, while the next block travels, and
// merges the partial results by their log-sum-exp, as flash attention's online softmax does.
// The backward passes the blocks around again, with their key and value gradients, which
// arrive back at their owner after n hops.
//
// Causal load balancing: the sequence is cut into 2n chunks and rank r keeps chunks r and
// 2n - 1 - r (ChunkLayout), so every rank meets the same number of keys: the early chunk's
// queries few, the late chunk's many. Rotary positions are the global ones (Positions).
//
//   const ChunkLayout layout = *ChunkLayout::Create(seq_len, group.size(), group.rank());
//   at::Tensor q = Rotary(..., layout.Positions()), k = ..., v = ...;  // [B, 2L, heads, d]
//   at::Tensor out = RingAttention(q, k, v, group);                   // [B, 2L, H, d]
//   loss.backward();
//   PLAIT_RETURN_IF_ERROR(group.status());
//
// The blocks are computed in fp32 (for 16-bit inputs too) by one of two forms with the same
// values: on the CPU, the fused attention kernels the model's own attention runs
// (models/internal/ops.h), which hold a few rows of scores per thread; elsewhere (a GPU, or
// `generic`), LibTorch's generic ops (matmuls and exponentials) a tile of query rows at a
// time, so that the fp32 scores in memory at once stay under a bound however long the chunks
// are (ScoreTileRows). Under a causal meeting a tile meets only the keys before its last row.
#ifndef PLAIT_WRAP_CP_RING_ATTENTION_H_
#define PLAIT_WRAP_CP_RING_ATTENTION_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/statusor.h"
#include "parallel/graph_group.h"
#include "wrap/wrappable.h"

namespace plait::wrap::cp {

// Which two of the 2n chunks of a sequence rank r of n keeps: r and 2n - 1 - r, so that every
// rank does the same attention work (the default, and what the strategy uses); or 2r and
// 2r + 1, the contiguous split, whose later ranks meet more keys (benchmarks' contrast).
enum class ChunkOrder { kLoadBalanced, kContiguous };

// Where a rank's tokens lie in a sequence.
class ChunkLayout {
 public:
  // The layout of a sequence of `seq_len` tokens over `ranks` ranks, for rank `rank`;
  // InvalidArgument giving both numbers when seq_len is not a multiple of 2 * ranks.
  static absl::StatusOr<ChunkLayout> Create(int64_t seq_len, int ranks, int rank,
                                            ChunkOrder order = ChunkOrder::kLoadBalanced);

  // The chunks rank `rank` of `ranks` keeps, in the order it holds them.
  static std::array<int, 2> ChunksOf(int ranks, int rank,
                                     ChunkOrder order = ChunkOrder::kLoadBalanced);

  int64_t chunk_len() const { return chunk_len_; }
  int64_t local_len() const { return 2 * chunk_len_; }

  // The global positions of this rank's tokens, in order: int64 [local_len()].
  at::Tensor Positions() const;

  // This rank's tokens of `x` (whose dimension `dim` is the whole sequence), in order.
  at::Tensor Slice(const at::Tensor& x, int64_t dim) const;

 private:
  ChunkLayout(int64_t chunk_len, int ranks, int rank, ChunkOrder order)
      : chunk_len_(chunk_len), ranks_(ranks), rank_(rank), order_(order) {}

  int64_t chunk_len_;
  int ranks_;
  int rank_;
  ChunkOrder order_;
};

// The most fp32 scores (batch x key/value heads x query rows x keys) a tile holds by default:
// 64 MiB of them, rows enough that each tile's matmuls run at full speed.
inline constexpr int64_t kMaxScoreElements = int64_t{1} << 24;

// The query rows of each tile for a micro-batch of `batch` sequences, `kv_heads` key/value
// heads and chunks of `chunk_len` tokens: as many as keep a tile's scores within
// `max_score_elements`, at least 1 and at most a chunk.
int64_t ScoreTileRows(int64_t batch, int64_t kv_heads, int64_t chunk_len,
                      int64_t max_score_elements = kMaxScoreElements);

// What one rank of a ring computes for a micro-batch: its sequences, its query and key/value
// heads, their width, and the tokens of a chunk.
struct RingShape {
  int64_t batch = 1;
  int64_t heads = 1;
  int64_t kv_heads = 1;
  int64_t head_dim = 1;
  int64_t chunk_len = 1;
};

// The bytes ring attention allocates and frees while it computes one block, beyond what it
// keeps for the backward, at their most (in the backward): the block's fp32 gradients of its
// queries, keys and values; in the fused form (`fused`) each of `threads` threads' rows of
// scores; in the generic form its fp32 copies of the queries, their outputs and the outputs'
// gradients grouped by key/value head and two tiles of fp32 scores (the probabilities and
// their gradient).
double RingWorkingBytes(const RingShape& shape, bool fused, int threads,
                        int64_t max_score_elements = kMaxScoreElements);

// How RingAttention computes: the bound on each tile's scores (the generic form's), the
// chunks each rank holds (its q, k and v must be ChunkLayout slices in that order), and
// whether it takes the generic form on the CPU too (the path a GPU runs).
struct RingOptions {
  int64_t max_score_elements = kMaxScoreElements;
  ChunkOrder order = ChunkOrder::kLoadBalanced;
  bool generic = false;
};

// Causal grouped-query attention with scale 1 / sqrt(d) of this rank's queries q [B, 2L, H, d]
// over the keys and values of the whole sequence, of which this rank holds k and v
// [B, 2L, KV, d] (KV dividing H): each a ChunkLayout slice of the group's sequence, with
// L = chunk_len. Returns [B, 2L, H, d] in q's dtype, differentiable in q, k and v. A failed
// send or receive is kept in `group` (the result is then meaningless). Each tile of scores
// holds at most `options.max_score_elements` (unless one query row's exceed it).
at::Tensor RingAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         parallel::GraphGroup& group, const RingOptions& options = {});

// Context parallelism over `group` (which must outlive it) in a model's forward, a layer of its
// seams: each rank computes ChunkLayout's slice of every sequence for the group's rank, at its
// positions, and attends over the whole sequence by RingAttention. A sequence that does not
// divide into the layout's chunks stops the forward (plans are checked first).
class RingContext final : public SeamLayer {
 public:
  explicit RingContext(parallel::GraphGroup& group) : group_(group) {}

  // This rank's slice of `x` [B, T, ...] (dimension 1 the whole sequence), in the order it
  // computes it; its positions in a sequence of `seq_len`, int64 [T / n] on `device`.
  at::Tensor Slice(const at::Tensor& x);
  at::Tensor Positions(int64_t seq_len, const at::Device& device);
  // RingAttention of this rank's q [B, T / n, H, d] over the group's k and v.
  at::Tensor Attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool generic);
  // An all-reduce over the group forward, and of the gradients backward.
  at::Tensor SumOverRanks(const at::Tensor& partial);

  // SeamLayer: the sequence (Slice, Positions, SumOverRanks) and the attention.
  std::vector<Seam> changes() const override { return {Seam::kSequence, Seam::kAttention}; }
  at::Tensor OwnPart(const at::Tensor& x, TensorNext next) override { return Slice(next(x)); }
  at::Tensor Positions(int64_t seq_len, const at::Device& device,
                       PositionsNext /*next: the whole sequence's*/) override {
    return Positions(seq_len, device);
  }
  at::Tensor SumOverParts(const at::Tensor& partial, TensorNext next) override {
    return SumOverRanks(next(partial));
  }
  at::Tensor Attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool generic,
                       AttentionNext /*next: over this rank's keys alone*/) override {
    return Attention(q, k, v, generic);
  }
  std::string DecodeRefusal() const override {
    return "context_parallel computes a slice of every sequence on each rank";
  }

 private:
  ChunkLayout LayoutOf(int64_t seq_len) const;

  parallel::GraphGroup& group_;
};

}  // namespace plait::wrap::cp

#endif  // PLAIT_WRAP_CP_RING_ATTENTION_H_
