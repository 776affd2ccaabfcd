#include "wrap/cp/ring_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

#include "ATen/core/Tensor.h"
#include "ATen/ops/cat.h"
#include "ATen/ops/exp.h"
#include "ATen/ops/log.h"
#include "ATen/ops/logaddexp.h"
#include "ATen/ops/matmul.h"
#include "ATen/ops/stack.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "models/internal/ops.h"
#include "torch/csrc/autograd/custom_function.h"
#include "torch/csrc/autograd/generated/variable_factories.h"

namespace plait::wrap::cp {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What the messages here are for, as their errors say.
constexpr const char* kBlocks = "ring attention keys and values";
constexpr const char* kBlockGradients = "ring attention key and value gradients";
constexpr const char* kSequenceSums = "context-parallel sequence sums";

// `x` summed over the ranks of `group`, in a copy.
at::Tensor SummedOverRanks(const at::Tensor& x, parallel::GraphGroup& group, parallel::Pass pass) {
  at::Tensor sum = x.clone(at::MemoryFormat::Contiguous);
  const parallel::ScopedPlace place = group.Place(pass, kSequenceSums);
  group.Wait(group.communicator().AllReduce(sum, parallel::ReduceOp::kSum));
  return sum;
}

// RingContext::SumOverRanks: the ranks' partial sums summed, and so their gradients.
class SumOverRanksFunction : public torch::autograd::Function<SumOverRanksFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& partial,
                            parallel::GraphGroup* group) {
    group->SaveIn(ctx);
    return SummedOverRanks(partial, *group, parallel::Pass::kForward);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {
        SummedOverRanks(grads[0], parallel::GraphGroup::SavedIn(ctx), parallel::Pass::kBackward),
        at::Tensor()};
  }
};

// A chunk's queries (or their outputs' rows) grouped by key/value head, fp32 and times
// `scale`: [B, L, H, d] -> [B, KV, G * L, d], row g * L + t for query t of head kv * G + g.
at::Tensor GroupedQueries(const at::Tensor& q, int64_t kv_heads, double scale = 1.0) {
  const int64_t batch = q.size(0), len = q.size(1), heads = q.size(2), d = q.size(3);
  at::Tensor wide = q.to(at::kFloat);
  if (scale != 1.0) wide = wide * scale;
  return wide.reshape({batch, len, kv_heads, heads / kv_heads, d})
      .permute({0, 2, 3, 1, 4})
      .reshape({batch, kv_heads, heads / kv_heads * len, d});
}

// The inverse of GroupedQueries: [B, KV, G * L, d] -> [B, L, H, d].
at::Tensor UngroupedQueries(const at::Tensor& grouped, int64_t len) {
  const int64_t batch = grouped.size(0), kv_heads = grouped.size(1), d = grouped.size(3);
  const int64_t groups = grouped.size(2) / len;
  return grouped.reshape({batch, kv_heads, groups, len, d})
      .permute({0, 3, 1, 2, 4})
      .reshape({batch, len, kv_heads * groups, d});
}

// Each row's log-sum-exp [B, H, L] as GroupedQueries lays out its rows, [B, KV, G * L, 1],
// and back.
at::Tensor GroupedRows(const at::Tensor& lse, int64_t kv_heads) {
  return lse.reshape({lse.size(0), kv_heads, -1, 1});
}
at::Tensor UngroupedRows(const at::Tensor& grouped, int64_t heads) {
  return grouped.reshape({grouped.size(0), heads, -1});
}

// Keys or values by head: [B, L, KV, d] -> [B, KV, L, d], and back.
at::Tensor ByHead(const at::Tensor& x) { return x.permute({0, 2, 1, 3}); }

// How a query chunk meets a key chunk: all of it (an earlier chunk), causally (its own), or
// not at all (a later one).
enum class Meeting { kAll, kCausal, kNone };
Meeting MeetingOf(int query_chunk, int key_chunk) {
  if (key_chunk < query_chunk) return Meeting::kAll;
  return key_chunk == query_chunk ? Meeting::kCausal : Meeting::kNone;
}

