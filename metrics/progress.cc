#include "metrics/progress.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

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

void ProgressLog::Step(const StepMetrics& metrics, double tokens_per_s, double eta_seconds) {
  std::string fields = absl::StrFormat("loss %.4f | lr %.2e | %.0f tok/s | ETA %s", metrics.loss,
                                       metrics.lr, tokens_per_s, Duration(eta_seconds));
  if (metrics.eval_loss) absl::StrAppendFormat(&fields, " | eval %.4f", *metrics.eval_loss);
  if (metrics.skipped) fields += " | update skipped: non-finite gradient norm";
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
