// Training curves as a picture, for a quick look at runs without TensorBoard
// (//tools:plot): one SVG with four panels against the step, the loss with the evaluation
// loss (dashed) and the data's entropy floor when a run knows it, the learning rate, the
// gradient norm and tokens/s, each run in its own colour and named in the legend:
//
//   PLAIT_ASSIGN_OR_RETURN(RunCurves a, ReadRunCurves("runs/a/metrics.jsonl", "a"));
//   PLAIT_ASSIGN_OR_RETURN(RunCurves b, ReadRunCurves("runs/b/metrics.jsonl", "b"));
//   std::string svg = CurvesSvg({a, b});
#ifndef PLAIT_METRICS_CURVES_SVG_H_
#define PLAIT_METRICS_CURVES_SVG_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace plait::metrics {

// One run's numbers to draw.
struct RunCurves {
  std::string name;  // in the legend
  // Each metric's (step, value) points, by the metrics file's names ("loss", "eval_loss", ...).
  std::map<std::string, std::vector<std::pair<int64_t, double>>> series;
  std::optional<double> entropy_floor;
};

// The run of the metrics file `path`, named `name` in the legend, with the entropy floor
// from the run summary beside it (run_summary.h) when there is one. A row that is not
// an object with a step (the last one, cut short by a killed run) is left out, and so is a
// value that is not a number. An error naming the path when it cannot be read or holds no row.
absl::StatusOr<RunCurves> ReadRunCurves(const std::string& path, std::string name);

// The SVG document of `runs`' curves; its first two lines mark it as CurvesSvg's.
std::string CurvesSvg(const std::vector<RunCurves>& runs);

// Whether `text` is a document CurvesSvg wrote: what a rerun of //tools:plot may replace.
bool IsCurvesSvg(absl::string_view text);

}  // namespace plait::metrics

#endif  // PLAIT_METRICS_CURVES_SVG_H_
