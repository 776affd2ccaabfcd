#include "metrics/progress.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/human.h"
#include "models/flop_convention.h"

namespace plait::metrics {
namespace {

// ANSI "erase to the end of the line": what a shorter line leaves of a longer one.
constexpr char kEraseToEndOfLine[] = "\x1b[K";
constexpr int kBarWidth = 20;

std::string Duration(double seconds) {
  const int64_t s = static_cast<int64_t>(std::lround(seconds));
  return s >= 60 ? absl::StrFormat("%dm%02ds", s / 60, s % 60) : absl::StrFormat("%ds", s);
}

// "[=========>          ]" for `done` of `total`.
std::string Bar(int64_t done, int64_t total) {
  const int filled = static_cast<int>(kBarWidth * done / total);
  std::string bar(kBarWidth, ' ');
  for (int i = 0; i < filled; ++i) bar[i] = '=';
  if (filled < kBarWidth) bar[filled] = '>';
  return absl::StrCat("[", bar, "]");
}

}  // namespace

void ProgressLog::Print(const std::string& line) {
  out_ << line;
  if (style_ == Style::kStatusLine) out_ << kEraseToEndOfLine;
  out_ << "\n" << std::flush;
}

void ProgressLog::Header(int64_t trained_parameters, int64_t model_parameters, int ranks,
                         int64_t tokens_per_step, std::optional<double> entropy_floor,
                         int64_t resume_step, const std::string& restart) {
  std::string header = absl::StrCat(
      "training ", base::CountOf(trained_parameters, "parameter", "parameters"),
      trained_parameters == model_parameters
          ? ""
          : absl::StrCat(" of a ", model_parameters, "-parameter model"),
      " on ", base::CountOf(ranks, "rank", "ranks"), ", ",
      base::CountOf(total_steps_, "step", "steps"), " of ", tokens_per_step, " tokens");
  if (entropy_floor) {
    absl::StrAppendFormat(&header, "; synthetic data, entropy floor %.4f nats", *entropy_floor);
  }
  Print(header);
  if (!restart.empty()) {
    Print(absl::StrCat(restart, ": ",
                       resume_step > 0 ? absl::StrCat("resumed after step ", resume_step)
                                       : "no checkpoint to resume from, starting over"));
  } else if (resume_step > 0) {
    Print(absl::StrCat("resumed after step ", resume_step));
  }
}

void ProgressLog::Summary(const RunMetrics& run) {
  // What this run trained, which a resumed one began after the step it resumed from.
  const int64_t after_step = run.steps.empty() ? 0 : run.steps.front().step - 1;
  std::string summary = absl::StrFormat(
      "done: %s%s in %.1f s, %.0f tokens/s", base::CountOf(StepsTrained(run), "step", "steps"),
      after_step > 0 ? absl::StrCat(" after step ", after_step) : "", run.seconds,
      run.tokens_per_s);
  if (run.mfu) {
    absl::StrAppendFormat(&summary, ", MFU %.2f%% (%s)", 100.0 * *run.mfu, models::kFlopConvention);
  }
  if (run.peak_device_memory_bytes) {
    absl::StrAppend(&summary, ", peak device memory ",
                    base::HumanBytes(static_cast<double>(*run.peak_device_memory_bytes)),
                    " per rank");
  }
  if (run.best_eval_loss) {
    absl::StrAppendFormat(&summary, ", best eval loss %.4f", *run.best_eval_loss);
  }
  if (run.entropy_floor && run.best_eval_loss) {
    absl::StrAppendFormat(&summary, " (entropy floor %.4f, gap %.4f nats)", *run.entropy_floor,
                          *run.best_eval_loss - *run.entropy_floor);
  }
  // The objective's final evaluation (DPO's reward accuracy and margin).
  if (!run.steps.empty()) {
    for (const auto& [name, value] : run.steps.back().eval_named) {
      if (name == "rewards/accuracies" || name == "rewards/margins") {
        absl::StrAppendFormat(&summary, ", final eval_%s %.4f", name, value);
      }
    }
  }
  if (!run.peak_memory_bytes.empty()) {
    const auto peak = std::max_element(run.peak_memory_bytes.begin(), run.peak_memory_bytes.end());
    absl::StrAppend(&summary, "; peak memory ", base::HumanBytes(*peak), " (rank ",
                    peak - run.peak_memory_bytes.begin(), ")");
  }
  const int64_t skipped = SkippedSteps(run);
  if (skipped > 0) {
    absl::StrAppend(&summary, ", ", base::CountOf(skipped, "update", "updates"), " skipped");
  }
  if (run.checkpoints_written > 0) {
    absl::StrAppend(&summary, ", ",
                    base::CountOf(run.checkpoints_written, "checkpoint", "checkpoints"),
                    " written");
  }
  if (!run.restarts.empty()) {
    const int64_t repeated = StepsRepeated(run);
    absl::StrAppend(&summary, ", ",
                    base::CountOf(static_cast<int64_t>(run.restarts.size()), "restart", "restarts"),
                    " (", base::CountOf(repeated, "step", "steps"), " trained again)");
  }
  Print(summary);
}

void ProgressLog::Step(const StepMetrics& metrics, double tokens_per_s, double eta_seconds) {
  std::string fields = absl::StrFormat("loss %.4f | lr %.2e | %.0f tok/s | ETA %s", metrics.loss,
                                       metrics.lr, tokens_per_s, Duration(eta_seconds));
  for (const auto& [name, value] : metrics.named) {
    absl::StrAppendFormat(&fields, " | %s %.4f", name, value);
  }
  if (metrics.eval_loss) absl::StrAppendFormat(&fields, " | eval %.4f", *metrics.eval_loss);
  for (const auto& [name, value] : metrics.eval_named) {
    absl::StrAppendFormat(&fields, " | eval_%s %.4f", name, value);
  }
  if (metrics.skipped)
    absl::StrAppend(&fields, " | update skipped: non-finite ", SkipCause(metrics));
  const std::string step = absl::StrFormat("step %d/%d", metrics.step, total_steps_);
  const bool stays = metrics.step == total_steps_ || metrics.eval_loss || metrics.skipped;
  if (stays) {
    Print(absl::StrCat(step, " | ", fields));
  } else if (style_ == Style::kStatusLine) {
    // Ends with a carriage return, so the next step draws over it.
    out_ << step << " " << Bar(metrics.step, total_steps_) << " " << fields << kEraseToEndOfLine
         << "\r" << std::flush;
  } else if (metrics.step % log_every_ == 0) {
    Print(absl::StrCat(step, " | ", fields));
  }
}

}  // namespace plait::metrics
