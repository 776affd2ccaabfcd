#include "metrics/metrics_log.h"

#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/file.h"
#include "base/status.h"
#include "nlohmann/json.hpp"

namespace plait::metrics {

using Json = nlohmann::json;

absl::Status KeepRowsUpTo(const std::string& path, int64_t step) {
  std::error_code error;
  if (!std::filesystem::exists(path, error)) return absl::OkStatus();
  PLAIT_ASSIGN_OR_RETURN(const std::string text, base::ReadFile(path));
  std::string kept;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(start, end - start);
    start = end + 1;
    const Json row = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    // A row cut short by a kill is not valid JSON: dropped with the steps after the resume.
    if (row.is_discarded() || !row.is_object()) continue;
    const auto it = row.find("step");
    if (it != row.end() && it->is_number_integer() && it->get<int64_t>() <= step) {
      absl::StrAppend(&kept, line, "\n");
    }
  }
  return base::WriteFileAtomically(path, kept);
}

absl::StatusOr<MetricsLog> MetricsLog::Open(const std::string& path, int64_t resume_step) {
  PLAIT_RETURN_IF_ERROR(KeepRowsUpTo(path, resume_step));
  auto out = std::make_unique<std::ofstream>(path, std::ios::app);
  if (!*out) return absl::InvalidArgumentError(absl::StrCat("cannot write \"", path, "\""));
  return MetricsLog(path, std::move(out));
}

absl::Status MetricsLog::Append(const StepMetrics& metrics) {
  Json row = {{"step", metrics.step},
              {"loss", metrics.loss},
              {"lr", metrics.lr},
              {"tokens_per_s", metrics.tokens_per_s}};
  if (metrics.grad_norm) row["grad_norm"] = *metrics.grad_norm;
  if (metrics.skipped) row["skipped"] = true;
  if (metrics.mfu) row["mfu"] = *metrics.mfu;
  if (metrics.eval_loss) row["eval_loss"] = *metrics.eval_loss;
  *out_ << row.dump() << "\n";
  out_->flush();
  if (!*out_) return absl::DataLossError(absl::StrCat(path_, ": cannot write step ", metrics.step));
  return absl::OkStatus();
}

}  // namespace plait::metrics
