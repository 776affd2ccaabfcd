// Validates a training plan and prints what it will do, before anything runs:
//
//   bazel run //tools:plan_check -- trainer/plans/llama_fsdp.textproto [--set=training.steps=50]
//
// The world size is the plan's mesh size unless --world_size=N says otherwise (to check the
// plan for another launch). Exits 1 listing every violation, 2 on a usage error.
#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "trainer/explain.h"
#include "trainer/plan.h"
#include "trainer/validate.h"

int main(int argc, char** argv) {
  std::string path;
  std::vector<std::string> overrides;
  std::optional<int> world_size;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    int value = 0;
    if (absl::ConsumePrefix(&arg, "--set=")) {
      overrides.emplace_back(arg);
    } else if (absl::ConsumePrefix(&arg, "--world_size=") && absl::SimpleAtoi(arg, &value)) {
      world_size = value;
    } else if (!absl::StartsWith(arg, "--") && path.empty()) {
      path = std::string(arg);
    } else {
      std::cerr << "plan_check: unexpected argument \"" << argv[i] << "\"\n"
                << "usage: plan_check PLAN.textproto [--set=path=value]... [--world_size=N]\n";
      return 2;
    }
  }
  if (path.empty()) {
    std::cerr << "usage: plan_check PLAN.textproto [--set=path=value]... [--world_size=N]\n";
    return 2;
  }
  // Under `bazel run`, relative paths are the user's, not the runfiles tree's.
  if (const char* dir = std::getenv("BUILD_WORKING_DIRECTORY"); dir != nullptr && path[0] != '/') {
    path = std::string(dir) + "/" + path;
  }
  absl::StatusOr<plait::trainer::Plan> plan = plait::trainer::LoadPlan(path);
  if (!plan.ok()) {
    std::cerr << plan.status().message() << "\n";
    return 1;
  }
  for (const std::string& assignment : overrides) {
    if (absl::Status status = plait::trainer::ApplyOverride(assignment, *plan); !status.ok()) {
      std::cerr << status.message() << "\n";
      return 1;
    }
  }
  const int ranks = world_size.value_or(plait::trainer::MeshRanks(*plan));
  if (absl::Status status = plait::trainer::ValidatePlan(*plan, ranks); !status.ok()) {
    std::cerr << path << ": invalid plan for " << ranks << " ranks:\n" << status.message() << "\n";
    return 1;
  }
  absl::StatusOr<std::string> text = plait::trainer::ExplainPlan(*plan, ranks);
  if (!text.ok()) {
    std::cerr << text.status().message() << "\n";
    return 1;
  }
  std::cout << path << ": valid\n" << *text << "\n";
  return 0;
}
