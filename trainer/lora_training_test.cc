// LoRA plans in the trainer, on ranks as threads over TCP: the frozen base gets its values
// (from the seed or a Hugging Face folder, each rank its slice) while the adapters keep
// LoRA's; only the adapters train; one process, FSDP and DDP on 2 ranks, tensor parallelism
// and FSDP over it, and a pipeline of 2 stages, train to the same losses; a resumed run reproduces
// the straight one bit for bit; the exported folder is a plain model with the adapters merged; and
// a trainable parameter without a gradient stops the run.
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "ATen/Context.h"
#include "ATen/core/Tensor.h"
#include "ATen/ops/allclose.h"
#include "ATen/ops/mm.h"
#include "ATen/ops/roll.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/status_matchers.h"
#include "base/test_paths.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "models/causal_lm.h"
#include "models/hf_checkpoint.h"
#include "models/model_config.h"
#include "models/safetensors.h"
#include "optim/optimizer.h"
#include "parallel/device_mesh.h"
#include "parallel/trainable_parameter.h"
#include "plan/plan.h"
#include "plan/testing_resolved.h"
#include "prepared/prepared_model.h"
#include "torch/csrc/autograd/generated/variable_factories.h"
#include "trainer/run_checkpoints.h"
#include "trainer/testing_ranks.h"
#include "trainer/trainer.h"
#include "wrap/lora/lora.h"
#include "wrap/lora/nf4.h"
#include "wrap/lora/peft_adapter.h"

namespace plait::trainer {
namespace {

namespace fs = std::filesystem;
using ::plait::base::testing::FreshTestDir;
using ::plait::base::testing::IsOk;
using ::plait::base::testing::StatusIs;
using ::plait::prepared::BuildOptimizer;
using ::plait::prepared::CheckEveryParameterHasGradient;
using ::plait::prepared::PreparedModel;
using ::plait::prepared::Role;
using ::plait::trainer::testing::ConfigOf;
using ::plait::trainer::testing::ShortShippedPlan;
using ::plait::trainer::testing::TrainOnRanks;
using ::plait::trainer::testing::WithMesh;
using ::testing::HasSubstr;

constexpr char kLora[] = R"pb(lora { rank: 4 alpha: 8 target: "*q_proj" target: "*v_proj" })pb";
// The same adapters with PEFT's lora_dropout.
constexpr char kLoraDropout[] =
    R"pb(lora { rank: 4 alpha: 8 dropout: 0.5 target: "*q_proj" target: "*v_proj" })pb";
// The same adapters over an NF4 base with double quantization (QLoRA).
constexpr char kQLora[] = R"pb(lora {
                                 rank: 4
                                 alpha: 8
                                 target: "*q_proj"
                                 target: "*v_proj"
                                 base_quantization: NF4
                                 double_quant: true
                               })pb";

bool IsAdapter(const std::string& name) { return absl::StrContains(name, ".lora_"); }

// The shipped plan `name`, shortened (ShortShippedPlan), with the LoRA step `lora` before its
// steps, but after a pipeline step (none when empty: a plan shipped with adapters).
plan::Plan LoraPlan(const std::string& name, const std::string& lora = kLora) {
  plan::Plan plan = ShortShippedPlan(name);
  if (lora.empty()) return plan;
  google::protobuf::RepeatedPtrField<wrap::PrepareStep> steps;
  wrap::PrepareStep adapters;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(lora, &adapters));
  for (const wrap::PrepareStep& step : plan.prepare()) {
    if (!step.has_pipeline() && adapters.has_lora()) *steps.Add() = std::move(adapters);
    *steps.Add() = step;
  }
  if (adapters.has_lora()) *steps.Add() = std::move(adapters);
  *plan.mutable_prepare() = steps;
  return plan;
}

// The model llama_single's spec gives with `seed`, whole, as CausalLM::Create initialises it.
std::shared_ptr<models::CausalLM> ModelOfSeed(int seed) {
  models::ModelSpec spec = ShortShippedPlan("llama_single").model();
  spec.mutable_init()->set_seed(seed);
  return models::CausalLM::Create(ConfigOf(spec), spec.init()).value();
}

