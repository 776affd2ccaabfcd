#include "objectives/step_items.h"

#include <numeric>
#include <utility>

#include "ATen/core/Tensor.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "torch/csrc/autograd/generated/variable_factories.h"

namespace plait::objectives {

absl::StatusOr<StepItems> StepItems::Count(std::vector<int64_t> items,
                                           const parallel::DeviceMesh& mesh,
                                           const std::vector<std::string>& scoring_dims) {
  // Each micro-batch's, summed on the mesh's device, and read back once, only when some
  // dimension has ranks to sum over: one rank's counts never leave the host.
  std::vector<int64_t> global = items;
  at::Tensor summed;
  for (const std::string& dim : scoring_dims) {
    PLAIT_ASSIGN_OR_RETURN(parallel::Communicator* const group, mesh.communicator(dim));
    if (group->size() == 1) continue;
    if (!summed.defined()) {
      summed = torch::tensor(global, at::TensorOptions(at::kLong)).to(mesh.device());
    }
    PLAIT_RETURN_IF_ERROR(
        base::Annotate(group->AllReduce(summed, parallel::ReduceOp::kSum)->Wait(),
                       absl::StrCat("counting the step's scored items over \"", dim, "\"")));
  }
  if (summed.defined()) {
    const at::Tensor host = summed.cpu();
    global.assign(host.data_ptr<int64_t>(), host.data_ptr<int64_t>() + host.numel());
  }
  const int64_t n = std::accumulate(global.begin(), global.end(), int64_t{0});
  PLAIT_ASSIGN_OR_RETURN(const auto data_parallel, mesh.SubgridRankAndSize(scoring_dims));
  if (n == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "none of the step's ", items.size(), " micro-batches on ", data_parallel.second,
        " data-parallel rank(s) scores an item (every target is the ignore index): its loss "
        "would be 0 / 0; check that the data's completions are not all cut off by seq_len"));
  }
  return StepItems(std::move(items), std::move(global), n, data_parallel.second);
}

at::Tensor StepItems::ScaledForBackward(const at::Tensor& loss, int micro) const {
  const int64_t own = items_.at(micro);
  if (own == 0) return loss * 0.0;
  // Both counts are exact in a double (below 2^53), and so is the quotient when it is a whole
  // number: then this is the division by the accumulation count it always was.
  return loss / (static_cast<double>(total_) / (static_cast<double>(own) * data_parallel_size_));
}

}  // namespace plait::objectives