// A tile of a chunk's grouped queries: the rows g * L + t for t in [first, first + rows) of
// group g, and the keys of the other chunk they meet: all L of them, or under a causal meeting
// those before the tile's last row (the later ones are hidden from every row of the tile).
struct Tile {
  int64_t group = 0;
  int64_t first = 0;
  int64_t rows = 0;
  int64_t keys = 0;
  int64_t Row(int64_t len) const { return group * len + first; }
};

// The tiles of a chunk of `len` queries in `groups` groups meeting its keys by `meeting`,
// `tile_rows` rows each (the last of a group fewer).
std::vector<Tile> TilesOf(int64_t groups, int64_t len, int64_t tile_rows, Meeting meeting) {
  std::vector<Tile> tiles;
  for (int64_t group = 0; group < groups; ++group) {
    for (int64_t first = 0; first < len; first += tile_rows) {
      const int64_t rows = std::min(tile_rows, len - first);
      tiles.push_back({group, first, rows, meeting == Meeting::kCausal ? first + rows : len});
    }
  }
  return tiles;
}

// The scores, fp32 [B, KV, rows, keys], of a tile of grouped queries `q` [B, KV, G * L, d]
// (already scaled) against the keys `k` [B, KV, L, d] it meets, -inf where a causal meeting
// hides them; each score then less its row's `lse` and exponentiated where `lse` is given
// (the backward's probabilities), in place.
at::Tensor TileScores(const at::Tensor& q, const at::Tensor& k, const Tile& tile, Meeting meeting,
                      const at::Tensor& lse = {}) {
  const int64_t row = tile.Row(k.size(2));
  at::Tensor scores =
      at::matmul(q.narrow(2, row, tile.rows), k.narrow(2, 0, tile.keys).transpose(-1, -2));
  if (meeting == Meeting::kCausal) {
    const auto options = at::TensorOptions(at::kLong).device(q.device());
    const at::Tensor query = torch::arange(tile.first, tile.first + tile.rows, options);
    scores.masked_fill_(torch::arange(tile.keys, options).unsqueeze(0) > query.unsqueeze(1),
                        -std::numeric_limits<float>::infinity());
  }
  if (lse.defined()) scores.sub_(lse.narrow(2, row, tile.rows)).exp_();
  return scores;
}

// One block of the ring, a chunk's queries q [B, L, H, d] against a chunk's keys and values
// k, v [B, L, KV, d] (all fp32), computed by one of two forms with the same values: the fused
// CPU kernels (models/internal/ops.h) or LibTorch's generic ops in tiles of query rows.
struct BlockForm {
  // The block's output [B, L, H, d] and its rows' log-sum-exp [B, H, L].
  models::internal::AttentionBlock (*forward)(const at::Tensor& q, const at::Tensor& k,
                                              const at::Tensor& v, Meeting meeting,
                                              int64_t tile_rows);
  // The block's share of the gradients of q, k and v, from the whole attention's output
  // `out`, log-sum-exp `lse` and output gradient `dout`.
  std::array<at::Tensor, 3> (*backward)(const at::Tensor& q, const at::Tensor& k,
                                        const at::Tensor& v, const at::Tensor& out,
                                        const at::Tensor& lse, const at::Tensor& dout,
                                        Meeting meeting, int64_t tile_rows);
};

models::internal::AttentionBlock FusedForward(const at::Tensor& q, const at::Tensor& k,
                                              const at::Tensor& v, Meeting meeting,
                                              int64_t /*tile_rows*/) {
  return models::internal::FusedAttentionBlock(q.contiguous(), k.contiguous(), v,
                                               meeting == Meeting::kCausal);
}

std::array<at::Tensor, 3> FusedBackward(const at::Tensor& q, const at::Tensor& k,
                                        const at::Tensor& v, const at::Tensor& out,
                                        const at::Tensor& lse, const at::Tensor& dout,
                                        Meeting meeting, int64_t /*tile_rows*/) {
  return models::internal::FusedAttentionBlockBackward(q.contiguous(), k.contiguous(), v, out, lse,
                                                       dout, meeting == Meeting::kCausal);
}

