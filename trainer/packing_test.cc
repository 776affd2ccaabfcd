// Packed rows train as the same examples padded one sequence to a row: on examples of very
// different lengths (completions of 1 to 3 tokens beside sequences of 20 to 126), on one
// process, on DDP and FSDP over 2 ranks with 2 accumulated micro-batches and on tensor
// parallelism over 2 ranks with activation checkpointing, SFT packed by best fit (PACKING_BFD)
// or per micro-batch (PACKING_PADDING_FREE) and DPO packed per micro-batch have the losses,
// gradient norms, metrics, evaluation loss and final parameters of the padded run of one process
// that reads the same examples in the same steps.
#include "data/packing.h"

#include <cmath>
#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_matchers.h"
#include "data/data.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/causal_lm.h"
#include "models/hf_checkpoint.h"
#include "plan/plan.h"
#include "trainer/testing_ranks.h"
#include "trainer/trainer.h"

namespace plait::trainer {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::trainer::testing::ExpectSameParameters;
using ::plait::trainer::testing::ExpectSameSteps;
using ::plait::trainer::testing::SavedRun;
using ::plait::trainer::testing::ShortShippedPlan;
using ::plait::trainer::testing::TrainAndSave;
using ::plait::trainer::testing::TrainOnRanks;
using ::testing::HasSubstr;

constexpr int kSteps = 10;
constexpr int kRowsPerStep = 4;
constexpr int64_t kSeqLen = 128;
constexpr int64_t kVocab = 4096;  // the tiny preset's

struct Example {
  std::vector<int64_t> prompt, completion;
};

// Example i of a file, `length` tokens of which the first `prompt_length` prompt, counting up
// by a stride of its own, so that the model has something to learn.
Example MakeExample(int64_t i, int64_t prompt_length, int64_t length) {
  const int64_t start = (i * 131) % kVocab;
  const int64_t stride = 1 + i % 5;
  Example example;
  for (int64_t t = 0; t < length; ++t) {
    (t < prompt_length ? example.prompt : example.completion)
        .push_back((start + t * stride) % kVocab);
  }
  return example;
}

// `rows` rows' worth of examples, in pairs whose lengths sum to kSeqLen: a long one (68 to 126
// tokens: over half a row) and a short one (2 to 4 tokens, a 1-token prompt and 1 to 3
// completion tokens; or 20 to 60). Best-fit decreasing then packs each long sequence with a short
// one of the same length as its partner's, so every row holds two examples.
std::vector<Example> MakeExamples(int rows, int64_t first_index) {
  std::vector<Example> examples;
  for (int r = 0; r < rows; ++r) {
    const int64_t i = first_index + 2 * r;
    const int64_t short_length = r % 2 == 0 ? 2 + r % 3 : 20 + (r * 13) % 41;
    examples.push_back(MakeExample(i, 1 + (i * 7) % 20, kSeqLen - short_length));
    examples.push_back(
        MakeExample(i + 1, short_length < 20 ? 1 : 1 + ((i + 1) * 7) % 19, short_length));
  }
  return examples;
}

void WriteExamples(const std::string& path, const std::vector<Example>& examples) {
  std::ofstream out(path);
  for (const Example& example : examples) {
    out << "{\"prompt\": [" << absl::StrJoin(example.prompt, ", ") << "], \"completion\": ["
        << absl::StrJoin(example.completion, ", ") << "]}\n";
  }
}

struct Files {
  std::string train, eval;
};

// The examples in file order (to be packed), or, `in_packed_order`, in the order of their
// packed rows (what a padded run of two examples per row reads in the same steps).
Files WriteFiles(bool in_packed_order) {
  Files files;
  for (const bool train : {true, false}) {
    std::vector<Example> examples =
        MakeExamples(train ? kSteps * kRowsPerStep : kRowsPerStep, train ? 0 : 100000);
    if (in_packed_order) {
      std::vector<int64_t> lengths;
      for (const Example& e : examples) lengths.push_back(e.prompt.size() + e.completion.size());
      std::vector<Example> ordered;
      for (const std::vector<int64_t>& row : data::BestFitDecreasing(lengths, kSeqLen)) {
        EXPECT_EQ(row.size(), 2u);
        for (const int64_t index : row) ordered.push_back(examples[index]);
      }
      examples = ordered;
    }
    const std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/", train ? "train" : "eval",
                                          in_packed_order ? "_padded" : "_packed", ".jsonl");
    WriteExamples(path, examples);
    (train ? files.train : files.eval) = path;
  }
  return files;
}

