// The metrics file of a training run: one JSON object per optimizer step (JSONL), written by
// rank 0 and flushed after every row, so a run that is killed leaves every finished step in
// it. A fresh run creates the file and refuses a path that exists, so a misnamed path never
// destroys a user's file. A resumed run continues its metrics file at the step it resumes
// from: the rows after that step (logged after the checkpoint, before the kill) are dropped,
// since the run writes them again; so does a run its launcher restarted, even one that found
// no checkpoint and starts over (Continue). At the end of the run its summary goes beside it
// (run_summary.h: "metrics.jsonl" -> "metrics.run_summary.json"), which a fresh run
// refuses to find there as it refuses its metrics file.
//
//   PLAIT_ASSIGN_OR_RETURN(MetricsLog log, MetricsLog::Open("metrics.jsonl", resume_step));
//   PLAIT_RETURN_IF_ERROR(log.Append(metrics));  // {"step":1,"loss":2.31,"lr":0.001,...}
//   PLAIT_RETURN_IF_ERROR(log.WriteSummary(run));
#ifndef PLAIT_METRICS_METRICS_LOG_H_
#define PLAIT_METRICS_METRICS_LOG_H_

#include <cstdint>
#include <fstream>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "metrics/step_metrics.h"

namespace plait::metrics {

class MetricsLog {
 public:
  // Creates `path`, or with `resume_step` > 0 continues it after keeping its rows of steps up
  // to `resume_step` (the others, and a row cut short by a kill, are dropped). Refused,
  // naming the path and why, before anything is written: a path that exists for a fresh run,
  // or that is not a regular file (a directory, link, FIFO, device), or not a metrics file;
  // its summary's path when it exists for a fresh run or is not a regular file.
  static absl::StatusOr<MetricsLog> Open(const std::string& path, int64_t resume_step);

  // Open for a run that an earlier start of the same job began (a launcher restarted its
  // ranks): as with `resume_step` = `after_step`, but also for 0, where a restart found no
  // checkpoint and starts over, and the earlier start's rows are all dropped.
  static absl::StatusOr<MetricsLog> Continue(const std::string& path, int64_t after_step);

  // Writes one row and flushes it. Optional fields appear only when set.
  absl::Status Append(const StepMetrics& metrics);

  // Writes the run's summary (RunSummaryJson) beside the metrics file, replacing a resumed
  // run's earlier one.
  absl::Status WriteSummary(const RunMetrics& run) const;

 private:
  // Open, and Continue when `continues`.
  static absl::StatusOr<MetricsLog> OpenFile(const std::string& path, bool continues,
                                             int64_t after_step);

  MetricsLog(std::string path, std::unique_ptr<std::ofstream> out)
      : path_(std::move(path)), out_(std::move(out)) {}

  std::string path_;
  std::unique_ptr<std::ofstream> out_;
};

// The rows of `path` of steps up to `step`, the rest dropped; a missing file stays missing.
absl::Status KeepRowsUpTo(const std::string& path, int64_t step);

}  // namespace plait::metrics

#endif  // PLAIT_METRICS_METRICS_LOG_H_
