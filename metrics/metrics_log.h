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
// A restart first notes itself in the run's restarts file beside the metrics file
// (RestartsPath: "metrics.restarts.jsonl"), one JSON object a line: its number, the step it
// resumed after, why the start before it ended and, verbatim, the rows it drops, which were
// trained and are trained again:
//   {"restart":1,"after_step":20,"cause":"rank 1 was killed by signal 9 (Killed)",
//    "repeated":[{"loss":2.31,...,"step":21,...},...]}
// so that the summary covers every start of the run (run_summary.h's WholeRun). A restart
// that ended before it opened the metrics file leaves no line: the next one drops, and notes,
// the rows it would have dropped, but that restart's cause is lost. A resumed run whose
// metrics file keeps an earlier run's rows begins the file with the step it resumed after,
// {"restart":0,"after_step":20}: its own restarts count from there. A fresh run refuses to
// find a restarts file, as it refuses the summary.
//
//   PLAIT_ASSIGN_OR_RETURN(MetricsLog log, MetricsLog::Open("metrics.jsonl", resume_step));
//   PLAIT_RETURN_IF_ERROR(log.Append(metrics));  // {"step":1,"loss":2.31,"lr":0.001,...}
//   PLAIT_RETURN_IF_ERROR(log.WriteSummary(run));
#ifndef PLAIT_METRICS_METRICS_LOG_H_
#define PLAIT_METRICS_METRICS_LOG_H_

#include <cstdint>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "metrics/run_summary.h"
#include "metrics/step_metrics.h"

namespace plait::metrics {

class MetricsLog {
 public:
  // Creates `path`, or with `resume_step` > 0 continues it after keeping its rows of steps up
  // to `resume_step` (the others, and a row cut short by a kill, are dropped). Refused,
  // naming the path and why, before anything is written: a path that exists for a fresh run,
  // or that is not a regular file (a directory, link, FIFO, device), or not a metrics file;
  // its summary's path or its restarts file's when it exists for a fresh run or is not a
  // regular file.
  static absl::StatusOr<MetricsLog> Open(const std::string& path, int64_t resume_step);

  // Open for a run that an earlier start of the same job began (a launcher restarted its
  // ranks): as with `resume_step` = `restart.after_step`, but also for 0, where a restart
  // found no checkpoint and starts over, and the earlier start's rows are all dropped. The
  // restart, with the rows it drops, is noted in the restarts file first, and what the earlier
  // starts left is read (earlier()); a restarts file that is not one is refused, naming its
  // line. `restart.repeated` is ignored.
  static absl::StatusOr<MetricsLog> Continue(const std::string& path, Restart restart);

  // Writes one row and flushes it. Optional fields appear only when set.
  absl::Status Append(const StepMetrics& metrics);

  // Writes the run's summary (RunSummaryJson) beside the metrics file, replacing a resumed
  // run's earlier one.
  absl::Status WriteSummary(const RunMetrics& run) const;

  // For a log that Continue opened, what the run's earlier starts left: their rows kept in
  // the metrics file (from its first start's), and its restarts, this one last, each with
  // the rows it dropped; empty for Open's.
  const EarlierStarts& earlier() const { return earlier_; }

 private:
  // Open (`restart` unset) and Continue.
  static absl::StatusOr<MetricsLog> OpenFile(const std::string& path, int64_t after_step,
                                             std::optional<Restart> restart);

  MetricsLog(std::string path, std::unique_ptr<std::ofstream> out, EarlierStarts earlier)
      : path_(std::move(path)), out_(std::move(out)), earlier_(std::move(earlier)) {}

  std::string path_;
  std::unique_ptr<std::ofstream> out_;
  EarlierStarts earlier_;
};

// The rows of `path` of steps up to `step`, the rest dropped; a missing file stays missing.
absl::Status KeepRowsUpTo(const std::string& path, int64_t step);

}  // namespace plait::metrics

#endif  // PLAIT_METRICS_METRICS_LOG_H_