// A preference file of kSteps * kPairsPerStep pairs (and one step's held out) whose prompts
// and completions differ a lot in length: a 1- to 20-token prompt, completions of 1 to 3
// tokens or 20 to 60, the rejected one counting down where the chosen one counts up.
constexpr int kPairsPerStep = 8;
Files WritePairFiles() {
  Files files;
  for (const bool train : {true, false}) {
    const int pairs = train ? kSteps * kPairsPerStep : kPairsPerStep;
    const std::string path =
        absl::StrCat(std::getenv("TEST_TMPDIR"), "/", train ? "train" : "eval", "_pairs.jsonl");
    std::ofstream out(path);
    const int64_t first = train ? 0 : 100000;
    for (int64_t i = first; i < first + pairs; ++i) {
      const int64_t length = i % 3 == 0 ? 1 + (i / 3) % 3 : 20 + (i * 13) % 41;
      const Example chosen = MakeExample(i, 1 + (i * 7) % 20, 1 + (i * 7) % 20 + length);
      std::vector<int64_t> rejected;
      for (int64_t t = 0; t < 1 + (i * 5) % 40; ++t) {
        rejected.push_back((kVocab - 1 - 3 * t - i % kVocab) % kVocab);
      }
      out << "{\"prompt\": [" << absl::StrJoin(chosen.prompt, ", ") << "], \"chosen\": ["
          << absl::StrJoin(chosen.completion, ", ") << "], \"rejected\": ["
          << absl::StrJoin(rejected, ", ") << "]}\n";
    }
    (train ? files.train : files.eval) = path;
  }
  return files;
}

// The objective trained and how its rows are packed.
struct Layout {
  bool dpo = false;
  data::PackingStrategy packing = data::PACKING_NONE;
  // "fsdp", "ddp", "tp" (tensor parallelism with selective activation checkpointing), or "" for
  // one process.
  std::string strategy;
  int ranks = 1;
  int accumulation = 1;
};

// SGD with momentum (as sft_normalization_test, which says why) on `layout.ranks`
// data-parallel ranks under `layout.strategy`, each accumulating `layout.accumulation`
// micro-batches; evaluated at the last step on the held-out file's one step. SFT trains
// //trainer:llama_sft's model on kRowsPerStep best-fit rows a step (PACKING_BFD) or twice as
// many examples in the order of those rows; DPO trains //trainer:qwen_dpo_fsdp's policy against
// its frozen reference on kPairsPerStep pairs a step.
plan::Plan TrainingPlan(const Layout& layout) {
  static const Files packed_files = WriteFiles(false);
  static const Files padded_files = WriteFiles(true);
  static const Files pair_files = WritePairFiles();
  plan::Plan plan = ShortShippedPlan(layout.dpo ? "qwen_dpo_fsdp" : "llama_sft");
  plan.clear_mesh();
  plan.clear_prepare();
  for (plan::FrozenModel& frozen : *plan.mutable_frozen()) frozen.clear_prepare();
  if (!layout.strategy.empty()) {
    const bool tp = layout.strategy == "tp";
    parallel::MeshConfig::Dimension* dim = plan.mutable_mesh()->add_dims();
    dim->set_name(tp ? "tp" : "dp");
    dim->set_size(layout.ranks);
    wrap::PrepareStep step;
    if (layout.strategy == "fsdp") step.mutable_fsdp()->set_mesh_dim("dp");
    if (layout.strategy == "ddp") step.mutable_ddp()->set_mesh_dim("dp");
    if (tp) step.mutable_tensor_parallel()->set_mesh_dim("tp");
    *plan.add_prepare() = step;
    for (plan::FrozenModel& frozen : *plan.mutable_frozen()) *frozen.add_prepare() = step;
    if (tp) {
      plan.add_prepare()->mutable_activation_checkpointing()->set_policy(
          wrap::ActivationCheckpointingConfig::SELECTIVE);
    }
  }
  plan.mutable_optimizer()->mutable_sgd()->set_momentum(0.9);
  // DPO's gradients grow with the rewards: a smaller step keeps the rounding of the two
  // summation orders from growing past the tolerance over the steps.
  plan.mutable_schedule()->set_lr(layout.dpo ? 0.03 : 0.1);
  const bool bfd = layout.packing == data::PACKING_BFD;
  data::PairFiles* files = layout.dpo ? plan.mutable_data()->mutable_preference_files()
                                      : plan.mutable_data()->mutable_sft_files();
  const Files& paths = layout.dpo ? pair_files : bfd ? packed_files : padded_files;
  files->set_train_path(paths.train);
  files->set_eval_path(paths.eval);
  files->set_packing(layout.packing);
  plan::TrainingConfig* training = plan.mutable_training();
  training->set_steps(kSteps);
  training->set_eval_every(kSteps);
  training->set_seq_len(kSeqLen);
  const int global_batch = layout.dpo ? kPairsPerStep : bfd ? kRowsPerStep : 2 * kRowsPerStep;
  const int data_parallel = layout.strategy == "tp" ? 1 : layout.ranks;
  training->set_micro_batch(global_batch / data_parallel / layout.accumulation);
  training->set_grad_accumulation(layout.accumulation);
  training->set_global_batch(global_batch);
  training->set_eval_batches(1);
  return plan;
}

// The padded run of one process that `layout`'s runs must equal.
const SavedRun& Padded(bool dpo) {
  static const SavedRun* sft =
      new SavedRun(TrainAndSave(TrainingPlan({.dpo = false}), 1, "padded_sft"));
  static const SavedRun* preference =
      new SavedRun(TrainAndSave(TrainingPlan({.dpo = true}), 1, "padded_dpo"));
  return dpo ? *preference : *sft;
}

