#include "metrics/metrics_log.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "base/file.h"
#include "base/json.h"
#include "base/status.h"
#include "nlohmann/json.hpp"

namespace plait::metrics {

using Json = nlohmann::json;

namespace {

// A row of a metrics file: its line (without its end), its 1-based number, its step.
struct Row {
  absl::string_view line;
  int64_t line_number;
  int64_t step;
};

// The rows of `text`: its lines that are JSON objects with an integer "step". A row cut short
// by a kill is not valid JSON: it is left out, as a step never finished.
std::vector<Row> Rows(absl::string_view text) {
  std::vector<Row> rows;
  int64_t line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    if (line.empty()) continue;
    const absl::StatusOr<Json> row = base::ParseJson("a metrics row", line);
    if (!row.ok() || !row->is_object()) continue;
    const auto it = row->find("step");
    if (it == row->end() || !it->is_number_integer()) continue;
    rows.push_back(Row{line, line_number, it->get<int64_t>()});
  }
  return rows;
}

// The lines of `rows` of steps up to `step`, each with its end.
std::string LinesUpTo(const std::vector<Row>& rows, int64_t step) {
  std::string kept;
  for (const Row& row : rows) {
    if (row.step <= step) absl::StrAppend(&kept, row.line, "\n");
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

// The StepMetrics of `row`, an object Append wrote: the inverse of Append, but that a number
// written as null (one that was not finite) reads as NaN, and the objective's metrics come
// back in the order of their names. `where` ("metrics.jsonl line 4") begins an error naming a
// field that is not what Append writes.
absl::StatusOr<StepMetrics> ParseRow(const Json& row, absl::string_view where) {
  if (!row.is_object() || !row.contains("step") || !row["step"].is_number_integer()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": expected a metrics row, an object with an integer \"step\""));
  }
  StepMetrics metrics;
  for (const auto& [key, value] : row.items()) {
    if (key == "step") {
      metrics.step = value.get<int64_t>();
      continue;
    }
    if (key == "skipped") {
      if (!value.is_boolean()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": \"skipped\" is ", base::DescribeJson(value), ", not a bool"));
      }
      metrics.skipped = value.get<bool>();
      continue;
    }
    // Written as a double, as every scalar (Scalars): a whole number, far below 2^63.
    if (key == "peak_device_memory_bytes") {
      const double bytes = value.is_number() ? value.get<double>() : -1.0;
      if (!(bytes >= 0.0 && bytes < 0x1p62) || std::trunc(bytes) != bytes) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": \"", key, "\" is ", base::DescribeJson(value), ", not a byte count"));
      }
      metrics.peak_device_memory_bytes = static_cast<int64_t>(bytes);
      continue;
    }
    if (!value.is_number() && !value.is_null()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": \"", key, "\" is ", base::DescribeJson(value), ", not a number"));
    }
    const double number =
        value.is_null() ? std::numeric_limits<double>::quiet_NaN() : value.get<double>();
    absl::string_view eval_name = key;
    if (key == "loss") {
      metrics.loss = number;
    } else if (key == "lr") {
      metrics.lr = number;
    } else if (key == "tokens_per_s") {
      metrics.tokens_per_s = number;
    } else if (key == "grad_norm") {
      metrics.grad_norm = number;
    } else if (key == "mfu") {
      metrics.mfu = number;
    } else if (key == "eval_loss") {
      metrics.eval_loss = number;
    } else if (absl::ConsumePrefix(&eval_name, "eval_")) {
      metrics.eval_named.emplace_back(std::string(eval_name), number);
    } else {
      metrics.named.emplace_back(key, number);
    }
  }
  return metrics;
}

// The StepMetrics of each of `rows`, rows of the metrics file `path` (Rows), whose errors
// name the path and the row's line.
absl::StatusOr<std::vector<StepMetrics>> ParseRows(const std::vector<const Row*>& rows,
                                                   const std::string& path) {
  std::vector<StepMetrics> parsed;
  for (const Row* row : rows) {
    const std::string where = absl::StrCat(path, " line ", row->line_number);
    PLAIT_ASSIGN_OR_RETURN(const Json json, base::ParseJson(where, row->line));
    PLAIT_ASSIGN_OR_RETURN(StepMetrics metrics, ParseRow(json, where));
    parsed.push_back(std::move(metrics));
  }
  return parsed;
}

