// The trainer's regressions, on ranks as threads over TCP: the optimizer owns exactly the
// prepared model's trainable shards, an FSDP plan on 2 ranks trains to the single-process
// plan's losses, and a frozen model is prepared without optimizer or gradient state.
#include "trainer/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "ATen/ops/equal.h"
#include "ATen/ops/log_softmax.h"
#include "absl/strings/str_cat.h"
#include "base/allocation_counter.h"
#include "base/dtype.pb.h"
#include "base/status_matchers.h"
#include "data/data_config.h"
#include "data/data_loader.h"
#include "data/testing_token_files.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "metrics/step_metrics.h"
#include "models/causal_lm.h"
#include "models/estimates.h"
#include "models/hf_checkpoint.h"
#include "models/model_config.h"
#include "objectives/objective.h"
#include "optim/optimizer.h"
#include "parallel/device_mesh.h"
#include "parallel/tensor_slice.h"
#include "parallel/test_ranks.h"
#include "plan/plan.h"
#include "plan/testing_resolved.h"
#include "prepared/prepared_model.h"
#include "torch/csrc/autograd/generated/variable_factories.h"
#include "trainer/testing_ranks.h"

namespace plait::trainer {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::base::testing::StatusIs;
using ::plait::plan::testing::Resolved;
using ::plait::prepared::BuildOptimizer;
using ::plait::prepared::PreparedModel;
using ::plait::prepared::Role;
using ::plait::trainer::testing::ConfigOf;
using ::plait::trainer::testing::ExpectSameSteps;
using ::plait::trainer::testing::ShortShippedPlan;
using ::plait::trainer::testing::TrainOnRanks;
using ::plait::trainer::testing::WithMesh;
using ::testing::DoubleNear;
using ::testing::HasSubstr;

TEST(PreparedModelTest, OptimizerOwnsExactlyTheTrainableShards) {
  const plan::Plan plan = ShortShippedPlan("llama_fsdp");
  WithMesh(plan, 2, [&](int rank, const parallel::DeviceMesh& mesh) {
    auto prepared = PreparedModel::Prepare(plan.model(), ConfigOf(plan.model()), "", plan.prepare(),
                                           mesh, Role::kTrained, "plan");
    ASSERT_THAT(prepared, IsOk());
    auto optimizer = BuildOptimizer(**prepared, plan.optimizer());
    ASSERT_THAT(optimizer, IsOk());
    const auto& trainable = (*prepared)->trainable_parameters();
    const auto& owned = (*optimizer)->parameters();
    ASSERT_EQ(owned.size(), trainable.size());
    int64_t shard_elements = 0;
    for (size_t i = 0; i < owned.size(); ++i) {
      EXPECT_EQ(owned[i].name, trainable[i].name);
      EXPECT_EQ(owned[i].tensor.unsafeGetTensorImpl(), trainable[i].tensor.unsafeGetTensorImpl())
          << owned[i].name;
      shard_elements += owned[i].tensor.numel();
    }
    // Shards, not the full tensors: about half of the model on each of 2 ranks.
    const int64_t full = models::NumParameters((*prepared)->model().config());
    EXPECT_LT(shard_elements, full * 0.51) << "rank " << rank;
    EXPECT_GT(shard_elements, full * 0.49) << "rank " << rank;
  });
}

TEST(PreparedModelTest, FrozenModelIsPreparedWithoutOptimizerOrGradients) {
  const plan::Plan plan = ShortShippedPlan("llama_fsdp");
  WithMesh(plan, 2, [&](int rank, const parallel::DeviceMesh& mesh) {
    auto frozen = PreparedModel::Prepare(plan.model(), ConfigOf(plan.model()), "", plan.prepare(),
                                         mesh, Role::kFrozen, "plan.frozen[0]");
    ASSERT_THAT(frozen, IsOk());
    EXPECT_TRUE((*frozen)->trainable_parameters().empty());
    EXPECT_THAT(BuildOptimizer(**frozen, plan.optimizer()),
                StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("frozen")));
    // It runs (FSDP gathers its shards) and leaves no gradient anywhere.
    const at::Tensor tokens = torch::randint(100, {2, 8}, at::kLong);
    at::Tensor loss = (*frozen)->model().Loss(tokens, tokens);
    EXPECT_TRUE(std::isfinite(loss.item<double>()));
    EXPECT_FALSE(loss.requires_grad());
    ASSERT_THAT((*frozen)->preparation().BackwardStatus(), IsOk());
    for (const auto& named : (*frozen)->model().NamedParameters()) {
      EXPECT_FALSE(named.parameter.requires_grad()) << named.name;
      EXPECT_FALSE(named.parameter.grad().defined()) << named.name;
    }
  });
}

TEST(PreparedModelTest, SavesAndLoadsHuggingFaceFolders) {
  const plan::Plan plan = ShortShippedPlan("llama_fsdp");
  const std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/hf/out");
  std::map<std::string, at::Tensor> saved;
  const int64_t draws_before_seeded = models::internal::SeededDraws();
  WithMesh(plan, 2, [&](int rank, const parallel::DeviceMesh& mesh) {
    auto prepared = PreparedModel::Prepare(plan.model(), ConfigOf(plan.model()), "", plan.prepare(),
                                           mesh, Role::kTrained, "plan");
    ASSERT_THAT(prepared, IsOk());
    ASSERT_THAT((*prepared)->SaveHf(dir, rank, 0), IsOk());
    auto full = (*prepared)->preparation().FullParameters();
    ASSERT_THAT(full, IsOk());
    if (rank == 0) saved = *full;
  });
  EXPECT_GT(models::internal::SeededDraws(), draws_before_seeded);
  // Loaded on one rank with another seed: the folder's weights replace the initialisation,
  // which is not drawn.
  const plan::Plan single = ShortShippedPlan("llama_single");
  models::ModelSpec other_seed = single.model();
  other_seed.mutable_init()->set_seed(99);
  WithMesh(single, 1, [&](int, const parallel::DeviceMesh& mesh) {
    const int64_t draws = models::internal::SeededDraws();
    auto loaded = PreparedModel::Prepare(other_seed, ConfigOf(other_seed), dir, single.prepare(),
                                         mesh, Role::kTrained, "plan");
    ASSERT_THAT(loaded, IsOk());
    EXPECT_EQ(models::internal::SeededDraws(), draws);
    for (const auto& named : (*loaded)->model().NamedParameters()) {
      EXPECT_TRUE(named.parameter.equal(saved.at(named.name))) << named.name;
    }
    EXPECT_THAT(PreparedModel::Prepare(other_seed, ConfigOf(other_seed), dir + "/missing",
                                       single.prepare(), mesh, Role::kTrained, "plan"),
                StatusIs(absl::StatusCode::kNotFound, HasSubstr("plan.hf_weights_dir: ")));
  });
}

