#include "wrap/ep/expert_dispatch.h"

#include <numeric>

#include "ATen/core/Tensor.h"
#include "torch/csrc/autograd/custom_function.h"
#include "torch/csrc/autograd/generated/variable_factories.h"

namespace plait::wrap::ep {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What the messages here are for, as their errors say.
constexpr char kCounts[] = "expert-parallel row counts";
constexpr char kRows[] = "expert-parallel rows";

// `input`'s rows, send_rows[r] of them to rank r, exchanged for receive_rows[r] from each rank r.
at::Tensor Exchanged(const at::Tensor& input, const std::vector<int64_t>& send_rows,
                     const std::vector<int64_t>& receive_rows, parallel::GraphGroup& group,
                     parallel::Pass pass, const char* purpose) {
  const int64_t rows = std::accumulate(receive_rows.begin(), receive_rows.end(), int64_t{0});
  std::vector<int64_t> shape = input.sizes().vec();
  shape[0] = rows;
  at::Tensor output = torch::empty(shape, input.options());
  const parallel::ScopedPlace place = group.Place(pass, purpose);
  group.Wait(group.communicator().AllToAll(input.contiguous(), output, send_rows, receive_rows));
  return output;
}

// An all-to-all of rows whose backward is the all-to-all of their gradients the other way.
class AllToAllFunction : public torch::autograd::Function<AllToAllFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input,
                            std::vector<int64_t> send_rows, std::vector<int64_t> receive_rows,
                            parallel::GraphGroup* group) {
    group->SaveIn(ctx);
    ctx->saved_data["send_rows"] = send_rows;
    ctx->saved_data["receive_rows"] = receive_rows;
    return Exchanged(input, send_rows, receive_rows, *group, parallel::Pass::kForward, kRows);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const std::vector<int64_t> send_rows = ctx->saved_data["send_rows"].toIntVector();
    const std::vector<int64_t> receive_rows = ctx->saved_data["receive_rows"].toIntVector();
    return {Exchanged(grads[0], receive_rows, send_rows, parallel::GraphGroup::SavedIn(ctx),
                      parallel::Pass::kBackward, kRows),
            at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

std::pair<int64_t, int64_t> ExpertDispatch::LocalExperts(int64_t num_experts) const {
  const int64_t count = num_experts / group_.size();
  return {group_.rank() * count, count};
}

ExpertDispatch::Dispatched ExpertDispatch::Dispatch(const at::Tensor& rows,
                                                    const std::vector<int64_t>& expert_rows) {
  const int ranks = group_.size();
  const int64_t local = static_cast<int64_t>(expert_rows.size()) / ranks;
  Dispatched dispatched;
  // counts[s][i]: the rows rank s routes to this rank's expert i. Zeros where the exchange
  // failed, so that nothing is sized from garbage.
  const at::Tensor counts =
      torch::zeros({ranks, local}, at::kLong)
          .copy_(Exchanged(torch::tensor(expert_rows, at::kLong).to(rows.device()),
                           std::vector<int64_t>(ranks, local), std::vector<int64_t>(ranks, local),
                           group_, parallel::Pass::kForward, kCounts)
                     .view({ranks, local})
                     .cpu());
  const auto count = counts.accessor<int64_t, 2>();
  for (int r = 0; r < ranks; ++r) {
    dispatched.sent_rows.push_back(std::accumulate(
        expert_rows.begin() + r * local, expert_rows.begin() + (r + 1) * local, int64_t{0}));
    int64_t received = 0;
    for (int64_t i = 0; i < local; ++i) received += count[r][i];
    dispatched.received_rows.push_back(received);
  }
  const at::Tensor received =
      AllToAllFunction::apply(rows, dispatched.sent_rows, dispatched.received_rows, &group_);
  // Each sender's rows come grouped by expert: regroup them by expert, senders in rank order.
  std::vector<int64_t> sender_first(ranks, 0);
  for (int r = 1; r < ranks; ++r) {
    sender_first[r] = sender_first[r - 1] + dispatched.received_rows[r - 1];
  }
  std::vector<int64_t> order;
  order.reserve(static_cast<size_t>(received.size(0)));
  for (int64_t i = 0; i < local; ++i) {
    int64_t expert_total = 0;
    for (int r = 0; r < ranks; ++r) {
      for (int64_t j = 0; j < count[r][i]; ++j) order.push_back(sender_first[r] + j);
      sender_first[r] += count[r][i];
      expert_total += count[r][i];
    }
    dispatched.expert_rows.push_back(expert_total);
  }
  dispatched.order = torch::tensor(order, at::kLong).to(rows.device());
  dispatched.rows = received.index_select(0, dispatched.order);
  return dispatched;
}

at::Tensor ExpertDispatch::Combine(const at::Tensor& outputs, const Dispatched& dispatched) {
  // Back in the order received (by sender): output j was received as row order[j]. Then to
  // the senders.
  const at::Tensor by_sender = torch::empty_like(outputs).index_copy(0, dispatched.order, outputs);
  return AllToAllFunction::apply(by_sender, dispatched.received_rows, dispatched.sent_rows,
                                 &group_);
}

at::Tensor ExpertDispatch::Experts(const at::Tensor& rows, const std::vector<int64_t>& expert_rows,
                                   int64_t /*first_expert: 0, the layer's*/, ExpertsNext next) {
  const Dispatched dispatched = Dispatch(rows, expert_rows);
  const int64_t first = LocalExperts(static_cast<int64_t>(expert_rows.size())).first;
  return Combine(next(dispatched.rows, dispatched.expert_rows, first), dispatched);
}

}  // namespace plait::wrap::ep
