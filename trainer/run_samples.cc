#include "trainer/run_samples.h"

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/file.h"
#include "base/json.h"
#include "base/status.h"
#include "data/tokenizer/load_tokenizer.h"
#include "generation/completion_text.h"
#include "generation/on_mesh.h"
#include "plan/memory_estimate.h"

namespace plait::trainer {
namespace {

constexpr char kField[] = "plan.training.samples";

// The lines of the samples file `path` drawn after steps up to `last_step`: what a run
// resumed after that step keeps.
absl::StatusOr<std::string> LinesUpTo(const std::string& path, int64_t last_step) {
  PLAIT_ASSIGN_OR_RETURN(const std::string text, base::ReadFile(path));
  std::string kept;
  int line_number = 0;
  for (const absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    ++line_number;
    const std::string where = absl::StrCat(path, ":", line_number);
    PLAIT_ASSIGN_OR_RETURN(const nlohmann::json json, base::ParseJson(where, line));
    if (!json.is_object())
      return absl::InvalidArgumentError(absl::StrCat(where, ": not a JSON object"));
    PLAIT_ASSIGN_OR_RETURN(const int64_t step, base::JsonFields(json, where).Int("step"));
    if (step <= last_step) absl::StrAppend(&kept, line, "\n");
  }
  return kept;
}

}  // namespace

absl::StatusOr<std::optional<RunSamples>> RunSamples::Open(const plan::ResolvedPlan& resolved,
                                                           const parallel::DeviceMesh& mesh,
                                                           int64_t resume_step) {
  if (!resolved.training().has_samples()) return std::nullopt;
  const generation::SamplesConfig& config = resolved.training().samples();
  RunSamples samples(resolved, mesh);
  samples.path_ = resolved.samples_path;
  PLAIT_ASSIGN_OR_RETURN(
      std::unique_ptr<data::tokenizer::Tokenizer> tokenizer,
      base::Annotate(data::tokenizer::LoadTokenizer(base::UserPath(resolved.samples_tokenizer)),
                     absl::StrCat(kField, ".tokenizer")));
  samples.tokenizer_ = std::move(tokenizer);
  for (int i = 0; i < config.prompts_size(); ++i) {
    PLAIT_ASSIGN_OR_RETURN(
        const std::vector<int32_t> ids,
        base::Annotate(samples.tokenizer_->Encode(config.prompts(i), /*add_special_tokens=*/true),
                       absl::StrCat(kField, ".prompts[", i, "]")));
    samples.prompts_.emplace_back(ids.begin(), ids.end());
  }
  // A completion ends at the model's end-of-sequence ids (those of its Hugging Face folder,
  // where it has one) and at its tokenizer's.
  std::vector<int64_t> ends;
  if (const std::string& config_path = resolved.plan.model().hf_config_path();
      !config_path.empty()) {
    const std::filesystem::path folder =
        std::filesystem::path(base::UserPath(config_path)).parent_path();
    PLAIT_ASSIGN_OR_RETURN(ends, generation::EndOfSequenceIds(folder.string()));
  }
  samples.options_.end_of_sequence = generation::WithTokenizerEnd(ends, *samples.tokenizer_);
  samples.options_.detokenize = [tokenizer = samples.tokenizer_](const std::vector<int64_t>& ids) {
    return generation::CompletionText(*tokenizer, ids);
  };
  PLAIT_ASSIGN_OR_RETURN(const plan::MemoryEstimate estimate, plan::EstimateMemory(resolved));
  samples.keep_gathered_ = estimate.generation.has_value() && estimate.generation->keep_gathered;

  absl::Status own;
  if (mesh.rank() == 0) {
    const bool exists = std::filesystem::exists(samples.path_);
    if (resume_step == 0 && exists) {
      own = absl::AlreadyExistsError(absl::StrCat(
          kField, ".file: ", samples.path_,
          " exists; a fresh run never writes over a file (give another, or a run_dir)"));
    } else if (exists) {
      absl::StatusOr<std::string> kept = LinesUpTo(samples.path_, resume_step);
      if (kept.ok()) samples.lines_ = *std::move(kept);
      own = base::Annotate(kept.status(), absl::StrCat(kField, ".file"));
    }
  }
  PLAIT_RETURN_IF_ERROR(mesh.Agree(own, "opening the samples file"));
  return samples;
}

bool RunSamples::IsDue(int64_t step) const {
  const int64_t every = resolved_->training().samples().every_steps();
  return step == resolved_->training().steps() || (every > 0 && step % every == 0);
}

absl::Status RunSamples::Draw(int64_t step, prepared::PreparedModel& prepared) {
  const generation::SamplesConfig& config = resolved_->training().samples();
  const std::string when = absl::StrCat("samples after step ", step);
  PLAIT_ASSIGN_OR_RETURN(
      const std::vector<generation::Completion> completions,
      base::Annotate(generation::GenerateOnMesh(prepared, *mesh_, prompts_, config.sampling(),
                                                options_, keep_gathered_),
                     when));
  if (mesh_->rank() != 0) return absl::OkStatus();
  PLAIT_ASSIGN_OR_RETURN(
      const std::string lines,
      base::Annotate(generation::CompletionLines(completions, *tokenizer_, {{"step", step}}),
                     when));
  absl::StrAppend(&lines_, lines);
  return base::Annotate(base::WriteFileAtomically(path_, lines_), absl::StrCat(kField, ".file"));
}

}  // namespace plait::trainer
