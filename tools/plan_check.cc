// Validates a training plan and prints what it will do, before anything runs:
//
//   bazel run //tools:plan_check -- plan/examples/llama_fsdp.textproto [--set=training.steps=50]
//
// The world size is the plan's mesh size unless --world_size=N says otherwise (to check the
// plan for another launch). The plan must also fit in this machine's memory with all its ranks
// here, unless --skip_memory_check. With --target=NAME (and --nodes=N, --targets_file=FILE) it
// is checked for a GPU cluster instead, from any machine (plan/target_check.h): the memory per
// GPU with suggestions when it does not fit, and the step time. Exits 1 listing every
// violation or when the plan does not fit, 2 on a usage error.
#include <iostream>
#include <string>

#include "base/file.h"
#include "base/guarded_main.h"
#include "models/estimates.h"
#include "parallel/device_mesh.h"
#include "plan/explain.h"
#include "plan/plan.h"
#include "plan/target_check.h"
#include "plan/validate.h"

namespace {
constexpr char kUsage[] =
    "usage: plan_check PLAN.textproto [--set=path=value]... [--world_size=N] "
    "[--skip_memory_check] [--target=NAME [--nodes=N] [--targets_file=FILE]]";

// The check of `plan` (from `path`) for the GPU cluster `arguments` name.
int CheckForTarget(const plait::plan::Plan& plan, const std::string& path,
                   const plait::plan::PlanArguments& arguments) {
  absl::StatusOr<plait::plan::TargetCatalogue> catalogue =
      plait::plan::LoadTargets(plait::base::UserPath(arguments.targets_file));
  if (!catalogue.ok()) {
    std::cerr << catalogue.status().message() << "\n";
    return 1;
  }
  absl::StatusOr<plait::plan::TargetCheck> check =
      plait::plan::CheckOnTarget(plan, *catalogue, arguments.target, arguments.nodes);
  if (!check.ok()) {
    std::cerr << path << ": "
              << (absl::IsInvalidArgument(check.status()) ? "invalid plan" : "refused")
              << " for --target=" << arguments.target << ":\n"
              << check.status().message() << "\n";
    return 1;
  }
  absl::StatusOr<std::string> text =
      plait::plan::ExplainPlan(check->resolved, plait::models::kLibTorch2Kernels);
  if (!text.ok()) {
    std::cerr << text.status().message() << "\n";
    return 1;
  }
  std::cout << path << ": valid\n"
            << *text << "\n"
            << plait::plan::DescribeTargetCheck(*check, *catalogue) << "\n";
  return check->fits() ? 0 : 1;
}
}  // namespace

int RunPlanCheck(int argc, char** argv) {
  absl::StatusOr<plait::plan::PlanArguments> arguments =
      plait::plan::ParsePlanArguments(argc, argv, plait::plan::PlanCommand::kCheck);
  if (arguments.ok() && arguments->help) {
    std::cout << kUsage << "\n" << plait::plan::PlanFlagsHelp(plait::plan::PlanCommand::kCheck);
    return 0;
  }
  if (!arguments.ok() || arguments->plan_path.empty()) {
    if (!arguments.ok()) std::cerr << "plan_check: " << arguments.status().message() << "\n";
    std::cerr << kUsage << "\n";
    return 2;
  }
  const std::string path = plait::base::UserPath(arguments->plan_path);
  absl::StatusOr<plait::plan::Plan> plan = plait::plan::LoadPlanFromArguments(*arguments, "", "");
  if (!plan.ok()) {
    std::cerr << plan.status().message() << "\n";
    return 1;
  }
  if (!arguments->target.empty()) return CheckForTarget(*plan, path, *arguments);
  const int ranks =
      arguments->world_size.value_or(static_cast<int>(plait::parallel::MeshRanks(plan->mesh())));
  // Checked as if every rank ran on this machine.
  const absl::StatusOr<plait::plan::ResolvedPlan> resolved =
      plait::plan::ResolveForMachine(*plan, ranks, ranks, arguments->skip_memory_check);
  if (!resolved.ok()) {
    const absl::Status& status = resolved.status();
    std::cerr << path
              << (absl::IsInvalidArgument(status) ? ": invalid plan for " : ": refused for ")
              << ranks << " ranks:\n"
              << status.message() << "\n";
    return 1;
  }
  absl::StatusOr<std::string> text = plait::plan::ExplainPlan(*resolved);
  if (!text.ok()) {
    std::cerr << text.status().message() << "\n";
    return 1;
  }
  std::cout << path << ": valid\n" << *text << "\n";
  return 0;
}

int main(int argc, char** argv) {
  return plait::base::RunCatchingExceptions("plan_check", [&] { return RunPlanCheck(argc, argv); });
}
