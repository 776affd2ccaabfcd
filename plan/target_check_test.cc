#include "plan/target_check.h"

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/file.h"
#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/estimates.h"
#include "models/model_config.h"
#include "plan/plan.h"

namespace plait::plan {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::base::testing::StatusIs;
using ::testing::AllOf;
using ::testing::DoubleNear;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

Plan ClusterPlan(const std::string& name) {
  absl::StatusOr<Plan> plan =
      LoadPlan(absl::StrCat(std::getenv("TEST_SRCDIR"), "/plait/plan/examples/clusters/", name));
  EXPECT_THAT(plan, IsOk());
  return plan.value_or(Plan());
}

Plan Llama8b() { return ClusterPlan("llama3.1_8b_fsdp_8xh100.textproto"); }
Plan Llama70b() { return ClusterPlan("llama3.1_70b_fsdp_tp_256xh100.textproto"); }

TargetCatalogue BuiltinTargets() {
  absl::StatusOr<TargetCatalogue> catalogue = LoadTargets("");
  EXPECT_THAT(catalogue, IsOk());
  return catalogue.value_or(TargetCatalogue());
}

std::string WriteTemp(const std::string& name, const std::string& text) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/", name);
  EXPECT_THAT(base::WriteFileAtomically(path, text), IsOk());
  return path;
}

TEST(LoadTargetsTest, TheCatalogueHasTheIssuesDevices) {
  const TargetCatalogue catalogue = BuiltinTargets();
  for (const char* name : {"h100-sxm", "h100-96gb", "h200", "a100-80gb", "mi300x", "b200"}) {
    absl::StatusOr<Target> target = FindTarget(catalogue, name);
    ASSERT_THAT(target, IsOk()) << name;
    EXPECT_GT(target->memory_gib(), 70) << name;
    EXPECT_GT(target->bf16_tflops(), 300) << name;
    EXPECT_EQ(target->gpus_per_node(), 8) << name;
  }
  EXPECT_EQ(FindTarget(catalogue, "h200")->memory_gib(), 140.4);
  EXPECT_GT(catalogue.reserve().fixed_gib(), 0);
  EXPECT_GT(catalogue.speed().mfu(), 0);
  EXPECT_THAT(FindTarget(catalogue, "h300"),
              StatusIs(absl::StatusCode::kNotFound,
                       AllOf(HasSubstr("--target=h300"), HasSubstr("h100-sxm, h100-96gb, h200"))));
}

TEST(LoadTargetsTest, AUsersFileAddsAndReplacesTargets) {
  const std::string path = WriteTemp("targets.textproto", R"pb(
    targets {
      name: "h200"
      memory_gib: 100
      bf16_tflops: 900
      intra_node_gb_per_s: 400
      inter_node_gb_per_s: 25
      gpus_per_node: 4
    }
    targets {
      name: "lab-gpu"
      memory_gib: 24
      fp32_tflops: 80
      intra_node_gb_per_s: 32
      inter_node_gb_per_s: 12.5
      gpus_per_node: 2
    }
    speed { mfu: 0.3 link_efficiency: 0.7 }
  )pb");
  absl::StatusOr<TargetCatalogue> catalogue = LoadTargets(path);
  ASSERT_THAT(catalogue, IsOk());
  EXPECT_EQ(FindTarget(*catalogue, "h200")->memory_gib(), 100);
  EXPECT_EQ(FindTarget(*catalogue, "lab-gpu")->gpus_per_node(), 2);
  EXPECT_EQ(FindTarget(*catalogue, "b200")->memory_gib(), 179);  // kept
  EXPECT_EQ(catalogue->speed().mfu(), 0.3);
  EXPECT_EQ(catalogue->reserve().fixed_gib(), BuiltinTargets().reserve().fixed_gib());
}

TEST(LoadTargetsTest, AUsersFileIsCheckedFieldByField) {
  const std::string path = WriteTemp("bad_targets.textproto", R"pb(
    targets { name: "half" memory_gib: 80 gpus_per_node: 0 }
    reserve { fragmentation: 1.5 }
  )pb");
  EXPECT_THAT(LoadTargets(path),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(path + ": targets[0].bf16_tflops"),
                             HasSubstr(path + ": targets[0].intra_node_gb_per_s"),
                             HasSubstr(path + ": targets[0].gpus_per_node"),
                             HasSubstr(path + ": reserve.fragmentation"))));
  EXPECT_THAT(LoadTargets(path + ".missing"), Not(IsOk()));
}

