#include "trainer/testing_memory.h"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/allocation_counter.h"
#include "base/status_matchers.h"
#include "gtest/gtest.h"
#include "models/model_config.h"
#include "plan/plan.h"
#include "plan/testing_resolved.h"
#include "trainer/testing_ranks.h"
#include "trainer/trainer.h"

namespace plait::trainer::testing {

using ::plait::base::testing::IsOk;
using ::plait::plan::testing::Resolved;

std::vector<MeasuredMemory> MeasureTrainingMemory(const plan::Plan& plan, int ranks) {
  EXPECT_GE(plan.training().steps(), 2) << "the first step is not measured";
  const plan::ResolvedPlan resolved = Resolved(plan, ranks);
  std::vector<MeasuredMemory> measured(ranks);
  WithMesh(plan, ranks, [&](int rank, const parallel::DeviceMesh& mesh) {
    base::AllocationCounter counter;
    MeasuredMemory& memory = measured[rank];
    TrainOptions options;
    options.before_step = [&](int64_t step) {
      // The counter's peak is the previous step's.
      if (step >= 2) memory.peak_bytes = std::max(memory.peak_bytes, counter.peak());
      memory.between_steps_bytes = counter.current();
      counter.ResetPeak();
    };
    {
      base::AllocationCounter::Scope counting(counter);
      ASSERT_THAT(Train(resolved, mesh, options), IsOk());
    }
    memory.peak_bytes = std::max(memory.peak_bytes, counter.peak());  // the last step's
  });
  return measured;
}

namespace {

plan::Plan Shortened(plan::Plan plan) {
  for (const char* override :
       {"training.steps=3", "schedule.warmup.steps=1", "training.eval_every=0",
        "training.eval_batches=1", "training.metrics_file="}) {
    EXPECT_THAT(plan::ApplyOverride(override, plan), IsOk());
  }
  return plan;
}

// `check` with activation checkpointing by `policy` before its own steps.
MemoryCheckPlan Checkpointed(MemoryCheckPlan check, std::string name,
                             wrap::ActivationCheckpointingConfig::Policy policy) {
  check.name = std::move(name);
  const auto steps = check.plan.prepare();
  check.plan.clear_prepare();
  check.plan.add_prepare()->mutable_activation_checkpointing()->set_policy(policy);
  check.plan.mutable_prepare()->MergeFrom(steps);
  return check;
}

}  // namespace

MemoryCheckPlan LongSequencePlan(int64_t seq_len, int context_ranks) {
  MemoryCheckPlan check{absl::StrCat("llama_long_1x", seq_len, "_cp", context_ranks),
                        Shortened(LoadShippedPlan("llama_long")), context_ranks};
  check.plan.mutable_model()->clear_dtype();
  check.plan.mutable_mesh()->mutable_dims(0)->set_size(context_ranks);
  if (context_ranks == 1) {
    check.plan.clear_mesh();
    check.plan.clear_prepare();
  }
  EXPECT_THAT(plan::ApplyOverride(absl::StrCat("training.seq_len=", seq_len), check.plan), IsOk());
  return check;
}

std::vector<MemoryCheckPlan> MemoryCheckPlans() {
  std::vector<MemoryCheckPlan> plans;
  const MemoryCheckPlan fsdp{"llama_fsdp", Shortened(LoadShippedPlan("llama_fsdp")), 2};
  plans.push_back(fsdp);
  plans.push_back({"llama_ddp", Shortened(LoadShippedPlan("llama_ddp")), 2});
  absl::StatusOr<plan::Plan> medium = plan::LoadPlan(absl::StrCat(
      std::getenv("TEST_SRCDIR"), "/plait/trainer/testdata/runs/medium_single.textproto"));
  EXPECT_THAT(medium, IsOk());
  const MemoryCheckPlan medium_check{"medium", Shortened(medium.value_or(plan::Plan())), 1};
  plans.push_back(medium_check);
  plan::Plan bf16 = LoadShippedPlan("llama_fsdp");
  bf16.mutable_model()->set_dtype(base::DTYPE_BFLOAT16);
  plans.push_back({"llama_fsdp_bf16", Shortened(std::move(bf16)), 2});
  // Activation checkpointing: FULL on the medium shape (where the gradients outgrow the
  // activations kept), SELECTIVE under FSDP.
  plans.push_back(
      Checkpointed(medium_check, "medium_full", wrap::ActivationCheckpointingConfig::FULL));
  plans.push_back(
      Checkpointed(fsdp, "llama_fsdp_selective", wrap::ActivationCheckpointingConfig::SELECTIVE));
  // Tensor parallelism: llama_tp (16 x 64 tokens); with sequence parallelism on that batch
  // and on one sequence of 1024 tokens, and with SELECTIVE checkpointing too; and llama_2d (FSDP
  // over TP slices).
  const MemoryCheckPlan tp{"llama_tp", Shortened(LoadShippedPlan("llama_tp")), 2};
  plans.push_back(tp);
  MemoryCheckPlan sp = tp;
  sp.name = "llama_tp_sp";
  sp.plan.mutable_prepare(0)->mutable_tensor_parallel()->set_sequence_parallel(true);
  plans.push_back(sp);
  MemoryCheckPlan one_sequence = sp;
  one_sequence.name = "llama_tp_sp_1x1024";
  for (const char* override :
       {"training.micro_batch=1", "training.seq_len=1024", "training.global_batch=1"}) {
    EXPECT_THAT(plan::ApplyOverride(override, one_sequence.plan), IsOk());
  }
  plans.push_back(one_sequence);
  plans.push_back(
      Checkpointed(sp, "llama_tp_sp_selective", wrap::ActivationCheckpointingConfig::SELECTIVE));
  const MemoryCheckPlan two_d{"llama_2d", Shortened(LoadShippedPlan("llama_2d")), 4};
  plans.push_back(two_d);
  // Gradient accumulation: the second micro-batch's activations beside the first one's
  // gradients.
  MemoryCheckPlan accumulating = fsdp;
  accumulating.name = "llama_fsdp_2_micro_batches";
  for (const char* override : {"training.micro_batch=4", "training.grad_accumulation=2"}) {
    EXPECT_THAT(plan::ApplyOverride(override, accumulating.plan), IsOk());
  }
  plans.push_back(accumulating);
  // A pipeline of 2 stages and 4 micro-batches a step, 1F1B: the first stage holds 2 of them
  // in flight, the last 1 with its logits, both beside their gradients.
  const MemoryCheckPlan pp{"llama_pp", Shortened(LoadShippedPlan("llama_pp")), 2};
  plans.push_back(pp);
  // INTERLEAVED_1F1B, 2 stages of one block per rank: rank 0 holds 5 stage micro-batches in
  // flight at its peak, a block's activations each.
  MemoryCheckPlan interleaved = pp;
  interleaved.name = "llama_pp_interleaved";
  wrap::PipelineConfig& pipeline = *interleaved.plan.mutable_prepare(0)->mutable_pipeline();
  pipeline.set_schedule("INTERLEAVED_1F1B");
  pipeline.set_stages_per_rank(2);
  plans.push_back(interleaved);
  // The pipeline's stages each split over 2 context-parallel ranks (4 ranks): each rank holds
  // its stage's micro-batches in flight for half of every sequence.
  MemoryCheckPlan pipeline_context = pp;
  pipeline_context.name = "llama_pp_cp";
  pipeline_context.ranks = 4;
  parallel::MeshConfig::Dimension& stage_cp = *pipeline_context.plan.mutable_mesh()->add_dims();
  stage_cp.set_name("cp");
  stage_cp.set_size(2);
  pipeline_context.plan.add_prepare()->mutable_context_parallel()->set_mesh_dim("cp");
  plans.push_back(pipeline_context);
  // Context parallelism over 2 ranks, one sequence of 1024 tokens: each rank computes 512 of
  // them, as one process would a sequence of 512 (and holds one gradient's all-reduce buffers
  // after the backward).
  MemoryCheckPlan context{"llama_cp_1x1024", Shortened(LoadShippedPlan("llama_single")), 2};
  parallel::MeshConfig::Dimension& cp = *context.plan.mutable_mesh()->add_dims();
  cp.set_name("cp");
  cp.set_size(2);
  context.plan.add_prepare()->mutable_context_parallel()->set_mesh_dim("cp");
  for (const char* override :
       {"training.micro_batch=1", "training.seq_len=1024", "training.global_batch=1"}) {
    EXPECT_THAT(plan::ApplyOverride(override, context.plan), IsOk());
  }
  plans.push_back(context);
  // A real shape: Qwen2.5-0.5B's widths and its 151,936-token vocabulary (tied embeddings),
  // 2 of its 24 layers, one sequence of 512 tokens in fp32, where the embeddings, the
  // logits and their gradient outweigh the blocks.
  MemoryCheckPlan real_widths = medium_check;
  real_widths.name = "qwen2.5-0.5b_2_layers_1x512";
  absl::StatusOr<models::ModelConfig> qwen = models::PresetConfig("qwen2.5-0.5b");
  EXPECT_THAT(qwen, IsOk());
  *real_widths.plan.mutable_model()->mutable_config() = qwen.value_or(models::ModelConfig());
  real_widths.plan.mutable_model()->mutable_config()->set_num_hidden_layers(2);
  for (const char* override :
       {"training.micro_batch=1", "training.seq_len=512", "training.global_batch=1"}) {
    EXPECT_THAT(plan::ApplyOverride(override, real_widths.plan), IsOk());
  }
  plans.push_back(real_widths);
  // Qwen3's per-head norms of q and k: the tiny Qwen3 (heads of 64 over a hidden of 128) in
  // llama_fsdp's plan.
  MemoryCheckPlan qwen3{"qwen3_tiny_fsdp", Shortened(LoadShippedPlan("llama_fsdp")), 2};
  qwen3.plan.mutable_model()->set_preset("qwen3-tiny");
  plans.push_back(qwen3);
  // A mixture of experts: the tiny Qwen3-MoE (8 experts, 2 a token) in the same plan.
  MemoryCheckPlan moe = qwen3;
  moe.name = "qwen3_moe_tiny_fsdp";
  moe.plan.mutable_model()->set_preset("qwen3-moe-tiny");
  plans.push_back(moe);
  // LoRA on q/k/v/o and the MLP: a frozen base (no gradients, no optimizer state) whose
  // projections keep only what their adapters' backward reads, under FSDP, on the medium
  // shape, where the activations dominate, and under FSDP over tensor parallelism, which
  // splits the adapters with their projections; and QLoRA under FSDP, which shards the NF4
  // bytes of the base.
  for (const auto& [base, quantization] :
       {std::pair{fsdp, wrap::LoraConfig::NONE}, std::pair{medium_check, wrap::LoraConfig::NONE},
        std::pair{two_d, wrap::LoraConfig::NONE}, std::pair{fsdp, wrap::LoraConfig::NF4}}) {
    MemoryCheckPlan lora = base;
    lora.name += quantization == wrap::LoraConfig::NF4 ? "_qlora" : "_lora";
    google::protobuf::RepeatedPtrField<wrap::PrepareStep> steps;
    wrap::LoraConfig& config = *steps.Add()->mutable_lora();
    config.set_rank(8);
    config.set_alpha(16);
    config.add_target("*_proj");
    config.set_base_quantization(quantization);
    for (const wrap::PrepareStep& step : lora.plan.prepare()) *steps.Add() = step;
    *lora.plan.mutable_prepare() = steps;
    plans.push_back(std::move(lora));
  }
  return plans;
}

}  // namespace plait::trainer::testing