// A Hugging Face folder holding ModelOfSeed(seed) in fp32, made once per test process.
std::string HfFolderOfSeed(int seed) {
  const std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/hf/seed", seed);
  if (!fs::exists(dir + "/config.json")) {
    EXPECT_THAT(models::SaveHfModel(*ModelOfSeed(seed), dir), IsOk());
  }
  return dir;
}

// Every rank's prepared parameters hold the base's values (those of `base`, the seed's or
// the folder's) and the adapters LoRA's (A drawn by its seed, B zero); only the adapters are
// the optimizer's, and two optimizer steps change them and leave the base bitwise as it was.
void ExpectOnlyTheAdaptersTrain(const plan::Plan& plan, int ranks, const std::string& hf_dir,
                                const models::CausalLM& base) {
  at::manual_seed(4);
  const at::Tensor tokens = torch::randint(ConfigOf(plan.model()).vocab_size(), {2, 16}, at::kLong);
  WithMesh(plan, ranks, [&](int rank, const parallel::DeviceMesh& mesh) {
    auto prepared = PreparedModel::Prepare(plan.model(), ConfigOf(plan.model()), hf_dir,
                                           plan.prepare(), mesh, Role::kTrained, "plan");
    ASSERT_THAT(prepared, IsOk());
    std::set<std::string> trained;
    for (const parallel::TrainableParameter& parameter : (*prepared)->trainable_parameters()) {
      EXPECT_TRUE(IsAdapter(parameter.name)) << parameter.name;
      trained.insert(parameter.name);
    }
    EXPECT_EQ(trained.size(), 4u * 2u * 2u);  // q and v of 4 blocks, A and B
    auto before = (*prepared)->preparation().FullParameters();
    ASSERT_THAT(before, IsOk());
    const auto base_parameters = base.named_parameters();
    for (const auto& [name, values] : *before) {
      if (!IsAdapter(name)) {
        EXPECT_TRUE(values.equal(base_parameters[name])) << name << " on rank " << rank;
      } else if (absl::StrContains(name, "lora_A")) {
        const at::Tensor want = wrap::lora::InitialA(0, name, 4, values.size(1));
        EXPECT_TRUE(values.equal(want)) << name << " on rank " << rank;
      } else {
        EXPECT_TRUE(values.equal(torch::zeros_like(values))) << name << " on rank " << rank;
      }
    }
    auto optimizer = BuildOptimizer(**prepared, plan.optimizer());
    ASSERT_THAT(optimizer, IsOk());
    for (int step = 0; step < 2; ++step) {
      (*prepared)->model().Loss(tokens, at::roll(tokens, -1, 1)).backward();
      ASSERT_THAT((*prepared)->preparation().BackwardStatus(), IsOk());
      ASSERT_THAT(CheckEveryParameterHasGradient((*prepared)->trainable_parameters(), step + 1),
                  IsOk());
      ASSERT_THAT((*optimizer)->Step(1e-2), IsOk());
      (*optimizer)->ZeroGrad();
    }
    auto after = (*prepared)->preparation().FullParameters();
    ASSERT_THAT(after, IsOk());
    for (const auto& [name, values] : *after) {
      EXPECT_EQ(values.equal(before->at(name)), !IsAdapter(name)) << name << " on rank " << rank;
    }
  });
}

TEST(LoraPreparedModelTest, TheBaseGetsItsValuesAndOnlyTheAdaptersTrain) {
  const std::shared_ptr<models::CausalLM> seeded = ModelOfSeed(1);  // the plans' seed
  ExpectOnlyTheAdaptersTrain(LoraPlan("llama_single"), 1, "", *seeded);
  ExpectOnlyTheAdaptersTrain(LoraPlan("llama_fsdp"), 2, "", *seeded);
  const std::string dir = HfFolderOfSeed(5);
  const std::shared_ptr<models::CausalLM> pretrained = ModelOfSeed(5);
  ExpectOnlyTheAdaptersTrain(LoraPlan("llama_single"), 1, dir, *pretrained);
  ExpectOnlyTheAdaptersTrain(LoraPlan("llama_fsdp"), 2, dir, *pretrained);
}