// Figures that are typos, whose estimates would print as inf or 0, and two targets of one
// name (which --target would pick between silently) are refused, naming the target.
TEST(LoadTargetsTest, FiguresBeyondAnyPartAndTwoTargetsOfOneNameAreRefused) {
  const std::string path = WriteTemp("absurd_targets.textproto", R"pb(
    targets {
      name: "typo"
      memory_gib: 1e308
      bf16_tflops: inf
      fp8_tflops: 1e-300
      intra_node_gb_per_s: 450
      inter_node_gb_per_s: 1e7
      gpus_per_node: 2147483647
    }
    targets {
      name: "lab-gpu"
      memory_gib: 24
      fp32_tflops: 80
      intra_node_gb_per_s: 32
      inter_node_gb_per_s: 12.5
      gpus_per_node: 2
    }
    targets {
      name: "lab-gpu"
      memory_gib: 48
      fp32_tflops: 80
      intra_node_gb_per_s: 32
      inter_node_gb_per_s: 12.5
      gpus_per_node: 2
    }
    reserve { fixed_gib: 1e308 }
    speed { mfu: 1e-300 link_efficiency: 0.5 }
  )pb");
  const std::string target = path + ": targets[0].";
  EXPECT_THAT(
      LoadTargets(path),
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr(target + "memory_gib: 1e+308 GiB is not within [0.001, 1e+06] "
                                        "(target \"typo\")"),
                     HasSubstr(target + "bf16_tflops: inf TFLOP/s"),
                     HasSubstr(target + "fp8_tflops: 1e-300 TFLOP/s"),
                     HasSubstr(target + "inter_node_gb_per_s: 1e+07 GB/s"),
                     HasSubstr(target + "gpus_per_node: 2147483647 is not within [1, 16777216]"),
                     HasSubstr(path + ": targets[2].name: \"lab-gpu\" is targets[1]'s name too"),
                     HasSubstr(path + ": reserve.fixed_gib: 1e+308"),
                     HasSubstr(path + ": speed.mfu: 1e-300 is not within [0.001, 1]"))));
}

// Torchtitan's Llama 3.1 8B run on one node of 8 H200s: it fits, the step is compute-bound
// (FSDP's collectives over NVLink take a fraction of it), and its FLOPs are the run's.
TEST(CheckOnTargetTest, Llama8bFsdpFitsOnEightH200s) {
  const TargetCatalogue catalogue = BuiltinTargets();
  absl::StatusOr<TargetCheck> check = CheckOnTarget(Llama8b(), catalogue, "h200", 1);
  ASSERT_THAT(check, IsOk());
  EXPECT_EQ(check->resolved.world_size, 8);
  EXPECT_EQ(check->resolved.plan.model().dtype(), base::DTYPE_BFLOAT16);  // auto, on the GPU
  EXPECT_TRUE(check->fits());
  EXPECT_THAT(check->suggestions, IsEmpty());
  EXPECT_EQ(check->time.bound, "compute");
  ASSERT_EQ(check->time.links.size(), 1u);
  EXPECT_EQ(check->time.links[0].mesh_dim, "dp");
  EXPECT_FALSE(check->time.links[0].across_nodes);
  EXPECT_LT(check->time.links[0].seconds, check->time.compute_seconds / 4);
  // One FLOP convention: what the run's MFU and model_bench count (TrainingFlopsPerToken).
  const double per_token = models::TrainingFlopsPerToken(check->resolved.model, 8192);
  EXPECT_DOUBLE_EQ(check->resolved.flops_per_token, per_token);
  EXPECT_THAT(check->time.flops_per_gpu, DoubleNear(per_token * 2 * 8192, 1e3));
  // tokens/s per GPU = a GPU's tokens / the step: MFU x peak / FLOPs a token when compute-bound.
  EXPECT_THAT(check->time.tokens_per_second_per_gpu,
              DoubleNear(catalogue.speed().mfu() * 989.4e12 / per_token, 1));
  EXPECT_THAT(DescribeTargetCheck(*check, catalogue),
              AllOf(HasSubstr("target: h200, 1 node x 8 GPUs (8 ranks)"), HasSubstr("fits: "),
                    HasSubstr(models::kFlopConvention), HasSubstr("bound by compute")));
}

