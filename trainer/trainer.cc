#include "trainer/trainer.h"

#include <chrono>
#include <cmath>
#include <fstream>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status.h"
#include "data/data_config.h"
#include "data/data_loader.h"
#include "models/causal_lm.h"
#include "models/model_config.h"
#include "nlohmann/json.hpp"
#include "optim/optimizer.h"
#include "sched/schedule_builder.h"
#include "trainer/checkpoint.h"
#include "trainer/plan.h"
#include "trainer/prepared_model.h"
#include "trainer/progress.h"

namespace plait::trainer {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// The mean of `value` over every rank of the mesh.
absl::StatusOr<double> MeshMean(double value, const parallel::DeviceMesh& mesh) {
  torch::Tensor tensor = torch::full({1}, value, torch::kFloat32);
  PLAIT_RETURN_IF_ERROR(mesh.AllReduce(tensor, parallel::ReduceOp::kAverage));
  return tensor.item<double>();
}

// The mean loss over `batches` held-out micro-batches of every rank.
absl::StatusOr<double> Evaluate(PreparedModel& prepared, data::DataLoader& eval, int64_t batches,
                                const parallel::DeviceMesh& mesh) {
  torch::NoGradGuard no_grad;
  eval.Reset();
  double sum = 0.0;
  for (int64_t i = 0; i < batches; ++i) {
    const data::Batch batch = eval.Next();
    sum += prepared.model().Loss(batch.inputs, batch.targets).item<double>();
  }
  PLAIT_RETURN_IF_ERROR(prepared.preparation().BackwardStatus());
  return MeshMean(sum / batches, mesh);
}

}  // namespace

