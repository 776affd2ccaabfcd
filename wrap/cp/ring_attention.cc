#include "wrap/cp/ring_attention.h"

#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "torch/csrc/autograd/custom_function.h"

namespace plait::wrap::cp {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What the messages here are for, as their errors say.
constexpr const char* kBlocks = "ring attention keys and values";
constexpr const char* kBlockGradients = "ring attention key and value gradients";

// A chunk's queries grouped by key/value head, fp32: [B, L, H, d] -> [B, KV, G * L, d], row
// g * L + t for query t of head kv * G + g.
torch::Tensor GroupedQueries(const torch::Tensor& q, int64_t kv_heads) {
  const int64_t batch = q.size(0), len = q.size(1), heads = q.size(2), d = q.size(3);
  return q.to(torch::kFloat32)
      .reshape({batch, len, kv_heads, heads / kv_heads, d})
      .permute({0, 2, 3, 1, 4})
      .reshape({batch, kv_heads, heads / kv_heads * len, d});
}

// The inverse of GroupedQueries, in `dtype`: [B, KV, G * L, d] -> [B, L, H, d].
torch::Tensor UngroupedQueries(const torch::Tensor& grouped, int64_t len, torch::ScalarType dtype) {
  const int64_t batch = grouped.size(0), kv_heads = grouped.size(1), d = grouped.size(3);
  const int64_t groups = grouped.size(2) / len;
  return grouped.reshape({batch, kv_heads, groups, len, d})
      .permute({0, 3, 1, 2, 4})
      .reshape({batch, len, kv_heads * groups, d})
      .to(dtype);
}

// A chunk's keys or values by head, fp32: [B, L, KV, d] -> [B, KV, L, d].
torch::Tensor ByHead(const torch::Tensor& x) { return x.to(torch::kFloat32).permute({0, 2, 1, 3}); }

// Rows g * L + t of grouped queries meet the keys u <= t of their own chunk: true above that
// diagonal, [G * L, L].
torch::Tensor AboveDiagonal(int64_t groups, int64_t len, const torch::Device& device) {
  const auto options = torch::TensorOptions(torch::kInt64).device(device);
  const torch::Tensor query = torch::arange(len, options).repeat({groups}).unsqueeze(1);
  return torch::arange(len, options).unsqueeze(0) > query;
}

// How a query chunk meets a key chunk: all of it (an earlier chunk), causally (its own), or
// not at all (a later one).
enum class Meeting { kAll, kCausal, kNone };
Meeting MeetingOf(int query_chunk, int key_chunk) {
  if (key_chunk < query_chunk) return Meeting::kAll;
  return key_chunk == query_chunk ? Meeting::kCausal : Meeting::kNone;
}

// The scaled scores of grouped queries `q` [B, KV, G * L, d] against keys `k` [B, KV, L, d],
// -inf where a causal meeting hides them.
torch::Tensor Scores(const torch::Tensor& q, const torch::Tensor& k, Meeting meeting,
                     double scale) {
  torch::Tensor scores = torch::matmul(q, k.transpose(-1, -2)) * scale;
  if (meeting == Meeting::kCausal) {
    scores.masked_fill_(AboveDiagonal(q.size(2) / k.size(2), k.size(2), q.device()),
                        -std::numeric_limits<float>::infinity());
  }
  return scores;
}

// One rank's blocks, as they travel: its keys and values stacked, [2, B, 2L, KV, d], in the
// inputs' dtype; or, in the backward, their gradients so far, in fp32.
torch::Tensor Stacked(const torch::Tensor& k, const torch::Tensor& v) {
  return torch::stack({k, v}).contiguous();
}

// The keys, and the values, of chunk `index` (0 or 1) of a Stacked pair, by head in fp32.
torch::Tensor KeysOf(const torch::Tensor& stacked, int index, int64_t len) {
  return ByHead(stacked[0].narrow(1, index * len, len));
}
torch::Tensor ValuesOf(const torch::Tensor& stacked, int index, int64_t len) {
  return ByHead(stacked[1].narrow(1, index * len, len));
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
Hop StartHop(const torch::Tensor& outgoing, torch::Tensor& incoming, parallel::GraphGroup& group,
             parallel::Pass pass, const char* purpose) {
  const int n = group.size();
  const parallel::ScopedPlace place = group.Place(pass, purpose);
  incoming = torch::empty_like(outgoing);
  Hop hop;
  hop.sent = group.communicator().Send(outgoing, (group.rank() + 1) % n);
  hop.received = group.communicator().Receive(incoming, (group.rank() + n - 1) % n);
  return hop;
}

class RingAttentionFunction : public torch::autograd::Function<RingAttentionFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, parallel::GraphGroup* group) {
    const int n = group->size();
    const int rank = group->rank();
    const int64_t len = q.size(1) / 2;
    const int64_t kv_heads = k.size(2);
    const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
    const std::array<int, 2> own = ChunkLayout::ChunksOf(n, rank);
    std::array<torch::Tensor, 2> queries, outputs, lses;
    for (int i = 0; i < 2; ++i) queries[i] = GroupedQueries(q.narrow(1, i * len, len), kv_heads);
    torch::Tensor blocks = Stacked(k, v);
    for (int hop = 0; hop < n; ++hop) {
      const int owner = (rank + n - hop) % n;
      torch::Tensor next;
      std::optional<Hop> travel;
      if (hop + 1 < n) {
        travel = StartHop(blocks, next, *group, parallel::Pass::kForward, kBlocks);
      }
      const std::array<int, 2> theirs = ChunkLayout::ChunksOf(n, owner);
      for (int i = 0; i < 2; ++i) {
        for (int j = 0; j < 2; ++j) {
          const Meeting meeting = MeetingOf(own[i], theirs[j]);
          if (meeting == Meeting::kNone) continue;
          const torch::Tensor scores = Scores(queries[i], KeysOf(blocks, j, len), meeting, scale);
          const torch::Tensor lse = torch::logsumexp(scores, -1, /*keepdim=*/true);
          const torch::Tensor out =
              torch::matmul(torch::exp(scores - lse), ValuesOf(blocks, j, len));
          if (!outputs[i].defined()) {
            outputs[i] = out;
            lses[i] = lse;
            continue;
          }
          // The online softmax's merge of two partial results.
          const torch::Tensor merged = torch::logaddexp(lses[i], lse);
          outputs[i] = outputs[i] * torch::exp(lses[i] - merged) + out * torch::exp(lse - merged);
          lses[i] = merged;
        }
      }
      if (travel.has_value()) {
        travel->Wait(*group);
        blocks = next;
      }
    }
    group->SaveIn(ctx);
    ctx->save_for_backward(
        {q, k, v, torch::stack({outputs[0], outputs[1]}), torch::stack({lses[0], lses[1]})});
    return torch::cat({UngroupedQueries(outputs[0], len, q.scalar_type()),
                       UngroupedQueries(outputs[1], len, q.scalar_type())},
                      1);
  }

