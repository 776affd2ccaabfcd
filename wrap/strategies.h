// The registry of preparation strategies: the Strategy (strategy.h) a plan's step names.
//
//   PLAIT_ASSIGN_OR_RETURN(std::unique_ptr<Strategy> strategy, MakeStrategy(plan.prepare(0)));
#ifndef PLAIT_WRAP_STRATEGIES_H_
#define PLAIT_WRAP_STRATEGIES_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "google/protobuf/repeated_ptr_field.h"
#include "wrap/strategy.h"
#include "wrap/wrap.pb.h"

namespace plait::wrap {

// The strategy `step` names, configured and not applied. InvalidArgument when it names none or
// its config is invalid, naming the field ("ddp.bucket_cap_mb: ...").
absl::StatusOr<std::unique_ptr<Strategy>> MakeStrategy(const PrepareStep& step);

// A plan's step whose strategy has the facet `Facet` (StepsWith).
template <typename Facet>
struct StepWith {
  int index = 0;  // in the plan's steps
  std::unique_ptr<Strategy> strategy;
  const Facet* facet = nullptr;  // of `strategy`
};

// The steps of `steps` whose strategy has the facet `Facet`, in step order. A step that names
// no valid strategy is left out (MakeStrategy's error is the rules' to report).
template <typename Facet>
std::vector<StepWith<Facet>> StepsWith(
    const google::protobuf::RepeatedPtrField<PrepareStep>& steps) {
  std::vector<StepWith<Facet>> found;
  for (int i = 0; i < steps.size(); ++i) {
    absl::StatusOr<std::unique_ptr<Strategy>> strategy = MakeStrategy(steps[i]);
    if (!strategy.ok()) continue;
    const Facet* const facet = FacetOf<Facet>(**strategy);
    if (facet != nullptr) found.push_back({i, *std::move(strategy), facet});
  }
  return found;
}

// Introduces `later` to the one of `earlier` (a plan's steps before it) that runs on the
// dimension `later` borrows: that step is told that `later` takes over what it keeps whole
// there (ParameterLayout::HandOverReplicated), and `later` is handed its layout
// (ParameterLayout::Borrow). Nothing where `later` borrows none.
void HandOver(const std::vector<std::unique_ptr<Strategy>>& earlier, Strategy& later);

// The steps a plan none of whose steps keeps less of `saves` may add, smallest change first
// (SmallerVersions): activation checkpointing, SELECTIVE then FULL, for the activations; FSDP
// over a dimension "dp" for the parameters.
std::vector<PrepareStep> StepsThatSave(SmallerVersions::Saves saves);

// The mesh dimensions, of `mesh_dims` in their order, whose ranks read different data under
// `steps`: those of the steps whose strategy splits the batch (FSDP, DDP), replicate
// dimensions included. A step that names no strategy is left out (the rules report it).
std::vector<std::string> DataParallelDimsOf(
    const google::protobuf::RepeatedPtrField<PrepareStep>& steps,
    const std::vector<std::string>& mesh_dims);

// Those, and the dimensions whose ranks each compute a slice of every sequence (context
// parallelism): the dimensions whose ranks score different items of a step
// (objectives::StepItems counts over them).
std::vector<std::string> ScoringDimsOf(const google::protobuf::RepeatedPtrField<PrepareStep>& steps,
                                       const std::vector<std::string>& mesh_dims);

// The dimensions whose ranks run the blocks' feed-forward on different tokens
// (DataSplit::splits_tokens: the scoring dimensions, and tensor parallelism's under sequence
// parallelism): over which a mixture of experts' routing is summed.
std::vector<std::string> RoutingDimsOf(const google::protobuf::RepeatedPtrField<PrepareStep>& steps,
                                       const std::vector<std::string>& mesh_dims);

}  // namespace plait::wrap

#endif  // PLAIT_WRAP_STRATEGIES_H_