absl::StatusOr<TrainReport> Train(const Plan& plan, const parallel::DeviceMesh& mesh,
                                  const TrainOptions& options) {
  const TrainingConfig& training = plan.training();
  const int rank = mesh.rank();
  const int world_size = mesh.layout().world_size();
  std::optional<ProgressLog> progress;
  if (rank == 0 && options.log != nullptr) {
    progress.emplace(
        *options.log,
        options.log_is_terminal ? ProgressLog::Style::kStatusLine : ProgressLog::Style::kPlainLines,
        training.steps(), LogEvery(training));
  }

  PLAIT_ASSIGN_OR_RETURN(models::ModelConfig config,
                         models::ResolveModelSpec(plan.model(), "plan.model"));
  PLAIT_ASSIGN_OR_RETURN(sched::Schedule schedule,
                         sched::BuildSchedule(ResolvedSchedule(plan), "plan.schedule"));
  const data::DataConfig data_config = data::ResolvedDataConfig(plan.data());
  // Every mesh dimension is a data-parallel one (ValidatePlan: each is used by FSDP or DDP),
  // so the data-parallel rank and width are the world's.
  const int dp_rank = rank, dp_size = world_size;
  PLAIT_ASSIGN_OR_RETURN(
      data::DataLoader train,
      data::DataLoader::Create(data_config, data::Split::kTrain, config.vocab_size(),
                               training.micro_batch(), training.seq_len(), dp_rank, dp_size,
                               "plan.data"));
  PLAIT_ASSIGN_OR_RETURN(
      data::DataLoader eval,
      data::DataLoader::Create(data_config, data::Split::kEval, config.vocab_size(),
                               training.micro_batch(), training.seq_len(), dp_rank, dp_size,
                               "plan.data"));
  PLAIT_ASSIGN_OR_RETURN(Checkpointer checkpointer,
                         Checkpointer::Open(plan, options.checkpoint_dir, mesh));
  std::ofstream metrics;
  if (rank == 0 && !options.metrics_path.empty()) {
    PLAIT_RETURN_IF_ERROR(KeepMetricsUpTo(options.metrics_path, checkpointer.resume_step()));
    metrics.open(options.metrics_path, std::ios::app);
    if (!metrics) {
      return absl::InvalidArgumentError(
          absl::StrCat("plan.training.metrics_file: cannot write \"", options.metrics_path, "\""));
    }
  }

  PLAIT_ASSIGN_OR_RETURN(std::unique_ptr<PreparedModel> prepared,
                         PreparedModel::Prepare(plan.model(), plan.hf_weights_dir(), plan.prepare(),
                                                mesh, Role::kTrained, "plan"));
  // Frozen models live for the run, prepared like the trained one; the language-model loss
  // here does not read them (a preference loss would).
  std::vector<std::unique_ptr<PreparedModel>> frozen;
  for (int i = 0; i < plan.frozen_size(); ++i) {
    PLAIT_ASSIGN_OR_RETURN(
        std::unique_ptr<PreparedModel> model,
        PreparedModel::Prepare(plan.frozen(i).model(), plan.frozen(i).hf_weights_dir(),
                               plan.frozen(i).prepare(), mesh, Role::kFrozen,
                               absl::StrCat("plan.frozen[", i, "]")));
    frozen.push_back(std::move(model));
  }
  PLAIT_ASSIGN_OR_RETURN(std::unique_ptr<optim::Optimizer> optimizer,
                         BuildOptimizer(*prepared, plan.optimizer()));
  PLAIT_RETURN_IF_ERROR(checkpointer.Restore(*optimizer, train));

  const int64_t steps = training.steps();
  const int64_t accumulation = GradAccumulation(training);
  const double tokens_per_step =
      static_cast<double>(training.micro_batch()) * world_size * accumulation * training.seq_len();
  const double flops_per_token = models::TrainingFlopsPerToken(config, training.seq_len());
  const double peak = training.peak_flops_per_rank() * world_size;
  auto mfu_of = [&](double tokens_per_s) -> std::optional<double> {
    if (peak <= 0.0) return std::nullopt;
    return tokens_per_s * flops_per_token / peak;
  };

  TrainReport report;
  report.entropy_floor = train.EntropyFloor();
  if (progress) {
    std::string header =
        absl::StrCat("training ", NumParameters(config), " parameters on ", world_size,
                     world_size == 1 ? " rank" : " ranks", ", ", steps, " steps of ",
                     static_cast<int64_t>(tokens_per_step), " tokens");
    if (report.entropy_floor) {
      absl::StrAppendFormat(&header, "; synthetic data, entropy floor %.4f nats",
                            *report.entropy_floor);
    }
    progress->Print(header);
    if (checkpointer.resume_step() > 0) {
      progress->Print(absl::StrCat("resumed after step ", checkpointer.resume_step()));
    }
  }

  const Clock::time_point start = Clock::now();
  double training_seconds = 0.0;  // without evaluation
  const int64_t first_step = checkpointer.resume_step();
  for (int64_t step = first_step; step < steps; ++step) {
    const Clock::time_point step_start = Clock::now();
    const double lr = schedule.LearningRate(step);
    double loss_sum = 0.0;
    for (int64_t micro = 0; micro < accumulation; ++micro) {
      const data::Batch batch = train.Next();
      const auto no_sync = prepared->preparation().NoSyncIf(micro + 1 < accumulation);
      torch::Tensor loss = prepared->model().Loss(batch.inputs, batch.targets) / accumulation;
      loss.backward();
      loss_sum += loss.item<double>();
    }
    absl::Status backward = prepared->preparation().BackwardStatus();
    if (!backward.ok()) {
      return absl::Status(backward.code(),
                          absl::StrCat("step ", step + 1, ": ", backward.message()));
    }
    PLAIT_ASSIGN_OR_RETURN(optim::StepReport update, optimizer->Step(lr));
    optimizer->ZeroGrad();
    PLAIT_ASSIGN_OR_RETURN(const double loss, MeshMean(loss_sum, mesh));
    const double step_seconds = Seconds(Clock::now() - step_start);
    training_seconds += step_seconds;

    StepMetrics metrics_row;
    metrics_row.step = step + 1;
    metrics_row.loss = loss;
    metrics_row.lr = lr;
    metrics_row.grad_norm = update.grad_norm;
    metrics_row.skipped = update.skipped;
    metrics_row.tokens_per_s = tokens_per_step / step_seconds;
    metrics_row.mfu = mfu_of(metrics_row.tokens_per_s);
    const bool last = step + 1 == steps;
    if (last || (training.eval_every() > 0 && (step + 1) % training.eval_every() == 0)) {
      PLAIT_ASSIGN_OR_RETURN(metrics_row.eval_loss,
                             Evaluate(*prepared, eval, training.eval_batches(), mesh));
      if (!report.best_eval_loss || *metrics_row.eval_loss < *report.best_eval_loss) {
        report.best_eval_loss = metrics_row.eval_loss;
      }
    }
    report.steps.push_back(metrics_row);

    if (metrics.is_open()) {
      nlohmann::json row = {{"step", metrics_row.step},
                            {"loss", metrics_row.loss},
                            {"lr", metrics_row.lr},
                            {"tokens_per_s", metrics_row.tokens_per_s}};
      if (metrics_row.grad_norm) row["grad_norm"] = *metrics_row.grad_norm;
      if (metrics_row.skipped) row["skipped"] = true;
      if (metrics_row.mfu) row["mfu"] = *metrics_row.mfu;
      if (metrics_row.eval_loss) row["eval_loss"] = *metrics_row.eval_loss;
      metrics << row.dump() << "\n";
      metrics.flush();
    }
    if (progress) {
      const double elapsed = Seconds(Clock::now() - start);
      progress->Step(metrics_row, tokens_per_step * (step + 1 - first_step) / training_seconds,
                     elapsed / (step + 1 - first_step) * (steps - step - 1));
    }
    PLAIT_RETURN_IF_ERROR(checkpointer.SaveIfDue(step + 1, *optimizer));
  }
  if (!options.save_hf_dir.empty()) {
    absl::Status saved = prepared->SaveHf(options.save_hf_dir, rank, /*writer=*/0);
    if (!saved.ok()) {
      return absl::Status(saved.code(),
                          absl::StrCat("plan.training.save_hf_dir: ", saved.message()));
    }
    if (progress) progress->Print(absl::StrCat("saved the model to ", options.save_hf_dir));
  }
  report.seconds = Seconds(Clock::now() - start);
  // A run resumed from its last step trains no step.
  report.tokens_per_s =
      first_step < steps ? tokens_per_step * (steps - first_step) / training_seconds : 0.0;
  report.mfu = mfu_of(report.tokens_per_s);
  if (progress) {
    std::string summary = absl::StrFormat("done: %d steps in %.1f s, %.0f tokens/s", steps,
                                          report.seconds, report.tokens_per_s);
    if (report.mfu) absl::StrAppendFormat(&summary, ", MFU %.2f%%", 100.0 * *report.mfu);
    if (report.best_eval_loss) {
      absl::StrAppendFormat(&summary, ", best eval loss %.4f", *report.best_eval_loss);
    }
    if (report.entropy_floor && report.best_eval_loss) {
      absl::StrAppendFormat(&summary, " (entropy floor %.4f, gap %.4f nats)", *report.entropy_floor,
                            *report.best_eval_loss - *report.entropy_floor);
    }
    progress->Print(summary);
  }
  return report;
}

}  // namespace plait::trainer