  // For each hop, with P = exp(scores - lse) and D = rowsum(dO * O): dV += P^T dO,
  // dS = P * (dO V^T - D), dQ += scale dS K, dK += scale dS^T Q.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    parallel::GraphGroup& group = parallel::GraphGroup::SavedIn(ctx);
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor& q = saved[0];
    const torch::Tensor& k = saved[1];
    const torch::Tensor& v = saved[2];
    const int n = group.size();
    const int rank = group.rank();
    const int64_t len = q.size(1) / 2;
    const int64_t kv_heads = k.size(2);
    const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
    const std::array<int, 2> own = ChunkLayout::ChunksOf(n, rank);
    std::array<torch::Tensor, 2> queries, output_grads, row_dots, query_grads;
    for (int i = 0; i < 2; ++i) {
      queries[i] = GroupedQueries(q.narrow(1, i * len, len), kv_heads);
      output_grads[i] = GroupedQueries(grads[0].narrow(1, i * len, len), kv_heads);
      row_dots[i] = (output_grads[i] * saved[3][i]).sum(-1, /*keepdim=*/true);
      query_grads[i] = torch::zeros_like(queries[i]);
    }
    torch::Tensor blocks = Stacked(k, v);
    // The gradients of the blocks held, summed over the ranks they have passed: fp32, laid
    // out as `blocks`.
    torch::Tensor block_grads =
        torch::zeros(blocks.sizes(), blocks.options().dtype(torch::kFloat32));
    for (int hop = 0; hop < n; ++hop) {
      const int owner = (rank + n - hop) % n;
      torch::Tensor next;
      std::optional<Hop> travel;
      if (hop + 1 < n) {
        travel = StartHop(blocks, next, group, parallel::Pass::kBackward, kBlocks);
      }
      const std::array<int, 2> theirs = ChunkLayout::ChunksOf(n, owner);
      for (int j = 0; j < 2; ++j) {
        const torch::Tensor keys = KeysOf(blocks, j, len);
        const torch::Tensor values = ValuesOf(blocks, j, len);
        torch::Tensor key_grad = torch::zeros_like(keys);
        torch::Tensor value_grad = torch::zeros_like(values);
        bool met = false;
        for (int i = 0; i < 2; ++i) {
          const Meeting meeting = MeetingOf(own[i], theirs[j]);
          if (meeting == Meeting::kNone) continue;
          met = true;
          const torch::Tensor p =
              torch::exp(Scores(queries[i], keys, meeting, scale) - saved[4][i]);
          value_grad += torch::matmul(p.transpose(-1, -2), output_grads[i]);
          const torch::Tensor ds =
              p * (torch::matmul(output_grads[i], values.transpose(-1, -2)) - row_dots[i]);
          query_grads[i] += torch::matmul(ds, keys) * scale;
          key_grad += torch::matmul(ds.transpose(-1, -2), queries[i]) * scale;
        }
        if (!met) continue;
        // [B, KV, L, d] -> the blocks' [B, L, KV, d].
        block_grads[0].narrow(1, j * len, len) += key_grad.permute({0, 2, 1, 3});
        block_grads[1].narrow(1, j * len, len) += value_grad.permute({0, 2, 1, 3});
      }
      // The gradients go on with their blocks; after n hops each owner has its own back.
      if (n > 1) {
        torch::Tensor arriving;
        StartHop(block_grads, arriving, group, parallel::Pass::kBackward, kBlockGradients)
            .Wait(group);
        block_grads = arriving;
      }
      if (travel.has_value()) {
        travel->Wait(group);
        blocks = next;
      }
    }
    const torch::Tensor query_grad =
        torch::cat({UngroupedQueries(query_grads[0], len, q.scalar_type()),
                    UngroupedQueries(query_grads[1], len, q.scalar_type())},
                   1);
    return {query_grad, block_grads[0].to(k.scalar_type()), block_grads[1].to(v.scalar_type()),
            torch::Tensor()};
  }
};

}  // namespace

