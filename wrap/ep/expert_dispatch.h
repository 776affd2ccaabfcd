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
//   model.SetExpertParallelOps(&dispatch);
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

// ExpertParallelOps over `group` (which must outlive it and every graph built through it). A
// failed all-to-all is kept in the group (the results are then meaningless).
class ExpertDispatch final : public ExpertParallelOps {
 public:
  explicit ExpertDispatch(parallel::GraphGroup& group) : group_(group) {}

  // Contiguous shares: rank r holds [r E / n, (r + 1) E / n). E must divide by n (plans are
  // checked first).
  std::pair<int64_t, int64_t> LocalExperts(int64_t num_experts) const override;
  Dispatched Dispatch(const at::Tensor& rows, const std::vector<int64_t>& expert_rows) override;
  at::Tensor Combine(const at::Tensor& outputs, const Dispatched& dispatched) override;

 private:
  parallel::GraphGroup& group_;
};

}  // namespace plait::wrap::ep

#endif  // PLAIT_WRAP_EP_EXPERT_DISPATCH_H_