// Deferred initialisation: whatever the layout, the prepared model holds the values
// CausalLM::Create gives the same spec, exactly in fp32 and rounded in bf16, and what the
// optimizer trains (FSDP's fp32 shards, the fp32 masters of bf16 parameters) their fp32 values.
TEST(PreparedModelTest, EveryLayoutHoldsTheModelsInitialisation) {
  for (const auto& [name, ranks] : {std::pair<std::string, int>{"llama_single", 1},
                                    {"llama_fsdp", 2},
                                    {"llama_ddp", 2},
                                    {"llama_tp", 2},
                                    {"llama_2d", 4},
                                    {"llama_hsdp", 4}}) {
    for (const base::Dtype dtype : {base::DTYPE_FLOAT32, base::DTYPE_BFLOAT16}) {
      SCOPED_TRACE(absl::StrCat(name, " in ", base::Dtype_Name(dtype)));
      plan::Plan plan = ShortShippedPlan(name);
      plan.mutable_model()->set_dtype(dtype);
      absl::StatusOr<models::ModelConfig> config =
          models::ResolveModelSpec(plan.model(), "plan.model");
      ASSERT_THAT(config, IsOk());
      absl::StatusOr<std::shared_ptr<models::CausalLM>> created =
          models::CausalLM::Create(*config, plan.model().init());
      ASSERT_THAT(created, IsOk());
      std::map<std::string, at::Tensor> initial;
      for (const auto& item : (*created)->named_parameters()) initial[item.key()] = item.value();
      WithMesh(plan, ranks, [&](int rank, const parallel::DeviceMesh& mesh) {
        auto prepared = PreparedModel::Prepare(plan.model(), ConfigOf(plan.model()), "",
                                               plan.prepare(), mesh, Role::kTrained, "plan");
        ASSERT_THAT(prepared, IsOk());
        for (const parallel::TrainableParameter& parameter : (*prepared)->trainable_parameters()) {
          const at::Tensor& trained =
              parameter.master.defined() ? parameter.master : parameter.tensor;
          ASSERT_EQ(trained.scalar_type(), at::kFloat) << parameter.name;
          const parallel::TensorSlice& slice = parameter.slice;
          EXPECT_TRUE(slice.DataOf(trained.detach())
                          .equal(parallel::NarrowTo(
                              initial.at(parameter.name),
                              parallel::TensorSlice::Whole(slice.global_shape).box, slice.box)))
              << parameter.name << " on rank " << rank;
        }
        auto full = (*prepared)->preparation().FullParameters();
        ASSERT_THAT(full, IsOk());
        ASSERT_EQ(full->size(), initial.size());
        for (const auto& [parameter, values] : initial) {
          const at::Tensor& held = full->at(parameter);
          EXPECT_TRUE(held.equal(values.to(held.scalar_type())))
              << parameter << " on rank " << rank;
        }
      });
    }
  }
}

// Deferred initialisation: a rank that holds half of the model, under FSDP, tensor
// parallelism or a pipeline of 2 stages, allocates while the model is prepared its half and one
// whole parameter or block at a time, never the whole model, which the single process holds. The
// model: 16 of tiny's blocks, 55 MB in fp32, whose largest parameter is 4 MB.
TEST(PreparedModelTest, NoRankHoldsTheWholeModelWhenItsPreparationSplitsIt) {
  models::ModelConfig config = models::PresetConfig("tiny").value();
  config.set_num_hidden_layers(16);
  const double model_bytes = 4.0 * static_cast<double>(models::NumParameters(config));
  for (const auto& [name, ranks] : {std::pair<std::string, int>{"llama_single", 1},
                                    {"llama_fsdp", 2},
                                    {"llama_tp", 2},
                                    {"llama_pp", 2}}) {
    SCOPED_TRACE(name);
    plan::Plan plan = ShortShippedPlan(name);
    *plan.mutable_model()->mutable_config() = config;
    WithMesh(plan, ranks, [&](int rank, const parallel::DeviceMesh& mesh) {
      base::AllocationCounter counter;
      {
        base::AllocationCounter::Scope counting(counter);
        ASSERT_THAT(PreparedModel::Prepare(plan.model(), ConfigOf(plan.model()), "", plan.prepare(),
                                           mesh, Role::kTrained, "plan"),
                    IsOk());
      }
      const double peak = static_cast<double>(counter.peak());
      std::cout << name << " rank " << rank << ": preparing allocated at most "
                << peak / model_bytes << " of the model's fp32 bytes\n";
      if (ranks == 1) {
        EXPECT_GE(peak, model_bytes);
      } else {
        EXPECT_GT(peak, 0.5 * model_bytes);
        EXPECT_LT(peak, 0.7 * model_bytes);
      }
    });
  }
}

