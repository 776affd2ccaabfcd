// Pipeline parallelism trains as one process: //trainer:llama_fsdp's tiny Llama (4 blocks) for
// 10 AdamW steps with clipping, 4 micro-batches a step, cut into stages over "pp" with each
// schedule (GPIPE, 1F1B, ZB_H1, INTERLEAVED_1F1B with 2 stages per rank) on 2 and on 4 ranks
// (a block a stage; interleaved with 8 blocks), uneven stages (stage_starts), pp 2 x DDP 2 and pp 2
// x FSDP 2 (each interleaved too) and pp 2 x TP 2, and the tiny Qwen2 (its embedding tied to the
// output projection) on pp 2, pp 2 x FSDP 2 and interleaved pp 2, has the losses, gradient norms,
// evaluation loss and final parameters of the run of one process that reads the same batches,
// within 1e-5 relative, as do the shipped jobs llama_pp and llama_3d. Each rank builds and its
// optimizer owns exactly its stage's parameters.
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "ATen/Context.h"
#include "ATen/core/Tensor.h"
#include "absl/strings/str_cat.h"
#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/parameter_shapes.h"
#include "plan/plan.h"
#include "plan/validate.h"
#include "prepared/prepared_model.h"
#include "torch/csrc/autograd/generated/variable_factories.h"
#include "trainer/testing_ranks.h"
#include "trainer/trainer.h"