// The generic form: the queries grouped by key/value head (scaled), a tile of rows at a time.
models::internal::AttentionBlock TiledForward(const at::Tensor& q, const at::Tensor& k,
                                              const at::Tensor& v, Meeting meeting,
                                              int64_t tile_rows) {
  const int64_t len = q.size(1), kv_heads = k.size(2);
  const at::Tensor queries =
      GroupedQueries(q, kv_heads, 1.0 / std::sqrt(static_cast<double>(q.size(3))));
  const at::Tensor keys = ByHead(k), values = ByHead(v);
  at::Tensor out = torch::empty_like(queries);
  at::Tensor lse = torch::empty({q.size(0), kv_heads, queries.size(2), 1}, queries.options());
  for (const Tile& tile : TilesOf(queries.size(2) / len, len, tile_rows, meeting)) {
    // Every row meets a key (under a causal meeting, its own), so the maximum is finite.
    at::Tensor scores = TileScores(queries, keys, tile, meeting);
    const at::Tensor row_max = std::get<0>(scores.max(-1, /*keepdim=*/true));
    const at::Tensor row_sum = scores.sub_(row_max).exp_().sum(-1, /*keepdim=*/true);
    const int64_t row = tile.Row(len);
    out.narrow(2, row, tile.rows)
        .copy_(at::matmul(scores, values.narrow(2, 0, tile.keys)).div_(row_sum));
    lse.narrow(2, row, tile.rows).copy_(row_max + at::log(row_sum));
  }
  return {UngroupedQueries(out, len), UngroupedRows(lse, q.size(2))};
}

// With P = exp(scores - lse) and D = rowsum(dO * O): dV = P^T dO, dS = P * (dO V^T - D),
// dQ = scale dS K, dK = scale dS^T Q (the queries kept scaled, so dK needs no more).
std::array<at::Tensor, 3> TiledBackward(const at::Tensor& q, const at::Tensor& k,
                                        const at::Tensor& v, const at::Tensor& out,
                                        const at::Tensor& lse, const at::Tensor& dout,
                                        Meeting meeting, int64_t tile_rows) {
  const int64_t len = q.size(1), kv_heads = k.size(2);
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
  const at::Tensor queries = GroupedQueries(q, kv_heads, scale);
  const at::Tensor output_grads = GroupedQueries(dout, kv_heads);
  const at::Tensor row_dots =
      (output_grads * GroupedQueries(out, kv_heads)).sum(-1, /*keepdim=*/true);
  const at::Tensor lses = GroupedRows(lse, kv_heads);
  const at::Tensor keys = ByHead(k), values = ByHead(v);
  at::Tensor query_grad = torch::zeros_like(queries);
  at::Tensor key_grad = torch::zeros_like(keys);
  at::Tensor value_grad = torch::zeros_like(values);
  for (const Tile& tile : TilesOf(queries.size(2) / len, len, tile_rows, meeting)) {
    const int64_t row = tile.Row(len);
    const at::Tensor p = TileScores(queries, keys, tile, meeting, lses);
    const at::Tensor output_grad = output_grads.narrow(2, row, tile.rows);
    const at::Tensor tile_keys = keys.narrow(2, 0, tile.keys);
    value_grad.narrow(2, 0, tile.keys) += at::matmul(p.transpose(-1, -2), output_grad);
    at::Tensor ds = at::matmul(output_grad, values.narrow(2, 0, tile.keys).transpose(-1, -2));
    ds.sub_(row_dots.narrow(2, row, tile.rows)).mul_(p);
    query_grad.narrow(2, row, tile.rows) += at::matmul(ds, tile_keys).mul_(scale);
    key_grad.narrow(2, 0, tile.keys) +=
        at::matmul(ds.transpose(-1, -2), queries.narrow(2, row, tile.rows));
  }
  return {UngroupedQueries(query_grad, len), ByHead(key_grad), ByHead(value_grad)};
}

constexpr BlockForm kFusedForm{FusedForward, FusedBackward};
constexpr BlockForm kTiledForm{TiledForward, TiledBackward};