void ExpectSameRun(const TrainReport& actual, const TrainReport& expected) {
  ASSERT_EQ(expected.steps.size(), 10u);
  ASSERT_EQ(actual.steps.size(), 10u);
  for (size_t i = 0; i < expected.steps.size(); ++i) {
    EXPECT_NEAR(actual.steps[i].loss, expected.steps[i].loss, 1e-5 * expected.steps[i].loss) << i;
    ASSERT_TRUE(expected.steps[i].grad_norm.has_value());
    EXPECT_NEAR(*actual.steps[i].grad_norm, *expected.steps[i].grad_norm,
                1e-5 * *expected.steps[i].grad_norm)
        << i;
  }
  ASSERT_TRUE(expected.steps[4].eval_loss.has_value());
  EXPECT_NEAR(*actual.steps[4].eval_loss, *expected.steps[4].eval_loss,
              1e-5 * *expected.steps[4].eval_loss);
  // It trained: the loss fell from about ln(vocab).
  EXPECT_LT(expected.steps.back().loss, expected.steps.front().loss - 1.0);
}

const TrainReport& SingleProcessRun() {
  static const TrainReport* report =
      new TrainReport(TrainOnRanks(ShortShippedPlan("llama_single"), 1));
  return *report;
}

// The report holds the plan's memory estimate and what each rank's tensors held at the peak
// of the second step, within 15% of it (memory_measured_test checks more plans, more closely).
void ExpectTheMemoryEstimateHeld(const TrainReport& report, int ranks) {
  ASSERT_TRUE(report.memory_estimate_bytes.has_value());
  ASSERT_EQ(report.peak_tensor_bytes.size(), static_cast<size_t>(ranks));
  for (const int64_t peak : report.peak_tensor_bytes) {
    EXPECT_THAT(*report.memory_estimate_bytes / static_cast<double>(peak), DoubleNear(1.0, 0.15));
  }
}

TEST(TrainTest, TheSingleProcessRunReportsItsMemoryAgainstTheEstimate) {
  ExpectTheMemoryEstimateHeld(SingleProcessRun(), 1);
}

TEST(TrainTest, FsdpOnTwoRanksTrainsToTheSingleProcessLosses) {
  const TrainReport fsdp = TrainOnRanks(ShortShippedPlan("llama_fsdp"), 2);
  ExpectSameRun(fsdp, SingleProcessRun());
  ExpectTheMemoryEstimateHeld(fsdp, 2);
}

// Micro-batches of 4 with 2 accumulation steps on each of 2 ranks: the same 16 sequences per
// step as the single process, through DDP's no-sync scope.
TEST(TrainTest, DdpWithAccumulationTrainsToTheSingleProcessLosses) {
  plan::Plan plan = ShortShippedPlan("llama_ddp");
  ASSERT_THAT(plan::ApplyOverride("training.micro_batch=4", plan), IsOk());
  ASSERT_THAT(plan::ApplyOverride("training.grad_accumulation=2", plan), IsOk());
  // Evaluation reads eval_batches global batches whatever the layout: 2 micro-batches of 4 on
  // each of 2 ranks are the single process's 16 held-out sequences.
  ExpectSameRun(TrainOnRanks(plan, 2), SingleProcessRun());
}

// A bf16 run's losses follow the fp32 single process's at bf16's precision, and it trained.
void ExpectTracksTheFp32Run(const TrainReport& bf16) {
  const TrainReport& fp32 = SingleProcessRun();
  ASSERT_EQ(bf16.steps.size(), fp32.steps.size());
  for (size_t i = 0; i < fp32.steps.size(); ++i) {
    EXPECT_NEAR(bf16.steps[i].loss, fp32.steps[i].loss, 0.03 * fp32.steps[i].loss) << i;
  }
  EXPECT_LT(bf16.steps.back().loss, bf16.steps.front().loss - 1.0);
}

// plan.model.dtype: a bf16 model computes in bf16 while FSDP keeps its shards, and so the
// optimizer, in fp32; it tracks the fp32 run at bf16's precision.
TEST(TrainTest, Bf16ModelOnTwoFsdpRanksTracksTheFp32Run) {
  plan::Plan plan = ShortShippedPlan("llama_fsdp");
  ASSERT_THAT(plan::ApplyOverride("model.dtype=DTYPE_BFLOAT16", plan), IsOk());
  WithMesh(plan, 2, [&](int rank, const parallel::DeviceMesh& mesh) {
    auto prepared = PreparedModel::Prepare(plan.model(), ConfigOf(plan.model()), "", plan.prepare(),
                                           mesh, Role::kTrained, "plan");
    ASSERT_THAT(prepared, IsOk());
    for (const auto& named : (*prepared)->model().NamedParameters()) {
      EXPECT_EQ(named.parameter.scalar_type(), at::kBFloat16) << named.name;
    }
    for (const parallel::TrainableParameter& parameter : (*prepared)->trainable_parameters()) {
      EXPECT_EQ(parameter.tensor.scalar_type(), at::kFloat) << parameter.name;
    }
  });
  ExpectTracksTheFp32Run(TrainOnRanks(plan, 2));
}

// llama_single's model initialised from `seed` (weights no shipped plan starts from), saved
// in fp32 to the Hugging Face folder `dir`; null after a failure, which it reports.
std::shared_ptr<models::CausalLM> SavedModelOfSeed(int seed, const std::string& dir) {
  models::ModelSpec seeded = ShortShippedPlan("llama_single").model();
  seeded.mutable_init()->set_seed(seed);
  auto config = models::ResolveModelSpec(seeded, "plan.model");
  EXPECT_THAT(config, IsOk());
  if (!config.ok()) return nullptr;
  auto model = models::CausalLM::Create(*config, seeded.init());
  EXPECT_THAT(model, IsOk());
  if (!model.ok()) return nullptr;
  const absl::Status saved = models::SaveHfModel(**model, dir, at::kFloat);
  EXPECT_THAT(saved, IsOk());
  return saved.ok() ? *model : nullptr;
}

