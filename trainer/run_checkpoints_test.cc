// The trainer's checkpoints on ranks as threads over TCP: a run resumed from step k
// reproduces the straight run's losses, parameters and optimizer state (single process and
// FSDP on 2 ranks), the metrics file of a resumed run, and the errors that name what the
// trainer stores: the plan fields of its fingerprint, its parameters and optimizer state. The
// layout and the protocol are checkpoint/checkpointer_test.cc's.
#include "trainer/run_checkpoints.h"

#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/status_matchers.h"
#include "base/test_paths.h"
#include "checkpoint/checkpointer.h"
#include "checkpoint/manifest.h"
#include "data/data_config.h"
#include "data/data_loader.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/causal_lm.h"
#include "models/safetensors.h"
#include "nlohmann/json.hpp"
#include "parallel/device_mesh.h"
#include "parallel/test_ranks.h"
#include "plan/plan.h"
#include "plan/testing_resolved.h"
#include "prepared/prepared_model.h"
#include "torch/csrc/autograd/generated/variable_factories.h"
#include "trainer/testing_ranks.h"
#include "trainer/trainer.h"

namespace plait::trainer {
namespace {

namespace fs = std::filesystem;
using ::plait::base::testing::FolderEntries;
using ::plait::base::testing::FreshTestDir;
using ::plait::base::testing::IsOk;
using ::plait::base::testing::StatusIs;
using ::plait::plan::testing::Resolved;
using ::plait::prepared::BuildOptimizer;
using ::plait::prepared::PreparedModel;
using ::plait::prepared::Role;
using ::plait::trainer::testing::ConfigOf;
using ::plait::trainer::testing::LoadShippedPlan;
using ::plait::trainer::testing::TrainOnRanks;
using ::plait::trainer::testing::WithMesh;
using ::testing::AllOf;
using ::testing::HasSubstr;

// A shipped plan shortened to 8 steps (warmup 2, evaluation after steps 4 and 8), with
// checkpoints every 3 steps into `dir`, and `overrides` applied.
plan::Plan ShortPlan(const std::string& name, const std::string& dir,
                     const std::vector<std::string>& overrides = {}) {
  plan::Plan plan = LoadShippedPlan(name);
  for (const std::string& assignment : std::vector<std::string>{
           "training.steps=8", "schedule.warmup.steps=2", "training.eval_every=4",
           "training.eval_batches=1", "training.metrics_file=", "training.checkpoint.every=3",
           absl::StrCat("training.checkpoint.dir=", dir)}) {
    EXPECT_THAT(plan::ApplyOverride(assignment, plan), IsOk()) << assignment;
  }
  for (const std::string& assignment : overrides) {
    EXPECT_THAT(plan::ApplyOverride(assignment, plan), IsOk()) << assignment;
  }
  return plan;
}

std::map<std::string, at::Tensor> ReadAll(const std::string& path) {
  absl::StatusOr<std::unique_ptr<models::SafetensorsFile>> file =
      models::SafetensorsFile::Open(path);
  EXPECT_THAT(file, IsOk());
  std::map<std::string, at::Tensor> tensors;
  for (const auto& [name, entry] : (*file)->entries()) tensors[name] = *(*file)->Read(name);
  return tensors;
}

// Copies the checkpoint folder `checkpoint` into `plan`'s checkpoint dir and trains `plan`
// resuming from it on `ranks` ranks.
TrainReport ResumeFrom(const std::string& checkpoint, plan::Plan plan, int ranks) {
  const fs::path dir = plan.training().checkpoint().dir();
  fs::create_directories(dir);
  fs::copy(checkpoint, dir / fs::path(checkpoint).filename(), fs::copy_options::recursive);
  EXPECT_THAT(plan::ApplyOverride("training.checkpoint.resume=true", plan), IsOk());
  return TrainOnRanks(plan, ranks);
}

// Runs 8 steps straight, then resumes a copy of the step-3 checkpoint for steps 4..8: the
// same losses, gradient norms and evaluation, and the same final parameters and optimizer
// state (bitwise: the same operations on the same numbers).
void ExpectResumeReproducesTheStraightRun(const std::string& plan_name, int ranks,
                                          const std::vector<std::string>& overrides = {}) {
  const std::string name = absl::StrCat(plan_name, overrides.empty() ? "" : "_overridden");
  const std::string straight_dir = FreshTestDir(name + "_straight");
  const std::string resumed_dir = FreshTestDir(name + "_resumed");
  const TrainReport straight = TrainOnRanks(ShortPlan(plan_name, straight_dir, overrides), ranks);
  ASSERT_EQ(straight.steps.size(), 8u);
  EXPECT_THAT(FolderEntries(straight_dir),
              ::testing::ElementsAre(".lock", "step-00000003", "step-00000006", "step-00000008"));

  const plan::Plan resuming = ShortPlan(plan_name, resumed_dir, overrides);
  const int64_t draws = models::internal::SeededDraws();
  const TrainReport resumed = ResumeFrom(straight_dir + "/step-00000003", resuming, ranks);
  // The checkpoint holds the trained model's values, which are not drawn first (a frozen
  // model is not checkpointed: it draws its own).
  if (resuming.frozen_size() == 0) {
    EXPECT_EQ(models::internal::SeededDraws(), draws);
  }
  ASSERT_EQ(resumed.steps.size(), 5u);
  for (size_t i = 0; i < resumed.steps.size(); ++i) {
    const auto& want = straight.steps[i + 3];
    const auto& have = resumed.steps[i];
    EXPECT_EQ(have.step, want.step);
    EXPECT_EQ(have.loss, want.loss) << "step " << want.step;
    EXPECT_EQ(have.lr, want.lr) << "step " << want.step;
    EXPECT_EQ(have.grad_norm, want.grad_norm) << "step " << want.step;
    EXPECT_EQ(have.eval_loss, want.eval_loss) << "step " << want.step;
  }
  for (int rank = 0; rank < ranks; ++rank) {
    const std::string file = "/step-00000008/" + checkpoint::RankFileName(rank, ranks);
    const auto want = ReadAll(straight_dir + file);
    const auto have = ReadAll(resumed_dir + file);
    ASSERT_EQ(have.size(), want.size());
    for (const auto& [name, tensor] : want) {
      ASSERT_EQ(have.count(name), 1u) << name;
      EXPECT_TRUE(have.at(name).equal(tensor)) << file << ": " << name;
    }
  }
}

TEST(CheckpointTest, SingleProcessResumeReproducesTheStraightRun) {
  ExpectResumeReproducesTheStraightRun("llama_single", 1);
}

TEST(CheckpointTest, FsdpOnTwoRanksResumeReproducesTheStraightRun) {
  ExpectResumeReproducesTheStraightRun("llama_fsdp", 2);
}

// Each rank saves its tensor-parallel slices and their optimizer state.
TEST(CheckpointTest, TensorParallelOnTwoRanksResumeReproducesTheStraightRun) {
  ExpectResumeReproducesTheStraightRun("llama_tp", 2);
}

// FSDP's shards of the tensor-parallel slices, on a dp x tp mesh of 4 ranks.
TEST(CheckpointTest, FsdpTimesTensorParallelOnFourRanksResumeReproducesTheStraightRun) {
  ExpectResumeReproducesTheStraightRun("llama_2d", 4);
}

// The library's refusal (checkpoint/checkpointer.h) under the plan's field names.
// DPO: the policy and its optimizer are saved; the reference is rebuilt from its seed.
TEST(CheckpointTest, DpoOnTwoFsdpRanksResumeReproducesTheStraightRun) {
  ExpectResumeReproducesTheStraightRun("qwen_dpo_fsdp", 2);
}

// With precompute_reference the resumed run precomputes the batches from its checkpoint on.
TEST(CheckpointTest, DpoWithAPrecomputedReferenceResumeReproducesTheStraightRun) {
  ExpectResumeReproducesTheStraightRun("qwen_dpo_fsdp", 2,
                                       {"objective.dpo.precompute_reference=true"});
}

// The resharding plans: `name` (a shipped plan) with a global batch of 4 sequences of 32
// tokens over its data-parallel ranks, 16 steps (or `steps`) at a constant learning rate
// after 2 steps of warmup (so that a run of 8 steps has the rates of the first 8 of 16), and a
// checkpoint every 8 steps into `dir`; `dp_ranks` (when set) is the size of its mesh's one
// dimension.
plan::Plan ReshardPlan(const std::string& name, const std::string& dir, int64_t micro_batch,
                       int dp_ranks = 0, int64_t steps = 16) {
  plan::Plan plan =
      ShortPlan(name, dir,
                {absl::StrCat("training.steps=", steps), "training.checkpoint.every=8",
                 "training.seq_len=32", "training.global_batch=4",
                 absl::StrCat("training.micro_batch=", micro_batch), "training.eval_every=0"});
  plan.mutable_schedule()->mutable_constant_with_warmup();
  if (dp_ranks > 0) plan.mutable_mesh()->mutable_dims(0)->set_size(dp_ranks);
  return plan;
}

// Every tensor of the checkpoint folder `folder`, whole.
std::map<std::string, at::Tensor> ReadCheckpoint(const std::string& folder) {
  absl::StatusOr<checkpoint::Manifest> manifest =
      checkpoint::ReadManifest(folder + "/" + checkpoint::kManifest);
  EXPECT_THAT(manifest, IsOk());
  std::map<std::string, at::Tensor> tensors;
  if (!manifest.ok()) return tensors;
  checkpoint::SliceReader reader(folder, *manifest);
  for (const auto& [name, stored] : manifest->tensors) {
    absl::StatusOr<at::Tensor> tensor = reader.ReadWhole(name);
    EXPECT_THAT(tensor, IsOk()) << name;
    if (tensor.ok()) tensors[name] = *tensor;
  }
  return tensors;
}

// Resumes the checkpoint of step 8 in `saved_dir` with `plan` (16 steps) on `ranks` ranks and
// checks steps 9..16 and the final parameters and optimizer state against `straight`, the
// straight 16-step run whose checkpoints are in `straight_dir`: losses, gradient norms and
// parameters within 1e-5 relative (the reduction order differs between layouts; tensors
// relative to their norm, as in wrap/parity_test.cc), and the optimizer's moments within
// 1e-4 (they average gradients, whose reduction-order noise is relatively larger where the
// gradient is small: a key projection's, whose gradient is near zero by construction).
void ExpectResumeMatches(const std::string& saved_dir, plan::Plan plan, int ranks,
                         const TrainReport& straight, const std::string& straight_dir) {
  const std::string dir = plan.training().checkpoint().dir();
  const TrainReport resumed = ResumeFrom(saved_dir + "/step-00000008", plan, ranks);
  ASSERT_EQ(resumed.steps.size(), 8u);
  for (size_t i = 0; i < resumed.steps.size(); ++i) {
    const auto& want = straight.steps[i + 8];
    const auto& have = resumed.steps[i];
    EXPECT_EQ(have.step, want.step);
    EXPECT_NEAR(have.loss, want.loss, 1e-5 * want.loss) << "step " << want.step;
    ASSERT_TRUE(have.grad_norm.has_value() && want.grad_norm.has_value());
    EXPECT_NEAR(*have.grad_norm, *want.grad_norm, 1e-5 * *want.grad_norm) << "step " << want.step;
  }
  const auto want = ReadCheckpoint(straight_dir + "/step-00000016");
  const auto have = ReadCheckpoint(dir + "/step-00000016");
  ASSERT_EQ(have.size(), want.size());
  for (const auto& [name, tensor] : want) {
    ASSERT_EQ(have.count(name), 1u) << name;
    if (tensor.dim() == 0) {
      EXPECT_TRUE(have.at(name).equal(tensor)) << name;  // update counts
      continue;
    }
    const double error =
        (have.at(name).to(at::kDouble) - tensor.to(at::kDouble)).norm().item<double>() /
        tensor.to(at::kDouble).norm().item<double>();
    EXPECT_LE(error, absl::StartsWith(name, "param/") ? 1e-5 : 1e-4) << name;
  }
}

// A run of 8 steps on 2 FSDP ranks resumes on 1 rank, on 4 FSDP ranks and on a 3-D mesh (2
// pipeline stages x FSDP 2 x tensor parallel 2, 8 ranks), one on 2 DDP ranks on 2 FSDP
// ranks, one on a 2-D mesh (tensor parallel inside FSDP, 4 ranks) on 2 tensor-parallel ranks,
// one on 2 pipeline stages (and one on 2 pipeline ranks of 2 interleaved stages) on 2 FSDP
// ranks, and one on 2 context-parallel ranks on 2 FSDP ranks (and the FSDP run's on 2
// context-parallel ranks), each for 8 more steps, as the straight 16-step run on 2 FSDP ranks: each
// new rank reads its parts of the old ranks' slices.
TEST(CheckpointReshardTest, ACheckpointResumesOnAnotherWorldSizeAndLayout) {
  const std::string straight_dir = FreshTestDir("reshard_straight");
  const TrainReport straight =
      TrainOnRanks(ReshardPlan("llama_fsdp", straight_dir, /*micro_batch=*/2, /*dp_ranks=*/2), 2);
  ASSERT_EQ(straight.steps.size(), 16u);
  {
    SCOPED_TRACE("2 FSDP ranks -> 1 rank");
    ExpectResumeMatches(straight_dir, ReshardPlan("llama_single", FreshTestDir("reshard_1"), 4), 1,
                        straight, straight_dir);
  }
  {
    SCOPED_TRACE("2 FSDP ranks -> 4 FSDP ranks");
    ExpectResumeMatches(straight_dir, ReshardPlan("llama_fsdp", FreshTestDir("reshard_4"), 1, 4), 4,
                        straight, straight_dir);
  }
  {
    SCOPED_TRACE("2 DDP ranks -> 2 FSDP ranks");
    const std::string ddp_dir = FreshTestDir("reshard_ddp");
    TrainOnRanks(ReshardPlan("llama_ddp", ddp_dir, 2, 2, /*steps=*/8), 2);
    ExpectResumeMatches(ddp_dir, ReshardPlan("llama_fsdp", FreshTestDir("reshard_ddp_fsdp"), 2, 2),
                        2, straight, straight_dir);
  }
  {
    SCOPED_TRACE("2 FSDP x 2 tensor-parallel ranks -> 2 tensor-parallel ranks");
    const std::string two_d_dir = FreshTestDir("reshard_2d");
    TrainOnRanks(ReshardPlan("llama_2d", two_d_dir, 2, 0, /*steps=*/8), 4);
    ExpectResumeMatches(two_d_dir, ReshardPlan("llama_tp", FreshTestDir("reshard_2d_tp"), 4), 2,
                        straight, straight_dir);
  }
  {
    SCOPED_TRACE("2 pipeline stages -> 2 FSDP ranks");
    const std::string pp_dir = FreshTestDir("reshard_pp");
    TrainOnRanks(ReshardPlan("llama_pp", pp_dir, 1, 0, /*steps=*/8), 2);
    ExpectResumeMatches(pp_dir, ReshardPlan("llama_fsdp", FreshTestDir("reshard_pp_fsdp"), 2, 2), 2,
                        straight, straight_dir);
  }
  {
    SCOPED_TRACE("2 pipeline ranks of 2 interleaved stages -> 2 FSDP ranks");
    const std::string interleaved_dir = FreshTestDir("reshard_interleaved");
    plan::Plan interleaved = ReshardPlan("llama_pp", interleaved_dir, 1, 0, /*steps=*/8);
    wrap::PipelineConfig& pipeline = *interleaved.mutable_prepare(0)->mutable_pipeline();
    pipeline.set_schedule("INTERLEAVED_1F1B");
    pipeline.set_stages_per_rank(2);
    TrainOnRanks(interleaved, 2);
    ExpectResumeMatches(interleaved_dir,
                        ReshardPlan("llama_fsdp", FreshTestDir("reshard_interleaved_fsdp"), 2, 2),
                        2, straight, straight_dir);
  }
  {
    // Context parallelism splits no parameter: its checkpoints are one process's.
    const auto context_parallel = [](const std::string& dir, int64_t steps) {
      plan::Plan plan = ReshardPlan("llama_single", dir, 4, 0, steps);
      parallel::MeshConfig::Dimension& cp = *plan.mutable_mesh()->add_dims();
      cp.set_name("cp");
      cp.set_size(2);
      plan.add_prepare()->mutable_context_parallel()->set_mesh_dim("cp");
      return plan;
    };
    SCOPED_TRACE("2 context-parallel ranks -> 2 FSDP ranks, and back");
    const std::string cp_dir = FreshTestDir("reshard_cp");
    TrainOnRanks(context_parallel(cp_dir, 8), 2);
    ExpectResumeMatches(cp_dir, ReshardPlan("llama_fsdp", FreshTestDir("reshard_cp_fsdp"), 2, 2), 2,
                        straight, straight_dir);
    ExpectResumeMatches(straight_dir, context_parallel(FreshTestDir("reshard_fsdp_cp"), 16), 2,
                        straight, straight_dir);
  }
  {
    SCOPED_TRACE("2 FSDP ranks -> 2 pipeline stages x 2 FSDP x 2 tensor-parallel ranks");
    ExpectResumeMatches(straight_dir, ReshardPlan("llama_3d", FreshTestDir("reshard_3d"), 1), 8,
                        straight, straight_dir);
  }
}

// A mixture of experts trained on 2 expert-parallel ranks (each keeping 4 of the 8 experts,
// which its checkpoint names as the model does) resumes on 4 expert-parallel ranks (2 experts
// each), on 2 expert-parallel x 2 tensor-parallel ranks (sequence parallel: attention split,
// the experts whole), on 2 expert-parallel x 2 FSDP ranks with the dense parts sharded over
// all 4, on 2 FSDP ranks and on 1 rank, each as the straight run: every rank reads the experts
// it keeps from the ranks that wrote them.
TEST(CheckpointReshardTest, AMixtureOfExpertsResumesOnAnotherExpertParallelOrDenseLayout) {
  const std::string straight_dir = FreshTestDir("moe_straight");
  const TrainReport straight =
      TrainOnRanks(ReshardPlan("qwen3_moe_ep", straight_dir, /*micro_batch=*/2, 2), 2);
  ASSERT_EQ(straight.steps.size(), 16u);
  const auto checkpoint = ReadCheckpoint(straight_dir + "/step-00000008");
  EXPECT_EQ(checkpoint.count("param/model.layers.3.mlp.experts.7.down_proj.weight"), 1u);
  {
    SCOPED_TRACE("2 expert-parallel ranks -> 4");
    ExpectResumeMatches(straight_dir, ReshardPlan("qwen3_moe_ep", FreshTestDir("moe_ep4"), 1, 4), 4,
                        straight, straight_dir);
  }
  {
    SCOPED_TRACE("2 expert-parallel ranks -> 2 expert-parallel x 2 tensor-parallel ranks");
    plan::Plan tp = ReshardPlan("qwen3_moe_ep", FreshTestDir("moe_ep_tp"), 2);
    parallel::MeshConfig::Dimension& dim = *tp.mutable_mesh()->add_dims();
    dim.set_name("tp");
    dim.set_size(2);
    wrap::TensorParallelConfig& split = *tp.add_prepare()->mutable_tensor_parallel();
    split.set_mesh_dim("tp");
    split.set_sequence_parallel(true);
    ExpectResumeMatches(straight_dir, tp, 4, straight, straight_dir);
  }
  {
    SCOPED_TRACE("2 expert-parallel ranks -> 2 expert-parallel x 2 FSDP ranks, dense over 4");
    plan::Plan fsdp = ReshardPlan("qwen3_moe_ep", FreshTestDir("moe_ep_fsdp"), 1);
    parallel::MeshConfig::Dimension& dim = *fsdp.mutable_mesh()->add_dims();
    dim.set_name("dp");
    dim.set_size(2);
    wrap::FsdpConfig& shard = *fsdp.add_prepare()->mutable_fsdp();
    shard.set_mesh_dim("dp");
    shard.set_shard_dense_over_mesh_dim("ep");
    ExpectResumeMatches(straight_dir, fsdp, 4, straight, straight_dir);
  }
  {
    SCOPED_TRACE("2 expert-parallel ranks -> 2 FSDP ranks");
    plan::Plan fsdp = ReshardPlan("qwen3_moe_ep", FreshTestDir("moe_fsdp"), 2);
    fsdp.mutable_mesh()->mutable_dims(0)->set_name("dp");
    fsdp.mutable_prepare(0)->mutable_fsdp()->set_mesh_dim("dp");
    ExpectResumeMatches(straight_dir, fsdp, 2, straight, straight_dir);
  }
  {
    SCOPED_TRACE("2 expert-parallel ranks -> 1 rank");
    plan::Plan single = ReshardPlan("qwen3_moe_ep", FreshTestDir("moe_single"), 4);
    single.clear_mesh();
    single.clear_prepare();
    ExpectResumeMatches(straight_dir, single, 1, straight, straight_dir);
  }
}

TEST(CheckpointTest, AFreshRunNeverOverwritesCheckpoints) {
  const std::string dir = FreshTestDir("fresh");
  const plan::Plan plan = ShortPlan("llama_single", dir);
  fs::create_directories(dir + "/step-00000003");
  const plan::ResolvedPlan resolved = Resolved(plan, 1);
  WithMesh(plan, 1, [&](int, const parallel::DeviceMesh& mesh) {
    EXPECT_THAT(
        RunCheckpoints::Open(resolved, mesh),
        StatusIs(absl::StatusCode::kFailedPrecondition,
                 AllOf(HasSubstr("plan.training.checkpoint.dir: \"" + dir +
                                 "\" already holds checkpoints (newest " + dir + "/step-00000003)"),
                       HasSubstr("plan.training.checkpoint.resume"))));
  });
}

// `plan` writing the metrics file `path`.
plan::Plan WithMetrics(plan::Plan plan, const std::string& path) {
  plan.mutable_training()->set_metrics_file(path);
  return plan;
}

TEST(CheckpointTest, MetricsOfAResumedRunContinueTheFile) {
  const std::string straight_dir = FreshTestDir("metrics_straight");
  const std::string resumed_dir = FreshTestDir("metrics_resumed");
  const std::string straight_metrics = straight_dir + ".jsonl";
  const std::string resumed_metrics = resumed_dir + ".jsonl";
  TrainOnRanks(WithMetrics(ShortPlan("llama_single", straight_dir), straight_metrics), 1);
  std::vector<std::string> rows;
  std::ifstream in(straight_metrics);
  for (std::string line; std::getline(in, line);) rows.push_back(line);
  ASSERT_EQ(rows.size(), 8u);

  // The killed run had saved step 3 and logged up to step 5, its last row cut short.
  fs::create_directories(resumed_dir);
  fs::copy(straight_dir + "/step-00000003", resumed_dir + "/step-00000003",
           fs::copy_options::recursive);
  {
    std::ofstream out(resumed_metrics);
    for (int i = 0; i < 4; ++i) out << rows[i] << "\n";
    out << rows[4].substr(0, rows[4].size() / 2);
  }
  plan::Plan plan = ShortPlan("llama_single", resumed_dir);
  ASSERT_THAT(plan::ApplyOverride("training.checkpoint.resume=true", plan), IsOk());
  TrainOnRanks(WithMetrics(plan, resumed_metrics), 1);

  std::ifstream resumed(resumed_metrics);
  std::vector<std::string> lines;
  for (std::string line; std::getline(resumed, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 8u);
  for (size_t i = 0; i < lines.size(); ++i) {
    const nlohmann::json have = nlohmann::json::parse(lines[i]);
    const nlohmann::json want = nlohmann::json::parse(rows[i]);
    EXPECT_EQ(have["step"], i + 1);
    EXPECT_EQ(have["loss"], want["loss"]) << "step " << i + 1;
    if (i < 3) {
      EXPECT_EQ(lines[i], rows[i]) << "rows before the checkpoint are kept as they were";
    }
  }
}

// Saves a checkpoint of step 1 of `plan` on `ranks` ranks into its checkpoint dir: one
// optimizer step on one batch, so parameters and state are those of a trained step, passed
// to `before_save` when one is given.
void SaveStepOne(const plan::Plan& plan, int ranks,
                 const std::function<void(PreparedModel&)>& before_save = {}) {
  const plan::ResolvedPlan resolved = Resolved(plan, ranks);
  WithMesh(plan, ranks, [&](int rank, const parallel::DeviceMesh& mesh) {
    auto prepared = PreparedModel::Prepare(plan.model(), ConfigOf(plan.model()), "", plan.prepare(),
                                           mesh, Role::kTrained, "plan");
    ASSERT_THAT(prepared, IsOk());
    auto optimizer = BuildOptimizer(**prepared, plan.optimizer());
    ASSERT_THAT(optimizer, IsOk());
    const at::Tensor tokens = torch::randint(100, {2, 8}, at::kLong);
    (*prepared)->model().Loss(tokens, tokens).backward();
    ASSERT_THAT((*optimizer)->Step(1e-3), IsOk());
    if (before_save) before_save(**prepared);
    auto checkpointer = RunCheckpoints::Open(resolved, mesh);
    ASSERT_THAT(checkpointer, IsOk());
    ASSERT_THAT(checkpointer->Save(1, **optimizer), IsOk());
  });
}

// What RunCheckpoints::Open and then Restore return on each of `ranks` ranks resuming `plan`.
std::vector<absl::Status> ResumeStatuses(plan::Plan plan, int ranks) {
  EXPECT_THAT(plan::ApplyOverride("training.checkpoint.resume=true", plan), IsOk());
  const plan::ResolvedPlan resolved = Resolved(plan, ranks);
  std::vector<absl::Status> statuses(ranks);
  WithMesh(plan, ranks, [&](int rank, const parallel::DeviceMesh& mesh) {
    auto prepared = PreparedModel::Prepare(plan.model(), ConfigOf(plan.model()), "", plan.prepare(),
                                           mesh, Role::kTrained, "plan");
    ASSERT_THAT(prepared, IsOk());
    auto optimizer = BuildOptimizer(**prepared, plan.optimizer());
    ASSERT_THAT(optimizer, IsOk());
    auto checkpointer = RunCheckpoints::Open(resolved, mesh);
    if (!checkpointer.ok()) {
      statuses[rank] = checkpointer.status();
      return;
    }
    auto loader = data::DataLoader::Create(data::ResolvedDataConfig(plan.data()),
                                           data::Split::kTrain, 4096, plan.training().micro_batch(),
                                           plan.training().seq_len(), /*dp_rank=*/rank,
                                           /*dp_size=*/ranks, "plan.data");
    ASSERT_THAT(loader, IsOk());
    statuses[rank] = checkpointer->Restore(**optimizer, *loader);
  });
  return statuses;
}

// A single-process checkpoint of step 1 in a fresh dir; its manifest's path.
struct SavedCheckpoint {
  plan::Plan plan;
  std::string manifest;
};
SavedCheckpoint SaveSingle(const std::string& name) {
  const std::string dir = FreshTestDir(name);
  SavedCheckpoint saved{ShortPlan("llama_single", dir), dir + "/step-00000001/checkpoint.json"};
  SaveStepOne(saved.plan, 1);
  return saved;
}

// Rewrites the manifest `path` passed through `edit`.
void RewriteManifest(const std::string& path, const std::function<void(nlohmann::json&)>& edit) {
  std::ifstream in(path);
  nlohmann::json manifest = nlohmann::json::parse(in);
  edit(manifest);
  std::ofstream(path) << manifest.dump(2);
}

TEST(CheckpointErrorsTest, AnUndamagedCheckpointLoads) {
  const SavedCheckpoint saved = SaveSingle("undamaged");
  EXPECT_THAT(ResumeStatuses(saved.plan, 1)[0], IsOk());
}

TEST(CheckpointErrorsTest, AChangedFingerprintNamesTheFieldAndBothValues) {
  SavedCheckpoint saved = SaveSingle("fingerprint");
  ASSERT_THAT(plan::ApplyOverride("training.seq_len=32", saved.plan), IsOk());
  // An override cannot swap the plan's optimizer (a oneof): changed in the plan itself.
  saved.plan.mutable_optimizer()->mutable_sgd()->set_momentum(0.9);
  ASSERT_THAT(plan::ApplyOverride("model.dtype=DTYPE_BFLOAT16", saved.plan), IsOk());
  ASSERT_THAT(plan::ApplyOverride("training.micro_batch=8", saved.plan), IsOk());
  ASSERT_THAT(plan::ApplyOverride("training.global_batch=0", saved.plan), IsOk());
  EXPECT_THAT(ResumeStatuses(saved.plan, 1)[0],
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(saved.manifest + ": cannot resume from it"),
                             HasSubstr("fingerprint.plan.model.dtype: \"DTYPE_FLOAT32\" in "
                                       "the checkpoint, \"DTYPE_BFLOAT16\" in this plan"),
                             HasSubstr("fingerprint.plan.training.seq_len: \"64\" in the "
                                       "checkpoint, \"32\" in this plan"),
                             HasSubstr("fingerprint.plan.optimizer: \"adamw\" in the "
                                       "checkpoint, \"sgd\" in this plan"),
                             HasSubstr("fingerprint.plan.training.global_batch: \"16\" in the "
                                       "checkpoint, \"8\" in this plan"))));
}

TEST(CheckpointErrorsTest, MissingExtraAndMisshapedTensorsNameTheFileAndTensor) {
  const SavedCheckpoint saved = SaveSingle("tensors");
  const std::string weight = "param/model.layers.0.self_attn.q_proj.weight";
  const std::string moment = "optim/model.norm.weight:exp_avg";
  RewriteManifest(saved.manifest, [&](nlohmann::json& manifest) {
    nlohmann::json& tensors = manifest["tensors"];
    ASSERT_EQ(tensors.count(weight), 1u) << "the tiny model's names changed";
    tensors.erase(weight);
    tensors["param/bogus"] = {
        {"dtype", "F32"}, {"shape", {0}}, {"slices", nlohmann::json::array()}};
    tensors[moment]["shape"] = {3};
    tensors[moment]["slices"][0]["lengths"] = {3};
  });
  EXPECT_THAT(
      ResumeStatuses(saved.plan, 1)[0],
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr(saved.manifest + ": does not fit this rank's model and optimizer"),
                     HasSubstr(weight + ": missing; this rank has it with shape [256, 256]"),
                     HasSubstr("param/bogus: in the checkpoint, but no rank has such "
                               "trainable parameter"),
                     HasSubstr(moment + ": shape [3] in the checkpoint, [256] here"))));
}