// A bf16 model's frozen base is held in bf16 (no fp32 copy: it never updates) with the
// rounded values; the adapters train through the optimizer's fp32 masters.
TEST(LoraPreparedModelTest, ABf16BaseIsHeldInBf16) {
  plan::Plan plan = LoraPlan("llama_single");
  ASSERT_THAT(plan::ApplyOverride("model.dtype=DTYPE_BFLOAT16", plan), IsOk());
  const std::shared_ptr<models::CausalLM> seeded = ModelOfSeed(1);
  WithMesh(plan, 1, [&](int, const parallel::DeviceMesh& mesh) {
    auto prepared = PreparedModel::Prepare(plan.model(), ConfigOf(plan.model()), "", plan.prepare(),
                                           mesh, Role::kTrained, "plan");
    ASSERT_THAT(prepared, IsOk());
    const auto base = seeded->named_parameters();
    for (const auto& named : (*prepared)->model().NamedParameters()) {
      EXPECT_EQ(named.parameter.scalar_type(), at::kBFloat16) << named.name;
      if (IsAdapter(named.name)) continue;
      EXPECT_TRUE(named.parameter.equal(base[named.name].to(at::kBFloat16))) << named.name;
    }
    for (const parallel::TrainableParameter& parameter : (*prepared)->trainable_parameters()) {
      EXPECT_FALSE(parameter.master.defined()) << parameter.name;  // the optimizer widens it
    }
  });
}

// The losses of two runs, step by step, within `relative` of the second's.
void ExpectSameLosses(const TrainReport& actual, const TrainReport& expected, double relative) {
  ASSERT_EQ(actual.steps.size(), 10u);
  ASSERT_EQ(expected.steps.size(), 10u);
  for (size_t i = 0; i < expected.steps.size(); ++i) {
    EXPECT_NEAR(actual.steps[i].loss, expected.steps[i].loss, relative * expected.steps[i].loss)
        << "step " << i + 1;
  }
}

TEST(LoraTrainTest, FsdpAndDdpOnTwoRanksTrainToTheSingleProcessLosses) {
  const TrainReport single = TrainOnRanks(LoraPlan("llama_single"), 1);
  // It trained, through the adapters alone.
  ASSERT_EQ(single.steps.size(), 10u);
  EXPECT_LT(single.steps.back().loss, single.steps.front().loss - 0.1);
  std::cout << "LoRA on one process: loss " << single.steps.front().loss << " at step 1, "
            << single.steps.back().loss << " at step 10\n";
  ExpectSameLosses(TrainOnRanks(LoraPlan("llama_fsdp"), 2), single, 1e-5);
  ExpectSameLosses(TrainOnRanks(LoraPlan("llama_ddp"), 2), single, 1e-5);
}

// TP-aware LoRA on every projection: tensor parallelism splits B with a column-parallel
// projection's outputs and A with a row-parallel one's inputs, and sums the gradients of the
// matrices it keeps whole. On 2 ranks (llama_tp) and on FSDP over them (llama_2d, 4 ranks),
// with 2 micro-batches a step, the losses are one process's.
TEST(LoraTrainTest, TensorParallelAndFsdpOverItTrainToTheSingleProcessLosses) {
  constexpr char kEveryProjection[] = R"pb(lora { rank: 4 alpha: 8 target: "*_proj" })pb";
  const auto accumulating = [&](const std::string& name) {
    plan::Plan plan = LoraPlan(name, kEveryProjection);
    plan.mutable_training()->set_micro_batch(plan.training().micro_batch() / 2);
    plan.mutable_training()->set_grad_accumulation(2);
    return plan;
  };
  const TrainReport single = TrainOnRanks(accumulating("llama_single"), 1);
  ASSERT_EQ(single.steps.size(), 10u);
  EXPECT_LT(single.steps.back().loss, single.steps.front().loss - 0.1);
  ExpectSameLosses(TrainOnRanks(accumulating("llama_tp"), 2), single, 1e-5);
  ExpectSameLosses(TrainOnRanks(accumulating("llama_2d"), 4), single, 1e-5);
}