// The fp32 master weights of a bf16 model start from the fp32 values it was initialised with
// (FSDP's fp32 shards, the optimizer's masters of bf16 parameters), in every layout, or from
// a Hugging Face folder's fp32 values: not from their rounded bf16 copy, which the model
// computes with.
TEST(PreparedModelTest, Bf16MastersStartFromTheFp32Values) {
  const auto expect_masters = [](const plan::Plan& plan, int ranks, const std::string& hf_dir,
                                 const models::CausalLM& fp32) {
    WithMesh(plan, ranks, [&](int rank, const parallel::DeviceMesh& mesh) {
      auto prepared = PreparedModel::Prepare(plan.model(), ConfigOf(plan.model()), hf_dir,
                                             plan.prepare(), mesh, Role::kTrained, "plan");
      ASSERT_THAT(prepared, IsOk());
      auto optimizer = BuildOptimizer(**prepared, plan.optimizer());
      ASSERT_THAT(optimizer, IsOk());
      const optim::OptimizerState state = (*optimizer)->SaveState();
      for (const parallel::TrainableParameter& parameter : (*optimizer)->parameters()) {
        const parallel::TensorSlice& slice = parameter.slice;
        const at::Tensor want =
            parallel::NarrowTo(fp32.named_parameters()[parameter.name],
                               parallel::TensorSlice::Whole(slice.global_shape).box, slice.box);
        const bool bf16 = parameter.tensor.scalar_type() == at::kBFloat16;
        const at::Tensor master =
            bf16 ? state.tensors.at(parameter.name + ":master") : parameter.tensor;
        EXPECT_TRUE(slice.DataOf(master).equal(want)) << "rank " << rank << " " << parameter.name;
        if (bf16) {
          EXPECT_TRUE(slice.DataOf(parameter.tensor).equal(want.to(at::kBFloat16)))
              << parameter.name;
        }
      }
    });
  };
  const std::map<std::string, int> plans = {
      {"llama_single", 1}, {"llama_ddp", 2}, {"llama_fsdp", 2}, {"llama_tp", 2}, {"llama_2d", 4}};
  for (const auto& [name, ranks] : plans) {
    SCOPED_TRACE(name);
    plan::Plan plan = ShortShippedPlan(name);
    ASSERT_THAT(plan::ApplyOverride("model.dtype=DTYPE_BFLOAT16", plan), IsOk());
    auto config = models::ResolveModelSpec(plan.model(), "plan.model");
    ASSERT_THAT(config, IsOk());
    auto initialised = models::CausalLM::Create(*config, plan.model().init());
    ASSERT_THAT(initialised, IsOk());
    expect_masters(plan, ranks, "", **initialised);
  }
  const std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/hf/fp32_masters");
  const std::shared_ptr<models::CausalLM> pretrained = SavedModelOfSeed(7, dir);
  ASSERT_NE(pretrained, nullptr);
  for (const auto& [name, ranks] : {std::pair<std::string, int>{"llama_single", 1},
                                    std::pair<std::string, int>{"llama_tp", 2}}) {
    SCOPED_TRACE(name + " from " + dir);
    plan::Plan plan = ShortShippedPlan(name);
    ASSERT_THAT(plan::ApplyOverride("model.dtype=DTYPE_BFLOAT16", plan), IsOk());
    expect_masters(plan, ranks, dir, *pretrained);
  }
}

// Tensor parallelism over 2 ranks (both read the 16 sequences of a step), and FSDP over
// dp=2 x tensor parallelism over tp=2 (each dp pair reads 8): the single process's losses.
TEST(TrainTest, TensorParallelAndTwoDimensionalRunsTrainToTheSingleProcessLosses) {
  ExpectSameRun(TrainOnRanks(ShortShippedPlan("llama_tp"), 2), SingleProcessRun());
  ExpectSameRun(TrainOnRanks(ShortShippedPlan("llama_2d"), 4), SingleProcessRun());
}

// A tensor-parallel run from a Hugging Face folder: each rank loads only its slice of each
// tensor (llama_2d: tensor parallelism's slices, sharded further by FSDP), which together
// are the folder's weights, and llama_tp trains from the folder as one process does from it.
// The folder's weights are another seed's than the plans', so a run that ignored them would
// differ.
TEST(TrainTest, TensorParallelRanksLoadTheirSlicesOfAHuggingFaceFolder) {
  const std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/hf/seed5");
  const std::shared_ptr<models::CausalLM> pretrained = SavedModelOfSeed(5, dir);
  ASSERT_NE(pretrained, nullptr);

  const plan::Plan two_d = ShortShippedPlan("llama_2d");
  WithMesh(two_d, 4, [&](int rank, const parallel::DeviceMesh& mesh) {
    auto prepared = PreparedModel::Prepare(two_d.model(), ConfigOf(two_d.model()), dir,
                                           two_d.prepare(), mesh, Role::kTrained, "plan");
    ASSERT_THAT(prepared, IsOk());
    for (const parallel::TrainableParameter& parameter : (*prepared)->trainable_parameters()) {
      if (parameter.name != "model.layers.0.mlp.up_proj.weight") continue;
      // A quarter of it: half the columns' rows, then half of those.
      EXPECT_EQ(parameter.slice.box.numel() * 4,
                parallel::TensorSlice::Whole(parameter.slice.global_shape).box.numel());
      EXPECT_TRUE(parameter.slice.DataOf(parameter.tensor)
                      .equal(parallel::NarrowTo(
                          pretrained->named_parameters()[parameter.name],
                          parallel::TensorSlice::Whole(parameter.slice.global_shape).box,
                          parameter.slice.box)));
    }
    auto full = (*prepared)->preparation().FullParameters();
    ASSERT_THAT(full, IsOk());
    for (const auto& item : pretrained->named_parameters()) {
      EXPECT_TRUE(full->at(item.key()).equal(item.value())) << rank << " " << item.key();
    }
  });

  plan::Plan tp = ShortShippedPlan("llama_tp");
  tp.set_hf_weights_dir(dir);
  plan::Plan single = ShortShippedPlan("llama_single");
  single.set_hf_weights_dir(dir);
  const TrainReport expected = TrainOnRanks(single, 1);
  ExpectSameRun(TrainOnRanks(tp, 2), expected);
  EXPECT_NE(expected.steps[0].loss, SingleProcessRun().steps[0].loss);
}

