#include "trainer/plan.h"

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"

namespace plait::trainer {
namespace {

// Collects the parser's messages as "source:line:col: message" (1-based, as editors count).
class ErrorCollector : public google::protobuf::io::ErrorCollector {
 public:
  explicit ErrorCollector(std::string source) : source_(std::move(source)) {}

  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    errors_.push_back(absl::StrCat(source_, ":", line + 1, ":", column + 1, ": ", message));
  }
  void AddWarning(int line, google::protobuf::io::ColumnNumber column,
                  const std::string& message) override {
    AddError(line, column, message);
  }

  std::string Joined() const { return absl::StrJoin(errors_, "\n"); }

 private:
  std::string source_;
  std::vector<std::string> errors_;
};

// Parses (or merges, keeping what `plan` holds) `text` into `plan`.
absl::Status MergeText(absl::string_view text, absl::string_view source, Plan& plan) {
  ErrorCollector errors{std::string(source)};
  google::protobuf::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  // Unknown fields stay errors (the parser's default); this keeps it explicit.
  parser.AllowUnknownField(false);
  parser.AllowUnknownExtension(false);
  if (!parser.MergeFromString(std::string(text), &plan)) {
    std::string joined = errors.Joined();
    if (joined.empty()) joined = absl::StrCat(source, ": not a valid plan");
    return absl::InvalidArgumentError(joined);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Plan> ParsePlan(absl::string_view text, absl::string_view source) {
  Plan plan;
  absl::Status status = MergeText(text, source, plan);
  if (!status.ok()) return status;
  return plan;
}

absl::StatusOr<Plan> LoadPlan(const std::string& path) {
  std::ifstream file(path);
  if (!file) return absl::NotFoundError(absl::StrCat(path, ": cannot read the plan file"));
  std::stringstream text;
  text << file.rdbuf();
  return ParsePlan(text.str(), path);
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

std::string StrategyName(const PrepareStep& step) {
  const google::protobuf::OneofDescriptor* oneof =
      PrepareStep::descriptor()->FindOneofByName("strategy");
  const google::protobuf::FieldDescriptor* field =
      step.GetReflection()->GetOneofFieldDescriptor(step, oneof);
  return field == nullptr ? "" : field->name();
}

int MeshRanks(const Plan& plan) {
  int ranks = 1;
  for (const auto& dim : plan.mesh().dims()) ranks *= dim.size();
  return ranks;
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

DataConfig ResolvedData(const Plan& plan) {
  DataConfig data = plan.data();
  if (data.source_case() == DataConfig::SOURCE_NOT_SET) data.mutable_synthetic();
  if (data.has_synthetic()) {
    SyntheticData& synthetic = *data.mutable_synthetic();
    if (!synthetic.has_num_states()) synthetic.set_num_states(kDefaultNumStates);
    if (!synthetic.has_branching()) synthetic.set_branching(kDefaultBranching);
    if (!synthetic.has_peak()) synthetic.set_peak(kDefaultPeak);
  }
  return data;
}

}  // namespace plait::trainer
