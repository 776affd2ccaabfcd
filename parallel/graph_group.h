// A communicator used inside autograd graphs, whose forward and backward functions cannot
// return errors: each waits on its collectives through the group, which keeps the first
// failure for the caller to check after the backward (tensor parallelism's operators,
// context parallelism's ring attention).
//
//   GraphGroup group(*mesh.communicator("tp").value());
//   at::Tensor y = SomeCollectiveOp(x, group);  // waits with group.Wait(work)
//   loss.backward();
//   PLAIT_RETURN_IF_ERROR(group.status());
#ifndef PLAIT_PARALLEL_GRAPH_GROUP_H_
#define PLAIT_PARALLEL_GRAPH_GROUP_H_

#include <memory>

#include "ATen/core/Tensor.h"
#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "parallel/communicator.h"
#include "torch/csrc/autograd/custom_function.h"

namespace plait::parallel {

// The communicator of a group and the first error of the collectives waited on through it. It
// must outlive every autograd graph built with it.
class GraphGroup {
 public:
  explicit GraphGroup(Communicator& communicator) : communicator_(communicator) {}

  Communicator& communicator() const { return communicator_; }
  int size() const { return communicator_.size(); }
  int rank() const { return communicator_.rank(); }

  // Waits for `work` and keeps its error if it is the first.
  void Wait(const std::shared_ptr<Work>& work);

  // The time spent in Wait so far: what a rank's compute waited for its peers (a benchmark's
  // busy time is its wall time less this).
  absl::Duration waited() const;

  // The first error of a collective; it stays, since the ranks are out of step after it.
  absl::Status status() const;

  // Says, around the collectives issued while it lives, the pass they belong to and what they
  // are for, as their errors do: "backward, all_reduce of tensor-parallel input gradient (f)".
  ScopedPlace Place(Pass pass, const char* purpose) {
    return ScopedPlace(communicator_, {StepPlace::kNoBlock, pass, purpose});
  }

  // An autograd function's group travels in its context (saved_data) as an integer.
  void SaveIn(torch::autograd::AutogradContext* ctx);
  static GraphGroup& SavedIn(torch::autograd::AutogradContext* ctx);

 private:
  Communicator& communicator_;
  mutable absl::Mutex mutex_;
  absl::Status status_ ABSL_GUARDED_BY(mutex_);
  absl::Duration waited_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace plait::parallel

#endif  // PLAIT_PARALLEL_GRAPH_GROUP_H_