// `layout`'s run is the padded run of one process; its log is written to `log` when given.
void ExpectPaddedRun(const Layout& layout, const std::string& name, std::ostream* log = nullptr) {
  TrainOptions options;
  options.log = log;
  const SavedRun run = TrainAndSave(TrainingPlan(layout), layout.ranks, name, options);
  const SavedRun& expected = Padded(layout.dpo);
  ASSERT_EQ(expected.report.steps.size(), static_cast<size_t>(kSteps));
  // DPO's rewards are beta times the difference of two sequence log-probabilities of hundreds
  // of nats, whose fp32 sums differ by ~1e-5 nats between one summation order and another (the
  // log-probabilities themselves agree to 1e-7 relative): they agree to 5e-6, absolute.
  ExpectSameSteps(run.report, expected.report, name, 1e-5, layout.dpo ? 0.5 : 1e-2);
  ASSERT_TRUE(expected.report.steps.back().eval_loss.has_value());
  ASSERT_TRUE(run.report.steps.back().eval_loss.has_value());
  const double eval_loss = *expected.report.steps.back().eval_loss;
  EXPECT_NEAR(*run.report.steps.back().eval_loss, eval_loss, 1e-5 * eval_loss) << name;
  ExpectSameParameters(run, expected, name);
}

// The comparisons mean something: the padded runs' parameters move 100 times the tolerance.
TEST(PackingTest, ThePaddedRunsTrain) {
  for (const bool dpo : {false, true}) {
    const plan::Plan plan = TrainingPlan({.dpo = dpo});
    const std::shared_ptr<models::CausalLM> initial =
        models::CausalLM::Create(testing::ConfigOf(plan.model()), plan.model().init()).value();
    double moved = 0, norm = 0;
    for (const auto& named : initial->NamedParameters()) {
      moved +=
          (Padded(dpo).parameters.at(named.name) - named.parameter).pow(2).sum().item<double>();
      norm += named.parameter.pow(2).sum().item<double>();
    }
    EXPECT_GT(std::sqrt(moved), 1e-3 * std::sqrt(norm)) << (dpo ? "dpo" : "sft");
  }
}

TEST(PackingTest, BestFitSftOnOneProcessTrainsAsPadded) {
  std::ostringstream log;
  ExpectPaddedRun({.packing = data::PACKING_BFD}, "bfd", &log);
  // Every row holds a long and a short example that fill it; padded, half the tokens would be
  // padding.
  EXPECT_THAT(log.str(), HasSubstr("training data: 80 sequences in 40 rows of 128 tokens "
                                   "(PACKING_BFD), 0.0% padding; one sequence a row: 80 rows, "
                                   "50.0% padding; PACKING_PADDING_FREE: "));
  EXPECT_THAT(log.str(), HasSubstr("useful (not padding) tokens/s: "));
}

TEST(PackingTest, BestFitSftOnDdpWithAccumulationTrainsAsPadded) {
  ExpectPaddedRun({.packing = data::PACKING_BFD, .strategy = "ddp", .ranks = 2, .accumulation = 2},
                  "bfd ddp x accumulation");
}

TEST(PackingTest, BestFitSftOnFsdpWithAccumulationTrainsAsPadded) {
  ExpectPaddedRun({.packing = data::PACKING_BFD, .strategy = "fsdp", .ranks = 2, .accumulation = 2},
                  "bfd fsdp x accumulation");
}

TEST(PackingTest, BestFitSftWithTensorParallelismAndCheckpointingTrainsAsPadded) {
  ExpectPaddedRun({.packing = data::PACKING_BFD, .strategy = "tp", .ranks = 2},
                  "bfd tp x selective checkpointing");
}

TEST(PackingTest, PaddingFreeSftOnFsdpWithAccumulationTrainsAsPadded) {
  ExpectPaddedRun(
      {.packing = data::PACKING_PADDING_FREE, .strategy = "fsdp", .ranks = 2, .accumulation = 2},
      "padding-free fsdp x accumulation");
}

TEST(PackingTest, PaddingFreeDpoOnOneProcessTrainsAsPadded) {
  ExpectPaddedRun({.dpo = true, .packing = data::PACKING_PADDING_FREE}, "dpo padding-free");
}

TEST(PackingTest, PaddingFreeDpoOnDdpWithAccumulationTrainsAsPadded) {
  ExpectPaddedRun({.dpo = true,
                   .packing = data::PACKING_PADDING_FREE,
                   .strategy = "ddp",
                   .ranks = 2,
                   .accumulation = 2},
                  "dpo padding-free ddp x accumulation");
}

TEST(PackingTest, PaddingFreeDpoOnFsdpWithAccumulationTrainsAsPadded) {
  ExpectPaddedRun({.dpo = true,
                   .packing = data::PACKING_PADDING_FREE,
                   .strategy = "fsdp",
                   .ranks = 2,
                   .accumulation = 2},
                  "dpo padding-free fsdp x accumulation");
}

}  // namespace
}  // namespace plait::trainer
