// The samples a run draws (plan.training.samples): its prompts encoded once with the plan's
// tokenizer, completions drawn by every rank after each step that is due
// (generation::GenerateOnMesh: each data-parallel rank its share, the weights kept gathered
// for the phase where the plan's memory estimate says they fit), and rank 0 writing them,
// after those of the earlier steps, to the samples file, one JSON object a completion with the
// step it was drawn after. A fresh run refuses a samples file that exists, as it refuses its
// metrics file; a resumed run keeps the lines of the steps up to the one it resumes from.
//
//   PLAIT_ASSIGN_OR_RETURN(std::optional<RunSamples> samples,
//                          RunSamples::Open(resolved, mesh, resume_step));
//   if (samples && samples->IsDue(step)) PLAIT_RETURN_IF_ERROR(samples->Draw(step, *prepared));
#ifndef PLAIT_TRAINER_RUN_SAMPLES_H_
#define PLAIT_TRAINER_RUN_SAMPLES_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "data/tokenizer/tokenizer.h"
#include "generation/generate.h"
#include "parallel/device_mesh.h"
#include "plan/resolved_plan.h"
#include "prepared/prepared_model.h"

namespace plait::trainer {

class RunSamples {
 public:
  // The samples of `resolved` (nullopt where it draws none), on rank mesh.rank(), for a run
  // that resumes after `resume_step` (0: a fresh one). Errors name plan.training.samples'
  // fields: its tokenizer, or a file that exists (fresh) or cannot be read (resumed).
  static absl::StatusOr<std::optional<RunSamples>> Open(const plan::ResolvedPlan& resolved,
                                                        const parallel::DeviceMesh& mesh,
                                                        int64_t resume_step);

  // Whether the samples are drawn after step `step` (1-based): every every_steps, and the last.
  bool IsDue(int64_t step) const;

  // Draws the completions of the prompts after step `step` on `prepared` (every rank of the
  // mesh must call it), and rank 0 writes them after the earlier ones.
  absl::Status Draw(int64_t step, prepared::PreparedModel& prepared);

  // The samples file.
  const std::string& path() const { return path_; }

 private:
  RunSamples(const plan::ResolvedPlan& resolved, const parallel::DeviceMesh& mesh)
      : resolved_(&resolved), mesh_(&mesh) {}

  const plan::ResolvedPlan* resolved_;
  const parallel::DeviceMesh* mesh_;
  std::shared_ptr<const data::tokenizer::Tokenizer> tokenizer_;
  std::vector<std::vector<int64_t>> prompts_;
  generation::GenerateOptions options_;
  bool keep_gathered_ = false;
  std::string path_;
  std::string lines_;  // rank 0's: every line written so far
};

}  // namespace plait::trainer

#endif  // PLAIT_TRAINER_RUN_SAMPLES_H_