// From a Hugging Face folder of another seed's weights: FSDP's ranks each read their shards
// of the base, and train as one process does from it; the folder's weights were used.
TEST(LoraTrainTest, FromAHuggingFaceFolderFsdpTrainsAsOneProcess) {
  plan::Plan single = LoraPlan("llama_single");
  plan::Plan fsdp = LoraPlan("llama_fsdp");
  const std::string dir = HfFolderOfSeed(5);
  single.set_hf_weights_dir(dir);
  fsdp.set_hf_weights_dir(dir);
  const TrainReport expected = TrainOnRanks(single, 1);
  ExpectSameLosses(TrainOnRanks(fsdp, 2), expected, 1e-5);
  const TrainReport seeded = TrainOnRanks(LoraPlan("llama_single"), 1);
  ASSERT_FALSE(seeded.steps.empty());
  EXPECT_NE(expected.steps.front().loss, seeded.steps.front().loss);
}

// Checkpoints hold the adapters and their optimizer state alone; a run resumed after step 5
// gives its base its values again (QLoRA's quantized again) and continues bit for bit as the
// straight run, on FSDP's 2 ranks from the seed and from a Hugging Face folder, with dropout
// (its masks drawn as the straight run drew them, each rank its own), QLoRA on them from the
// folder, and DPO of adapters against the policy without them (qwen_lora_dpo_fsdp); a resume
// from another base is refused.
TEST(LoraTrainTest, AResumedRunReproducesTheStraightRun) {
  struct Case {
    const char* plan;
    const char* lora;
    bool from_hf;
  };
  for (const Case& one : {Case{"llama_fsdp", kLora, false}, Case{"llama_fsdp", kLora, true},
                          Case{"llama_fsdp", kLoraDropout, false}, Case{"llama_fsdp", kQLora, true},
                          Case{"qwen_lora_dpo_fsdp", "", false}}) {
    const bool from_hf = one.from_hf;
    const std::string name = absl::StrCat(one.plan,
                                          one.lora == kQLora         ? "_qlora_"
                                          : one.lora == kLoraDropout ? "_dropout_"
                                                                     : "_",
                                          from_hf ? "hf" : "seed");
    SCOPED_TRACE(name);
    const auto with_checkpoints = [&](const std::string& dir) {
      plan::Plan plan = LoraPlan(one.plan, one.lora);
      if (from_hf) plan.set_hf_weights_dir(HfFolderOfSeed(5));
      for (const std::string& assignment : {std::string("training.checkpoint.every=5"),
                                            absl::StrCat("training.checkpoint.dir=", dir)}) {
        EXPECT_THAT(plan::ApplyOverride(assignment, plan), IsOk()) << assignment;
      }
      return plan;
    };
    const std::string straight_dir = FreshTestDir("lora_straight_" + name);
    const TrainReport straight = TrainOnRanks(with_checkpoints(straight_dir), 2);
    ASSERT_EQ(straight.steps.size(), 10u);
    // Only the adapters, and their optimizer state, are saved.
    for (const fs::directory_entry& file :
         fs::directory_iterator(straight_dir + "/step-00000005")) {
      if (file.path().extension() != ".safetensors") continue;
      auto tensors = models::SafetensorsFile::Open(file.path().string());
      ASSERT_THAT(tensors, IsOk());
      for (const auto& [tensor, entry] : (*tensors)->entries()) {
        EXPECT_TRUE(IsAdapter(tensor)) << file.path() << ": " << tensor;
      }
    }

    const std::string resumed_dir = FreshTestDir("lora_resumed_" + name);
    fs::create_directories(resumed_dir);
    fs::copy(straight_dir + "/step-00000005", resumed_dir + "/step-00000005",
             fs::copy_options::recursive);
    plan::Plan resuming = with_checkpoints(resumed_dir);
    ASSERT_THAT(plan::ApplyOverride("training.checkpoint.resume=true", resuming), IsOk());
    const TrainReport resumed = TrainOnRanks(resuming, 2);
    ASSERT_EQ(resumed.steps.size(), 5u);
    for (size_t i = 0; i < resumed.steps.size(); ++i) {
      const auto& want = straight.steps[i + 5];
      EXPECT_EQ(resumed.steps[i].step, want.step);
      EXPECT_EQ(resumed.steps[i].loss, want.loss) << "step " << want.step;
      EXPECT_EQ(resumed.steps[i].grad_norm, want.grad_norm) << "step " << want.step;
    }

    // The base the checkpoint's adapters were trained on is part of its fingerprint: a
    // resume from the other source is refused, naming the field.
    plan::Plan other_base = resuming;
    other_base.set_hf_weights_dir(from_hf ? "" : HfFolderOfSeed(5));
    WithMesh(other_base, 2, [&](int, const parallel::DeviceMesh& mesh) {
      EXPECT_THAT(RunCheckpoints::Open(plan::testing::Resolved(other_base, 2), mesh),
                  StatusIs(absl::StatusCode::kInvalidArgument,
                           HasSubstr("fingerprint.plan.hf_weights_dir: ")));
    });
  }
}