// One line of a restarts file: a restart (number 1 or more) or the resume its run began with
// (number 0), with its rows as written.
struct RestartLine {
  Restart restart;
  Json repeated;  // an array
};

// The non-negative integer `key` of `line`, an object; `where` begins the error.
absl::StatusOr<int64_t> Count(const Json& line, const char* key, absl::string_view where) {
  const auto it = line.find(key);
  if (it == line.end() || !it->is_number_integer() || it->get<int64_t>() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": \"", key, "\" is ",
                     it == line.end() ? "missing" : base::DescribeJson(*it), ", not a count"));
  }
  return it->get<int64_t>();
}

// The lines of the restarts file `path`, whose text is `text`.
absl::StatusOr<std::vector<RestartLine>> ParseRestarts(absl::string_view text,
                                                       const std::string& path) {
  std::vector<RestartLine> lines;
  int64_t line_number = 0;
  for (absl::string_view text_line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    const std::string where = absl::StrCat(path, " line ", ++line_number);
    PLAIT_ASSIGN_OR_RETURN(const Json line, base::ParseJson(where, text_line));
    if (!line.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": expected an object, got ", base::DescribeJson(line)));
    }
    RestartLine parsed;
    PLAIT_ASSIGN_OR_RETURN(parsed.restart.number, Count(line, "restart", where));
    PLAIT_ASSIGN_OR_RETURN(parsed.restart.after_step, Count(line, "after_step", where));
    parsed.repeated = line.value("repeated", Json::array());
    if (parsed.restart.number > 0) {
      const auto cause = line.find("cause");
      if (cause == line.end() || !cause->is_string() || !parsed.repeated.is_array()) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": a restart needs a \"cause\" string and a \"repeated\" array of rows"));
      }
      parsed.restart.cause = cause->get<std::string>();
      for (size_t i = 0; i < parsed.repeated.size(); ++i) {
        PLAIT_ASSIGN_OR_RETURN(
            StepMetrics row,
            ParseRow(parsed.repeated[i], absl::StrCat(where, " repeated[", i, "]")));
        parsed.restart.repeated.push_back(std::move(row));
      }
    }
    lines.push_back(std::move(parsed));
  }
  return lines;
}

// Notes `restart` in the restarts file of the metrics file `path`, whose rows are `rows`, with
// the rows after its step, which it drops, and returns what the earlier starts of its run
// left. Written before the metrics file drops those rows: a restart killed in between drops
// them again, and its next one finds them noted already (the same step, the same rows) and
// does not count them twice.
absl::StatusOr<EarlierStarts> NoteRestart(const std::string& path, const std::vector<Row>& rows,
                                          Restart restart) {
  const std::string restarts_path = RestartsPath(path);
  std::string text;
  std::error_code error;
  if (std::filesystem::exists(restarts_path, error)) {
    PLAIT_ASSIGN_OR_RETURN(text, base::ReadFile(restarts_path));
  }
  PLAIT_ASSIGN_OR_RETURN(std::vector<RestartLine> lines, ParseRestarts(text, restarts_path));

  EarlierStarts earlier;
  int64_t first_step = 0;  // of the run's first start; a resume's that began it
  for (const RestartLine& line : lines) {
    if (line.restart.number == 0) {
      first_step = line.restart.after_step;
    } else {
      earlier.restarts.push_back(line.restart);
    }
  }
  std::vector<const Row*> kept, dropped;
  for (const Row& row : rows) {
    if (row.step > restart.after_step) {
      dropped.push_back(&row);
    } else if (row.step > first_step) {
      kept.push_back(&row);
    }
  }
  PLAIT_ASSIGN_OR_RETURN(earlier.steps, ParseRows(kept, path));
  if (!lines.empty() && lines.back().restart.number > 0 &&
      lines.back().restart.after_step == restart.after_step) {
    Json dropped_rows = Json::array();
    for (const Row* row : dropped) {
      PLAIT_ASSIGN_OR_RETURN(Json json, base::ParseJson(path, row->line));
      dropped_rows.push_back(std::move(json));
    }
    if (lines.back().repeated == dropped_rows) dropped.clear();  // noted already
  }
  PLAIT_ASSIGN_OR_RETURN(restart.repeated, ParseRows(dropped, path));
  if (!text.empty() && text.back() != '\n') text += '\n';
  absl::StrAppend(
      &text, "{\"restart\":", restart.number, ",\"after_step\":", restart.after_step,
      ",\"cause\":", Json(restart.cause).dump(-1, ' ', false, Json::error_handler_t::replace),
      ",\"repeated\":[",
      absl::StrJoin(dropped, ",",
                    [](std::string* out, const Row* row) { absl::StrAppend(out, row->line); }),
      "]}\n");
  PLAIT_RETURN_IF_ERROR(base::WriteFileAtomically(restarts_path, text));
  earlier.restarts.push_back(std::move(restart));
  return earlier;
}

