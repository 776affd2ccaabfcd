// Context parallelism trains as one process: //trainer:llama_fsdp's tiny Llama (4 heads on 2
// key/value heads) for 10 AdamW steps with clipping, each sequence of 64 tokens split over
// "cp" on 2 and 4 ranks, cp 2 x FSDP 2, cp 2 x DDP 2, cp 2 x TP 2, cp 2 x a pipeline of 2 and
// cp 2 with activation checkpointing, and the tiny Qwen2 (biases, a tied embedding) on cp 2,
// has the losses, gradient norms, evaluation loss and final parameters of the run of one
// process that reads the same batches, within 1e-5 relative; and so has
// //trainer:qwen_dpo_fsdp's DPO on cp 2 (its reference split as the policy is, or
// precomputed) and on cp 2 x FSDP 2. Plans it cannot run yet are refused, naming the field.
#include <string>

#include "absl/strings/str_cat.h"
#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plan/plan.h"
#include "plan/validate.h"
#include "trainer/testing_ranks.h"

namespace plait::trainer {
namespace {

using ::plait::base::testing::StatusIs;
using ::plait::trainer::testing::AddMeshStep;
using ::plait::trainer::testing::ExpectSameTraining;
using ::plait::trainer::testing::SavedRun;
using ::plait::trainer::testing::ShortShippedPlan;
using ::plait::trainer::testing::TrainAndSaveOnce;
using ::testing::HasSubstr;

constexpr int kGlobalBatch = 16;
constexpr int kMicroBatches = 2;

struct Layout {
  std::string preset = "tiny";  // "qwen2-tiny": a tied embedding, q/k/v biases
  int cp = 1;                   // 1: no context parallelism
  std::string data_parallel;    // "ddp" or "fsdp" over "dp"
  int dp = 1;
  int tp = 1;                  // tensor parallelism over "tp"
  int pp = 1;                  // a 1F1B pipeline over "pp", each rank's stage split over "cp"
  bool checkpointing = false;  // FULL activation checkpointing, recomputing the ring's forward
  // //trainer:qwen_dpo_fsdp's DPO (preset unread), its frozen reference prepared with the
  // policy's context-parallel and FSDP steps, or its log-probabilities precomputed.
  bool dpo = false;
  bool precompute_reference = false;
  int ranks() const { return pp * cp * dp * tp; }
};

plan::Plan TrainingPlan(const Layout& layout) {
  plan::Plan plan = ShortShippedPlan(layout.dpo ? "qwen_dpo_fsdp" : "llama_fsdp");
  if (!layout.dpo) plan.mutable_model()->set_preset(layout.preset);
  plan.clear_mesh();
  plan.clear_prepare();
  if (layout.dpo) {
    plan.mutable_objective()->mutable_dpo()->set_precompute_reference(layout.precompute_reference);
    plan::FrozenModel& reference = *plan.mutable_frozen(0);
    reference.clear_prepare();
    if (layout.cp > 1) reference.add_prepare()->mutable_context_parallel()->set_mesh_dim("cp");
    if (layout.data_parallel == "fsdp") reference.add_prepare()->mutable_fsdp()->set_mesh_dim("dp");
  }
  if (layout.pp > 1) {
    wrap::PipelineConfig& pipeline = *AddMeshStep(plan, "pp", layout.pp).mutable_pipeline();
    pipeline.set_mesh_dim("pp");
    pipeline.set_schedule("1F1B");
  }
  if (layout.cp > 1) {
    AddMeshStep(plan, "cp", layout.cp).mutable_context_parallel()->set_mesh_dim("cp");
  }
  if (layout.tp > 1) {
    AddMeshStep(plan, "tp", layout.tp).mutable_tensor_parallel()->set_mesh_dim("tp");
  }
  if (layout.checkpointing) {
    plan.add_prepare()->mutable_activation_checkpointing()->set_policy(
        wrap::ActivationCheckpointingConfig::FULL);
  }
  if (layout.data_parallel == "ddp") {
    AddMeshStep(plan, "dp", layout.dp).mutable_ddp()->set_mesh_dim("dp");
  }
  if (layout.data_parallel == "fsdp") {
    AddMeshStep(plan, "dp", layout.dp).mutable_fsdp()->set_mesh_dim("dp");
  }
  plan::TrainingConfig& training = *plan.mutable_training();
  training.set_global_batch(kGlobalBatch);
  training.set_grad_accumulation(kMicroBatches);
  training.set_micro_batch(kGlobalBatch / kMicroBatches / layout.dp);
  return plan;
}

// `layout`'s run, trained once per test process under `name`.
const SavedRun& Trained(const Layout& layout, const std::string& name) {
  return TrainAndSaveOnce(TrainingPlan(layout), layout.ranks(), name);
}

void ExpectOneProcessRun(const Layout& layout, const std::string& name) {
  const Layout one{.preset = layout.preset, .dpo = layout.dpo};
  ExpectSameTraining(Trained(layout, name),
                     Trained(one, "one process " + (layout.dpo ? "dpo" : layout.preset)), name);
}

// The comparisons mean something: the run of one process trains.
TEST(ContextParallelTest, TheOneProcessRunTrains) {
  const SavedRun& run = Trained({}, "one process tiny");
  ASSERT_EQ(run.report.steps.size(), 10u);
  EXPECT_LT(run.report.steps.back().loss, run.report.steps.front().loss - 0.1);
}

TEST(ContextParallelTest, OnTwoAndFourRanksEqualsOneProcess) {
  ExpectOneProcessRun({.cp = 2}, "cp 2");
  ExpectOneProcessRun({.cp = 4}, "cp 4");
}

TEST(ContextParallelTest, QwenWithBiasesAndATiedEmbeddingEqualsOneProcess) {
  ExpectOneProcessRun({.preset = "qwen2-tiny", .cp = 2}, "qwen2 cp 2");
}

TEST(ContextParallelTest, WithFsdpAndDdpEqualsOneProcess) {
  ExpectOneProcessRun({.cp = 2, .data_parallel = "fsdp", .dp = 2}, "cp 2 x FSDP 2");
  ExpectOneProcessRun({.cp = 2, .data_parallel = "ddp", .dp = 2}, "cp 2 x DDP 2");
}

TEST(ContextParallelTest, WithTensorParallelismEqualsOneProcess) {
  ExpectOneProcessRun({.cp = 2, .tp = 2}, "cp 2 x TP 2");
}

// Each stage of a pipeline computes its ranks' slices of the micro-batches' sequences and
// passes them on to the next stage's ranks of the same slices.
TEST(ContextParallelTest, WithAPipelineEqualsOneProcess) {
  ExpectOneProcessRun({.cp = 2, .pp = 2}, "cp 2 x pp 2");
}

// Activation checkpointing runs each block's forward again in the backward, its ring included.
TEST(ContextParallelTest, WithActivationCheckpointingEqualsOneProcess) {
  ExpectOneProcessRun({.cp = 2, .checkpointing = true}, "cp 2 with FULL checkpointing");
}

// DPO sums each sequence's log-probabilities over the ranks' slices, for the policy and for
// its reference (split likewise, or precomputed before the first step), so every rank
// compares whole sequences.
TEST(ContextParallelTest, DpoEqualsOneProcess) {
  ExpectOneProcessRun({.cp = 2, .dpo = true}, "dpo cp 2");
  ExpectOneProcessRun({.cp = 2, .dpo = true, .precompute_reference = true},
                      "dpo cp 2, reference precomputed");
  ExpectOneProcessRun({.cp = 2, .data_parallel = "fsdp", .dp = 2, .dpo = true},
                      "dpo cp 2 x FSDP 2");
}

// Plans it cannot run are refused before anything runs, naming the field.
TEST(ContextParallelTest, InvalidPlansNameTheField) {
  plan::Plan odd = TrainingPlan({.cp = 4});
  odd.mutable_training()->set_seq_len(60);
  EXPECT_THAT(plan::Resolve(odd, 4).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("plan.prepare[0].context_parallel.mesh_dim: \"cp\" (4 ranks) cuts "
                                 "each sequence into 8 equal chunks")));
}

}  // namespace
}  // namespace plait::trainer