namespace plait::trainer {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::base::testing::StatusIs;
using ::plait::prepared::PreparedModel;
using ::plait::prepared::Role;
using ::plait::trainer::testing::AddMeshStep;
using ::plait::trainer::testing::ConfigOf;
using ::plait::trainer::testing::ExpectSameTraining;
using ::plait::trainer::testing::SavedRun;
using ::plait::trainer::testing::ShortShippedPlan;
using ::plait::trainer::testing::TrainAndSave;
using ::plait::trainer::testing::TrainAndSaveOnce;
using ::plait::trainer::testing::WithMesh;
using ::testing::HasSubstr;

constexpr int kGlobalBatch = 16;
constexpr int kMicroBatches = 4;

struct Layout {
  std::string preset = "tiny";  // "qwen2-tiny": tied embeddings, q/k/v biases
  int blocks = 0;               // more than the preset's 4 (0: the preset's)
  int pp = 1;                   // 1: no pipeline
  std::string schedule = "1F1B";
  int stages_per_rank = 1;            // more: INTERLEAVED_1F1B
  std::vector<int64_t> stage_starts;  // empty: equal stages
  std::string data_parallel;          // "ddp" or "fsdp" over "dp", after the pipeline
  int dp = 1;
  int tp = 1;  // tensor parallelism over "tp", after the pipeline
  bool sequence_parallel = false;
  // Activation checkpointing of the stage's blocks, after the pipeline (unspecified: none).
  wrap::ActivationCheckpointingConfig::Policy checkpointing =
      wrap::ActivationCheckpointingConfig::POLICY_UNSPECIFIED;
  int ranks() const { return pp * dp * tp; }
};

plan::Plan TrainingPlan(const Layout& layout) {
  plan::Plan plan = ShortShippedPlan("llama_fsdp");
  plan.mutable_model()->set_preset(layout.preset);
  if (layout.blocks > 0) {
    models::ModelConfig config = ConfigOf(plan.model());
    config.set_num_hidden_layers(layout.blocks);
    *plan.mutable_model()->mutable_config() = config;
  }
  plan.clear_mesh();
  plan.clear_prepare();
  // Each mesh dimension and the step on it, in the rules' order.
  if (layout.pp > 1) {
    wrap::PipelineConfig& pipeline = *AddMeshStep(plan, "pp", layout.pp).mutable_pipeline();
    pipeline.set_mesh_dim("pp");
    pipeline.set_schedule(layout.schedule);
    pipeline.set_stages_per_rank(layout.stages_per_rank);
    for (const int64_t start : layout.stage_starts) pipeline.add_stage_starts(start);
  }
  if (layout.checkpointing != wrap::ActivationCheckpointingConfig::POLICY_UNSPECIFIED) {
    plan.add_prepare()->mutable_activation_checkpointing()->set_policy(layout.checkpointing);
  }
  if (layout.tp > 1) {
    wrap::TensorParallelConfig& tp = *AddMeshStep(plan, "tp", layout.tp).mutable_tensor_parallel();
    tp.set_mesh_dim("tp");
    tp.set_sequence_parallel(layout.sequence_parallel);
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

// `layout` with INTERLEAVED_1F1B and 2 stages on each pipeline rank (with 2 ranks, one block a
// stage).
Layout Interleaved(Layout layout) {
  layout.schedule = "INTERLEAVED_1F1B";
  layout.stages_per_rank = 2;
  return layout;
}

const Layout kInterleaved = Interleaved({.pp = 2});

// `layout`'s run, trained once per test process under `name`.
const SavedRun& Trained(const Layout& layout, const std::string& name) {
  return TrainAndSaveOnce(TrainingPlan(layout), layout.ranks(), name);
}

// The run of one process of the model `preset` (with `blocks` blocks).
const SavedRun& OneProcess(const std::string& preset = "tiny", int blocks = 0) {
  return Trained({.preset = preset, .blocks = blocks},
                 absl::StrCat("one_process_", preset, "_", blocks));
}

void ExpectOneProcessRun(const Layout& layout, const std::string& name) {
  ExpectSameTraining(Trained(layout, name), OneProcess(layout.preset, layout.blocks), name);
}

// The comparisons mean something: the run of one process moves its parameters far more than
// the tolerance.
TEST(PipelineTest, TheOneProcessRunTrains) {
  const SavedRun& run = OneProcess();
  ASSERT_EQ(run.report.steps.size(), 10u);
  EXPECT_LT(run.report.steps.back().loss, run.report.steps.front().loss - 0.1);
}

TEST(PipelineTest, GPipeOnTwoRanksEqualsOneProcess) {
  ExpectOneProcessRun({.pp = 2, .schedule = "GPIPE"}, "pp 2 GPIPE");
}

TEST(PipelineTest, OneFOneBOnTwoRanksEqualsOneProcess) {
  ExpectOneProcessRun({.pp = 2, .schedule = "1F1B"}, "pp 2 1F1B");
}

TEST(PipelineTest, ZeroBubbleOnTwoRanksEqualsOneProcess) {
  ExpectOneProcessRun({.pp = 2, .schedule = "ZB_H1"}, "pp 2 ZB_H1");
}

// A middle stage of four holds neither the embedding nor the output layers: FSDP's root unit
// there has nothing to gather (it was refused at start: "unit root has no parameters").
TEST(PipelineTest, FourStagesWithFsdpEqualOneProcess) {
  ExpectOneProcessRun({.pp = 4, .data_parallel = "fsdp", .dp = 2}, "pp 4 x FSDP 2");
}

// A zero-bubble schedule runs each micro-batch's backward in two passes (the inputs' gradients,
// later the weights'); a checkpointed block recomputes its forward in each, and under SELECTIVE
// reads the projections' outputs its forward kept in both.
TEST(PipelineTest, ZeroBubbleWithActivationCheckpointingEqualsOneProcess) {
  using Config = wrap::ActivationCheckpointingConfig;
  for (const Config::Policy policy : {Config::FULL, Config::SELECTIVE}) {
    const std::string name = absl::StrCat("pp 2 ZB_H1 ", Config::Policy_Name(policy));
    ExpectSameTraining(
        TrainAndSave(TrainingPlan({.pp = 2, .schedule = "ZB_H1", .checkpointing = policy}), 2,
                     name),
        OneProcess(), name);
  }
}

// Two stages of one block on each of 2 ranks (rank 0: blocks 0 and 2), Megatron's interleaved
// order: each rank sends the other hidden states and gradients in one ordered channel.
TEST(PipelineTest, InterleavedOnTwoRanksEqualsOneProcess) {
  ExpectOneProcessRun(kInterleaved, "pp 2 INTERLEAVED_1F1B x 2");
}

// GPIPE and 1F1B run the same operations on the same tensors, each stage's gradients
// accumulated over the micro-batches in the same order: the same bits. ZB_H1 computes each
// micro-batch's input and weight gradients in two passes over its graph, with the same
// products, and accumulates the weights' in the same order: the same bits too.
// INTERLEAVED_1F1B differs in the last bits (and equals one process within 1e-5, above): its
// ranks hold other blocks (rank 0 blocks 0 and 2, not 0 and 1), so the gradient norm adds its
// squares in other groups, and the clipped steps round differently.
TEST(PipelineTest, TheSchedulesGiveTheSameBits) {
  const SavedRun& gpipe = Trained({.pp = 2, .schedule = "GPIPE"}, "pp 2 GPIPE");
  for (const auto& [schedule, name] :
       {std::pair<std::string, std::string>{"1F1B", "pp 2 1F1B"}, {"ZB_H1", "pp 2 ZB_H1"}}) {
    const SavedRun& run = Trained({.pp = 2, .schedule = schedule}, name);
    ASSERT_EQ(run.report.steps.size(), gpipe.report.steps.size());
    for (size_t i = 0; i < gpipe.report.steps.size(); ++i) {
      EXPECT_EQ(run.report.steps[i].loss, gpipe.report.steps[i].loss) << name << " step " << i;
      EXPECT_EQ(run.report.steps[i].grad_norm, gpipe.report.steps[i].grad_norm)
          << name << " step " << i;
    }
    for (const auto& [parameter, value] : gpipe.parameters) {
      EXPECT_TRUE(run.parameters.at(parameter).equal(value)) << name << " " << parameter;
    }
  }
}

// On 4 ranks, a block each, with each schedule; INTERLEAVED_1F1B's 8 stages cut the tiny Llama
// with 8 blocks.
TEST(PipelineTest, EachScheduleOnFourRanksEqualsOneProcess) {
  for (const std::string schedule : {"GPIPE", "1F1B", "ZB_H1"}) {
    ExpectOneProcessRun({.pp = 4, .schedule = schedule}, "pp 4 " + schedule);
  }
  ExpectOneProcessRun(Interleaved({.blocks = 8, .pp = 4}), "8 blocks, pp 4 INTERLEAVED_1F1B x 2");
}

TEST(PipelineTest, UnevenStagesEqualOneProcess) {
  ExpectOneProcessRun({.pp = 2, .schedule = "1F1B", .stage_starts = {1}}, "pp 2, blocks 0 | 1..3");
}

TEST(PipelineTest, WithDdpEqualsOneProcess) {
  ExpectOneProcessRun({.pp = 2, .data_parallel = "ddp", .dp = 2}, "pp 2 x DDP 2");
  // DDP reduces every bucket in the rank's last backward, its first stage's: the other stage's
  // gradients, complete by then, go with it.
  ExpectOneProcessRun(Interleaved({.pp = 2, .data_parallel = "ddp", .dp = 2}),
                      "pp 2 INTERLEAVED_1F1B x 2 x DDP 2");
}

TEST(PipelineTest, WithFsdpEqualsOneProcess) {
  ExpectOneProcessRun({.pp = 2, .data_parallel = "fsdp", .dp = 2}, "pp 2 x FSDP 2");
  ExpectOneProcessRun(Interleaved({.pp = 2, .data_parallel = "fsdp", .dp = 2}),
                      "pp 2 INTERLEAVED_1F1B x 2 x FSDP 2");
}

// Qwen2's tied embedding is held by the first and the last stage, which sum its gradients: it
// trains as in one process, alone and under FSDP.
TEST(PipelineTest, TiedEmbeddingsEqualOneProcess) {
  ExpectOneProcessRun({.preset = "qwen2-tiny", .pp = 2}, "qwen2 pp 2");
  ExpectOneProcessRun({.preset = "qwen2-tiny", .pp = 2, .data_parallel = "fsdp", .dp = 2},
                      "qwen2 pp 2 x FSDP 2");
  ExpectOneProcessRun(Interleaved({.preset = "qwen2-tiny", .pp = 2}),
                      "qwen2 pp 2 INTERLEAVED_1F1B x 2");
}

TEST(PipelineTest, WithTensorParallelismEqualsOneProcess) {
  ExpectOneProcessRun({.pp = 2, .tp = 2}, "pp 2 x TP 2");
  ExpectOneProcessRun({.pp = 2, .tp = 2, .sequence_parallel = true},
                      "pp 2 x TP 2 with sequence parallelism");
}

// The shipped jobs: //trainer:llama_pp (pp 2, 1F1B) and //trainer:llama_3d (pp 2 x FSDP 2 x
// TP 2 on 8 ranks) train as //trainer:llama_single does, on the same batches.
TEST(PipelineTest, TheShippedJobsEqualOneProcess) {
  const SavedRun single = TrainAndSave(ShortShippedPlan("llama_single"), 1, "llama_single");
  for (const auto& [name, ranks] : {std::pair<std::string, int>{"llama_pp", 2}, {"llama_3d", 8}}) {
    const SavedRun run = TrainAndSave(ShortShippedPlan(name), ranks, name);
    ExpectSameTraining(run, single, name);
  }
}

// Each rank builds and its optimizer owns exactly its stage's parameters, under the whole
// model's names: the embedding and blocks 0 and 1 on rank 0; blocks 2 and 3, the final norm
// and the output projection on rank 1.
TEST(PipelineTest, EachRankTrainsItsStageAlone) {
  const plan::Plan plan = ShortShippedPlan("llama_pp");
  const models::ModelConfig config = ConfigOf(plan.model());
  std::set<std::string> all;
  for (const models::ParameterShape& parameter : models::ParameterShapes(config)) {
    all.insert(parameter.name);
  }
  std::vector<std::set<std::string>> trained(2);
  WithMesh(plan, 2, [&](int rank, const parallel::DeviceMesh& mesh) {
    auto prepared = PreparedModel::Prepare(plan.model(), config, "", plan.prepare(), mesh,
                                           Role::kTrained, "plan");
    ASSERT_THAT(prepared, IsOk());
    for (const auto& named : (*prepared)->model().NamedParameters()) {
      trained[rank].insert(named.name);
    }
    std::set<std::string> owned;
    for (const parallel::TrainableParameter& parameter : (*prepared)->trainable_parameters()) {
      owned.insert(parameter.name);
    }
    EXPECT_EQ(owned, trained[rank]) << "rank " << rank;
  });
  std::set<std::string> both = trained[0];
  both.insert(trained[1].begin(), trained[1].end());
  EXPECT_EQ(both, all);
  EXPECT_EQ(trained[0].size() + trained[1].size(), all.size());
  EXPECT_EQ(trained[0].count("model.embed_tokens.weight"), 1u);
  EXPECT_EQ(trained[0].count("model.layers.1.mlp.down_proj.weight"), 1u);
  EXPECT_EQ(trained[1].count("model.layers.2.self_attn.q_proj.weight"), 1u);
  EXPECT_EQ(trained[1].count("lm_head.weight"), 1u);
  EXPECT_EQ(trained[1].count("model.norm.weight"), 1u);
}

// FSDP inside a pipeline gathers and reduces only what each stage computes with: under
// INTERLEAVED_1F1B (rank 0: the embedding, blocks 0 and 2) it moves the bytes it moves under
// 1F1B (rank 0: the embedding, blocks 0 and 1) on every rank, for one step of 4 micro-batches,
// so no stage gathers or reduces the root's layers for a forward that does not use them, and
// no prefetch reaches into another stage.
TEST(PipelineTest, FsdpMovesTheSameBytesUnderInterleaving) {
  const Layout one_f_one_b = {.pp = 2, .data_parallel = "fsdp", .dp = 2};
  const Layout interleaved = Interleaved(one_f_one_b);
  std::map<std::string, std::vector<int64_t>> sent;
  for (const auto& [name, layout] :
       {std::pair<std::string, Layout>{"1F1B", one_f_one_b}, {"INTERLEAVED_1F1B", interleaved}}) {
    const plan::Plan plan = TrainingPlan(layout);
    const models::ModelConfig config = ConfigOf(plan.model());
    sent[name].assign(layout.ranks(), 0);
    WithMesh(plan, layout.ranks(), [&](int rank, const parallel::DeviceMesh& mesh) {
      auto prepared = PreparedModel::Prepare(plan.model(), config, "", plan.prepare(), mesh,
                                             Role::kTrained, "plan");
      ASSERT_THAT(prepared, IsOk());
      models::CausalLM& model = (*prepared)->model();
      at::manual_seed(5);
      const at::Tensor tokens = torch::randint(config.vocab_size(), {kMicroBatches, 2, 17});
      const wrap::MicroBatchForward forward =
          [&](int micro, const at::Tensor& input) -> absl::StatusOr<at::Tensor> {
        const at::Tensor inputs = tokens[micro].narrow(1, 0, 16);
        if (input.defined()) model.SetStageInput(input);
        if (!model.HoldsOutputLayers()) return model.StageOutput(inputs);
        return model.Loss(inputs, tokens[micro].narrow(1, 1, 16)) / kMicroBatches;
      };
      parallel::Communicator* dp = mesh.communicator("dp").value();
      const auto bytes = [dp] {
        return dp->traffic(parallel::Collective::kAllGather).bytes_sent +
               dp->traffic(parallel::Collective::kReduceScatter).bytes_sent;
      };
      const int64_t before = bytes();
      ASSERT_THAT((*prepared)->preparation().TrainMicroBatches(kMicroBatches, forward), IsOk());
      sent[name][rank] = bytes() - before;
    });
  }
  EXPECT_EQ(sent["INTERLEAVED_1F1B"], sent["1F1B"]);
}

// Plans the pipeline cannot run are refused before anything runs, naming the field.
TEST(PipelineTest, InvalidPlansNameTheField) {
  const auto problems = [](const plan::Plan& plan, int ranks) {
    return plan::Resolve(plan, ranks).status();
  };
  plan::Plan after_fsdp = TrainingPlan({.pp = 2, .data_parallel = "fsdp", .dp = 2});
  std::swap(*after_fsdp.mutable_prepare(0), *after_fsdp.mutable_prepare(1));
  EXPECT_THAT(problems(after_fsdp, 4),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("pipeline_before_fsdp")));

  plan::Plan three_stages = TrainingPlan({.pp = 2});
  three_stages.mutable_mesh()->mutable_dims(0)->set_size(3);
  EXPECT_THAT(problems(three_stages, 3),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("plan.prepare[0].pipeline.stage_starts: is empty, and the 4 "
                                 "blocks do not divide into 3 equal stages")));

  plan::Plan empty_stage = TrainingPlan({.pp = 2, .stage_starts = {4}});
  EXPECT_THAT(
      problems(empty_stage, 2),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("plan.prepare[0].pipeline.stage_starts: [4] leaves stage 1 empty")));