// A Hugging Face folder holding a NaN in the rows of one tensor-parallel rank: that rank names
// the file and the tensor, and the other stops too, naming it.
TEST(PreparedModelTest, ANonFiniteWeightInOneRanksSliceStopsEveryRank) {
  const std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/hf/nan");
  const std::string name = "model.layers.0.mlp.up_proj.weight";
  const std::shared_ptr<models::CausalLM> model = SavedModelOfSeed(5, dir);
  ASSERT_NE(model, nullptr);
  {
    at::NoGradGuard no_grad;
    model->named_parameters()[name][687][0] = std::numeric_limits<float>::quiet_NaN();
  }
  ASSERT_THAT(models::SaveHfModel(*model, dir), IsOk());
  const plan::Plan tp = ShortShippedPlan("llama_tp");
  std::vector<absl::Status> statuses(2);
  WithMesh(tp, 2, [&](int rank, const parallel::DeviceMesh& mesh) {
    statuses[rank] = PreparedModel::Prepare(tp.model(), ConfigOf(tp.model()), dir, tp.prepare(),
                                            mesh, Role::kTrained, "plan")
                         .status();
  });
  EXPECT_THAT(statuses[1], StatusIs(absl::StatusCode::kInvalidArgument,
                                    "plan.hf_weights_dir: " + dir + "/model.safetensors: " + name +
                                        ": holds NaN"));
  EXPECT_THAT(statuses[0],
              StatusIs(absl::StatusCode::kAborted,
                       HasSubstr("plan.hf_weights_dir: loading " + dir + ": rank 1 failed")));
}

// Hybrid sharding over dp_replicate=2 x dp_shard=2 (each rank reads 4 of the 16 sequences):
// the single process's losses.
TEST(TrainTest, HybridShardingTrainsToTheSingleProcessLosses) {
  ExpectSameRun(TrainOnRanks(ShortShippedPlan("llama_hsdp"), 4), SingleProcessRun());
}

// A bf16 model under tensor parallelism: its slices compute and communicate in bf16, the
// optimizer keeps fp32 masters; it tracks the fp32 run at bf16's precision.
TEST(TrainTest, Bf16ModelOnTwoTensorParallelRanksTracksTheFp32Run) {
  plan::Plan plan = ShortShippedPlan("llama_tp");
  ASSERT_THAT(plan::ApplyOverride("model.dtype=DTYPE_BFLOAT16", plan), IsOk());
  ExpectTracksTheFp32Run(TrainOnRanks(plan, 2));
}

// Every rank's result of training `plan` on `ranks` ranks.
std::vector<absl::StatusOr<TrainReport>> TrainStatuses(const plan::Plan& plan, int ranks) {
  const plan::ResolvedPlan resolved = Resolved(plan, ranks);
  std::vector<absl::StatusOr<TrainReport>> results(ranks, absl::UnknownError("did not run"));
  WithMesh(plan, ranks, [&](int rank, const parallel::DeviceMesh& mesh) {
    results[rank] = Train(resolved, mesh, TrainOptions());
  });
  return results;
}

// `name` diverging: a learning rate that sends the weights out of range after the first
// step, for at most 8 steps, of which at most 3 may skip their update in a row.
plan::Plan Diverging(const std::string& name) {
  plan::Plan plan = ShortShippedPlan(name);
  for (const char* assignment :
       {"schedule.lr=1e30", "training.steps=8", "training.max_skipped_steps=3"}) {
    EXPECT_THAT(plan::ApplyOverride(assignment, plan), IsOk()) << assignment;
  }
  plan.mutable_schedule()->clear_warmup();
  return plan;
}

// A run whose every update is skipped stops with an error instead of succeeding: from step 2
// on, the gradient norm is not finite.
TEST(TrainTest, ARunThatSkipsEveryUpdateStops) {
  EXPECT_THAT(TrainStatuses(Diverging("llama_single"), 1)[0],
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "step 4: the last 3 updates were skipped: the gradient norm was not "
                       "finite; the run trains nothing (plan.training.max_skipped_steps = 3)"));
}

// Without clipping no gradient norm is measured: step 2's gradients, whose loss is finite,
// reach the weights and make them non-finite, so that step 3's loss, reduced over the mesh, is
// not finite on every rank. Every rank skips that update, finds its weights not finite and
// stops there, naming step 2's update, none waiting for another.
TEST(TrainTest, ADivergedRunWithoutClippingStopsOnEveryRank) {
  plan::Plan plan = Diverging("llama_fsdp");
  plan.mutable_optimizer()->clear_clipping();
  for (const auto& result : TrainStatuses(plan, 2)) {
    EXPECT_THAT(result, StatusIs(absl::StatusCode::kFailedPrecondition,
                                 HasSubstr("step 3: the trained parameters are not finite after "
                                           "the update of step 2: model.")));
  }
}

