#include "metrics/curves_svg.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/file.h"
#include "base/json.h"
#include "base/status.h"
#include "metrics/run_summary.h"
#include "nlohmann/json.hpp"

namespace plait::metrics {
namespace {

using Json = nlohmann::json;

// The picture's layout, in SVG user units (pixels).
constexpr double kPanelWidth = 480, kPanelHeight = 300, kLegendHeight = 36;
constexpr double kMarginLeft = 64, kMarginRight = 16, kMarginTop = 28, kMarginBottom = 36;
constexpr int kPanelsPerRow = 2;
constexpr int kTargetTicks = 5;

// Matplotlib's "tab10" colours, one per run (repeating after ten).
constexpr const char* kColours[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

struct Panel {
  const char* title;
  std::vector<const char*> metrics;  // the first solid, the others dashed with dots
  bool floor;                        // draws the runs' entropy floors
};

const std::vector<Panel>& Panels() {
  static const std::vector<Panel>* panels = new std::vector<Panel>{
      {"loss (solid), eval loss (dashed), entropy floor (dotted)", {"loss", "eval_loss"}, true},
      {"learning rate", {"lr"}, false},
      {"gradient norm, before clipping", {"grad_norm"}, false},
      {"tokens/s", {"tokens_per_s"}, false},
  };
  return *panels;
}

std::string XmlEscape(absl::string_view text) {
  std::string escaped;
  for (const char c : text) {
    switch (c) {
      case '&':
        escaped += "&amp;";
        break;
      case '<':
        escaped += "&lt;";
        break;
      case '>':
        escaped += "&gt;";
        break;
      case '"':
        escaped += "&quot;";
        break;
      case '\'':
        escaped += "&apos;";
        break;
      default:
        escaped += c;
    }
  }
  return escaped;
}

// A closed interval, grown to hold values.
struct Range {
  double low = std::numeric_limits<double>::infinity();
  double high = -std::numeric_limits<double>::infinity();

  void Add(double value) {
    low = std::min(low, value);
    high = std::max(high, value);
  }
  bool empty() const { return low > high; }
  // Widened when it is a single value, so that it maps to a line rather than a point.
  Range Padded(double fraction) const {
    const double pad = high > low ? (high - low) * fraction : std::max(std::abs(low) * 0.1, 1.0);
    return {low - pad, high + pad};
  }
};

// Tick values in `range`, a round number (1, 2 or 5 times a power of ten) apart.
std::vector<double> Ticks(const Range& range) {
  const double rough = (range.high - range.low) / kTargetTicks;
  const double power = std::pow(10.0, std::floor(std::log10(rough)));
  double step = power;
  for (const double multiple : {2.0, 5.0, 10.0}) {
    if (step >= rough) break;
    step = multiple * power;
  }
  std::vector<double> ticks;
  for (double tick = std::ceil(range.low / step) * step; tick <= range.high; tick += step) {
    ticks.push_back(std::abs(tick) < step * 1e-9 ? 0.0 : tick);
  }
  return ticks;
}

std::string Number(double value) { return absl::StrFormat("%.4g", value); }

// Maps data coordinates onto one panel's plotting area.
struct Frame {
  double left, top, width, height;
  Range x, y;

  double X(double step) const { return left + (step - x.low) / (x.high - x.low) * width; }
  double Y(double value) const { return top + (y.high - value) / (y.high - y.low) * height; }
};

void DrawAxes(const Frame& frame, std::string& svg) {
  absl::StrAppendFormat(&svg,
                        "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" "
                        "stroke=\"#999\"/>\n",
                        frame.left, frame.top, frame.width, frame.height);
  for (const double tick : Ticks(frame.y)) {
    const double y = frame.Y(tick);
    absl::StrAppendFormat(&svg,
                          "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/>"
                          "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n",
                          frame.left, y, frame.left + frame.width, y, frame.left - 4, y + 4,
                          Number(tick));
  }
  for (const double tick : Ticks(frame.x)) {
    absl::StrAppendFormat(&svg, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n",
                          frame.X(tick), frame.top + frame.height + 14, Number(tick));
  }
  absl::StrAppendFormat(&svg, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">step</text>\n",
                        frame.left + frame.width / 2, frame.top + frame.height + 28);
}

void DrawPanel(const Panel& panel, const std::vector<RunCurves>& runs, const Range& steps,
               double left, double top, std::string& svg) {
  Range values;
  for (const RunCurves& run : runs) {
    for (const char* metric : panel.metrics) {
      const auto it = run.series.find(metric);
      if (it == run.series.end()) continue;
      for (const auto& point : it->second) values.Add(point.second);
    }
    if (panel.floor && run.entropy_floor) values.Add(*run.entropy_floor);
  }
  absl::StrAppendFormat(&svg,
                        "<g class=\"panel\">\n<text x=\"%.1f\" y=\"%.1f\" "
                        "font-weight=\"bold\">%s</text>\n",
                        left + kMarginLeft, top + kMarginTop - 8, XmlEscape(panel.title));
  const Frame frame{left + kMarginLeft,
                    top + kMarginTop,
                    kPanelWidth - kMarginLeft - kMarginRight,
                    kPanelHeight - kMarginTop - kMarginBottom,
                    steps,
                    values.empty() ? Range{0, 1} : values.Padded(0.05)};
  DrawAxes(frame, svg);
  for (size_t r = 0; r < runs.size(); ++r) {
    const RunCurves& run = runs[r];
    const char* colour = kColours[r % std::size(kColours)];
    if (panel.floor && run.entropy_floor) {
      const double y = frame.Y(*run.entropy_floor);
      absl::StrAppendFormat(&svg,
                            "<line class=\"floor\" data-run=\"%s\" x1=\"%.1f\" y1=\"%.2f\" "
                            "x2=\"%.1f\" y2=\"%.2f\" stroke=\"%s\" stroke-dasharray=\"2 3\"/>\n",
                            XmlEscape(run.name), frame.left, y, frame.left + frame.width, y,
                            colour);
    }
    for (size_t m = 0; m < panel.metrics.size(); ++m) {
      const auto it = run.series.find(panel.metrics[m]);
      if (it == run.series.end()) continue;
      std::vector<std::string> points;
      for (const auto& [step, value] : it->second) {
        points.push_back(absl::StrFormat("%.1f,%.2f", frame.X(step), frame.Y(value)));
      }
      absl::StrAppendFormat(
          &svg,
          "<polyline class=\"series\" data-run=\"%s\" data-metric=\"%s\" fill=\"none\" "
          "stroke=\"%s\" stroke-width=\"1.5\"%s points=\"%s\"/>\n",
          XmlEscape(run.name), panel.metrics[m], colour, m == 0 ? "" : " stroke-dasharray=\"6 3\"",
          absl::StrJoin(points, " "));
      if (m == 0) continue;
      // Evaluations are few: a dot marks each.
      for (const auto& [step, value] : it->second) {
        absl::StrAppendFormat(&svg, "<circle cx=\"%.1f\" cy=\"%.2f\" r=\"2.5\" fill=\"%s\"/>\n",
                              frame.X(step), frame.Y(value), colour);
      }
    }
  }
  svg += "</g>\n";
}

// The XML declaration, and the comment that marks a document as CurvesSvg's.
constexpr char kHead[] =
    "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<!-- training curves drawn by plait's tools/plot "
    "-->\n";

}  // namespace

bool IsCurvesSvg(absl::string_view text) { return absl::StartsWith(text, kHead); }

absl::StatusOr<RunCurves> ReadRunCurves(const std::string& path, std::string name) {
  PLAIT_ASSIGN_OR_RETURN(const std::string text, base::ReadFile(path));
  RunCurves run;
  run.name = std::move(name);
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    const absl::StatusOr<Json> parsed = base::ParseJson(path, line);
    if (!parsed.ok()) continue;
    const Json& row = *parsed;
    if (!row.is_object() || !row.contains("step") || !row["step"].is_number_integer()) continue;
    const int64_t step = row["step"].get<int64_t>();
    for (const auto& [name, value] : row.items()) {
      if (name != "step" && value.is_number()) {
        run.series[name].emplace_back(step, value.get<double>());
      }
    }
  }
  if (run.series.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", path, "\" holds no metrics row (a JSON object with a step)"));
  }
  const absl::StatusOr<std::string> summary = base::ReadFile(RunSummaryPath(path));
  if (summary.ok()) {
    const absl::StatusOr<Json> json = base::ParseJson(RunSummaryPath(path), *summary);
    if (json.ok() && json->is_object() && json->contains("entropy_floor") &&
        (*json)["entropy_floor"].is_number()) {
      run.entropy_floor = (*json)["entropy_floor"].get<double>();
    }
  }
  return run;
}

