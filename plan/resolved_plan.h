// A plan resolved once for the world it runs in: every quantity the run, the explanation, the
// memory estimate and the checkpoints derive from a plan, derived in one place (Resolve,
// validate.h) after the plan passed every check. The model configs are read once (a Hugging
// Face config.json included), defaults are filled in, paths are where the user meant them,
// and the data-parallel dimensions, width and global batch come from the strategies
// themselves:
//
//   PLAIT_ASSIGN_OR_RETURN(const ResolvedPlan resolved, Resolve(plan, world_size));
//   resolved.model.hidden_size();    // plan.model's config, read once
//   resolved.global_batch;           // micro_batch x data_parallel_size x grad_accumulation
//   resolved.plan.training().steps();
#ifndef PLAIT_PLAN_RESOLVED_PLAN_H_
#define PLAIT_PLAN_RESOLVED_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "base/own_output.h"
#include "data/data.pb.h"
#include "models/model.pb.h"
#include "plan/plan.pb.h"
#include "sched/schedule.pb.h"

namespace plait::plan {

struct ResolvedPlan {
  // The plan as given, its DTYPE_AUTO resolved once a device is known (ResolveAutoDtypes,
  // compute_dtype.h).
  Plan plan;
  int world_size = 1;

  models::ModelConfig model;                // plan.model's config
  std::vector<models::ModelConfig> frozen;  // plan.frozen[i].model's, in plan order

  // plan.schedule with total_steps = training.steps.
  sched::ScheduleConfig schedule;
  // plan.data as the run reads it: data::ResolvedDataConfig's defaults, and text pair files
  // that name no tokenizer read the model's own, beside plan.model.hf_config_path.
  data::DataConfig data;

  // The training fields whose 0 means a default.
  int64_t grad_accumulation = 1;  // 0 means 1
  int64_t log_every = 10;         // 0 means 10
  int64_t max_skipped_steps = 5;  // 0 means 5
  // The micro-batches each rank reads per evaluation: eval_batches x grad_accumulation, so
  // that an evaluation reads the first eval_batches x global_batch held-out sequences on any
  // layout of the same global batch. 0: no evaluation.
  int64_t eval_micro_batches = 0;

  // Where the run writes, as the user meant the plan's paths (base::UserPath: relative to
  // where `bazel run` was started); empty where the plan writes nothing.
  std::string metrics_path;     // training.metrics_file
  std::string save_hf_dir;      // training.save_hf_dir
  std::string save_adapter_dir;  // training.save_adapter_dir
  std::string checkpoint_dir;   // training.checkpoint.dir
  std::string tensorboard_dir;  // training.tensorboard_dir
  std::string samples_path;     // training.samples.file (SamplesFile), when it has samples
  // The tokenizer of the samples' prompts, as the plan names it (training.samples.tokenizer,
  // else the data's text tokenizer, else the folder of model.hf_config_path).
  std::string samples_tokenizer;
  // What the run reads, by plan field, as the plan names it (from the working directory): the
  // models' config files and weight folders, the adapters a step starts from, the data files
  // (none of them where it writes: base::CheckOutputsApart). Empty paths are left out.
  std::vector<base::NamedPath> inputs;

  // The mesh dimensions whose strategies split the batch (FSDP's, DDP's, HSDP's replicas), in
  // mesh order, and the ranks they span: the data-parallel width.
  std::vector<std::string> data_parallel_dims;
  int64_t data_parallel_size = 1;
  // Those and the dimensions whose ranks each compute a slice of every sequence (context
  // parallelism), in mesh order: over which a step's scored items are counted.
  std::vector<std::string> scoring_dims;
  // Those and the dimensions whose ranks run the blocks' feed-forward on different tokens
  // (sequence parallelism), in mesh order: over which a mixture of experts' routing is summed.
  std::vector<std::string> routing_dims;
  // Sequences per optimizer step over the data-parallel ranks: micro_batch x
  // data_parallel_size x grad_accumulation.
  int64_t global_batch = 0;
  // What a step computes, for its tokens/s and MFU (objectives::WorkOf): the tokens the trained
  // model runs forward and backward in a step (global_batch x seq_len x the objective's rows
  // per sequence, two for DPO's pairs), and the model FLOPs per such token, its own
  // (models::TrainingFlopsPerToken) plus the forward FLOPs of the frozen models the objective
  // runs in each step (DPO's live reference), and of its forward-only passes of the trained
  // model (DPO's reference when it is the policy without its adapters), per trained token.
  double tokens_per_step = 0;
  double flops_per_token = 0;

  const TrainingConfig& training() const { return plan.training(); }
};

}  // namespace plait::plan

#endif  // PLAIT_PLAN_RESOLVED_PLAN_H_