// A run shorter than max_skipped_steps (5) whose every update is skipped (weights so large
// that the first loss already overflows) fails, naming how many and why.
TEST(TrainTest, AShortRunThatSkipsEveryUpdateFails) {
  plan::Plan plan = ShortShippedPlan("llama_single");
  ASSERT_THAT(plan::ApplyOverride("training.steps=3", plan), IsOk());
  ASSERT_THAT(plan::ApplyOverride("model.init.std=1e18", plan), IsOk());
  plan.mutable_schedule()->clear_warmup();  // longer than the run
  EXPECT_THAT(TrainStatuses(plan, 1)[0],
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "every one of the 3 steps was skipped: the loss was not finite; the run "
                       "trained nothing"));
}

// An evaluation never reads the held-out file's batches twice: more eval_batches than the file
// holds is refused before the first step, naming the field and the file's count.
TEST(TrainTest, EvalBatchesBeyondTheHeldOutFileAreRefused) {
  plan::Plan plan = ShortShippedPlan("llama_single");
  // 16 sequences of 64 tokens and one more token: exactly one micro-batch of 16.
  const std::string path = data::testing::WriteLlmc("eval.bin", data::testing::Iota(16 * 64 + 1));
  data::TokenFiles* files = plan.mutable_data()->mutable_token_files();
  files->set_train_path(path);
  files->set_eval_path(path);
  files->set_format(data::TOKEN_FORMAT_LLMC);
  ASSERT_THAT(plan::ApplyOverride("training.eval_batches=2", plan), IsOk());
  const plan::ResolvedPlan resolved = Resolved(plan, 1);
  WithMesh(plan, 1, [&](int, const parallel::DeviceMesh& mesh) {
    EXPECT_THAT(Train(resolved, mesh, TrainOptions()),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         "plan.training.eval_batches: 2 global batches (2 micro-batches per "
                         "rank) exceed the 1 micro-batches per rank that "
                         "plan.data.token_files.eval_path holds"));
  });
}

// //trainer:llama_sft's plan: its first step's loss is the initial model's cross-entropy of
// the completion tokens alone (a prompt's tokens carry no loss: with them scored the loss
// would differ), and FSDP on 2 ranks trains it as one process does.
TEST(SftTest, PromptTokensCarryNoLossAndFsdpTrainsAsOneProcess) {
  plan::Plan plan = ShortShippedPlan("llama_sft");
  plan::Plan single = plan;
  single.clear_mesh();
  single.clear_prepare();
  ASSERT_THAT(plan::ApplyOverride("training.micro_batch=16", single), IsOk());
  const TrainReport expected = TrainOnRanks(single, 1);
  ASSERT_EQ(expected.steps.size(), 10u);
  EXPECT_LT(expected.steps.back().loss, expected.steps.front().loss);

  const data::DataConfig data = data::ResolvedDataConfig(single.data());
  auto loader = data::DataLoader::Create(data, data::Split::kTrain, 4096, 16,
                                         single.training().seq_len(), 0, 1, "plan.data");
  ASSERT_THAT(loader, IsOk());
  const data::Batch batch = loader->Next().value();
  auto config = models::ResolveModelSpec(single.model(), "plan.model");
  ASSERT_THAT(config, IsOk());
  auto model = models::CausalLM::Create(*config, single.model().init());
  ASSERT_THAT(model, IsOk());
  at::NoGradGuard no_grad;
  // Every position's cross-entropy of the next input token; the last has none.
  const int64_t T = single.training().seq_len();
  const at::Tensor logits = (*model)->Forward(batch.inputs).narrow(1, 0, T - 1);
  const at::Tensor next = batch.inputs.narrow(1, 1, T - 1);
  const at::Tensor losses =
      -at::log_softmax(logits.to(at::kDouble), -1).gather(-1, next.unsqueeze(-1)).squeeze(-1);
  // The first completion token is input P, predicted at position P - 1.
  const int64_t P = data.synthetic_sft().prompt_length();
  const double completion = losses.narrow(1, P - 1, T - P).mean().item<double>();
  const double all = losses.mean().item<double>();
  EXPECT_NEAR(expected.steps[0].loss, completion, 1e-5 * completion);
  EXPECT_GT(std::abs(all - completion), 1e-3);

  ExpectSameSteps(TrainOnRanks(plan, 2), expected, "fsdp");
}

