#include "trainer/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ATen/Context.h"
#include "ATen/core/Tensor.h"
#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/allocation_counter.h"
#include "base/forward_generator.h"
#include "base/hash.h"
#include "base/heap.h"
#include "base/human.h"
#include "base/memory.h"
#include "base/status.h"
#include "base/torch_compat.h"
#include "data/data_loader.h"
#include "google/protobuf/text_format.h"
#include "metrics/metrics_log.h"
#include "metrics/progress.h"
#include "metrics/run_summary.h"
#include "metrics/tensorboard_log.h"
#include "models/causal_lm.h"
#include "models/estimates.h"
#include "models/model_config.h"
#include "models/safetensors.h"
#include "objectives/metric_means.h"
#include "objectives/model_losses.h"
#include "objectives/objective.h"
#include "objectives/step_items.h"
#include "optim/optimizer.h"
#include "parallel/device.h"
#include "plan/compute_dtype.h"
#include "plan/memory_estimate.h"
#include "prepared/prepared_model.h"
#include "sched/schedule_builder.h"
#include "torch/csrc/autograd/generated/variable_factories.h"
#include "trainer/run_checkpoints.h"
#include "trainer/run_samples.h"
#include "wrap/micro_batch_executor.h"

namespace plait::trainer {
namespace {

using ::plait::prepared::BuildOptimizer;
using ::plait::prepared::CheckEveryParameterHasGradient;
using ::plait::prepared::PreparedModel;
using ::plait::prepared::Role;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// "restart 1 after rank 1 was killed by signal 9 (Killed)" for a restarted job, "" for its
// first start.
std::string RestartLine(const TrainOptions& options) {
  if (options.restart_count == 0) return "";
  return absl::StrCat("restart ", options.restart_count,
                      options.restart_cause.empty() ? "" : " after ", options.restart_cause);
}

// How many parameters `parameters` (a rank's trainable parts) train over every rank of `mesh`,
// each element once: the elements of the parts held as replica 0, the ones a checkpoint
// saves (every rank must call it).
absl::StatusOr<int64_t> TrainedParameters(
    const std::vector<parallel::TrainableParameter>& parameters, const parallel::DeviceMesh& mesh) {
  int64_t own = 0;
  for (const parallel::TrainableParameter& parameter : parameters) {
    if (parameter.slice.replica == 0) own += parameter.slice.box.numel();
  }
  PLAIT_ASSIGN_OR_RETURN(const std::vector<int64_t> per_rank, mesh.PerRank(own));
  return std::accumulate(per_rank.begin(), per_rank.end(), int64_t{0});
}

// The next batch of `loader` on `device`, its copy in host memory, and the items
// `objective` scores of it on this rank (of its slice of each sequence under context
// parallelism: `preparation`'s OwnSlice), counted on the host before the batch moves.
struct CountedBatch {
  data::Batch batch;
  data::Batch host;
  int64_t items;
  // The objective's part of the batch computed by the frozen model it reads
  // (TrainingRun::ReadFrozen); undefined where it reads none.
  at::Tensor frozen_read = {};
};
absl::StatusOr<CountedBatch> NextCounted(data::DataLoader& loader,
                                         const objectives::Objective& objective,
                                         const wrap::Preparation& preparation,
                                         const at::Device& device) {
  PLAIT_ASSIGN_OR_RETURN(data::Batch host, loader.Next());
  data::Batch own = host;
  own.inputs = preparation.OwnSlice(host.inputs);
  own.targets = preparation.OwnSlice(host.targets);
  const int64_t items = objective.ScoredItems(own);
  data::Batch batch = data::ToDevice(host, device);
  return CountedBatch{std::move(batch), std::move(host), items};
}

// The peak FLOP/s of one rank in the dtype the plan's model computes in (DTYPE_AUTO
// resolved), MFU's denominator.
double PeakFlopsPerRank(const plan::Plan& plan) {
  const plan::TrainingConfig& training = plan.training();
  if (plan.model().dtype() == base::DTYPE_BFLOAT16 && training.peak_bf16_flops_per_rank() > 0) {
    return training.peak_bf16_flops_per_rank();
  }
  return training.peak_flops_per_rank();
}

// The seed of the random draws of step `step` (0-based) on `rank`: the same whether or when the
// run evaluated, in a straight run and in one resumed before the step.
uint64_t StepSeed(uint64_t run_seed, int rank, int64_t step) {
  return base::SplitMix64(
      base::SplitMix64(base::SplitMix64(run_seed) ^ static_cast<uint64_t>(rank)) ^
      static_cast<uint64_t>(step));
}

// One rank's training run of a resolved plan: what Start sets up (the prepared models, the
// objective, the optimizer built from the trained model, the data, the checkpoints and the
// logs), then Step after Step, each a full optimizer step with its evaluation when one is due.
class TrainingRun {
 public:
  // `resolved` must outlive the run, and `tensors`, which counts what this rank's tensors
  // hold on the CPU from before the run starts.
  static absl::StatusOr<std::unique_ptr<TrainingRun>> Start(const plan::ResolvedPlan& resolved,
                                                            const parallel::DeviceMesh& mesh,
                                                            const TrainOptions& options,
                                                            base::AllocationCounter& tensors);