// LoRA's dropout masks in training are the run's own: two runs that differ only in when they
// evaluate, each started after other draws of the process's default generator, train to the
// same losses bit for bit.
TEST(LoraDropoutTest, TrainingDrawsTheSameMasksWhenEvaluatingOrNot) {
  std::vector<TrainReport> runs;
  for (const int eval_every : {2, 0}) {  // 0: once, after the last step
    plan::Plan plan = LoraPlan("llama_single", kLoraDropout);
    ASSERT_THAT(plan::ApplyOverride(absl::StrCat("training.eval_every=", eval_every), plan),
                IsOk());
    at::manual_seed(eval_every);
    torch::rand({eval_every + 3});
    runs.push_back(TrainOnRanks(plan, 1));
  }
  ASSERT_EQ(runs[0].steps.size(), 10u);
  ASSERT_EQ(runs[1].steps.size(), 10u);
  for (size_t i = 0; i < runs[0].steps.size(); ++i) {
    EXPECT_EQ(runs[0].steps[i].loss, runs[1].steps[i].loss) << "step " << i + 1;
  }
  EXPECT_EQ(runs[0].steps.back().eval_loss, runs[1].steps.back().eval_loss);
  // The masks acted: B trained away from zero by step 3 (the warmup's first step has rate 0).
  const TrainReport without = TrainOnRanks(LoraPlan("llama_single"), 1);
  EXPECT_NE(runs[1].steps[2].loss, without.steps[2].loss);
}

// Evaluation computes without dropout (the model in eval mode), and the model trains with it
// again after: from adapters whose B is not zero, the first evaluation (after a step at the
// warmup's rate 0, which changes nothing) of a plan with dropout is that of the same plan
// without, while their training losses differ.
TEST(LoraDropoutTest, EvaluationComputesWithoutDropout) {
  const std::string adapter_dir = FreshTestDir("lora_dropout_start");
  const plan::Plan plan = LoraPlan("llama_single");
  WithMesh(plan, 1, [&](int, const parallel::DeviceMesh& mesh) {
    auto prepared = PreparedModel::Prepare(plan.model(), ConfigOf(plan.model()), "", plan.prepare(),
                                           mesh, Role::kTrained, "plan");
    ASSERT_THAT(prepared, IsOk());
    auto full = (*prepared)->preparation().FullParameters();
    ASSERT_THAT(full, IsOk());
    at::manual_seed(3);
    std::vector<std::pair<std::string, at::Tensor>> adapters;
    for (const auto& [name, values] : *full) {
      if (!IsAdapter(name)) continue;
      adapters.emplace_back(
          name, absl::StrContains(name, "lora_B") ? torch::randn_like(values) * 0.05 : values);
    }
    ASSERT_THAT(wrap::lora::SavePeftAdapter(adapter_dir, plan.prepare(0).lora(), adapters, ""),
                IsOk());
  });
  std::map<double, TrainReport> runs;
  for (const double dropout : {0.0, 0.5}) {
    plan::Plan starting = LoraPlan("llama_single");
    starting.mutable_prepare(0)->mutable_lora()->set_initial_adapter_dir(adapter_dir);
    starting.mutable_prepare(0)->mutable_lora()->set_dropout(dropout);
    ASSERT_THAT(plan::ApplyOverride("training.eval_every=1", starting), IsOk());
    runs[dropout] = TrainOnRanks(starting, 1);
    ASSERT_EQ(runs[dropout].steps.size(), 10u);
  }
  EXPECT_NE(runs[0.5].steps[0].loss, runs[0.0].steps[0].loss);
  EXPECT_EQ(runs[0.5].steps[0].eval_loss, runs[0.0].steps[0].eval_loss);
  // Training after the evaluation draws masks again.
  EXPECT_NE(runs[0.5].steps[1].loss, runs[0.0].steps[1].loss);
}