// The regression behind DPO under FSDP: the policy and its reference are prepared by their own
// steps in plan order (policy first), the optimizer owns exactly the policy's shards and
// nothing of the reference, and DPO steps leave the reference's parameters bit for bit as
// they were, without gradients.
TEST(DpoTest, TheReferenceIsShardedFrozenAndUntouchedByTraining) {
  const plan::Plan plan = ShortShippedPlan("qwen_dpo_fsdp");
  WithMesh(plan, 2, [&](int rank, const parallel::DeviceMesh& mesh) {
    auto policy = PreparedModel::Prepare(plan.model(), ConfigOf(plan.model()), "", plan.prepare(),
                                         mesh, Role::kTrained, "plan");
    ASSERT_THAT(policy, IsOk());
    const plan::FrozenModel& frozen = plan.frozen(0);
    auto reference =
        PreparedModel::Prepare(frozen.model(), ConfigOf(frozen.model()), "", frozen.prepare(), mesh,
                               Role::kFrozen, "plan.frozen[0]");
    ASSERT_THAT(reference, IsOk());
    auto optimizer = BuildOptimizer(**policy, plan.optimizer());
    ASSERT_THAT(optimizer, IsOk());
    // The reference's whole parameters, gathered from its shards, and what it computes: its
    // log-probabilities of a fixed batch. The gathered map is held in a variable: a range-for
    // over FullParameters().value() iterates a map destroyed with its temporary StatusOr
    // (the heap corruption this test once hit).
    const absl::StatusOr<std::map<std::string, at::Tensor>> parameters_before =
        (*reference)->preparation().FullParameters();
    ASSERT_THAT(parameters_before, IsOk());
    const data::Batch probe{torch::arange(64, at::kLong).view({2, 32}),
                            torch::arange(1, 65, at::kLong).view({2, 32})};
    const auto checksum = [&] {
      at::NoGradGuard no_grad;
      return (*reference)
          ->model()
          .SequenceLogProbs(probe.inputs, probe.targets)
          .sum()
          .item<double>();
    };
    const double before = checksum();
    std::set<const void*> reference_tensors;
    for (const auto& named : (*reference)->model().NamedParameters()) {
      reference_tensors.insert(named.parameter.unsafeGetTensorImpl());
    }
    ASSERT_EQ((*optimizer)->parameters().size(), (*policy)->trainable_parameters().size());
    for (const auto& owned : (*optimizer)->parameters()) {
      EXPECT_EQ(reference_tensors.count(owned.tensor.unsafeGetTensorImpl()), 0u) << owned.name;
    }
    auto objective = objectives::MakeObjective(
        plan.objective(), {{frozen.name(), &(*reference)->model()}}, "plan.objective");
    ASSERT_THAT(objective, IsOk());
    auto data = data::DataLoader::Create(data::ResolvedDataConfig(plan.data()), data::Split::kTrain,
                                         4096, plan.training().micro_batch(),
                                         plan.training().seq_len(), rank, 2, "plan.data");
    ASSERT_THAT(data, IsOk());
    for (int step = 0; step < 3; ++step) {
      (*objective)->Compute((*policy)->model(), data->Next().value())->loss.backward();
      ASSERT_THAT((*policy)->preparation().BackwardStatus(), IsOk());
      ASSERT_THAT((*optimizer)->Step(1e-3), IsOk());
      (*optimizer)->ZeroGrad();
    }
    for (const auto& named : (*reference)->model().NamedParameters()) {
      EXPECT_FALSE(named.parameter.grad().defined()) << named.name;
    }
    EXPECT_EQ(checksum(), before) << "rank " << rank;
    const absl::StatusOr<std::map<std::string, at::Tensor>> parameters_after =
        (*reference)->preparation().FullParameters();
    ASSERT_THAT(parameters_after, IsOk());
    ASSERT_EQ(parameters_after->size(), parameters_before->size());
    for (const auto& [name, tensor] : *parameters_before) {
      ASSERT_EQ(parameters_after->count(name), 1u) << name;
      EXPECT_TRUE(at::equal(parameters_after->at(name), tensor)) << name << " on rank " << rank;
    }
  });
}

// The DPO plan on one process, or its policy under DDP (the reference replicated), or as
// shipped: policy and reference both FSDP-sharded on 2 ranks.
plan::Plan DpoPlan(const std::string& layout) {
  plan::Plan plan = ShortShippedPlan("qwen_dpo_fsdp");
  if (layout == "fsdp") return plan;
  plan.clear_prepare();
  plan.mutable_frozen(0)->clear_prepare();
  if (layout == "ddp") {
    plan.add_prepare()->mutable_ddp()->set_mesh_dim("dp");
  } else {
    plan.clear_mesh();
    EXPECT_THAT(plan::ApplyOverride("training.micro_batch=16", plan), IsOk());
  }
  return plan;
}

TEST(DpoTest, FsdpAndDdpOnTwoRanksTrainToTheSingleProcessRun) {
  const TrainReport single = TrainOnRanks(DpoPlan("single"), 1);
  ASSERT_EQ(single.steps.size(), 10u);
  // The policy starts as its reference: z = 0, so the sigmoid loss is ln 2 and rewards are 0.
  EXPECT_FLOAT_EQ(single.steps[0].loss, std::log(2.0));
  for (const auto& [name, value] : single.steps[0].named) {
    if (name.rfind("rewards/", 0) == 0) {
      EXPECT_EQ(value, 0.0) << name;
    }
  }
  EXPECT_LT(single.steps.back().loss, single.steps.front().loss);
  for (const std::string layout : {"fsdp", "ddp"}) {
    ExpectSameSteps(TrainOnRanks(DpoPlan(layout), 2), single, layout);
  }
}

// DPO of a mixture of experts (the policy and its reference the tiny Qwen3-MoE): the policy's
// load-balancing loss joins the DPO loss, its routing summed over the ranks that read the step's
// pairs, so FSDP and DDP on 2 ranks train as one process, aux_loss and the experts' loads
// logged alike.
TEST(DpoTest, AMixtureOfExpertsOnTwoRanksTrainsToTheSingleProcessRun) {
  const auto with_experts = [](plan::Plan plan) {
    models::ModelConfig config = models::PresetConfig("qwen3-moe-tiny").value();
    config.set_router_aux_loss_coef(0.1);
    *plan.mutable_model()->mutable_config() = config;
    *plan.mutable_frozen(0)->mutable_model()->mutable_config() = config;
    return plan;
  };
  const TrainReport single = TrainOnRanks(with_experts(DpoPlan("single")), 1);
  ASSERT_EQ(single.steps.size(), 10u);
  const auto named = [](const metrics::StepMetrics& step, const std::string& name) {
    for (const auto& [key, value] : step.named) {
      if (key == name) return value;
    }
    ADD_FAILURE() << "no " << name;
    return 0.0;
  };
  // The sigmoid loss starts at ln 2, and the load-balancing loss adds 0.1 x aux.
  EXPECT_NEAR(single.steps[0].loss, std::log(2.0) + 0.1 * named(single.steps[0], "aux_loss"), 1e-6);
  EXPECT_GT(named(single.steps[0], "aux_loss"), 1.9);
  EXPECT_LT(single.steps.back().loss, single.steps.front().loss);
  for (const std::string layout : {"fsdp", "ddp"}) {
    ExpectSameSteps(TrainOnRanks(with_experts(DpoPlan(layout)), 2), single, layout);
  }
}