// Notes that a resume after `step` begins the run of the metrics file `path`, whose rows are
// `rows`: when the file keeps an earlier run's rows, its restarts file says where this run's
// begin; otherwise there is none (an earlier run's is removed).
absl::Status NoteResume(const std::string& path, const std::vector<Row>& rows, int64_t step) {
  const std::string restarts_path = RestartsPath(path);
  if (std::any_of(rows.begin(), rows.end(), [&](const Row& row) { return row.step <= step; })) {
    return base::WriteFileAtomically(restarts_path,
                                     absl::StrCat("{\"restart\":0,\"after_step\":", step, "}\n"));
  }
  std::error_code error;
  std::filesystem::remove(restarts_path, error);
  if (error) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot remove \"", restarts_path, "\", an earlier run's restarts: ", error.message()));
  }
  return absl::OkStatus();
}

// A file beside the metrics file, and what goes there ("the summary ... goes"), for the
// error refusing it.
struct Beside {
  std::string path;
  const char* what;
  const char* goes;
};

}  // namespace

absl::Status KeepRowsUpTo(const std::string& path, int64_t step) {
  std::error_code error;
  if (!std::filesystem::exists(path, error)) return absl::OkStatus();
  PLAIT_ASSIGN_OR_RETURN(const std::string text, base::ReadFile(path));
  return base::WriteFileAtomically(path, LinesUpTo(Rows(text), step));
}

absl::StatusOr<MetricsLog> MetricsLog::Open(const std::string& path, int64_t resume_step) {
  return OpenFile(path, resume_step, std::nullopt);
}

absl::StatusOr<MetricsLog> MetricsLog::Continue(const std::string& path, Restart restart) {
  const int64_t after_step = restart.after_step;
  return OpenFile(path, after_step, std::move(restart));
}

absl::StatusOr<MetricsLog> MetricsLog::OpenFile(const std::string& path, int64_t after_step,
                                                std::optional<Restart> restart) {
  const bool continues = restart.has_value() || after_step > 0;
  struct stat info;
  for (const Beside& beside : {Beside{RunSummaryPath(path), "the summary", "goes"},
                               Beside{RestartsPath(path), "the restarts", "are noted"}}) {
    if (lstat(beside.path.c_str(), &info) == 0 && (!continues || !S_ISREG(info.st_mode))) {
      return absl::FailedPreconditionError(absl::StrCat(
          "\"", beside.path, "\" already exists; ", beside.what,
          " of the run whose metrics file is \"", path, "\" ", beside.goes,
          " there, and a fresh run never overwrites a file: remove it or choose another "
          "metrics file"));
    }
  }
  const bool exists = lstat(path.c_str(), &info) == 0;
  std::string text;
  if (exists) {
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
    PLAIT_ASSIGN_OR_RETURN(text, base::ReadFile(path));
    PLAIT_RETURN_IF_ERROR(CheckIsMetricsFile(text, path));
  }
  const std::vector<Row> rows = Rows(text);
  EarlierStarts earlier;
  if (restart.has_value()) {
    PLAIT_ASSIGN_OR_RETURN(earlier, NoteRestart(path, rows, *std::move(restart)));
  } else if (after_step > 0) {
    PLAIT_RETURN_IF_ERROR(NoteResume(path, rows, after_step));
  }
  if (exists) {
    PLAIT_RETURN_IF_ERROR(base::WriteFileAtomically(path, LinesUpTo(rows, after_step)));
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
  return MetricsLog(path, std::move(out), std::move(earlier));
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
