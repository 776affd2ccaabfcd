// Rank 0's progress output of a training run. On a terminal (parallel::StdoutIsTerminal) one
// status line is redrawn in place after every step: a bar, the step, loss, learning rate,
// tokens/s and the time left. Elsewhere (a file, a pipe, CI logs) the same fields are printed
// as plain lines, every `log_every` steps. Either way a step that was evaluated, whose update
// was skipped, or that is the last is printed as a line that stays, as are the lines given to
// Print (the header, the summary), which draw over the status line.
//
//   ProgressLog progress(std::cout,
//                        parallel::StdoutIsTerminal() ? ProgressLog::Style::kStatusLine
//                                                     : ProgressLog::Style::kPlainLines,
//                        /*total_steps=*/100, /*log_every=*/10);
//   progress.Header(/*trained_parameters=*/4999424, /*model_parameters=*/4999424, /*ranks=*/2,
//                   /*tokens_per_step=*/1024, 1.1369, /*resume_step=*/0, /*restart=*/"");
//   progress.Step(metrics, /*tokens_per_s=*/3421, /*eta_seconds=*/19);
#ifndef PLAIT_METRICS_PROGRESS_H_
#define PLAIT_METRICS_PROGRESS_H_

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>

#include "metrics/step_metrics.h"

namespace plait::metrics {

class ProgressLog {
 public:
  enum class Style { kStatusLine, kPlainLines };

  // `log_every` > 0 spaces the plain lines; the status line is redrawn every step.
  ProgressLog(std::ostream& out, Style style, int64_t total_steps, int64_t log_every)
      : out_(out), style_(style), total_steps_(total_steps), log_every_(log_every) {}

  // A line that stays.
  void Print(const std::string& line);

  // The run's first lines: how many parameters train (and, when a preparation step froze
  // some or added adapters, of how large a model) on how many ranks, with the data's loss
  // floor when it is known, and the step a resumed run continues after (0: a fresh run).
  // `restart` says which start of a restarted job this is and why ("restart 1 after rank 1
  // was killed by signal 9 (Killed)"), "" for a first start; the resume line then begins
  // with it, and says so when the restart starts over for want of a checkpoint.
  void Header(int64_t trained_parameters, int64_t model_parameters, int ranks,
              int64_t tokens_per_step, std::optional<double> entropy_floor, int64_t resume_step,
              const std::string& restart);

  // The run's last line: the steps `run` trained (StepsTrained) and, for a resumed run, the
  // step it resumed after, time, speed, MFU, the best evaluation and its gap to the floor, the
  // largest rank's peak memory, and the skipped updates, checkpoints and restarts (with the
  // steps they trained again) when there were any.
  void Summary(const RunMetrics& run);

  // The progress after `metrics.step`: `tokens_per_s` averaged since the start, and the
  // estimated seconds left.
  void Step(const StepMetrics& metrics, double tokens_per_s, double eta_seconds);

 private:
  std::ostream& out_;
  Style style_;
  int64_t total_steps_;
  int64_t log_every_;
};

}  // namespace plait::metrics

#endif  // PLAIT_METRICS_PROGRESS_H_