// The exported folder is a plain model: no adapter tensors, the adapted projections' weights
// merged (W + scale * B A, changed by training), the others the base's.
TEST(LoraTrainTest, TheExportedFolderIsAPlainModelWithTheAdaptersMerged) {
  const std::string dir = FreshTestDir("lora_export");
  plan::Plan plan = LoraPlan("llama_fsdp");
  plan.mutable_training()->set_save_hf_dir(dir);
  TrainOnRanks(plan, 2);
  auto loaded = models::LoadHfModel(dir);
  ASSERT_THAT(loaded, IsOk());
  const std::shared_ptr<models::CausalLM> base = ModelOfSeed(1);
  const auto base_parameters = base->named_parameters();
  ASSERT_EQ((*loaded)->named_parameters().size(), base_parameters.size());
  for (const auto& item : (*loaded)->named_parameters()) {
    const bool adapted = absl::StrContains(item.key(), "q_proj.weight") ||
                         absl::StrContains(item.key(), "v_proj.weight");
    EXPECT_EQ(item.value().equal(base_parameters[item.key()]), !adapted) << item.key();
  }
}

// The adapters saved in PEFT's format are the trained ones: with the base, they make the
// exported merged model (W + alpha / rank * B A for each adapted projection), under PEFT's
// config (rank, alpha, the adapted modules); and a plan that starts from the folder holds them.
TEST(LoraTrainTest, TheSavedAdapterFolderIsTheTrainedAdapters) {
  const std::string adapter_dir = FreshTestDir("lora_adapter");
  const std::string merged_dir = FreshTestDir("lora_merged");
  plan::Plan plan = LoraPlan("llama_fsdp");
  plan.mutable_training()->set_save_adapter_dir(adapter_dir);
  plan.mutable_training()->set_save_hf_dir(merged_dir);
  TrainOnRanks(plan, 2);
  absl::StatusOr<wrap::lora::PeftAdapter> adapter = wrap::lora::ReadPeftAdapter(adapter_dir);
  ASSERT_THAT(adapter, IsOk());
  EXPECT_EQ(adapter->config.rank(), 4);
  EXPECT_EQ(adapter->config.alpha(), 8.0);
  auto merged = models::LoadHfModel(merged_dir);
  ASSERT_THAT(merged, IsOk());
  const auto merged_parameters = (*merged)->named_parameters();
  const auto base_parameters = ModelOfSeed(1)->named_parameters();
  const int64_t layers = (*merged)->config().num_hidden_layers();
  ASSERT_EQ(adapter->config.target_size(), 2 * layers);
  std::map<std::string, at::Tensor> tensors(adapter->tensors.begin(), adapter->tensors.end());
  for (const std::string& module : adapter->config.target()) {
    const at::Tensor a = tensors.at(module + ".lora_A.weight");
    const at::Tensor b = tensors.at(module + ".lora_B.weight");
    EXPECT_GT(b.abs().max().item<float>(), 0.0f) << module << ": B never trained";
    const std::string weight = module + ".weight";
    const at::Tensor expected = base_parameters[weight] + 2.0 * at::mm(b, a);
    EXPECT_TRUE(at::allclose(merged_parameters[weight], expected, 1e-5, 1e-7))
        << weight << ": " << (merged_parameters[weight] - expected).abs().max().item<float>();
  }
  // A plan continues training from the folder: every rank's adapters start as the saved ones.
  plan::Plan continued = LoraPlan("llama_fsdp");
  continued.mutable_prepare(0)->mutable_lora()->set_initial_adapter_dir(adapter_dir);
  WithMesh(continued, 2, [&](int rank, const parallel::DeviceMesh& mesh) {
    auto prepared = PreparedModel::Prepare(continued.model(), ConfigOf(continued.model()), "",
                                           continued.prepare(), mesh, Role::kTrained, "plan");
    ASSERT_THAT(prepared, IsOk());
    auto full = (*prepared)->preparation().FullParameters();
    ASSERT_THAT(full, IsOk());
    for (const auto& [name, saved] : tensors) {
      EXPECT_TRUE(full->at(name).equal(saved)) << name << " on rank " << rank;
    }
  });
}