// Each change suggested fits when the plan it makes is checked again.
void ExpectEverySuggestionFits(const TargetCheck& check, const TargetCatalogue& catalogue) {
  for (const Suggestion& suggestion : check.suggestions) {
    absl::StatusOr<TargetCheck> changed =
        CheckOnTarget(suggestion.plan, catalogue, check.target.name(), suggestion.nodes);
    ASSERT_THAT(changed, IsOk()) << suggestion.change;
    EXPECT_TRUE(changed->fits()) << suggestion.change;
    EXPECT_GT(suggestion.spare_bytes, 0) << suggestion.change;
  }
}

// The 8B plan without activation checkpointing at micro-batch 4 needs 245 GiB of activations a
// GPU: checkpointing or a smaller micro-batch make it fit; more FSDP ranks do not (they shard
// the parameters, not the activations).
TEST(CheckOnTargetTest, ActivationsThatDoNotFitGetCheckpointingOrSmallerMicroBatches) {
  Plan plan = Llama8b();
  plan.mutable_prepare()->DeleteSubrange(0, 1);  // no activation checkpointing
  plan.mutable_training()->set_micro_batch(4);
  const TargetCatalogue catalogue = BuiltinTargets();
  absl::StatusOr<TargetCheck> check = CheckOnTarget(plan, catalogue, "h100-sxm", 1);
  ASSERT_THAT(check, IsOk());
  ASSERT_FALSE(check->fits());
  ASSERT_EQ(check->suggestions.size(), 2u);
  EXPECT_THAT(check->suggestions[0].change,
              HasSubstr("activation_checkpointing { policy: FULL } added as prepare[0]"));
  EXPECT_THAT(check->suggestions[1].change,
              HasSubstr("--set=training.micro_batch=1 --set=training.grad_accumulation=4"));
  ExpectEverySuggestionFits(*check, catalogue);
  EXPECT_THAT(DescribeTargetCheck(*check, catalogue),
              AllOf(HasSubstr("does not fit: over by "), HasSubstr("fits with ")));
}

// The plan's own steps offer their versions that keep less (wrap::SmallerVersions): FULL in
// place of SELECTIVE checkpointing, FSDP in place of DDP.
TEST(CheckOnTargetTest, StepsThatDoNotKeepLeastOfferTheirSmallerVersions) {
  const TargetCatalogue catalogue = BuiltinTargets();
  Plan selective = Llama8b();
  selective.mutable_training()->set_micro_batch(4);
  absl::StatusOr<TargetCheck> check = CheckOnTarget(selective, catalogue, "h100-sxm", 1);
  ASSERT_THAT(check, IsOk());
  ASSERT_FALSE(check->fits());
  ASSERT_FALSE(check->suggestions.empty());
  EXPECT_EQ(check->suggestions[0].change,
            "prepare[0]: activation_checkpointing { policy: FULL } in place of "
            "activation_checkpointing { policy: SELECTIVE }");
  ExpectEverySuggestionFits(*check, catalogue);

  Plan replicated = Llama8b();
  replicated.mutable_prepare(1)->mutable_ddp()->set_mesh_dim("dp");
  replicated.mutable_training()->set_micro_batch(1);
  check = CheckOnTarget(replicated, catalogue, "h100-sxm", 1);
  ASSERT_THAT(check, IsOk());
  ASSERT_FALSE(check->fits());
  ASSERT_FALSE(check->suggestions.empty());
  EXPECT_EQ(check->suggestions[0].change,
            "prepare[1]: fsdp { mesh_dim: \"dp\" } in place of ddp { mesh_dim: \"dp\" }");
  ExpectEverySuggestionFits(*check, catalogue);
}

// A plan of no step that keeps less of the parameters is offered one over a new dimension.
TEST(CheckOnTargetTest, APlanWithoutShardingGetsFsdpOverANewDimension) {
  const TargetCatalogue catalogue = BuiltinTargets();
  Plan single = Llama8b();
  single.mutable_prepare()->DeleteSubrange(1, 1);
  single.mutable_mesh()->clear_dims();
  single.mutable_training()->set_micro_batch(1);
  single.mutable_training()->clear_global_batch();
  absl::StatusOr<TargetCheck> check = CheckOnTarget(single, catalogue, "h100-sxm", std::nullopt);
  ASSERT_THAT(check, IsOk());
  ASSERT_FALSE(check->fits());
  ASSERT_FALSE(check->suggestions.empty());
  EXPECT_THAT(check->suggestions[0].change,
              HasSubstr("fsdp { mesh_dim: \"dp\" } over a new mesh dim dp: "));
  ExpectEverySuggestionFits(*check, catalogue);
}