  // Trains from the checkpoint's step (0 for a fresh run) to the plan's last.
  absl::StatusOr<TrainReport> Run();

 private:
  TrainingRun(const plan::ResolvedPlan& resolved, const parallel::DeviceMesh& mesh,
              const TrainOptions& options, base::AllocationCounter& tensors)
      : resolved_(resolved),
        training_(resolved.training()),
        mesh_(mesh),
        options_(options),
        tensors_(tensors),
        peak_flops_per_rank_(PeakFlopsPerRank(resolved.plan)),
        draws_(mesh.device().is_cpu() ? base::MakeCpuGenerator(0)
                                      : at::globalContext().defaultGenerator(mesh.device())) {}

  // Sets up the logs rank 0 writes, continuing them after `resume_step`.
  absl::Status OpenLogs(int64_t resume_step);

  // The objective's start (Objective::Start), offered the batches the run will read.
  absl::Status StartObjective();

  // Optimizer step `step` (0-based): micro-batches with gradient accumulation, run by the
  // preparation's executor (Preparation::TrainMicroBatches), each weighted by its share of the
  // step's scored items, the update at the scheduled rate, and the evaluation when it is due.
  absl::StatusOr<metrics::StepMetrics> Step(int64_t step);

  // Where the objective reads a frozen model (Objective::FrozenRead), its part of each of
  // `batches` (Objective::ReadFrozen) into their frozen_read, computed under no-grad through
  // the frozen model's own preparation (its pipeline stages, if any) before the trained
  // model's passes; nothing otherwise.
  absl::Status ReadFrozen(std::vector<CountedBatch>& batches);

  // The forward of micro-batch i of `batches` on the trained model (wrap::MicroBatchForward):
  // from the hidden state `input` on a later pipeline stage; the stage's output, or, where the
  // model holds its output layers, the objective's loss, added to `means` and scaled by
  // `step_items` for the backward (unscaled without them, in an evaluation). `batches` and `means`
  // must outlive its use.
  wrap::MicroBatchForward Forward(const std::vector<CountedBatch>& batches,
                                  objectives::MetricMeans& means,
                                  const objectives::StepItems* step_items);

  // The objective's means over the items of the held-out batches of every rank, with the
  // trained model in eval mode (no dropout), as PyTorch's model.eval(); its mode is restored
  // after.
  absl::StatusOr<objectives::MeanMetrics> Evaluate();

  std::optional<double> Mfu(double tokens_per_s) const;
  // Prints, for pair files, the padding of the rows the run trains on (and what another
  // packing would make it) and the examples' own tokens/s at `tokens_per_s`.
  void PrintPadding(double tokens_per_s);

  // After the step the memory is checked on (its peak reset before it): the estimate and
  // each rank's peak of tensor bytes into `report`, and rank 0's warning when a rank's is more
  // than 15% off (every rank must call it).
  absl::Status CompareMemoryWithEstimate(TrainReport& report);

  // OK when every trainable parameter of every rank is finite; otherwise, on every rank, an
  // error starting "step `step`" that names the first that is not on the rank that found it
  // and `last_update`, the step of the last update applied, after which it is so. Every rank
  // must call it: after a step whose update was skipped, before a checkpoint and before the
  // run ends, so that nothing is saved from, nor does a run succeed with, a model that is not.
  absl::Status CheckParametersFinite(int64_t step, int64_t last_update) const;

  // `bytes` becomes the largest over the ranks of the mesh (every rank must call it).
  absl::Status MaxOverRanks(std::optional<int64_t>& bytes) const;

