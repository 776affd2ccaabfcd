// What one optimizer step of a training run measured: the row of the JSONL metrics file and
// of the progress output (progress.h).
#ifndef PLAIT_METRICS_STEP_METRICS_H_
#define PLAIT_METRICS_STEP_METRICS_H_

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace plait::metrics {

// An objective's metrics besides the loss, by TRL's names ("rewards/margins", ...), in the
// order it reports them.
using NamedMetrics = std::vector<std::pair<std::string, double>>;

struct StepMetrics {
  int64_t step = 0;   // 1 for the first optimizer step
  double loss = 0.0;  // mean over the global batch
  double lr = 0.0;
  std::optional<double> grad_norm;  // before clipping; when the optimizer clips
  bool skipped = false;             // a non-finite loss or gradient norm: no update (SkipCause)
  double tokens_per_s = 0.0;        // global batch tokens / step time
  std::optional<double> mfu;        // when training.peak_flops_per_rank is set
  std::optional<double> eval_loss;  // when evaluated after this step
  NamedMetrics named;               // the objective's, over the global batch
  NamedMetrics eval_named;          // the same at the evaluation, when evaluated
  // The most device memory this rank's tensors held at once in the step, its evaluation
  // included; on CUDA only.
  std::optional<int64_t> peak_device_memory_bytes;
};

// The step's numbers under the names of the metrics file's keys, which TensorBoard's scalars
// take too: loss, lr, tokens_per_s, then those set of grad_norm, mfu, eval_loss and
// peak_device_memory_bytes, the
// objective's metrics and its evaluation's ("eval_" + name). Without `skipped`, a flag.
NamedMetrics Scalars(const StepMetrics& metrics);

// What was not finite in a step whose update was skipped: "loss" when its loss is not
// finite (the trainer then skips the update whatever the gradients), else "gradient norm".
const char* SkipCause(const StepMetrics& metrics);

// The updates skipped in a row up to the last step counted, and what was not finite in them:
// the errors that stop a run which trains nothing say it.
class SkippedUpdates {
 public:
  void Count(const StepMetrics& metrics);
  int64_t in_a_row() const { return in_a_row_; }
  // "the loss was not finite", or "the gradient norm or the loss was not finite".
  std::string Why() const;

 private:
  int64_t in_a_row_ = 0;
  std::set<std::string> causes_;  // SkipCause's
};

// A restart of a run by its launcher (parallel::World::restart_count): the step of the
// checkpoint it resumed from, why the start before it ended, and that start's steps after the
// checkpoint, whose rows the restart dropped from the metrics file and which it trained again.
struct Restart {
  int64_t number = 0;      // 1 for the first restart of the run
  int64_t after_step = 0;  // 0: it found no checkpoint and started over
  std::string cause;       // parallel::World::restart_cause; empty when the launcher gave none
  std::vector<StepMetrics> repeated;
};

// What a whole run measured: its steps, and what its summary reports. A resumed run's are
// those of the steps it trained. A run its launcher restarted (WholeRun, run_summary.h) holds
// every step once in `steps`, from its first start to its last, and in `restarts` the steps
// it trained again.
struct RunMetrics {
  std::vector<StepMetrics> steps;
  std::optional<double> entropy_floor;  // the data's loss floor, when known (synthetic data)
  std::optional<double> best_eval_loss;
  double seconds = 0.0;
  double tokens_per_s = 0.0;  // over the steps trained
  std::optional<double> mfu;
  std::vector<int64_t> peak_memory_bytes;  // per rank: the process's peak resident memory
  // The plan's memory estimate for a rank (plan/memory_estimate.h), and what each rank's
  // tensors held at the peak of the step the trainer checked it on (the second a start
  // trained): LibTorch's CPU allocator's count, or CUDA's caching allocator's; what the
  // estimate counts. Unset and empty when no second step was trained.
  std::optional<double> memory_estimate_bytes;
  std::vector<int64_t> peak_tensor_bytes;
  int64_t checkpoints_written = 0;
  // The most device memory any rank's tensors held at once in the run; on CUDA only.
  std::optional<int64_t> peak_device_memory_bytes;
  std::vector<Restart> restarts;  // in order; none for a run that was not restarted
  std::string samples_file;       // where it wrote its samples; empty: it drew none
};

// The steps `run`'s restarts trained again.
int64_t StepsRepeated(const RunMetrics& run);

// The steps `run` trained: those of its steps and those its restarts trained again.
int64_t StepsTrained(const RunMetrics& run);

// The steps `run` trained (StepsTrained) whose update was skipped.
int64_t SkippedSteps(const RunMetrics& run);

}  // namespace plait::metrics

#endif  // PLAIT_METRICS_STEP_METRICS_H_