std::string CurvesSvg(const std::vector<RunCurves>& runs) {
  Range steps;
  for (const RunCurves& run : runs) {
    for (const auto& [name, points] : run.series) {
      for (const auto& point : points) steps.Add(static_cast<double>(point.first));
    }
  }
  if (steps.empty()) steps = {0, 1};
  if (steps.low == steps.high) steps = steps.Padded(0.0);
  const int rows = (static_cast<int>(Panels().size()) + kPanelsPerRow - 1) / kPanelsPerRow;
  const double width = kPanelsPerRow * kPanelWidth;
  const double height = kLegendHeight + rows * kPanelHeight;
  std::string svg = absl::StrFormat(
      "%s"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
      "viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\" font-size=\"11\">\n"
      "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n<g class=\"legend\">\n",
      kHead, width, height, width, height);
  double x = kMarginLeft;
  for (size_t r = 0; r < runs.size(); ++r) {
    absl::StrAppendFormat(&svg,
                          "<line x1=\"%.1f\" y1=\"18\" x2=\"%.1f\" y2=\"18\" stroke=\"%s\" "
                          "stroke-width=\"3\"/><text x=\"%.1f\" y=\"22\">%s</text>\n",
                          x, x + 20, kColours[r % std::size(kColours)], x + 26,
                          XmlEscape(runs[r].name));
    // Room for the name at about 6.5 units a character of the 11-unit font.
    x += 40 + 6.5 * runs[r].name.size();
  }
  svg += "</g>\n";
  for (size_t p = 0; p < Panels().size(); ++p) {
    DrawPanel(Panels()[p], runs, steps, (p % kPanelsPerRow) * kPanelWidth,
              kLegendHeight + (p / kPanelsPerRow) * kPanelHeight, svg);
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace plait::metrics