// 70B sharded over one node's 8 GPUs keeps 140 GB of parameters and optimizer state a GPU:
// FSDP over more nodes makes it fit.
TEST(CheckOnTargetTest, StateThatDoesNotFitGetsMoreFsdpRanks) {
  Plan plan = Llama70b();
  plan.mutable_mesh()->mutable_dims()->DeleteSubrange(1, 1);  // no tensor parallelism
  plan.mutable_mesh()->mutable_dims(0)->set_size(8);
  plan.mutable_prepare()->DeleteSubrange(0, 1);
  plan.mutable_training()->set_micro_batch(1);
  const TargetCatalogue catalogue = BuiltinTargets();
  absl::StatusOr<TargetCheck> check = CheckOnTarget(plan, catalogue, "h200", 1);
  ASSERT_THAT(check, IsOk());
  ASSERT_FALSE(check->fits());
  ASSERT_EQ(check->suggestions.size(), 1u);
  EXPECT_THAT(check->suggestions[0].change,
              HasSubstr("fsdp over more ranks: mesh dim dp: 16 (a global batch 2 times larger), "
                        "16 GPUs on 2 nodes"));
  EXPECT_EQ(check->suggestions[0].nodes, 2);
  ExpectEverySuggestionFits(*check, catalogue);
}

// 70B as FSDP 32 x TP 8 on 32 nodes: tensor parallelism's groups are a node's GPUs, FSDP's
// span the nodes; the tensor-parallel collectives hold the compute up.
TEST(CheckOnTargetTest, MeshDimensionsAreWithinOrAcrossNodes) {
  const TargetCatalogue catalogue = BuiltinTargets();
  absl::StatusOr<TargetCheck> check = CheckOnTarget(Llama70b(), catalogue, "h100-96gb", 32);
  ASSERT_THAT(check, IsOk());
  EXPECT_EQ(check->resolved.world_size, 256);
  ASSERT_EQ(check->time.links.size(), 2u);
  EXPECT_EQ(check->time.links[0].mesh_dim, "tp");
  EXPECT_FALSE(check->time.links[0].across_nodes);
  EXPECT_FALSE(check->time.links[0].overlaps_compute);
  EXPECT_EQ(check->time.links[1].mesh_dim, "dp");
  EXPECT_TRUE(check->time.links[1].across_nodes);
  EXPECT_GT(check->time.seconds, check->time.compute_seconds);
  EXPECT_THAT(check->time.bound, HasSubstr("waiting for the collectives over tp"));
}

// Qwen3-30B-A3B with expert parallelism inside each node and FSDP across the 8 nodes: the
// routed rows stay on a node's links, FSDP's groups (the experts' over dp, the dense parts'
// over dp and ep) span the nodes, and sharding the dense parts over ep too leaves each GPU
// 1/64 of them in place of 1/8.
TEST(CheckOnTargetTest, ExpertParallelInsideNodesAndFsdpAcrossThem) {
  const TargetCatalogue catalogue = BuiltinTargets();
  const Plan plan = ClusterPlan("qwen3_30b_a3b_ep_fsdp_64xh100.textproto");
  absl::StatusOr<TargetCheck> check = CheckOnTarget(plan, catalogue, "h100-sxm", 8);
  ASSERT_THAT(check, IsOk());
  EXPECT_TRUE(check->fits());
  ASSERT_EQ(check->time.links.size(), 3u);
  EXPECT_EQ(check->time.links[0].mesh_dim, "ep");
  EXPECT_FALSE(check->time.links[0].across_nodes);
  EXPECT_EQ(check->time.links[1].mesh_dim, "dp");
  EXPECT_TRUE(check->time.links[1].across_nodes);
  EXPECT_EQ(check->time.links[2].mesh_dim, "dp,ep");
  EXPECT_TRUE(check->time.links[2].across_nodes);

  Plan replicated = plan;
  replicated.mutable_prepare(2)->mutable_fsdp()->clear_shard_dense_over_mesh_dim();
  absl::StatusOr<TargetCheck> whole = CheckOnTarget(replicated, catalogue, "h100-sxm", 8);
  ASSERT_THAT(whole, IsOk());
  // ep's gradient average of the dense parts is back, within the node.
  ASSERT_EQ(whole->time.links.size(), 3u);
  EXPECT_EQ(whole->time.links[1].mesh_dim, "ep");
  EXPECT_FALSE(whole->time.links[1].across_nodes);
  const double saved = whole->memory.parameter_bytes - check->memory.parameter_bytes;
  EXPECT_GT(saved, 0.5 * kGiB);
}

