// Expert parallelism's dispatch: the experts of each mixture-of-experts layer are split over the
// n ranks of a group, rank r holding experts [r E / n, (r + 1) E / n), and the rows a rank routes
// travel to the ranks that hold their experts, and the experts' outputs back, by variable-size
// all-to-alls (parallel::Communicator::AllToAll), whose backward sends the gradients the other
// way, as torchtitan's and Megatron-core's token dispatchers do. Nothing is dropped: every
// routed row is computed (no capacity factor). The counts travel first, one all-to-all of each
// rank's rows per expert, so that every rank sizes what it receives.
//
//   parallel::GraphGroup group(*mesh.communicator("ep").value());
//   ExpertDispatch dispatch(group);
//   const auto [first, count] = dispatch.LocalExperts(num_experts);
//   model.KeepExperts(first, count);
//   model.seams().Add(&dispatch);
//   model.Loss(tokens, targets).backward();  // this rank's experts compute every rank's rows
//   PLAIT_RETURN_IF_ERROR(group.status());
#ifndef PLAIT_WRAP_EP_EXPERT_DISPATCH_H_
#define PLAIT_WRAP_EP_EXPERT_DISPATCH_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "parallel/graph_group.h"
#include "wrap/wrappable.h"

namespace plait::wrap::ep {

// The dispatch over `group` (which must outlive it and every graph built through it), a layer
// of a model's experts seam. A failed all-to-all is kept in the group (the results are then
// meaningless).
class ExpertDispatch final : public SeamLayer {
 public:
  explicit ExpertDispatch(parallel::GraphGroup& group) : group_(group) {}

  // The rows a rank's experts compute (Dispatch), and what Combine needs to send their outputs
  // back.
  struct Dispatched {
    at::Tensor rows;                     // grouped by this rank's expert, in order
    std::vector<int64_t> expert_rows;    // how many of `rows` each of this rank's experts computes
    std::vector<int64_t> sent_rows;      // this rank's rows to each rank
    std::vector<int64_t> received_rows;  // each rank's rows to this rank
    at::Tensor order;  // row j of `rows` is row order[j] of those received, by sender
  };

  // The experts this rank holds of a layer of `num_experts`: [first, first + count).
  // Contiguous shares: rank r holds [r E / n, (r + 1) E / n). E must divide by n (plans are
  // checked first).
  std::pair<int64_t, int64_t> LocalExperts(int64_t num_experts) const;

  // Sends `rows` [R, hidden] (a layer's routed rows, grouped by expert, expert_rows[e] of them
  // for expert e) to the ranks holding their experts. Differentiable: the gradients of the rows
  // received go back to their senders.
  Dispatched Dispatch(const at::Tensor& rows, const std::vector<int64_t>& expert_rows);

  // The outputs [M, hidden] of `dispatched.rows` back to the ranks that sent them: [R, hidden],
  // in the order Dispatch's `rows` had. Differentiable likewise.
  at::Tensor Combine(const at::Tensor& outputs, const Dispatched& dispatched);

  // SeamLayer: a layer's rows go to the ranks of their experts (Dispatch), this rank's
  // experts compute what it received (the layers below, `next`), and the outputs come back
  // (Combine). The model's call names all of a layer's experts.
  std::vector<Seam> changes() const override { return {Seam::kExperts}; }
  at::Tensor Experts(const at::Tensor& rows, const std::vector<int64_t>& expert_rows,
                     int64_t first_expert, ExpertsNext next) override;

 private:
  parallel::GraphGroup& group_;
};

}  // namespace plait::wrap::ep

#endif  // PLAIT_WRAP_EP_EXPERT_DISPATCH_H_
