#include "plan/plan.h"

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "base/file.h"
#include "base/status.h"
#include "base/text_proto.h"

namespace plait::plan {

absl::StatusOr<Plan> ParsePlan(absl::string_view text, absl::string_view source) {
  Plan plan;
  absl::Status status = base::ParseTextProto(text, source, plan);
  if (!status.ok()) return status;
  return plan;
}

absl::StatusOr<Plan> LoadPlan(const std::string& path) {
  PLAIT_ASSIGN_OR_RETURN(const std::string text,
                         base::Annotate(base::ReadFile(path), "reading the plan"));
  return ParsePlan(text, path);
}

absl::Status ApplyOverride(absl::string_view assignment, Plan& plan) {
  return base::MergeFieldAssignment(assignment, absl::StrCat("--set=", assignment), "plan", plan);
}

absl::StatusOr<PlanArguments> ParsePlanArguments(int argc, char** argv, PlanCommand command) {
  PlanArguments arguments;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    // The count the command takes, --world_size or --max_local_ranks.
    std::optional<int>* count = nullptr;
    if (command == PlanCommand::kCheck && absl::ConsumePrefix(&arg, "--world_size=")) {
      count = &arguments.world_size;
    } else if (command == PlanCommand::kCheck && absl::ConsumePrefix(&arg, "--nodes=")) {
      count = &arguments.nodes;
    } else if (command == PlanCommand::kTrain && absl::ConsumePrefix(&arg, "--max_local_ranks=")) {
      count = &arguments.max_local_ranks;
    }
    int number = 0;
    if (count != nullptr) {
      // Not taken for the plan's path, as "--world_size=x" once was.
      if (!absl::SimpleAtoi(arg, &number) || number < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat(argv[i], ": \"", arg, "\" is not a positive integer"));
      }
      *count = number;
    } else if (command == PlanCommand::kTrain && absl::ConsumePrefix(&arg, "--max_restarts=")) {
      if (!absl::SimpleAtoi(arg, &arguments.max_restarts) || arguments.max_restarts < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(argv[i], ": \"", arg, "\" is not an integer >= 0"));
      }
    } else if (command == PlanCommand::kCheck && absl::ConsumePrefix(&arg, "--target=")) {
      arguments.target = std::string(arg);
    } else if (command == PlanCommand::kCheck && absl::ConsumePrefix(&arg, "--targets_file=")) {
      arguments.targets_file = std::string(arg);
    } else if (absl::ConsumePrefix(&arg, "--set=")) {
      arguments.overrides.emplace_back(arg);
    } else if (arg == "--skip_memory_check") {
      arguments.skip_memory_check = true;
    } else if (arg == "--help" || arg == "-h") {
      arguments.help = true;
    } else if ((absl::ConsumePrefix(&arg, "--plan=") || !absl::StartsWith(arg, "--")) &&
               arguments.plan_path.empty()) {
      arguments.plan_path = std::string(arg);
    } else if (absl::ConsumePrefix(&arg, "--")) {
      // Worded as Abseil's flags word it in the other binaries.
      return absl::InvalidArgumentError(
          absl::StrCat("Unknown command line flag '", arg.substr(0, arg.find('=')),
                       "' (--help lists the flags)"));
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("unexpected argument \"", argv[i], "\" (--help lists the flags)"));
    }
  }
  if (arguments.target.empty() && (arguments.nodes || !arguments.targets_file.empty())) {
    return absl::InvalidArgumentError(
        absl::StrCat(arguments.nodes ? "--nodes" : "--targets_file", " needs --target=NAME"));
  }
  if (!arguments.target.empty() && arguments.world_size) {
    return absl::InvalidArgumentError(
        "--world_size with --target: the target's nodes (--nodes=N) give the world");
  }
  return arguments;
}

std::string PlanFlagsHelp(PlanCommand command) {
  struct Flag {
    const char* name;
    const char* text;
    bool train;
    bool check;
  };
  static constexpr Flag kFlags[] = {
      {"--plan=FILE", "the plan (or FILE alone); a job runs its own plan without it", true, true},
      {"--set=path=value", "sets one field of the plan, as its text would; repeatable", true, true},
      {"--world_size=N", "checks the plan for N ranks, not its mesh's size", false, true},
      {"--target=NAME",
       "checks the plan for a GPU cluster (h100-sxm, h100-96gb, h200, a100-80gb, mi300x, b200): "
       "memory per GPU, suggestions, step time",
       false, true},
      {"--nodes=N", "with --target: N nodes (default: as many as the plan's mesh fills)", false,
       true},
      {"--targets_file=FILE", "with --target: more targets, as plan/targets.textproto", false,
       true},
      {"--max_local_ranks=N", "the most ranks the job may start on this machine", true, false},
      {"--max_restarts=N",
       "starts every rank again after one fails, up to N times; the plan must resume from its "
       "checkpoints",
       true, false},
      {"--skip_memory_check", "goes on when the memory estimate exceeds this machine's", true,
       true},
      {"--help", "prints this", true, true},
  };
  std::string text = "flags:\n";
  for (const Flag& flag : kFlags) {
    if (command == PlanCommand::kTrain ? flag.train : flag.check) {
      absl::StrAppend(&text, "  ", absl::StrFormat("%-22s", flag.name), flag.text, "\n");
    }
  }
  return text;
}

absl::StatusOr<Plan> LoadPlanFromArguments(const PlanArguments& arguments,
                                           absl::string_view embedded_text,
                                           absl::string_view embedded_name) {
  absl::StatusOr<Plan> plan;
  if (!arguments.plan_path.empty()) {
    plan = LoadPlan(base::UserPath(arguments.plan_path));
  } else if (!embedded_text.empty()) {
    plan = ParsePlan(embedded_text, embedded_name);
  } else {
    return absl::InvalidArgumentError("no plan: give --plan=FILE");
  }
  for (const std::string& assignment : arguments.overrides) {
    if (!plan.ok()) break;
    PLAIT_RETURN_IF_ERROR(ApplyOverride(assignment, *plan));
  }
  return plan;
}

}  // namespace plait::plan