TEST(CheckOnTargetTest, AWorldOfOtherNodesIsTheMeshsStaticError) {
  EXPECT_THAT(CheckOnTarget(Llama8b(), BuiltinTargets(), "h200", 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("plan.mesh: dp=8 makes 8 ranks, but the world has 16")));
}

TEST(CheckOnTargetTest, AModelDtypeWithoutAPeakIsRefused) {
  const std::string path = WriteTemp("fp32_only.textproto", R"pb(
    targets {
      name: "fp32-only"
      memory_gib: 80
      fp32_tflops: 60
      intra_node_gb_per_s: 300
      inter_node_gb_per_s: 25
      gpus_per_node: 8
    }
  )pb");
  absl::StatusOr<TargetCatalogue> catalogue = LoadTargets(path);
  ASSERT_THAT(catalogue, IsOk());
  Plan plan = Llama8b();
  plan.mutable_model()->set_dtype(base::DTYPE_BFLOAT16);
  EXPECT_THAT(CheckOnTarget(plan, *catalogue, "fp32-only", 1),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("target \"fp32-only\" has no bf16 peak")));
  // DTYPE_AUTO computes in fp32 there.
  absl::StatusOr<TargetCheck> check = CheckOnTarget(Llama8b(), *catalogue, "fp32-only", 1);
  ASSERT_THAT(check, IsOk());
  EXPECT_EQ(check->resolved.plan.model().dtype(), base::DTYPE_FLOAT32);
}

// Published runs side by side with the estimate (README's table): torchtitan's H100 runs
// (benchmarks/llama3_h100_202412_torchtitan.md, on 96 GB H100s at 500 W). Their tokens/s
// are within 2x of the estimate at the catalogue's assumed MFU, their memory (the caching
// allocator's reserved peak) within 1.5x of the estimate with its fragmentation allowance.
TEST(KnownConfigurationsTest, TorchtitansH100RunsSideBySide) {
  const TargetCatalogue catalogue = BuiltinTargets();
  struct Published {
    Plan plan;
    int nodes;
    double tokens_per_second_per_gpu;
    double memory_gib;
  };
  for (const Published& run :
       {Published{Llama8b(), 1, 5762, 82.4}, Published{Llama70b(), 32, 829, 71.9}}) {
    absl::StatusOr<TargetCheck> check = CheckOnTarget(run.plan, catalogue, "h100-96gb", run.nodes);
    ASSERT_THAT(check, IsOk());
    EXPECT_TRUE(check->fits()) << run.plan.model().preset();
    const double ratio = check->time.tokens_per_second_per_gpu / run.tokens_per_second_per_gpu;
    EXPECT_GT(ratio, 0.5) << run.plan.model().preset();
    EXPECT_LT(ratio, 2.0) << run.plan.model().preset();
    const double memory_ratio = check->needed_bytes / (run.memory_gib * kGiB);
    EXPECT_GT(memory_ratio, 0.5) << run.plan.model().preset();
    EXPECT_LT(memory_ratio, 1.5) << run.plan.model().preset();
  }
}

// The FLOPs a token are the same wherever they are counted, for every preset: the resolved
// plan's (the run's MFU), TrainingFlopsPerToken's (model_bench's) and the target check's.
TEST(FlopConventionTest, OneCountForEveryPreset) {
  const TargetCatalogue catalogue = BuiltinTargets();
  for (const std::string& preset : models::PresetNames()) {
    Plan plan = Llama8b();
    plan.mutable_model()->set_preset(preset);
    plan.mutable_training()->set_seq_len(256);
    absl::StatusOr<TargetCheck> check = CheckOnTarget(plan, catalogue, "b200", 1);
    ASSERT_THAT(check, IsOk()) << preset;
    const double expected =
        models::TrainingFlopsPerToken(*models::PresetConfig(preset), /*seq_len=*/256);
    EXPECT_DOUBLE_EQ(check->resolved.flops_per_token, expected) << preset;
    EXPECT_THAT(
        check->time.flops_per_gpu * check->resolved.world_size / check->resolved.tokens_per_step,
        DoubleNear(expected, expected * 1e-12))
        << preset;
  }
}

}  // namespace
}  // namespace plait::plan