  // `report`, this start's, over every start of the run when its launcher restarted it and
  // this rank writes its metrics file, from which the earlier starts are read.
  TrainReport OverAllStarts(TrainReport report) const;

  const plan::ResolvedPlan& resolved_;
  const plan::TrainingConfig& training_;
  const parallel::DeviceMesh& mesh_;
  const TrainOptions& options_;
  base::AllocationCounter& tensors_;
  const double peak_flops_per_rank_;  // in the model's dtype; 0: no MFU
  // What the trained model's random draws in a step (LoRA's dropout masks) come from: the
  // thread's forward generator (base/forward_generator.h) during each step, seeded by
  // StepSeed with the model's seed (model.init.seed), so that they depend on neither the
  // process's other draws nor another rank's thread. On the CPU the run's own generator; on
  // an accelerator its device's default one, which the rank has to itself.
  at::Generator draws_;
  std::unique_ptr<sched::Schedule> schedule_;
  std::unique_ptr<PreparedModel> prepared_;
  // Prepared, kept for the run (or until the objective releases one).
  std::map<std::string, std::unique_ptr<PreparedModel>> frozen_;
  std::unique_ptr<objectives::Objective> objective_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::optional<data::DataLoader> train_, eval_;
  std::optional<RunCheckpoints> checkpoints_;
  std::optional<RunSamples> samples_;
  std::optional<metrics::MetricsLog> metrics_log_;
  std::optional<metrics::TensorBoardLog> tensorboard_;
  std::optional<metrics::ProgressLog> progress_;
  double training_seconds_ = 0.0;  // in steps, without evaluation
};

absl::StatusOr<std::unique_ptr<TrainingRun>> TrainingRun::Start(const plan::ResolvedPlan& resolved,
                                                                const parallel::DeviceMesh& mesh,
                                                                const TrainOptions& options,
                                                                base::AllocationCounter& tensors) {
  std::unique_ptr<TrainingRun> run(new TrainingRun(resolved, mesh, options, tensors));
  const plan::Plan& plan = resolved.plan;
  const plan::TrainingConfig& training = plan.training();
  PLAIT_ASSIGN_OR_RETURN(sched::Schedule schedule,
                         sched::BuildSchedule(resolved.schedule, "plan.schedule"));
  run->schedule_ = std::make_unique<sched::Schedule>(std::move(schedule));
  PLAIT_ASSIGN_OR_RETURN(run->checkpoints_, RunCheckpoints::Open(resolved, mesh));
  PLAIT_RETURN_IF_ERROR(run->OpenLogs(run->checkpoints_->resume_step()));

  // A resumed run's checkpoint holds every trainable parameter: their values are neither
  // drawn nor read before it is restored.
  const Role role = run->checkpoints_->resume_step() > 0 ? Role::kResumed : Role::kTrained;
  PLAIT_ASSIGN_OR_RETURN(run->prepared_,
                         PreparedModel::Prepare(plan.model(), resolved.model, plan.hf_weights_dir(),
                                                plan.prepare(), mesh, role, "plan"));
  // Frozen models live for the run, prepared like the trained one, after it; the objective
  // reads the ones it names (DPO's reference).
  std::map<std::string, models::CausalLM*> frozen;
  for (int i = 0; i < plan.frozen_size(); ++i) {
    PLAIT_ASSIGN_OR_RETURN(
        std::unique_ptr<PreparedModel> model,
        PreparedModel::Prepare(plan.frozen(i).model(), resolved.frozen[i],
                               plan.frozen(i).hf_weights_dir(), plan.frozen(i).prepare(), mesh,
                               Role::kFrozen, absl::StrCat("plan.frozen[", i, "]")));
    frozen[plan.frozen(i).name()] = &model->model();
    run->frozen_[plan.frozen(i).name()] = std::move(model);
  }
  PLAIT_ASSIGN_OR_RETURN(std::unique_ptr<objectives::Objective> objective,
                         objectives::MakeObjective(plan.objective(), frozen, "plan.objective"));
  // With the losses the model's own layers add (a mixture of experts' load balancing).
  run->objective_ = objectives::WithModelLosses(std::move(objective), resolved.model, mesh,
                                                resolved.routing_dims);
  PLAIT_ASSIGN_OR_RETURN(run->optimizer_, BuildOptimizer(*run->prepared_, plan.optimizer()));

  // The ranks of the dimensions that split the batch (FSDP's, DDP's) read different data.
  PLAIT_ASSIGN_OR_RETURN(const auto data_parallel,
                         mesh.SubgridRankAndSize(resolved.data_parallel_dims));
  const auto [dp_rank, dp_size] = data_parallel;
  for (const auto& [split, loader] :
       {std::pair{data::Split::kTrain, &run->train_}, std::pair{data::Split::kEval, &run->eval_}}) {
    PLAIT_ASSIGN_OR_RETURN(
        *loader, data::DataLoader::Create(resolved.data, split, resolved.model.vocab_size(),
                                          training.micro_batch(), training.seq_len(), dp_rank,
                                          dp_size, "plan.data"));
  }
  const std::optional<int64_t> held_out = run->eval_->DistinctBatches();
  if (held_out.has_value() && resolved.eval_micro_batches > *held_out) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan.training.eval_batches: ", training.eval_batches(), " global batches (",
                     resolved.eval_micro_batches, " micro-batches per rank) exceed the ", *held_out,
                     " micro-batches per rank that plan.data.token_files.eval_path holds"));
  }
  PLAIT_ASSIGN_OR_RETURN(run->samples_,
                         RunSamples::Open(resolved, mesh, run->checkpoints_->resume_step()));
  PLAIT_RETURN_IF_ERROR(run->checkpoints_->Restore(*run->optimizer_, *run->train_));
  PLAIT_RETURN_IF_ERROR(run->StartObjective());
  return run;
}

