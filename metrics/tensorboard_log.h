// TensorBoard's view of a training run (`tensorboard --logdir DIR`): rank 0 writes every
// step's numbers as scalars, under the names the metrics file gives them (Scalars in
// step_metrics.h), and the plan as text, to an event file of its own in DIR. Each run, a
// resumed one too, creates a new file named as TensorBoard's writers name theirs
// (events.out.tfevents.<seconds>.<host>.<pid>.<n>) and never writes over one; every event is
// flushed as it is written, so a killed run leaves each finished step readable.
//
//   PLAIT_ASSIGN_OR_RETURN(TensorBoardLog log, TensorBoardLog::Open("runs/a", resume_step));
//   PLAIT_RETURN_IF_ERROR(log.AppendText("plan", plan_text, resume_step + 1));
//   PLAIT_RETURN_IF_ERROR(log.Append(metrics));  // scalars "loss", "lr", ... at metrics.step
#ifndef PLAIT_METRICS_TENSORBOARD_LOG_H_
#define PLAIT_METRICS_TENSORBOARD_LOG_H_

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "metrics/step_metrics.h"
#include "metrics/tensorboard_event.pb.h"

namespace plait::metrics {

class TensorBoardLog {
 public:
  // Creates `dir` when it is missing, and a new event file in it that starts with the format's
  // version and a start marker at step resume_step + 1, from which TensorBoard drops the steps
  // of earlier files (those a resumed run writes again). Refused, naming the path, when `dir`
  // is not a folder or the file cannot be created.
  static absl::StatusOr<TensorBoardLog> Open(const std::string& dir, int64_t resume_step);

  const std::string& path() const { return path_; }

  // `text` at `step`, shown verbatim by TensorBoard's text plugin (as a fenced code block of
  // its markdown).
  absl::Status AppendText(const std::string& tag, absl::string_view text, int64_t step);

  // Scalars(metrics) at metrics.step, as one event.
  absl::Status Append(const StepMetrics& metrics);

 private:
  struct CloseFile {
    void operator()(std::FILE* file) const { std::fclose(file); }
  };

  TensorBoardLog(std::string path, std::unique_ptr<std::FILE, CloseFile> file)
      : path_(std::move(path)), file_(std::move(file)) {}

  // Stamps `event` with the wall time and writes it as one record, flushed.
  absl::Status Write(tensorboard::Event event);

  std::string path_;
  std::unique_ptr<std::FILE, CloseFile> file_;
};

}  // namespace plait::metrics

#endif  // PLAIT_METRICS_TENSORBOARD_LOG_H_