// The policy cut into 2 pipeline stages (1F1B, 2 micro-batches a step), with its frozen
// reference cut the same way or whole on each rank: at each step the reference runs through its
// own stages (or whole) first, and its log-probabilities reach the policy's last stage, where
// DPO scores the pairs; the first stage logs the same metrics.
TEST(DpoTest, PipelineOnTwoRanksTrainsToTheSingleProcessRun) {
  const TrainReport single = TrainOnRanks(DpoPlan("single"), 1);
  for (const bool reference_cut : {true, false}) {
    plan::Plan pp = DpoPlan("single");
    auto* dim = pp.mutable_mesh()->add_dims();
    dim->set_name("pp");
    dim->set_size(2);
    wrap::PipelineConfig pipeline;
    pipeline.set_mesh_dim("pp");
    pipeline.set_schedule("1F1B");
    *pp.add_prepare()->mutable_pipeline() = pipeline;
    if (reference_cut) *pp.mutable_frozen(0)->add_prepare()->mutable_pipeline() = pipeline;
    for (const char* override : {"training.micro_batch=8", "training.grad_accumulation=2"}) {
      EXPECT_THAT(plan::ApplyOverride(override, pp), IsOk());
    }
    ExpectSameSteps(TrainOnRanks(pp, 2), single,
                    reference_cut ? "pp 2, the reference cut too" : "pp 2");
  }
}

// The policy and its frozen reference both tensor-parallel over 2 ranks, each scoring its
// sequences from vocabulary-sharded logits. Qwen2-tiny's 7 heads do not split in 2: both
// models get 4 heads sharing 1 key/value head (one per rank, shared), in both runs.
TEST(DpoTest, TensorParallelOnTwoRanksTrainsToTheSingleProcessRun) {
  models::ModelConfig config = models::PresetConfig("qwen2-tiny").value();
  config.set_num_attention_heads(4);
  config.set_num_key_value_heads(1);
  auto with_four_heads = [&](plan::Plan plan) {
    *plan.mutable_model()->mutable_config() = config;
    *plan.mutable_frozen(0)->mutable_model()->mutable_config() = config;
    return plan;
  };
  plan::Plan tp = with_four_heads(DpoPlan("single"));
  auto* dim = tp.mutable_mesh()->add_dims();
  dim->set_name("tp");
  dim->set_size(2);
  tp.add_prepare()->mutable_tensor_parallel()->set_mesh_dim("tp");
  tp.mutable_frozen(0)->add_prepare()->mutable_tensor_parallel()->set_mesh_dim("tp");
  ExpectSameSteps(TrainOnRanks(tp, 2), TrainOnRanks(with_four_heads(DpoPlan("single")), 1), "tp");
}

// qwen_dpo_fsdp_hf: the policy and the reference both start from the Hugging Face folder the
// plan names (written here first, as a pretraining run's save_hf_dir would), and train as
// the same plan whose models start from the seed that made the folder's weights.
TEST(DpoTest, APlanFromAHuggingFaceFolderStartsBothModelsFromIt) {
  plan::Plan seeded = ShortShippedPlan("qwen_dpo_fsdp");
  for (models::ModelSpec* spec :
       {seeded.mutable_model(), seeded.mutable_frozen(0)->mutable_model()}) {
    spec->mutable_init()->set_seed(5);
  }
  const std::string folder = absl::StrCat(std::getenv("TEST_TMPDIR"), "/hf_pipeline");
  std::filesystem::create_directories(folder);
  ASSERT_EQ(chdir(folder.c_str()), 0);
  auto config = models::ResolveModelSpec(seeded.model(), "plan.model");
  ASSERT_THAT(config, IsOk());
  auto pretrained = models::CausalLM::Create(*config, seeded.model().init());
  ASSERT_THAT(pretrained, IsOk());
  ASSERT_THAT(models::SaveHfModel(**pretrained, "qwen2_tiny_pretrained"), IsOk());

  const plan::Plan from_folder = ShortShippedPlan("qwen_dpo_fsdp_hf");
  const TrainReport expected = TrainOnRanks(seeded, 2);
  const TrainReport run = TrainOnRanks(from_folder, 2);
  // The policy starts as its reference.
  EXPECT_FLOAT_EQ(run.steps[0].loss, std::log(2.0));
  ExpectSameSteps(run, expected, "from the folder", 1e-6);
}

// precompute_reference: the FSDP-sharded reference's log-probabilities computed before the
// first step, and the reference released, train as the live reference does, step by step
// (training and evaluation metrics) to 1e-6. The reference is another network than the
// policy's start, so that the rewards are not 0 from the start.
TEST(DpoTest, APrecomputedReferenceTrainsAsTheLiveOne) {
  plan::Plan live = DpoPlan("fsdp");
  live.mutable_frozen(0)->mutable_model()->mutable_init()->set_seed(2);
  plan::Plan precomputed = live;
  ASSERT_THAT(plan::ApplyOverride("objective.dpo.precompute_reference=true", precomputed), IsOk());
  const TrainReport expected = TrainOnRanks(live, 2);
  std::ostringstream log;
  TrainOptions options;
  options.log = &log;
  ExpectSameSteps(TrainOnRanks(precomputed, 2, options), expected, "precomputed", 1e-6);
  EXPECT_NE(expected.steps[0].named[0].second, 0.0);  // rewards/chosen
  // 8 pairs, 16 rows, in each micro-batch of rank 0.
  EXPECT_THAT(
      log.str(),
      HasSubstr("precomputed the reference log-probabilities of 176 sequences on rank 0 (10 "
                "training and 1 eval micro-batches per rank)"));
  EXPECT_THAT(log.str(), HasSubstr("released the frozen model \"reference\": the heap in use "
                                   "fell by"));
}

}  // namespace
}  // namespace plait::trainer