// The form that computes tensors like `q`: the fused kernels where they serve the CPU, unless
// `generic`.
const BlockForm& FormFor(const at::Tensor& q, bool generic) {
  return !generic && models::internal::FusedFormsServe(at::kFloat, q.device().type()) ? kFusedForm
                                                                                      : kTiledForm;
}

// Chunk `index` (0 or 1) of a rank's [B, 2L, ...] tensor, in fp32.
at::Tensor ChunkOf(const at::Tensor& x, int index, int64_t len) {
  return x.narrow(1, index * len, len).to(at::kFloat);
}

// One rank's blocks, as they travel: its keys and values stacked, [2, B, 2L, KV, d], in the
// inputs' dtype; or, in the backward, their gradients so far, in fp32.
at::Tensor Stacked(const at::Tensor& k, const at::Tensor& v) {
  return at::stack({k, v}).contiguous();
}

// Sends `outgoing` to the next rank of the ring and receives the previous rank's `incoming`
// (of the same shape), which the caller waits on through `group` once it has computed.
struct Hop {
  std::shared_ptr<parallel::Work> sent;
  std::shared_ptr<parallel::Work> received;
  void Wait(parallel::GraphGroup& group) const {
    group.Wait(received);
    group.Wait(sent);
  }
};
Hop StartHop(const at::Tensor& outgoing, at::Tensor& incoming, parallel::GraphGroup& group,
             parallel::Pass pass, const char* purpose) {
  const int n = group.size();
  const parallel::ScopedPlace place = group.Place(pass, purpose);
  incoming = torch::empty_like(outgoing);
  Hop hop;
  hop.sent = group.communicator().Send(outgoing, (group.rank() + 1) % n);
  hop.received = group.communicator().Receive(incoming, (group.rank() + n - 1) % n);
  return hop;
}

// The online softmax's merge of a block's output and log-sum-exp [B, H, L] into the chunk's so
// far (none yet: zeros and -inf), in place.
void Merge(const models::internal::AttentionBlock& block, at::Tensor& out, at::Tensor& lse) {
  // The log-sum-exps as [B, L, H, 1], beside their rows of the outputs.
  const auto beside_rows = [](const at::Tensor& x) { return x.transpose(1, 2).unsqueeze(-1); };
  const at::Tensor merged = at::logaddexp(lse, block.lse);
  out.mul_(beside_rows(at::exp(lse - merged)))
      .add_(block.out * beside_rows(at::exp(block.lse - merged)));
  lse.copy_(merged);
}