  plan::Plan interleaved_alone = TrainingPlan({.pp = 2, .schedule = "INTERLEAVED_1F1B"});
  EXPECT_THAT(problems(interleaved_alone, 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("plan.prepare[0].pipeline.stages_per_rank: is 1; "
                                 "INTERLEAVED_1F1B needs 2 or more stages per rank")));

  plan::Plan one_f_one_b_twice = TrainingPlan({.pp = 2, .stages_per_rank = 2});
  EXPECT_THAT(problems(one_f_one_b_twice, 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("plan.prepare[0].pipeline.stages_per_rank: is 2; only "
                                 "INTERLEAVED_1F1B places several stages on a rank")));

  Layout six_stages = kInterleaved;
  six_stages.stages_per_rank = 3;
  EXPECT_THAT(problems(TrainingPlan(six_stages), 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("plan.prepare[0].pipeline: 6 stages need at least as many "
                                 "blocks; the model has 4")));

  plan::Plan one_rank = TrainingPlan(kInterleaved);
  one_rank.mutable_mesh()->mutable_dims(0)->set_size(1);
  EXPECT_THAT(problems(one_rank, 1),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("plan.prepare[0].pipeline.stages_per_rank: is 2, but \"pp\" has "
                                 "1 rank")));

  plan::Plan too_few_micro_batches = TrainingPlan({.pp = 4});
  too_few_micro_batches.mutable_training()->set_grad_accumulation(2);
  too_few_micro_batches.mutable_training()->set_micro_batch(kGlobalBatch / 2);
  EXPECT_THAT(problems(too_few_micro_batches, 4),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("plan.prepare[0].pipeline: runs 2 micro-batch(es) a step "
                                 "(training.grad_accumulation) over 4 pipeline ranks")));

  plan::Plan partial_group = TrainingPlan(kInterleaved);
  partial_group.mutable_training()->set_global_batch(12);
  partial_group.mutable_training()->set_grad_accumulation(3);
  partial_group.mutable_training()->set_micro_batch(4);
  EXPECT_THAT(problems(partial_group, 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("INTERLEAVED_1F1B runs them in groups of the 2 pipeline ranks, "
                                 "so it needs a multiple of 2")));

  plan::Plan unknown = TrainingPlan({.pp = 2, .schedule = "2F2B"});
  EXPECT_THAT(problems(unknown, 2), StatusIs(absl::StatusCode::kInvalidArgument,
                                             HasSubstr("plan.prepare[0].pipeline.schedule")));
}

}  // namespace
}  // namespace plait::trainer