absl::Status TrainingRun::OpenLogs(int64_t resume_step) {
  if (mesh_.rank() != 0) return absl::OkStatus();
  if (options_.log != nullptr) {
    progress_.emplace(*options_.log,
                      options_.log_is_terminal ? metrics::ProgressLog::Style::kStatusLine
                                               : metrics::ProgressLog::Style::kPlainLines,
                      training_.steps(), resolved_.log_every);
  }
  if (!resolved_.metrics_path.empty()) {
    PLAIT_ASSIGN_OR_RETURN(
        metrics_log_,
        base::Annotate(
            options_.restart_count > 0
                ? metrics::MetricsLog::Continue(
                      resolved_.metrics_path,
                      metrics::Restart{
                          options_.restart_count, resume_step, options_.restart_cause, {}})
                : metrics::MetricsLog::Open(resolved_.metrics_path, resume_step),
            "plan.training.metrics_file"));
  }
  if (!resolved_.tensorboard_dir.empty()) {
    PLAIT_ASSIGN_OR_RETURN(tensorboard_, base::Annotate(metrics::TensorBoardLog::Open(
                                                            resolved_.tensorboard_dir, resume_step),
                                                        "plan.training.tensorboard_dir"));
    std::string plan_text;
    google::protobuf::TextFormat::PrintToString(resolved_.plan, &plan_text);
    PLAIT_RETURN_IF_ERROR(tensorboard_->AppendText("plan", plan_text, resume_step + 1));
  }
  return absl::OkStatus();
}

absl::Status TrainingRun::StartObjective() {
  objectives::RunStart start{
      *train_, (training_.steps() - checkpoints_->resume_step()) * resolved_.grad_accumulation,
      *eval_, resolved_.eval_micro_batches, mesh_.device()};
  start.eval.Reset();
  start.policy = &prepared_->model();
  start.release_frozen = [this](const std::string& name) -> absl::Status {
    const auto model = frozen_.find(name);
    if (model == frozen_.end()) {
      return absl::InternalError(absl::StrCat("no frozen model \"", name, "\" to release"));
    }
    PLAIT_RETURN_IF_ERROR(model->second->preparation().BackwardStatus());
    const std::optional<int64_t> held = base::HeapBytesInUse();
    frozen_.erase(model);
    const std::optional<int64_t> released = base::HeapBytesInUse();
    if (progress_) {
      progress_->Print(absl::StrCat(
          "released the frozen model \"", name, "\"",
          held && released
              ? absl::StrCat(": the heap in use fell by ", base::HumanBytes(*held - *released))
              : ""));
    }
    return absl::OkStatus();
  };
  start.print = [this](const std::string& line) {
    if (progress_) progress_->Print(line);
  };
  return objective_->Start(start);
}

