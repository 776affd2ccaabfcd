// Validates a training plan and prints what it will do, before anything runs:
//
//   bazel run //tools:plan_check -- plan/examples/llama_fsdp.textproto [--set=training.steps=50]
//
// The world size is the plan's mesh size unless --world_size=N says otherwise (to check the
// plan for another launch). The plan must also fit in this machine's memory with all its ranks
// here, unless --skip_memory_check. With --target=NAME (and --nodes=N, --targets_file=FILE) it
// is checked for a GPU cluster instead, from any machine (plan/target_check.h): the memory per
// GPU with suggestions when it does not fit, and the step time. For SFT and preference files it
// reads the training file and reports its rows an epoch and their padding, as the plan packs
// them and as the other PairFiles.packing strategies would. Exits 1 listing every violation or when
// the plan does not fit, 2 on a usage error.
#include <iostream>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/file.h"
#include "base/guarded_main.h"
#include "base/status.h"
#include "data/data_loader.h"
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

// For pair files, the rows of the training file an epoch and their padding, as the plan packs
// them and as the other packings would, read as rank 0 of `resolved` reads them; "" for the
// other sources.
absl::StatusOr<std::string> DescribeRows(const plait::plan::ResolvedPlan& resolved) {
  const plait::data::DataConfig& data = resolved.data;
  if (!data.has_sft_files() && !data.has_preference_files()) return "";
  PLAIT_ASSIGN_OR_RETURN(const plait::data::DataLoader loader,
                         plait::data::DataLoader::Create(
                             data, plait::data::Split::kTrain, resolved.model.vocab_size(),
                             resolved.training().micro_batch(), resolved.training().seq_len(), 0,
                             static_cast<int>(resolved.data_parallel_size), "plan.data"));
  return absl::StrCat("training data: ",
                      plait::data::DescribePacking(*loader.Packing(), loader.packing_strategy(),
                                                   resolved.training().seq_len()),
                      "\n");
}

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
  const absl::StatusOr<std::string> rows = DescribeRows(*resolved);
  if (!rows.ok()) {
    std::cerr << path << ": " << rows.status().message() << "\n";
    return 1;
  }
  std::cout << path << ": valid\n" << *text << "\n" << *rows;
  return 0;
}

int main(int argc, char** argv) {
  return plait::base::RunCatchingExceptions("plan_check", [&] { return RunPlanCheck(argc, argv); });
}