// QLoRA: the base a prepared model computes with is its values (the seed's, or a Hugging
// Face folder's, each stored as it is loaded) through NF4 for the targeted projections, and
// as they are for the rest, on one process and on FSDP's 2 ranks, which shard the NF4 bytes;
// it trains, and DDP's and FSDP's 2 ranks train as one process.
TEST(QLoraTrainTest, TheBaseIsQuantizedAsLoadedAndDdpAndFsdpTrainAsOneProcess) {
  const std::string dir = HfFolderOfSeed(5);
  for (const auto& [name, ranks, from_hf] :
       {std::tuple{"llama_single", 1, false}, std::tuple{"llama_single", 1, true},
        std::tuple{"llama_fsdp", 2, true}}) {
    plan::Plan plan = LoraPlan(name, kQLora);
    const auto base = ModelOfSeed(from_hf ? 5 : 1)->named_parameters();
    WithMesh(plan, ranks, [&](int rank, const parallel::DeviceMesh& mesh) {
      auto prepared =
          PreparedModel::Prepare(plan.model(), ConfigOf(plan.model()), from_hf ? dir : "",
                                 plan.prepare(), mesh, Role::kTrained, "plan");
      ASSERT_THAT(prepared, IsOk());
      auto full = (*prepared)->preparation().FullParameters();
      ASSERT_THAT(full, IsOk());
      ASSERT_EQ(full->size(), base.size() + 4u * 2u * 2u);
      for (const auto& [name, values] : *full) {
        if (IsAdapter(name)) continue;
        const bool held =
            absl::StrContains(name, "q_proj.weight") || absl::StrContains(name, "v_proj.weight");
        const at::Tensor want =
            held ? wrap::lora::Nf4Dequantize(wrap::lora::Nf4Quantize(base[name], true), at::kFloat)
                 : base[name];
        EXPECT_TRUE(values.equal(want))
            << name << (from_hf ? " from the folder" : "") << " on rank " << rank;
      }
    });
  }
  const auto from_folder = [&](const std::string& name) {
    plan::Plan plan = LoraPlan(name, kQLora);
    plan.set_hf_weights_dir(dir);
    return plan;
  };
  const TrainReport expected = TrainOnRanks(from_folder("llama_single"), 1);
  ASSERT_EQ(expected.steps.size(), 10u);
  EXPECT_LT(expected.steps.back().loss, expected.steps.front().loss - 0.1);
  std::cout << "QLoRA on one process: loss " << expected.steps.front().loss << " at step 1, "
            << expected.steps.back().loss << " at step 10\n";
  ExpectSameLosses(TrainOnRanks(from_folder("llama_ddp"), 2), expected, 1e-5);
  ExpectSameLosses(TrainOnRanks(from_folder("llama_fsdp"), 2), expected, 1e-5);
}