absl::StatusOr<metrics::StepMetrics> TrainingRun::Step(int64_t step) {
  if (options_.before_step) options_.before_step(step);
  const Clock::time_point start = Clock::now();
  parallel::ResetPeakMemory(mesh_.device());
  metrics::StepMetrics metrics;
  metrics.step = step + 1;
  metrics.lr = schedule_->LearningRate(step);
  mesh_.BeginStep(metrics.step);
  {
    std::lock_guard<std::mutex> lock(draws_.mutex());
    draws_.set_current_seed(StepSeed(resolved_.plan.model().init().seed(), mesh_.rank(), step));
  }
  const base::ScopedForwardGenerator drawing(draws_);
  // The step's items are counted over its micro-batches and data-parallel ranks before any
  // backward, which scales each micro-batch's mean by its share of them (step_items.h).
  std::vector<CountedBatch> batches;
  std::vector<int64_t> items;
  for (int64_t micro = 0; micro < resolved_.grad_accumulation; ++micro) {
    PLAIT_ASSIGN_OR_RETURN(
        CountedBatch batch,
        NextCounted(*train_, *objective_, prepared_->preparation(), mesh_.device()));
    items.push_back(batch.items);
    batches.push_back(std::move(batch));
  }
  PLAIT_ASSIGN_OR_RETURN(
      const objectives::StepItems step_items,
      base::Annotate(objectives::StepItems::Count(std::move(items), mesh_, resolved_.scoring_dims),
                     absl::StrCat("step ", metrics.step)));
  PLAIT_RETURN_IF_ERROR(base::Annotate(ReadFrozen(batches), absl::StrCat("step ", metrics.step)));
  objectives::MetricMeans means(objective_->MetricNames());
  // Its errors are the hooks' collectives', which name the step and their place in it, and
  // the objective's.
  PLAIT_RETURN_IF_ERROR(prepared_->preparation().TrainMicroBatches(
      static_cast<int>(resolved_.grad_accumulation), Forward(batches, means, &step_items)));
  if (step == checkpoints_->resume_step()) {
    // Nothing the optimizer owns is silently left out of the loss (every rank stops).
    PLAIT_RETURN_IF_ERROR(
        mesh_.Agree(CheckEveryParameterHasGradient(prepared_->trainable_parameters(), metrics.step),
                    absl::StrCat("step ", metrics.step)));
  }
  // The loss over the mesh comes before the update: every rank skips the update of a step
  // whose loss is not finite, so that its gradients never reach the weights.
  PLAIT_ASSIGN_OR_RETURN(const objectives::MeanMetrics mean,
                         base::Annotate(means.Mean(mesh_), absl::StrCat("step ", metrics.step)));
  PLAIT_ASSIGN_OR_RETURN(const optim::StepReport update,
                         std::isfinite(mean.loss) ? optimizer_->Step(metrics.lr)
                                                  : optimizer_->SkipNonFiniteLoss(mean.loss));
  optimizer_->ZeroGrad();
  metrics.loss = mean.loss;
  metrics.named = mean.metrics;
  metrics.grad_norm = update.grad_norm;
  metrics.skipped = update.skipped;
  const double seconds = Seconds(Clock::now() - start);
  training_seconds_ += seconds;
  metrics.tokens_per_s = resolved_.tokens_per_step / seconds;
  metrics.mfu = Mfu(metrics.tokens_per_s);
  const bool eval_due = training_.eval_every() > 0 && metrics.step % training_.eval_every() == 0;
  if (resolved_.eval_micro_batches > 0 && (eval_due || metrics.step == training_.steps())) {
    PLAIT_ASSIGN_OR_RETURN(
        const objectives::MeanMetrics eval,
        base::Annotate(Evaluate(), absl::StrCat("evaluation after step ", metrics.step)));
    metrics.eval_loss = eval.loss;
    metrics.eval_named = eval.metrics;
  }
  // Read after the evaluation, whose peak is the step's too.
  metrics.peak_device_memory_bytes = parallel::PeakMemory(mesh_.device());
  return metrics;
}

