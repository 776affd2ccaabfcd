// Reading a training plan (plan.proto) from its text form, strictly: unknown fields, bad
// enum values and malformed text are InvalidArgument errors that give `file:line:col`.
// Command-line overrides (`--set=training.steps=50`) are merged into a parsed plan through
// the same parser, so they are checked the same way, and the result still goes through
// Resolve (validate.h):
//
//   PLAIT_ASSIGN_OR_RETURN(Plan plan, LoadPlan("plan/examples/llama_fsdp.textproto"));
//   PLAIT_RETURN_IF_ERROR(ApplyOverride("training.steps=50", plan));
//   // error: "--set=training.stepz=50: plan.training has no field \"stepz\""
#ifndef PLAIT_PLAN_PLAN_H_
#define PLAIT_PLAN_PLAN_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "plan/plan.pb.h"

namespace plait::plan {

// Parses the text of a plan; `source` names it in errors ("plan.textproto:3:5: ...").
absl::StatusOr<Plan> ParsePlan(absl::string_view text, absl::string_view source);

// Reads and parses a plan file; NotFound naming the path when it cannot be read.
absl::StatusOr<Plan> LoadPlan(const std::string& path);

// Sets one singular scalar field of `plan` from "a.b.c=value" (value as in a text proto;
// strings need no quotes). InvalidArgument naming the override and the path component that
// does not exist, is repeated, or is a message.
absl::Status ApplyOverride(absl::string_view assignment, Plan& plan);

// The command line of the binaries that take a plan: the plan file (--plan=FILE, or one
// positional FILE) and --set=path=value overrides in order, for both; --max_local_ranks=N
// for the training jobs (how many ranks they may start on this machine) and --max_restarts=N
// (how many times a job that launches itself starts its ranks again after one fails,
// torchrun's flag), --world_size=N
// for //tools:plan_check (the world to check the plan for) and --target=NAME, --nodes=N and
// --targets_file=FILE (the GPU cluster to check it for: target_check.h), and
// --skip_memory_check for both
// (run a plan whose memory estimate exceeds what the machine has), and --help. Hand-parsed
// because --set repeats, and Abseil's flags (20220623) keep only the last value of a
// repeated flag.
enum class PlanCommand { kTrain, kCheck };
struct PlanArguments {
  std::string plan_path;  // as given; empty: none
  std::vector<std::string> overrides;
  std::optional<int> max_local_ranks;  // kTrain
  int max_restarts = 0;                // kTrain
  std::optional<int> world_size;       // kCheck
  std::string target;                  // kCheck; empty: this machine
  std::optional<int> nodes;            // kCheck, with target
  std::string targets_file;            // kCheck, with target; empty: the built-in catalogue
  bool skip_memory_check = false;
  bool help = false;  // --help (or -h): print PlanFlagsHelp and do nothing else
};

// Parses argv[1..argc); InvalidArgument naming the first argument `command` does not take,
// or whose count (--world_size, --max_local_ranks, --nodes) is not a positive integer, or
// --max_restarts not a count >= 0, or --nodes and --targets_file without --target, or
// --world_size with it.
absl::StatusOr<PlanArguments> ParsePlanArguments(int argc, char** argv, PlanCommand command);

// The flags `command` takes, one line each with what it does, for --help.
std::string PlanFlagsHelp(PlanCommand command);

// The plan `arguments` name, with their overrides applied: the file (a path relative to where
// the user ran `bazel run`, base::UserPath), else `embedded_text` (compiled into the binary
// and named `embedded_name` in errors). InvalidArgument when there is neither.
absl::StatusOr<Plan> LoadPlanFromArguments(const PlanArguments& arguments,
                                           absl::string_view embedded_text,
                                           absl::string_view embedded_name);

}  // namespace plait::plan

#endif  // PLAIT_PLAN_PLAN_H_