absl::StatusOr<ChunkLayout> ChunkLayout::Create(int64_t seq_len, int ranks, int rank) {
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
  return ChunkLayout(seq_len / (2 * ranks), ranks, rank);
}

std::array<int, 2> ChunkLayout::ChunksOf(int ranks, int rank) {
  return {rank, 2 * ranks - 1 - rank};
}

torch::Tensor ChunkLayout::Positions() const {
  std::vector<torch::Tensor> parts;
  for (const int chunk : ChunksOf(ranks_, rank_)) {
    parts.push_back(torch::arange(chunk * chunk_len_, (chunk + 1) * chunk_len_, torch::kInt64));
  }
  return torch::cat(parts);
}

torch::Tensor ChunkLayout::Slice(const torch::Tensor& x, int64_t dim) const {
  std::vector<torch::Tensor> parts;
  for (const int chunk : ChunksOf(ranks_, rank_)) {
    parts.push_back(x.narrow(dim, chunk * chunk_len_, chunk_len_));
  }
  return torch::cat(parts, dim);
}

torch::Tensor RingAttention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                            parallel::GraphGroup& group) {
  return RingAttentionFunction::apply(q, k, v, &group);
}

ChunkLayout RingContext::LayoutOf(int64_t seq_len) const {
  absl::StatusOr<ChunkLayout> layout = ChunkLayout::Create(seq_len, group_.size(), group_.rank());
  TORCH_CHECK(layout.ok(), layout.status().message());
  return *layout;
}

torch::Tensor RingContext::Slice(const torch::Tensor& x) { return LayoutOf(x.size(1)).Slice(x, 1); }

torch::Tensor RingContext::Positions(int64_t seq_len, const torch::Device& device) {
  return LayoutOf(seq_len).Positions().to(device);
}

torch::Tensor RingContext::Attention(const torch::Tensor& q, const torch::Tensor& k,
                                     const torch::Tensor& v) {
  return RingAttention(q, k, v, group_);
}

}  // namespace plait::wrap::cp