absl::StatusOr<TrainReport> TrainingRun::Run() {
  TrainReport report;
  report.entropy_floor = train_->EntropyFloor();
  PLAIT_ASSIGN_OR_RETURN(const int64_t trained_parameters,
                         TrainedParameters(prepared_->trainable_parameters(), mesh_));
  if (progress_) {
    progress_->Header(trained_parameters, NumParameters(resolved_.model),
                      mesh_.layout().world_size(), static_cast<int64_t>(resolved_.tokens_per_step),
                      report.entropy_floor, checkpoints_->resume_step(), RestartLine(options_));
  }
  const int64_t steps = training_.steps();
  const int64_t first_step = checkpoints_->resume_step();
  int64_t last_update = first_step;  // the step of the last update applied
  const Clock::time_point start = Clock::now();
  metrics::SkippedUpdates skipped;
  // The first step allocates the gradients and the optimizer's state as it goes (the state
  // after the backward's peak); the second holds what every later one does, and is compared
  // with the estimate. A run that ends before it is not compared.
  const int64_t memory_step = first_step + 1;
  for (int64_t step = first_step; step < steps; ++step) {
    if (step == memory_step) tensors_.ResetPeak();
    PLAIT_ASSIGN_OR_RETURN(const metrics::StepMetrics metrics, Step(step));
    if (step == memory_step) PLAIT_RETURN_IF_ERROR(CompareMemoryWithEstimate(report));
    skipped.Count(metrics);
    if (metrics.eval_loss &&
        (!report.best_eval_loss || *metrics.eval_loss < *report.best_eval_loss)) {
      report.best_eval_loss = metrics.eval_loss;
    }
    if (metrics.peak_device_memory_bytes) {
      report.peak_device_memory_bytes =
          std::max(report.peak_device_memory_bytes.value_or(0), *metrics.peak_device_memory_bytes);
    }
    report.steps.push_back(metrics);
    if (metrics_log_) PLAIT_RETURN_IF_ERROR(metrics_log_->Append(metrics));
    if (tensorboard_) PLAIT_RETURN_IF_ERROR(tensorboard_->Append(metrics));
    if (progress_) {
      const int64_t done = step + 1 - first_step;
      progress_->Step(metrics, resolved_.tokens_per_step * done / training_seconds_,
                      Seconds(Clock::now() - start) / done * (steps - step - 1));
    }
    if (!metrics.skipped) last_update = metrics.step;
    // A skipped update's non-finite loss or gradient norm may come from the data, or from
    // weights an earlier update sent out of range, which no later step brings back.
    if (metrics.skipped || checkpoints_->IsDue(metrics.step)) {
      PLAIT_RETURN_IF_ERROR(CheckParametersFinite(metrics.step, last_update));
    }
    if (skipped.in_a_row() >= resolved_.max_skipped_steps) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "step %d: %s: %s; the run trains nothing (plan.training.max_skipped_steps = %d)",
          metrics.step,
          skipped.in_a_row() == 1
              ? std::string("its update was skipped")
              : absl::StrCat("the last ", skipped.in_a_row(), " updates were skipped"),
          skipped.Why(), resolved_.max_skipped_steps));
    }
    if (samples_ && samples_->IsDue(metrics.step)) {
      PLAIT_RETURN_IF_ERROR(samples_->Draw(metrics.step, *prepared_));
      if (progress_) {
        progress_->Print(
            absl::StrCat("samples after step ", metrics.step, " in ", samples_->path()));
      }
    }
    PLAIT_RETURN_IF_ERROR(checkpoints_->SaveIfDue(step + 1, *optimizer_));
    if (checkpoints_->IsDue(step + 1)) ++report.checkpoints_written;
  }
  // A run shorter than max_skipped_steps that skipped every update.
  if (first_step < steps && skipped.in_a_row() == steps - first_step) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s%s was skipped: %s; the run trained nothing",
        steps - first_step == 1 ? std::string("the only step")
                                : absl::StrCat("every one of the ", steps - first_step, " steps"),
        first_step > 0 ? absl::StrCat(" after step ", first_step) : "", skipped.Why()));
  }
  if (first_step < steps) PLAIT_RETURN_IF_ERROR(CheckParametersFinite(steps, last_update));
  if (!resolved_.save_hf_dir.empty()) {
    PLAIT_RETURN_IF_ERROR(
        base::Annotate(prepared_->SaveHf(resolved_.save_hf_dir, mesh_.rank(), /*writer=*/0),
                       "plan.training.save_hf_dir"));
    if (progress_) progress_->Print(absl::StrCat("saved the model to ", resolved_.save_hf_dir));
  }
  if (!resolved_.save_adapter_dir.empty()) {
    PLAIT_RETURN_IF_ERROR(base::Annotate(
        prepared_->SaveAdapters(resolved_.save_adapter_dir, resolved_.plan.hf_weights_dir(),
                                mesh_.rank(), /*writer=*/0),
        "plan.training.save_adapter_dir"));
    if (progress_) {
      progress_->Print(
          absl::StrCat("saved the adapters to ", resolved_.save_adapter_dir, " (PEFT's format)"));
    }
  }
  if (samples_) report.samples_file = samples_->path();
  report.seconds = Seconds(Clock::now() - start);
  // A run resumed from its last step trains no step.
  report.tokens_per_s =
      first_step < steps ? resolved_.tokens_per_step * (steps - first_step) / training_seconds_ : 0.0;
  report.mfu = Mfu(report.tokens_per_s);
  if (progress_) PrintPadding(report.tokens_per_s);
  PLAIT_ASSIGN_OR_RETURN(report.peak_memory_bytes, mesh_.PerRank(base::PeakResidentBytes()));
  PLAIT_RETURN_IF_ERROR(MaxOverRanks(report.peak_device_memory_bytes));
  report = OverAllStarts(std::move(report));
  if (metrics_log_) PLAIT_RETURN_IF_ERROR(metrics_log_->WriteSummary(report));
  if (progress_) progress_->Summary(report);
  return report;
}

