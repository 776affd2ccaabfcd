// A plan checked for a GPU cluster it is not run on (//tools:plan_check --target): one rank's
// memory against a GPU's less what the runtime reserves, with the smallest changes that make a
// plan that does not fit fit (each checked by estimating again), and a step's time from the
// plan's model FLOPs at an assumed MFU and its collectives' bytes over the links their ranks
// share. The machines are data (targets.proto: plan/targets.textproto, and a user's file of the
// same form). Nothing here needs a GPU or a CUDA build: the activations are those LibTorch
// 2.x's generic ops keep on a GPU (models::kLibTorch2Kernels).
//
//   PLAIT_ASSIGN_OR_RETURN(const TargetCatalogue targets, LoadTargets(user_file));
//   PLAIT_ASSIGN_OR_RETURN(const TargetCheck check, CheckOnTarget(plan, targets, "h200", 2));
//   std::cout << DescribeTargetCheck(check);  // memory verdict, step time, suggestions
#ifndef PLAIT_PLAN_TARGET_CHECK_H_
#define PLAIT_PLAN_TARGET_CHECK_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "plan/memory_estimate.h"
#include "plan/plan.pb.h"
#include "plan/resolved_plan.h"
#include "plan/targets.pb.h"

namespace plait::plan {

// The built-in catalogue (plan/targets.textproto), with `user_file`'s targets added or put in
// place of those of the same name, and its reserve and speed where it sets them; the built-in
// one alone for an empty `user_file`. InvalidArgument naming the file, the field and the
// target for a target without a name, memory, a peak FLOP/s, links or GPUs per node, a figure
// beyond any real part's (1e308 GiB, inf TFLOP/s), two targets of one name in one file, and
// a reserve or speed assumption out of its range.
absl::StatusOr<TargetCatalogue> LoadTargets(const std::string& user_file);

// The target called `name`; NotFound listing the names the catalogue has.
absl::StatusOr<Target> FindTarget(const TargetCatalogue& catalogue, absl::string_view name);

// A step's time on the target: the model's FLOPs at the assumed MFU, each mesh dimension's
// collectives at the assumed share of the link its ranks share (NVLink within a node, the
// network across nodes), those that overlap the compute hidden behind it where it is longer.
struct StepTime {
  struct Link {
    std::string mesh_dim;
    bool across_nodes = false;
    double bytes = 0;  // a rank sends in a step
    double seconds = 0;
    bool overlaps_compute = true;
  };
  double flops_per_gpu = 0;  // a step's model FLOPs, one GPU's share
  double compute_seconds = 0;
  std::vector<Link> links;
  double seconds = 0;
  double tokens_per_second_per_gpu = 0;
  std::string bound;  // "compute", or the collectives that make the step longer
};

// A change to a plan that does not fit: in words, the plan it makes (on how many nodes:
// nullopt, as its mesh needs) and the memory that plan leaves spare.
struct Suggestion {
  std::string change;  // "activation_checkpointing { policy: SELECTIVE } added as prepare[0]"
  Plan plan;
  std::optional<int> nodes;
  double spare_bytes = 0;
};

struct TargetCheck {
  Target target;
  int nodes = 1;
  // The plan as it runs there: on CUDA, DTYPE_AUTO resolved for the GPU, for nodes x
  // gpus_per_node ranks.
  ResolvedPlan resolved;
  MemoryEstimate memory;
  double usable_bytes = 0;  // the GPU's memory less the reserve's fixed part
  double needed_bytes = 0;  // the estimate with the reserve's fragmentation allowance
  StepTime time;
  std::vector<Suggestion> suggestions;  // when it does not fit; the smallest of each kind

  bool fits() const { return needed_bytes <= usable_bytes; }
};

// `plan` checked on `nodes` nodes of the target `target_name` (nullopt: as many as the plan's
// mesh needs, filled in order), every rank on a GPU of its own. Resolve's InvalidArgument for a
// plan that is invalid there (its mesh not nodes x gpus_per_node ranks, a count that does not
// divide), NotFound for an unknown target, FailedPrecondition for a model dtype the GPU lacks
// a peak for.
absl::StatusOr<TargetCheck> CheckOnTarget(const Plan& plan, const TargetCatalogue& catalogue,
                                          absl::string_view target_name, std::optional<int> nodes);

// The check in lines: where it ran, the memory verdict (fits with X spare, or over by X, and
// the suggestions), the step time and what bounds it, with every assumption stated.
std::string DescribeTargetCheck(const TargetCheck& check, const TargetCatalogue& catalogue);

}  // namespace plait::plan

#endif  // PLAIT_PLAN_TARGET_CHECK_H_