class RingAttentionFunction : public torch::autograd::Function<RingAttentionFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, parallel::GraphGroup* group,
                            int64_t max_score_elements, int64_t order, bool generic) {
    const int n = group->size();
    const int rank = group->rank();
    const int64_t len = q.size(1) / 2;
    const auto chunk_order = static_cast<ChunkOrder>(order);
    const std::array<int, 2> own = ChunkLayout::ChunksOf(n, rank, chunk_order);
    const int64_t tile_rows = ScoreTileRows(q.size(0), k.size(2), len, max_score_elements);
    const BlockForm& form = FormFor(q, generic);
    // Per query chunk, its queries, the output so far and its rows' log-sum-exp over the keys
    // met so far.
    std::array<at::Tensor, 2> queries, outputs, lses;
    for (int i = 0; i < 2; ++i) {
      queries[i] = ChunkOf(q, i, len);
      outputs[i] = torch::zeros_like(queries[i]);
      lses[i] = torch::full({q.size(0), q.size(2), len}, -std::numeric_limits<float>::infinity(),
                            queries[i].options());
    }
    at::Tensor blocks = Stacked(k, v);
    for (int hop = 0; hop < n; ++hop) {
      const int owner = (rank + n - hop) % n;
      at::Tensor next;
      std::optional<Hop> travel;
      if (hop + 1 < n) {
        travel = StartHop(blocks, next, *group, parallel::Pass::kForward, kBlocks);
      }
      const std::array<int, 2> theirs = ChunkLayout::ChunksOf(n, owner, chunk_order);
      for (int j = 0; j < 2; ++j) {
        const at::Tensor keys = ChunkOf(blocks[0], j, len);
        const at::Tensor values = ChunkOf(blocks[1], j, len);
        for (int i = 0; i < 2; ++i) {
          const Meeting meeting = MeetingOf(own[i], theirs[j]);
          if (meeting == Meeting::kNone) continue;
          Merge(form.forward(queries[i], keys, values, meeting, tile_rows), outputs[i], lses[i]);
        }
      }
      if (travel.has_value()) {
        travel->Wait(*group);
        blocks = next;
      }
    }
    group->SaveIn(ctx);
    ctx->saved_data["tile_rows"] = tile_rows;
    ctx->saved_data["order"] = order;
    ctx->saved_data["generic"] = generic;
    ctx->save_for_backward(
        {q, k, v, at::stack({outputs[0], outputs[1]}), at::stack({lses[0], lses[1]})});
    return at::cat(outputs, 1).to(q.scalar_type());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    parallel::GraphGroup& group = parallel::GraphGroup::SavedIn(ctx);
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& q = saved[0];
    const at::Tensor& k = saved[1];
    const at::Tensor& v = saved[2];
    const int n = group.size();
    const int rank = group.rank();
    const int64_t len = q.size(1) / 2;
    const auto chunk_order = static_cast<ChunkOrder>(ctx->saved_data["order"].toInt());
    const std::array<int, 2> own = ChunkLayout::ChunksOf(n, rank, chunk_order);
    const int64_t tile_rows = ctx->saved_data["tile_rows"].toInt();
    const BlockForm& form = FormFor(q, ctx->saved_data["generic"].toBool());
    std::array<at::Tensor, 2> queries, output_grads, query_grads;
    for (int i = 0; i < 2; ++i) {
      queries[i] = ChunkOf(q, i, len);
      output_grads[i] = ChunkOf(grads[0], i, len).contiguous();
      query_grads[i] = torch::zeros_like(queries[i]);
    }
    at::Tensor blocks = Stacked(k, v);
    // The gradients of the blocks held, summed over the ranks they have passed: fp32, laid
    // out as `blocks`.
    at::Tensor block_grads = torch::zeros(blocks.sizes(), blocks.options().dtype(at::kFloat));
    for (int hop = 0; hop < n; ++hop) {
      const int owner = (rank + n - hop) % n;
      at::Tensor next;
      std::optional<Hop> travel;
      if (hop + 1 < n) {
        travel = StartHop(blocks, next, group, parallel::Pass::kBackward, kBlocks);
      }
      const std::array<int, 2> theirs = ChunkLayout::ChunksOf(n, owner, chunk_order);
      for (int j = 0; j < 2; ++j) {
        const at::Tensor keys = ChunkOf(blocks[0], j, len);
        const at::Tensor values = ChunkOf(blocks[1], j, len);
        for (int i = 0; i < 2; ++i) {
          const Meeting meeting = MeetingOf(own[i], theirs[j]);
          if (meeting == Meeting::kNone) continue;
          const auto [query_grad, key_grad, value_grad] =
              form.backward(queries[i], keys, values, saved[3][i], saved[4][i], output_grads[i],
                            meeting, tile_rows);
          query_grads[i] += query_grad;
          block_grads[0].narrow(1, j * len, len) += key_grad;
          block_grads[1].narrow(1, j * len, len) += value_grad;
        }
      }
      // The gradients go on with their blocks; after n hops each owner has its own back.
      if (n > 1) {
        at::Tensor arriving;
        StartHop(block_grads, arriving, group, parallel::Pass::kBackward, kBlockGradients)
            .Wait(group);
        block_grads = arriving;
      }
      if (travel.has_value()) {
        travel->Wait(group);
        blocks = next;
      }
    }
    return {at::cat(query_grads, 1).to(q.scalar_type()),
            block_grads[0].to(k.scalar_type()),
            block_grads[1].to(v.scalar_type()),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor()};
  }
};

}  // namespace

