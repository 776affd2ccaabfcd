// Draws the training curves of one or more metrics files (training.metrics_file) as one SVG,
// for a quick look at runs without TensorBoard: loss and evaluation loss against the step
// with the entropy floor when the run summary beside a file gives it, the learning rate, the
// gradient norm and tokens/s, each run in its own colour:
//
//   bazel run //tools:plot -- --out=curves.svg runs/{llama_fsdp,llama_ddp}/latest/metrics.jsonl
//
// Writes a new --out, or replaces a picture an earlier plot drew there; any other file is
// refused. Exits 1 when a metrics file cannot be read or the picture cannot be written, 2 on a
// usage error.
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "base/file.h"
#include "base/guarded_main.h"
#include "base/own_output.h"
#include "metrics/curves_svg.h"

ABSL_FLAG(std::string, out, "", "the SVG file to create");

namespace {

constexpr char kUsage[] = "usage: plot --out=CURVES.svg METRICS.jsonl...";

int Plot(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      absl::StrCat("draws the curves of metrics files as one SVG.\n  ", kUsage));
  const std::vector<char*> files = absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_out).empty() || files.size() < 2) {
    std::cerr << kUsage << "\n";
    return 2;
  }
  const std::string out = plait::base::UserPath(absl::GetFlag(FLAGS_out));
  const absl::StatusOr<bool> replaces = plait::base::CheckOutputFile(
      out,
      [](const std::string& path) {
        return plait::metrics::IsCurvesSvg(plait::base::ReadFile(path).value_or(""));
      },
      "plot");
  if (!replaces.ok()) {
    std::cerr << "plot: --out: " << replaces.status().message() << "\n";
    return 1;
  }
  std::vector<plait::metrics::RunCurves> runs;
  for (size_t i = 1; i < files.size(); ++i) {
    // Named as the user named the file, not by its path under bazel run.
    absl::StatusOr<plait::metrics::RunCurves> run = plait::metrics::ReadRunCurves(
        plait::base::UserPath(files[i]), std::string(absl::StripSuffix(files[i], ".jsonl")));
    if (!run.ok()) {
      std::cerr << "plot: " << run.status().message() << "\n";
      return 1;
    }
    runs.push_back(*std::move(run));
  }
  if (absl::Status status = plait::base::WriteFileAtomically(out, plait::metrics::CurvesSvg(runs));
      !status.ok()) {
    std::cerr << "plot: " << status.message() << "\n";
    return 1;
  }
  std::cout << "wrote " << out << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return plait::base::RunCatchingExceptions("plot", [&] { return Plot(argc, argv); });
}
