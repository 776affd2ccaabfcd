// Validates a training plan and prints what it will do, before anything runs:
//
//   bazel run //tools:plan_check -- plan/examples/llama_fsdp.textproto [--set=training.steps=50]
//
// The world size is the plan's mesh size unless --world_size=N says otherwise (to check the
// plan for another launch). The plan must also fit in this machine's memory with all its ranks
// here, unless --skip_memory_check. Exits 1 listing every violation, 2 on a usage error.
#include <iostream>
#include <string>

#include "base/file.h"
#include "base/guarded_main.h"
#include "parallel/device_mesh.h"
#include "plan/explain.h"
#include "plan/plan.h"
#include "plan/validate.h"

namespace {
constexpr char kUsage[] =
    "usage: plan_check PLAN.textproto [--set=path=value]... [--world_size=N] "
    "[--skip_memory_check]";
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