// The optimizer's update count must be one a run can have saved, 0 to the step: a resume
// refuses one that is missing, negative or past the step (an INT64_MAX would overflow at the
// next update), as tools/checkpoint verify does.
TEST(CheckpointErrorsTest, AnOptimizerStepARunCannotHaveSavedIsRefused) {
  const SavedCheckpoint saved = SaveSingle("optimizer_step");
  const std::string folder = saved.manifest.substr(0, saved.manifest.rfind('/'));
  for (const std::string& value : {std::string("-1"), std::string("2"), std::string("x"),
                                   std::string("9223372036854775807"), std::string()}) {
    RewriteManifest(saved.manifest, [&](nlohmann::json& manifest) {
      if (value.empty()) {
        manifest["metadata"].erase("optimizer_step");
      } else {
        manifest["metadata"]["optimizer_step"] = value;
      }
    });
    EXPECT_THAT(
        ResumeStatuses(saved.plan, 1)[0],
        StatusIs(absl::StatusCode::kDataLoss,
                 value.empty() ? absl::StrCat(folder, ": metadata.optimizer_step: missing")
                               : absl::StrCat(folder, ": metadata.optimizer_step: \"", value,
                                              "\" is not an integer from 0 to the step (1); a "
                                              "step updates the optimizer once at most")))
        << value;
  }
  RewriteManifest(saved.manifest,
                  [&](nlohmann::json& manifest) { manifest["metadata"]["optimizer_step"] = "0"; });
  EXPECT_THAT(ResumeStatuses(saved.plan, 1)[0], IsOk());
}

// A checkpoint whose parameter holds a NaN (saved by a run that had diverged) is refused on
// resume, naming the rank file and the tensor.
TEST(CheckpointErrorsTest, ANonFiniteParameterNamesTheFileAndTensor) {
  const std::string dir = FreshTestDir("non_finite");
  const plan::Plan plan = ShortPlan("llama_single", dir);
  const std::string name = "model.layers.0.mlp.up_proj.weight";
  SaveStepOne(plan, 1, [&](PreparedModel& prepared) {
    at::NoGradGuard no_grad;
    for (const auto& parameter : prepared.trainable_parameters()) {
      if (parameter.name == name) parameter.tensor[1][2] = std::numeric_limits<float>::quiet_NaN();
    }
  });
  EXPECT_THAT(ResumeStatuses(plan, 1)[0],
              StatusIs(absl::StatusCode::kInvalidArgument,
                       absl::StrCat(dir, "/step-00000001/", checkpoint::RankFileName(0, 1),
                                    ": param/", name, ": holds NaN")));
}

}  // namespace
}  // namespace plait::trainer
