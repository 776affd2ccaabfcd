#include "trainer/plan.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/file.h"
#include "base/status.h"
#include "base/text_proto.h"
#include "google/protobuf/descriptor.h"

namespace plait::trainer {
namespace {

// Parses (or merges, keeping what `plan` holds) `text` into `plan`.
absl::Status MergeText(absl::string_view text, absl::string_view source, Plan& plan) {
  return base::MergeTextProto(text, source, plan);
}

}  // namespace

absl::StatusOr<Plan> ParsePlan(absl::string_view text, absl::string_view source) {
  Plan plan;
  absl::Status status = MergeText(text, source, plan);
  if (!status.ok()) return status;
  return plan;
}

absl::StatusOr<Plan> LoadPlan(const std::string& path) {
  absl::StatusOr<std::string> text = base::ReadFile(path);
  if (!text.ok()) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot read the plan file"));
  }
  return ParsePlan(*text, path);
}

absl::Status ApplyOverride(absl::string_view assignment, Plan& plan) {
  const std::string where = absl::StrCat("--set=", assignment);
  const size_t equals = assignment.find('=');
  if (equals == absl::string_view::npos || equals == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": expected path=value, e.g. --set=training.steps=50"));
  }
  const std::vector<std::string> path = absl::StrSplit(assignment.substr(0, equals), '.');
  const std::string value(assignment.substr(equals + 1));

  // Walk the descriptors so errors name the component, and strings can be quoted here.
  const google::protobuf::Descriptor* message = Plan::descriptor();
  std::string walked = "plan";
  std::string prefix, suffix;
  for (size_t i = 0; i < path.size(); ++i) {
    const google::protobuf::FieldDescriptor* field = message->FindFieldByName(path[i]);
    if (field == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": ", walked, " has no field \"", path[i], "\""));
    }
    if (field->is_repeated()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": ", walked, ".", path[i], " is repeated; overrides set singular fields"));
    }
    const bool last = i + 1 == path.size();
    if (field->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) {
      if (last) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": ", walked, ".", path[i],
                                                       " is a message; name one of its fields"));
      }
      absl::StrAppend(&prefix, path[i], " { ");
      suffix = absl::StrCat(" }", suffix);
      message = field->message_type();
    } else {
      if (!last) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": ", walked, ".", path[i], " is not a message"));
      }
      const bool quote = field->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_STRING;
      absl::StrAppend(&prefix, path[i], ": ",
                      quote ? absl::StrCat("\"", absl::CEscape(value), "\"") : value);
    }
    absl::StrAppend(&walked, ".", path[i]);
  }
  return MergeText(absl::StrCat(prefix, suffix), where, plan);
}

absl::StatusOr<PlanArguments> ParsePlanArguments(int argc, char** argv, bool allow_world_size) {
  PlanArguments arguments;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    int world_size = 0;
    if (absl::ConsumePrefix(&arg, "--set=")) {
      arguments.overrides.emplace_back(arg);
    } else if (allow_world_size && absl::ConsumePrefix(&arg, "--world_size=") &&
               absl::SimpleAtoi(arg, &world_size)) {
      arguments.world_size = world_size;
    } else if ((absl::ConsumePrefix(&arg, "--plan=") || !absl::StartsWith(arg, "--")) &&
               arguments.plan_path.empty()) {
      arguments.plan_path = std::string(arg);
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument \"", argv[i], "\""));
    }
  }
  return arguments;
}

absl::StatusOr<Plan> LoadPlanFromArguments(const PlanArguments& arguments,
                                           absl::string_view embedded_text,
                                           absl::string_view embedded_name) {
  absl::StatusOr<Plan> plan;
  if (!arguments.plan_path.empty()) {
    plan = LoadPlan(UserPath(arguments.plan_path));
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

std::string UserPath(const std::string& path) {
  const char* dir = std::getenv("BUILD_WORKING_DIRECTORY");
  if (path.empty() || path[0] == '/' || dir == nullptr) return path;
  return absl::StrCat(dir, "/", path);
}

int64_t GradAccumulation(const TrainingConfig& training) {
  return training.grad_accumulation() == 0 ? 1 : training.grad_accumulation();
}

int64_t LogEvery(const TrainingConfig& training) {
  return training.log_every() == 0 ? 10 : training.log_every();
}

sched::ScheduleConfig ResolvedSchedule(const Plan& plan) {
  sched::ScheduleConfig schedule = plan.schedule();
  schedule.set_total_steps(plan.training().steps());
  return schedule;
}

}  // namespace plait::trainer