// LoRA on a pipeline (llama_pp: 2 stages, 1F1B): each stage adapts its own blocks'
// projections, and they train as one process's do; the merged export and the adapter folder,
// which rank 0 writes, hold every stage's adapters, equal to one process's. QLoRA trains so too.
TEST(LoraTrainTest, APipelineTrainsAsOneProcessAndSavesEveryStagesAdapters) {
  struct Saved {
    TrainReport report;
    wrap::lora::PeftAdapter adapter;
    std::shared_ptr<models::CausalLM> merged;
  };
  std::map<std::string, Saved> saved;
  for (const auto& [name, ranks] : {std::pair{"llama_single", 1}, std::pair{"llama_pp", 2}}) {
    plan::Plan plan = LoraPlan(name);
    const std::string adapter_dir = FreshTestDir(absl::StrCat(name, "_adapter"));
    const std::string merged_dir = FreshTestDir(absl::StrCat(name, "_merged"));
    plan.mutable_training()->set_save_adapter_dir(adapter_dir);
    plan.mutable_training()->set_save_hf_dir(merged_dir);
    TrainReport report = TrainOnRanks(plan, ranks);
    absl::StatusOr<wrap::lora::PeftAdapter> adapter = wrap::lora::ReadPeftAdapter(adapter_dir);
    ASSERT_THAT(adapter, IsOk()) << name;
    auto merged = models::LoadHfModel(merged_dir);
    ASSERT_THAT(merged, IsOk()) << name;
    saved[name] = {std::move(report), *std::move(adapter), *std::move(merged)};
  }
  const auto& [report, adapter, merged] = saved.at("llama_pp");
  const auto& [expected, expected_adapter, expected_merged] = saved.at("llama_single");
  EXPECT_LT(expected.steps.back().loss, expected.steps.front().loss - 0.1);  // it trained
  ExpectSameLosses(report, expected, 1e-5);
  EXPECT_EQ(
      std::vector<std::string>(adapter.config.target().begin(), adapter.config.target().end()),
      std::vector<std::string>(expected_adapter.config.target().begin(),
                               expected_adapter.config.target().end()));
  ASSERT_EQ(adapter.tensors.size(), expected_adapter.tensors.size());
  ASSERT_EQ(adapter.tensors.size(), 4u * 2u * 2u);  // q and v of 4 blocks, A and B
  for (size_t i = 0; i < adapter.tensors.size(); ++i) {
    const auto& [name, values] = adapter.tensors[i];
    const auto& [expected_name, expected_values] = expected_adapter.tensors[i];
    EXPECT_EQ(name, expected_name);
    EXPECT_LE((values - expected_values).norm().item<double>(),
              1e-5 * expected_values.norm().item<double>())
        << name;
  }
  const auto merged_parameters = merged->named_parameters();
  for (const auto& item : expected_merged->named_parameters()) {
    EXPECT_LE((merged_parameters[item.key()] - item.value()).norm().item<double>(),
              1e-5 * item.value().norm().item<double>())
        << item.key();
  }
  ExpectSameLosses(TrainOnRanks(LoraPlan("llama_pp", kQLora), 2),
                   TrainOnRanks(LoraPlan("llama_single", kQLora), 1), 1e-5);
}

// "Nothing silently frozen": a trainable parameter that got no gradient is named.
TEST(CheckEveryParameterHasGradientTest, NamesTheParametersWithoutOne) {
  std::vector<parallel::TrainableParameter> parameters;
  for (const std::string name : {"model.layers.0.self_attn.q_proj.lora_A.weight",
                                 "model.layers.0.self_attn.q_proj.lora_B.weight",
                                 "model.layers.1.self_attn.q_proj.lora_A.weight"}) {
    parallel::TrainableParameter parameter;
    parameter.name = name;
    parameter.tensor = torch::zeros({2, 2}).requires_grad_();
    parameters.push_back(parameter);
  }
  for (const parallel::TrainableParameter& parameter : parameters) {
    parameter.tensor.sum().backward();
  }
  EXPECT_THAT(CheckEveryParameterHasGradient(parameters, 1), IsOk());
  parameters[0].tensor.mutable_grad() = at::Tensor();
  parameters[2].tensor.mutable_grad() = at::Tensor();
  EXPECT_THAT(CheckEveryParameterHasGradient(parameters, 3),
              StatusIs(absl::StatusCode::kInternal,
                       "after step 3, the trainable parameters "
                       "model.layers.0.self_attn.q_proj.lora_A.weight, "
                       "model.layers.1.self_attn.q_proj.lora_A.weight got no gradient: no loss "
                       "reaches them, so the optimizer would never change them"));
  parameters[0].tensor.sum().backward();
  EXPECT_THAT(CheckEveryParameterHasGradient(parameters, 1),
              StatusIs(absl::StatusCode::kInternal,
                       HasSubstr("parameter model.layers.1.self_attn.q_proj.lora_A.weight got no "
                                 "gradient: no loss reaches it,")));
}

}  // namespace
}  // namespace plait::trainer
