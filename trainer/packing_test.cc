// Packed SFT (PACKING_BFD) trains as the same examples padded one to a row: on examples of
// very different lengths (completions of 1 to 3 tokens beside sequences of 64 to 126), one
// process, DDP and FSDP on 2 ranks with 2 accumulated micro-batches, each packed run has the
// losses, gradient norms, evaluation loss and final parameters of the padded run that reads
// the same examples in the same steps.
#include "data/packing.h"

#include <cmath>
#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_matchers.h"
#include "gtest/gtest.h"
#include "models/causal_lm.h"
#include "models/hf_checkpoint.h"
#include "plan/plan.h"
#include "trainer/testing_ranks.h"
#include "trainer/trainer.h"

namespace plait::trainer {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::trainer::testing::ExpectSameSteps;
using ::plait::trainer::testing::ShortShippedPlan;
using ::plait::trainer::testing::TrainOnRanks;

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

// //trainer:llama_sft's model trained by SGD with momentum (as sft_normalization_test, which
// says why), kRowsPerStep packed rows (or twice as many padded examples) a step, on `ranks`
// data-parallel ranks under `strategy` ("fsdp", "ddp", or "" for one process) accumulating
// `accumulation` micro-batches; evaluated at the last step on the held-out file's one step.
plan::Plan SftPlan(bool packed, const std::string& strategy, int ranks, int accumulation) {
  static const Files packed_files = WriteFiles(false);
  static const Files padded_files = WriteFiles(true);
  plan::Plan plan = ShortShippedPlan("llama_sft");
  plan.clear_mesh();
  plan.clear_prepare();
  if (!strategy.empty()) {
    parallel::MeshConfig::Dimension* dim = plan.mutable_mesh()->add_dims();
    dim->set_name("dp");
    dim->set_size(ranks);
    wrap::PrepareStep* step = plan.add_prepare();
    if (strategy == "fsdp") step->mutable_fsdp()->set_mesh_dim("dp");
    if (strategy == "ddp") step->mutable_ddp()->set_mesh_dim("dp");
  }
  plan.mutable_optimizer()->mutable_sgd()->set_momentum(0.9);
  plan.mutable_schedule()->set_lr(0.1);
  data::PairFiles* files = plan.mutable_data()->mutable_sft_files();
  files->set_train_path(packed ? packed_files.train : padded_files.train);
  files->set_eval_path(packed ? packed_files.eval : padded_files.eval);
  if (packed) files->set_packing(data::PACKING_BFD);
  plan::TrainingConfig* training = plan.mutable_training();
  training->set_steps(kSteps);
  training->set_eval_every(kSteps);
  training->set_seq_len(kSeqLen);
  const int global_batch = packed ? kRowsPerStep : 2 * kRowsPerStep;
  training->set_micro_batch(global_batch / ranks / accumulation);
  training->set_grad_accumulation(accumulation);
  training->set_global_batch(global_batch);
  training->set_eval_batches(1);
  return plan;
}

struct SftRun {
  TrainReport report;
  std::map<std::string, torch::Tensor> parameters;  // at the end, by Hugging Face name
};

SftRun Train(plan::Plan plan, int ranks, const std::string& name) {
  const std::string saved = absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
  plan.mutable_training()->set_save_hf_dir(saved);
  SftRun run{TrainOnRanks(plan, ranks), {}};
  absl::StatusOr<std::shared_ptr<models::CausalLM>> model = models::LoadHfModel(saved);
  EXPECT_THAT(model, IsOk());
  if (model.ok()) {
    for (const auto& named : (*model)->NamedParameters()) {
      run.parameters[named.name] = named.parameter.detach().clone();
    }
  }
  return run;
}

const SftRun& Padded() {
  static const SftRun* run = new SftRun(Train(SftPlan(false, "", 1, 1), 1, "padded"));
  return *run;
}

void ExpectSameRun(const SftRun& run, const std::string& layout) {
  const SftRun& expected = Padded();
  ASSERT_EQ(expected.report.steps.size(), static_cast<size_t>(kSteps));
  ExpectSameSteps(run.report, expected.report, layout);
  ASSERT_TRUE(expected.report.steps.back().eval_loss.has_value());
  ASSERT_TRUE(run.report.steps.back().eval_loss.has_value());
  const double eval_loss = *expected.report.steps.back().eval_loss;
  EXPECT_NEAR(*run.report.steps.back().eval_loss, eval_loss, 1e-5 * eval_loss) << layout;
  ASSERT_EQ(run.parameters.size(), expected.parameters.size());
  for (const auto& [name, value] : expected.parameters) {
    const torch::Tensor& actual = run.parameters.at(name);
    EXPECT_LE((actual - value).norm().item<double>(), 1e-5 * value.norm().item<double>())
        << layout << " " << name;
  }
}

// The comparisons mean something: the padded run's parameters move far beyond the tolerance.
TEST(PackingTest, ThePaddedRunTrains) {
  const plan::Plan plan = SftPlan(false, "", 1, 1);
  const std::shared_ptr<models::CausalLM> initial =
      models::CausalLM::Create(testing::ConfigOf(plan.model()), plan.model().init()).value();
  double moved = 0, norm = 0;
  for (const auto& named : initial->NamedParameters()) {
    moved += (Padded().parameters.at(named.name) - named.parameter).pow(2).sum().item<double>();
    norm += named.parameter.pow(2).sum().item<double>();
  }
  EXPECT_GT(std::sqrt(moved), 1e-2 * std::sqrt(norm));
}

TEST(PackingTest, OneProcessTrainsAsPadded) {
  ExpectSameRun(Train(SftPlan(true, "", 1, 1), 1, "packed"), "packed");
}

TEST(PackingTest, DdpOnTwoRanksWithTwoAccumulatedMicroBatchesTrainsAsPadded) {
  ExpectSameRun(Train(SftPlan(true, "ddp", 2, 2), 2, "packed_ddp"), "packed ddp x accumulation");
}

TEST(PackingTest, FsdpOnTwoRanksWithTwoAccumulatedMicroBatchesTrainsAsPadded) {
  ExpectSameRun(Train(SftPlan(true, "fsdp", 2, 2), 2, "packed_fsdp"), "packed fsdp x accumulation");
}

}  // namespace
}  // namespace plait::trainer
