// SFT on examples whose completions differ a lot in length (1 to 30 tokens): the step's loss
// is the summed loss of all its completion tokens over their count, so DDP and FSDP on 2
// ranks, 2 accumulated micro-batches on 1 rank, both together, and context parallelism on 2
// and 4 ranks (each scoring its slice of every example) train as one process on the whole
// batch does: the same losses, gradient norms, evaluation losses and final parameters.
// Averaging each micro-batch's mean instead (as plait did) is measurably another loss here.
// A mixture of experts trains its load-balancing loss as one process too: the routing of each
// micro-batch is summed over the ranks that read it, and the loss weighs as the micro-batch's
// share of the step's items (objectives/model_losses.h).
#include <cmath>
#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_matchers.h"
#include "data/data_config.h"
#include "data/data_loader.h"
#include "gtest/gtest.h"
#include "models/causal_lm.h"
#include "models/hf_checkpoint.h"
#include "models/model_config.h"
#include "plan/plan.h"
#include "trainer/testing_ranks.h"
#include "trainer/trainer.h"

namespace plait::trainer {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::trainer::testing::ExpectSameParameters;
using ::plait::trainer::testing::SavedRun;
using ::plait::trainer::testing::ShortShippedPlan;
using ::plait::trainer::testing::TrainAndSave;
using ::plait::trainer::testing::TrainOnRanks;

constexpr int kSteps = 6;
constexpr int kGlobalBatch = 16;
constexpr int64_t kVocab = 4096;  // the tiny preset's

// An SFT file of `examples` token-id examples. In every 16 examples, the first 8 complete
// their prompt with 1 to 3 tokens and the last 8 with 20 to 30: micro-batches of 8 or 4 score
// very different numbers of tokens. Each sequence counts up by a stride of its own, so the
// model has something to learn.
std::string WriteSftFile(const std::string& name, int examples) {
  const std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
  std::ofstream out(path);
  for (int i = 0; i < examples; ++i) {
    const int prompt_length = 1 + (i * 7) % 20;
    const int completion_length = i % 16 < 8 ? 1 + i % 3 : 20 + (i * 5) % 11;
    const int64_t start = (i * 131) % kVocab;
    const int64_t stride = 1 + i % 5;
    std::vector<int64_t> prompt, completion;
    for (int t = 0; t < prompt_length + completion_length; ++t) {
      (t < prompt_length ? prompt : completion).push_back((start + t * stride) % kVocab);
    }
    out << "{\"prompt\": [" << absl::StrJoin(prompt, ", ") << "], \"completion\": ["
        << absl::StrJoin(completion, ", ") << "]}\n";
  }
  return path;
}

// //trainer:llama_sft's model on the variable-length file, trained by SGD with momentum:
// AdamW turns reduction-order noise in a near-zero gradient component into a step of up to
// the learning rate either way, which moved a few embedding elements by 2e-4 (9e-6 of the
// tensor's norm) where the gradients agreed to 1e-6; SGD keeps the parameters as close as
// the gradients. `ranks` ranks under `strategy` ("fsdp", "ddp", "context_parallel", or "" for
// one process), each accumulating `accumulation` micro-batches, kGlobalBatch examples per
// step; evaluated at the last step on the 16 held-out examples. With `moe`, the model is the
// tiny Qwen3-MoE, its load-balancing loss weighed enough that a wrong gradient of it shows.
plan::Plan SftPlan(const std::string& strategy, int ranks, int accumulation, bool moe = false) {
  static const std::string train = WriteSftFile("train.jsonl", kSteps * kGlobalBatch);
  static const std::string eval = WriteSftFile("eval.jsonl", kGlobalBatch);
  plan::Plan plan = ShortShippedPlan("llama_sft");
  plan.clear_mesh();
  plan.clear_prepare();
  if (!strategy.empty()) {
    const std::string name = strategy == "context_parallel" ? "cp" : "dp";
    parallel::MeshConfig::Dimension* dim = plan.mutable_mesh()->add_dims();
    dim->set_name(name);
    dim->set_size(ranks);
    wrap::PrepareStep* step = plan.add_prepare();
    if (strategy == "fsdp") step->mutable_fsdp()->set_mesh_dim(name);
    if (strategy == "ddp") step->mutable_ddp()->set_mesh_dim(name);
    if (strategy == "context_parallel") step->mutable_context_parallel()->set_mesh_dim(name);
  }
  if (moe) {
    models::ModelConfig config = models::PresetConfig("qwen3-moe-tiny").value();
    config.set_router_aux_loss_coef(0.1);
    *plan.mutable_model()->mutable_config() = config;
  }
  plan.mutable_optimizer()->mutable_sgd()->set_momentum(0.9);
  plan.mutable_schedule()->set_lr(0.3);
  data::PairFiles* files = plan.mutable_data()->mutable_sft_files();
  files->set_train_path(train);
  files->set_eval_path(eval);
  plan::TrainingConfig* training = plan.mutable_training();
  training->set_steps(kSteps);
  training->set_eval_every(kSteps);
  // Context-parallel ranks read the same sequences.
  const int data_parallel = strategy == "context_parallel" ? 1 : ranks;
  const int micro_batch = kGlobalBatch / data_parallel / accumulation;
  training->set_micro_batch(micro_batch);
  training->set_grad_accumulation(accumulation);
  training->set_global_batch(kGlobalBatch);
  training->set_eval_batches(1);  // the held-out file's one global batch, on every layout
  return plan;
}

const SavedRun& SingleProcess() {
  static const SavedRun* run = new SavedRun(TrainAndSave(SftPlan("", 1, 1), 1, "single"));
  return *run;
}

// The tiny Qwen3-MoE's single process, accumulating 2 micro-batches (one of the short
// completions, one of the long) or not: its load-balancing loss is one of each micro-batch.
const SavedRun& SingleMoeProcess(int accumulation) {
  static auto* runs = new std::map<int, SavedRun>();
  auto it = runs->find(accumulation);
  if (it == runs->end()) {
    it = runs->emplace(accumulation, TrainAndSave(SftPlan("", 1, accumulation, /*moe=*/true), 1,
                                                  absl::StrCat("single_moe_", accumulation)))
             .first;
  }
  return it->second;
}

void ExpectNearRelative(double actual, double expected, const std::string& what) {
  EXPECT_NEAR(actual, expected, 1e-5 * std::abs(expected)) << what;
}

void ExpectSameRun(const SavedRun& run, const std::string& layout,
                   const SavedRun& expected = SingleProcess()) {
  ASSERT_EQ(run.report.steps.size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(expected.report.steps.size(), static_cast<size_t>(kSteps));
  for (int i = 0; i < kSteps; ++i) {
    const metrics::StepMetrics& a = run.report.steps[i];
    const metrics::StepMetrics& e = expected.report.steps[i];
    const std::string step = absl::StrCat(layout, " step ", e.step, " ");
    ExpectNearRelative(a.loss, e.loss, step + "loss");
    ASSERT_TRUE(a.grad_norm.has_value() && e.grad_norm.has_value());
    ExpectNearRelative(*a.grad_norm, *e.grad_norm, step + "grad_norm");
    ASSERT_EQ(a.named.size(), e.named.size());
    for (size_t m = 0; m < e.named.size(); ++m) {
      ExpectNearRelative(a.named[m].second, e.named[m].second, step + e.named[m].first);
    }
  }
  ASSERT_TRUE(expected.report.steps.back().eval_loss.has_value());
  ASSERT_TRUE(run.report.steps.back().eval_loss.has_value());
  ExpectNearRelative(*run.report.steps.back().eval_loss, *expected.report.steps.back().eval_loss,
                     layout + " eval_loss");
  ExpectSameParameters(run, expected, layout);
}

// The data makes the test able to fail: on the first batch, the mean of the two half-batches'
// means (what averaging micro-batch losses computes) is far from the mean over all tokens.
TEST(SftNormalizationTest, TheDataMakesMicroBatchMeansDiffer) {
  const plan::Plan plan = SftPlan("", 1, 1);
  auto loader =
      data::DataLoader::Create(data::ResolvedDataConfig(plan.data()), data::Split::kTrain, kVocab,
                               kGlobalBatch, plan.training().seq_len(), 0, 1, "plan.data");
  ASSERT_THAT(loader, IsOk());
  const data::Batch batch = loader->Next().value();
  auto config = models::ResolveModelSpec(plan.model(), "plan.model");
  ASSERT_THAT(config, IsOk());
  auto model = models::CausalLM::Create(*config, plan.model().init());
  ASSERT_THAT(model, IsOk());
  at::NoGradGuard no_grad;
  const auto loss = [&](int64_t first, int64_t rows) {
    return (*model)
        ->Loss(batch.inputs.narrow(0, first, rows), batch.targets.narrow(0, first, rows))
        .item<double>();
  };
  const at::Tensor scored = (batch.targets != data::kIgnoreTarget).sum(1);
  const int64_t short_half = scored.narrow(0, 0, 8).sum().item<int64_t>();
  const int64_t long_half = scored.narrow(0, 8, 8).sum().item<int64_t>();
  EXPECT_LT(short_half * 5, long_half);
  const double token_mean = loss(0, kGlobalBatch);
  EXPECT_NEAR(token_mean,
              (loss(0, 8) * short_half + loss(8, 8) * long_half) / (short_half + long_half),
              1e-5 * token_mean);
  EXPECT_GT(std::abs((loss(0, 8) + loss(8, 8)) / 2 - token_mean), 1e-3 * token_mean);
  // The first step of the single process scores that batch.
  EXPECT_NEAR(SingleProcess().report.steps[0].loss, token_mean, 1e-5 * token_mean);
  EXPECT_LT(SingleProcess().report.steps.back().loss, SingleProcess().report.steps[0].loss);
}

TEST(SftNormalizationTest, DdpOnTwoRanksTrainsAsOneProcess) {
  ExpectSameRun(TrainAndSave(SftPlan("ddp", 2, 1), 2, "ddp"), "ddp");
}

TEST(SftNormalizationTest, FsdpOnTwoRanksTrainsAsOneProcess) {
  ExpectSameRun(TrainAndSave(SftPlan("fsdp", 2, 1), 2, "fsdp"), "fsdp");
}

TEST(SftNormalizationTest, TwoAccumulatedMicroBatchesTrainAsOneProcess) {
  ExpectSameRun(TrainAndSave(SftPlan("", 1, 2), 1, "accumulation"), "accumulation");
}

TEST(SftNormalizationTest, DdpOnTwoRanksWithTwoAccumulatedMicroBatchesTrainsAsOneProcess) {
  ExpectSameRun(TrainAndSave(SftPlan("ddp", 2, 2), 2, "ddp_accumulation"), "ddp x accumulation");
}

TEST(SftNormalizationTest, FsdpOnTwoRanksWithTwoAccumulatedMicroBatchesTrainsAsOneProcess) {
  ExpectSameRun(TrainAndSave(SftPlan("fsdp", 2, 2), 2, "fsdp_accumulation"), "fsdp x accumulation");
}

// Context parallelism cuts each example into chunks that completions cross: the ranks score
// different numbers of completion tokens (some none), counted over them for the step's loss.
TEST(SftNormalizationTest, ContextParallelRanksScoringTheirSlicesTrainAsOneProcess) {
  ExpectSameRun(TrainAndSave(SftPlan("context_parallel", 2, 1), 2, "cp2"), "cp 2");
  ExpectSameRun(TrainAndSave(SftPlan("context_parallel", 4, 2), 4, "cp4_accumulation"),
                "cp 4 x accumulation");
}

TEST(SftNormalizationTest, MixtureOfExpertsReportsItsRoutingAndLearns) {
  const SavedRun& run = SingleMoeProcess(1);
  const metrics::StepMetrics& first = run.report.steps.front();
  ASSERT_EQ(first.named.size(), 3u);
  EXPECT_EQ(first.named[0].first, "aux_loss");
  // 2 of 8 experts a token: 2 when the routing is even, more when not.
  EXPECT_GT(first.named[0].second, 1.9);
  EXPECT_LT(first.named[0].second, 4.0);
  EXPECT_EQ(first.named[1].first, "expert_load_max");
  EXPECT_GE(first.named[1].second, 1.0);
  EXPECT_EQ(first.named[2].first, "expert_load_min");
  EXPECT_LE(first.named[2].second, 1.0);
  EXPECT_LT(run.report.steps.back().loss, first.loss);
}

TEST(SftNormalizationTest, MixtureOfExpertsOnTwoDataParallelRanksTrainsAsOneProcess) {
  ExpectSameRun(TrainAndSave(SftPlan("ddp", 2, 1, true), 2, "moe_ddp"), "moe ddp",
                SingleMoeProcess(1));
  ExpectSameRun(TrainAndSave(SftPlan("fsdp", 2, 1, true), 2, "moe_fsdp"), "moe fsdp",
                SingleMoeProcess(1));
}

// Context-parallel ranks read the same micro-batches as one process, scoring different
// numbers of their tokens: each micro-batch's load-balancing loss weighs by the items all of
// them score.
TEST(SftNormalizationTest, MixtureOfExpertsOnContextParallelRanksTrainsAsOneProcess) {
  ExpectSameRun(TrainAndSave(SftPlan("context_parallel", 2, 2, true), 2, "moe_cp2_accumulation"),
                "moe cp 2 x accumulation", SingleMoeProcess(2));
}

}  // namespace
}  // namespace plait::trainer