absl::Status TrainingRun::ReadFrozen(std::vector<CountedBatch>& batches) {
  const std::optional<std::string> name = objective_->FrozenRead();
  if (!name.has_value()) return absl::OkStatus();
  const auto frozen = frozen_.find(*name);
  if (frozen == frozen_.end()) {
    return absl::InternalError(absl::StrCat("no frozen model \"", *name, "\" to read"));
  }
  models::CausalLM& model = frozen->second->model();
  at::NoGradGuard no_grad;
  return base::Annotate(
      frozen->second->preparation().EvaluateMicroBatches(
          static_cast<int>(batches.size()),
          [&](int micro, const at::Tensor& input) {
            CountedBatch& batch = batches[micro];
            return model.StageForward(input, batch.batch.inputs, batch.batch.positions,
                                      [&]() -> absl::StatusOr<at::Tensor> {
                                        PLAIT_ASSIGN_OR_RETURN(
                                            batch.frozen_read,
                                            objective_->ReadFrozen(model, batch.batch));
                                        return batch.frozen_read;
                                      });
          }),
      absl::StrCat("frozen model \"", *name, "\""));
}

wrap::MicroBatchForward TrainingRun::Forward(const std::vector<CountedBatch>& batches,
                                             objectives::MetricMeans& means,
                                             const objectives::StepItems* step_items) {
  return [this, &batches, &means, step_items](int micro, const at::Tensor& input) {
    models::CausalLM& model = prepared_->model();
    const CountedBatch& batch = batches[micro];
    return model.StageForward(
        input, batch.batch.inputs, batch.batch.positions, [&]() -> absl::StatusOr<at::Tensor> {
          PLAIT_ASSIGN_OR_RETURN(objectives::ObjectiveOutput output,
                                 objective_->Compute(model, batch.batch, batch.host,
                                                     batch.frozen_read, step_items, micro));
          means.Add(output, batch.items);
          return step_items == nullptr ? output.loss
                                       : step_items->ScaledForBackward(output.loss, micro);
        });
  };
}

absl::StatusOr<objectives::MeanMetrics> TrainingRun::Evaluate() {
  at::NoGradGuard no_grad;
  models::CausalLM& model = prepared_->model();
  const bool was_training = model.is_training();
  model.eval();
  const absl::Cleanup restore_mode = [&model, was_training] { model.train(was_training); };
  eval_->Reset();
  std::vector<CountedBatch> batches;
  for (int64_t i = 0; i < resolved_.eval_micro_batches; ++i) {
    PLAIT_ASSIGN_OR_RETURN(
        CountedBatch batch,
        NextCounted(*eval_, *objective_, prepared_->preparation(), mesh_.device()));
    batches.push_back(std::move(batch));
  }
  PLAIT_RETURN_IF_ERROR(ReadFrozen(batches));
  objectives::MetricMeans means(objective_->MetricNames());
  PLAIT_RETURN_IF_ERROR(prepared_->preparation().EvaluateMicroBatches(
      static_cast<int>(batches.size()), Forward(batches, means, /*step_items=*/nullptr)));
  return means.Mean(mesh_);
}