absl::StatusOr<ChunkLayout> ChunkLayout::Create(int64_t seq_len, int ranks, int rank,
                                                ChunkOrder order) {
  if (ranks < 1 || rank < 0 || rank >= ranks) {
    return absl::InvalidArgumentError(
        absl::StrCat("context parallelism: rank ", rank, " of ", ranks, " ranks"));
  }
  if (seq_len <= 0 || seq_len % (2 * ranks) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "context parallelism over ", ranks, " ranks cuts each sequence into ", 2 * ranks,
        " equal chunks (two a rank, for causal load balance); a sequence of ", seq_len,
        " tokens does not divide into them: use a multiple of ", 2 * ranks));
  }
  return ChunkLayout(seq_len / (2 * ranks), ranks, rank, order);
}

std::array<int, 2> ChunkLayout::ChunksOf(int ranks, int rank, ChunkOrder order) {
  if (order == ChunkOrder::kContiguous) return {2 * rank, 2 * rank + 1};
  return {rank, 2 * ranks - 1 - rank};
}

at::Tensor ChunkLayout::Positions() const {
  std::vector<at::Tensor> parts;
  for (const int chunk : ChunksOf(ranks_, rank_, order_)) {
    parts.push_back(torch::arange(chunk * chunk_len_, (chunk + 1) * chunk_len_, at::kLong));
  }
  return at::cat(parts);
}

at::Tensor ChunkLayout::Slice(const at::Tensor& x, int64_t dim) const {
  std::vector<at::Tensor> parts;
  for (const int chunk : ChunksOf(ranks_, rank_, order_)) {
    parts.push_back(x.narrow(dim, chunk * chunk_len_, chunk_len_));
  }
  return at::cat(parts, dim);
}

int64_t ScoreTileRows(int64_t batch, int64_t kv_heads, int64_t chunk_len,
                      int64_t max_score_elements) {
  const int64_t per_row = std::max<int64_t>(1, batch * kv_heads * chunk_len);
  return std::clamp<int64_t>(max_score_elements / per_row, 1, std::max<int64_t>(1, chunk_len));
}

double RingWorkingBytes(const RingShape& shape, bool fused, int threads,
                        int64_t max_score_elements) {
  const auto rows = [&](int64_t heads) {
    return static_cast<double>(shape.batch * shape.chunk_len * heads * shape.head_dim) *
           sizeof(float);
  };
  const double gradients = rows(shape.heads + 2 * shape.kv_heads);
  if (fused) {
    return gradients +
           std::max(1, threads) * models::internal::FusedAttentionScratchBytes(shape.chunk_len);
  }
  const int64_t tile_rows =
      ScoreTileRows(shape.batch, shape.kv_heads, shape.chunk_len, max_score_elements);
  const double tiles =
      2.0 * static_cast<double>(shape.batch * shape.kv_heads * tile_rows * shape.chunk_len) *
      sizeof(float);
  return gradients + 3.0 * rows(shape.heads) + tiles;
}

at::Tensor RingAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         parallel::GraphGroup& group, const RingOptions& options) {
  return RingAttentionFunction::apply(q, k, v, &group, options.max_score_elements,
                                      static_cast<int64_t>(options.order), options.generic);
}

ChunkLayout RingContext::LayoutOf(int64_t seq_len) const {
  absl::StatusOr<ChunkLayout> layout = ChunkLayout::Create(seq_len, group_.size(), group_.rank());
  TORCH_CHECK(layout.ok(), layout.status().message());
  return *layout;
}

at::Tensor RingContext::Slice(const at::Tensor& x) { return LayoutOf(x.size(1)).Slice(x, 1); }

at::Tensor RingContext::Positions(int64_t seq_len, const at::Device& device) {
  return LayoutOf(seq_len).Positions().to(device);
}

at::Tensor RingContext::Attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  bool generic) {
  RingOptions options;
  options.generic = generic;
  return RingAttention(q, k, v, group_, options);
}

at::Tensor RingContext::SumOverRanks(const at::Tensor& partial) {
  return SumOverRanksFunction::apply(partial, &group_);
}

}  // namespace plait::wrap::cp
