#include "metrics/metrics_log.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "base/file.h"
#include "base/json.h"
#include "base/status.h"
#include "metrics/run_summary.h"
#include "nlohmann/json.hpp"

namespace plait::metrics {

using Json = nlohmann::json;

namespace {

// The rows of `text` of steps up to `step`. A row cut short by a kill is not valid JSON: it is
// dropped with the steps after the resume.
std::string RowsUpTo(absl::string_view text, int64_t step) {
  std::string kept;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    const absl::StatusOr<Json> row = base::ParseJson("a metrics row", line);
    if (!row.ok() || !row->is_object()) continue;
    const auto it = row->find("step");
    if (it != row->end() && it->is_number_integer() && it->get<int64_t>() <= step) {
      absl::StrAppend(&kept, line, "\n");
    }
  }
  return kept;
}

// OK when every row of `text`, the contents of `path`, is a JSON object with an integer
// "step" (the last one may be cut short, without its newline, by a killed run): a metrics
// file this class wrote.
absl::Status CheckIsMetricsFile(absl::string_view text, const std::string& path) {
  size_t start = 0;
  for (int64_t line_number = 1; start < text.size(); ++line_number) {
    const size_t end = text.find('\n', start);
    if (end == absl::string_view::npos) break;  // a row cut short
    const absl::StatusOr<Json> row = base::ParseJson(path, text.substr(start, end - start));
    const bool is_row =
        row.ok() && row->is_object() && row->contains("step") && (*row)["step"].is_number_integer();
    if (!is_row) {
      return absl::FailedPreconditionError(absl::StrCat(
          "\"", path, "\" exists and is not a metrics file (line ", line_number,
          " is not a row with a step); a run never overwrites it: choose another path"));
    }
    start = end + 1;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status KeepRowsUpTo(const std::string& path, int64_t step) {
  std::error_code error;
  if (!std::filesystem::exists(path, error)) return absl::OkStatus();
  PLAIT_ASSIGN_OR_RETURN(const std::string text, base::ReadFile(path));
  return base::WriteFileAtomically(path, RowsUpTo(text, step));
}

absl::StatusOr<MetricsLog> MetricsLog::Open(const std::string& path, int64_t resume_step) {
  return OpenFile(path, /*continues=*/resume_step > 0, resume_step);
}

absl::StatusOr<MetricsLog> MetricsLog::Continue(const std::string& path, int64_t after_step) {
  return OpenFile(path, /*continues=*/true, after_step);
}

absl::StatusOr<MetricsLog> MetricsLog::OpenFile(const std::string& path, bool continues,
                                                int64_t after_step) {
  struct stat info;
  const std::string summary = RunSummaryPath(path);
  if (lstat(summary.c_str(), &info) == 0 && (!continues || !S_ISREG(info.st_mode))) {
    return absl::FailedPreconditionError(absl::StrCat(
        "\"", summary, "\" already exists; the summary of the run whose metrics file is \"", path,
        "\" goes there, and a fresh run never overwrites a file: remove it or choose "
        "another metrics file"));
  }
  if (lstat(path.c_str(), &info) == 0) {
    if (!S_ISREG(info.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat("\"", path, "\" is ", base::FileKind(info.st_mode),
                       "; a metrics file is a regular file the run creates: choose another path"));
    }
    // An empty file holds nothing to lose: a run that failed before its first row leaves one.
    if (!continues && info.st_size > 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "\"", path,
          "\" already exists; a fresh run creates its metrics file and never "
          "overwrites one (only a run resumed from a checkpoint continues it): remove it or "
          "choose another path"));
    }
    PLAIT_ASSIGN_OR_RETURN(const std::string text, base::ReadFile(path));
    PLAIT_RETURN_IF_ERROR(CheckIsMetricsFile(text, path));
    PLAIT_RETURN_IF_ERROR(base::WriteFileAtomically(path, RowsUpTo(text, after_step)));
  } else {
    // Created here, exclusively: a file that appeared since the check is not overwritten.
    const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot create \"", path, "\": ", std::strerror(errno)));
    }
    close(fd);
  }
  auto out = std::make_unique<std::ofstream>(path, std::ios::app);
  if (!*out) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot write \"", path, "\": ", std::strerror(errno)));
  }
  return MetricsLog(path, std::move(out));
}

absl::Status MetricsLog::Append(const StepMetrics& metrics) {
  Json row = {{"step", metrics.step}};
  for (const auto& [name, value] : Scalars(metrics)) row[name] = value;
  if (metrics.skipped) row["skipped"] = true;
  *out_ << row.dump() << "\n";
  out_->flush();
  if (!*out_) {
    return absl::DataLossError(
        absl::StrCat(path_, ": cannot write step ", metrics.step, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status MetricsLog::WriteSummary(const RunMetrics& run) const {
  return base::WriteFileAtomically(RunSummaryPath(path_), RunSummaryJson(run));
}

}  // namespace plait::metrics