absl::Status TrainingRun::CompareMemoryWithEstimate(TrainReport& report) {
  // On CUDA the caching allocator's peak since the step reset it, else the CPU allocator's.
  const int64_t peak = parallel::PeakMemory(mesh_.device()).value_or(tensors_.peak());
  PLAIT_ASSIGN_OR_RETURN(report.peak_tensor_bytes, mesh_.PerRank(peak));
  PLAIT_ASSIGN_OR_RETURN(const std::vector<plan::MemoryEstimate> estimates,
                         plan::EstimateMemoryOfEachRank(resolved_));
  // The run's summary gives the largest, plan_check's figure.
  report.memory_estimate_bytes = plan::LargestOf(estimates).total_bytes();
  if (!progress_) return absl::OkStatus();
  if (const std::optional<std::string> warning =
          plan::CompareWithMeasured(estimates, report.peak_tensor_bytes)) {
    progress_->Print(*warning);
  }
  return absl::OkStatus();
}

void TrainingRun::PrintPadding(double tokens_per_s) {
  const std::optional<data::DataLoader::PackingFigures> figures = train_->Packing();
  if (!figures.has_value()) return;
  const data::PackingStrategy packing = train_->packing_strategy();
  progress_->Print(absl::StrFormat("training data: %s; useful (not padding) tokens/s: %.0f",
                                   data::DescribePacking(*figures, packing, training_.seq_len()),
                                   tokens_per_s * data::UsefulShare(*figures, packing)));
}

std::optional<double> TrainingRun::Mfu(double tokens_per_s) const {
  const double peak = peak_flops_per_rank_ * mesh_.layout().world_size();
  if (peak <= 0.0) return std::nullopt;
  return tokens_per_s * resolved_.flops_per_token / peak;
}

TrainReport TrainingRun::OverAllStarts(TrainReport report) const {
  if (!metrics_log_ || options_.restart_count == 0) return report;
  metrics::EarlierStarts earlier = metrics_log_->earlier();
  // A start saves a due checkpoint after writing its step's row, and a restart resumes from
  // the newest: each due step among the kept rows of the earlier starts was saved once, and
  // no step whose row a restart dropped.
  for (const metrics::StepMetrics& step : earlier.steps) {
    if (checkpoints_->IsDue(step.step)) ++earlier.checkpoints_written;
  }
  report = metrics::WholeRun(std::move(report), std::move(earlier), resolved_.tokens_per_step);
  report.mfu = Mfu(report.tokens_per_s);
  return report;
}

absl::Status TrainingRun::CheckParametersFinite(int64_t step, int64_t last_update) const {
  absl::Status own;
  for (const parallel::TrainableParameter& parameter : prepared_->trainable_parameters()) {
    if (!parameter.tensor.defined()) continue;
    const absl::Status finite = models::CheckFinite(
        parameter.tensor,
        absl::StrCat("step ", step,
                     ": the trained parameters are not finite after the update of step ",
                     last_update),
        parameter.name);
    if (!finite.ok()) {
      own = absl::FailedPreconditionError(
          absl::StrCat(finite.message(), "; the run stops and saves nothing from them"));
      break;
    }
  }
  return mesh_.Agree(own, absl::StrCat("step ", step));
}

absl::Status TrainingRun::MaxOverRanks(std::optional<int64_t>& bytes) const {
  if (!bytes) return absl::OkStatus();  // the same on every rank: all on CUDA, or none
  // fp32 holds byte counts to 2^-24 relative, far below what the summary prints.
  at::Tensor value = torch::full({1}, static_cast<double>(*bytes),
                                 at::TensorOptions(at::kFloat).device(mesh_.device()));
  PLAIT_RETURN_IF_ERROR(mesh_.AllReduce(value, parallel::ReduceOp::kMax));
  bytes = static_cast<int64_t>(value.item<double>());
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TrainReport> Train(const plan::ResolvedPlan& resolved,
                                  const parallel::DeviceMesh& mesh, const TrainOptions& options) {
  plan::ResolvedPlan on_device = resolved;  // outlives the run
  on_device.plan = plan::ResolveAutoDtypes(resolved.plan, mesh.device());
  // What this rank's tensors hold on the CPU, from before its models are built.
  base::AllocationCounter tensors;
  const base::AllocationCounter::Scope counting(tensors);
  PLAIT_ASSIGN_OR_RETURN(std::unique_ptr<TrainingRun> run,
                         TrainingRun::Start(on_device, mesh, options, tensors));
  return run->Run();
}

}  // namespace plait::trainer
