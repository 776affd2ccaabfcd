// Runs //tools:checkpoint on the checkpoint of a 2-step run on 2 FSDP ranks (threads over
// TCP rings): info names the step, layout and tensors; verify passes, then names the slice whose
// bytes changed; export-hf writes the parameters the run's own Hugging Face export holds, and
// refuses a LoRA run's checkpoint, which holds the adapters alone.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "base/file.h"
#include "base/status.h"
#include "base/status_matchers.h"
#include "base/test_paths.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "models/causal_lm.h"
#include "models/hf_checkpoint.h"
#include "models/safetensors.h"
#include "nlohmann/json.hpp"
#include "parallel/testdata/subprocess.h"
#include "plan/plan.h"
#include "torch/csrc/autograd/generated/variable_factories.h"
#include "trainer/testing_ranks.h"
#include "trainer/trainer.h"
#include "wrap/wrap.pb.h"

namespace plait::tools {
namespace {

namespace fs = std::filesystem;
using ::plait::base::testing::FreshTestDir;
using ::plait::base::testing::IsOk;
using ::testing::HasSubstr;
using ::testing::Not;

std::string Runfile(const std::string& path) {
  return absl::StrCat(std::getenv("TEST_SRCDIR"), "/plait/", path);
}

class CheckpointToolTest : public ::testing::Test {
 protected:
  // Runs the tool with `args`; its exit status, with its output in stdout_ and stderr_.
  int Run(const std::vector<std::string>& args) {
    const std::string out = dir_ + "/tool.out", err = dir_ + "/tool.err";
    parallel::testdata::SubprocessOptions options;
    options.argv = {Runfile("tools/checkpoint")};
    options.argv.insert(options.argv.end(), args.begin(), args.end());
    options.stdout_path = out;
    options.stderr_path = err;
    absl::StatusOr<pid_t> pid = parallel::testdata::StartSubprocess(options);
    EXPECT_THAT(pid, IsOk());
    absl::StatusOr<int> status = parallel::testdata::WaitForSubprocess(*pid, absl::Seconds(120));
    EXPECT_THAT(status, IsOk());
    stdout_ = base::ReadFile(out).value_or("");
    stderr_ = base::ReadFile(err).value_or("");
    return WIFEXITED(*status) ? WEXITSTATUS(*status) : -1;
  }

  // llama_fsdp's plan, shortened to 2 steps, checkpointing into dir_/ckpt.
  absl::StatusOr<plan::Plan> CheckpointingFsdpPlan() {
    PLAIT_ASSIGN_OR_RETURN(plan::Plan plan,
                           plan::LoadPlan(Runfile("plan/examples/llama_fsdp.textproto")));
    for (const std::string& assignment :
         {std::string("training.steps=2"), std::string("training.eval_every=0"),
          std::string("training.eval_batches=1"), std::string("training.metrics_file="),
          std::string("schedule.warmup.steps=1"),
          absl::StrCat("training.checkpoint.dir=", dir_, "/ckpt")}) {
      PLAIT_RETURN_IF_ERROR(plan::ApplyOverride(assignment, plan));
    }
    return plan;
  }

  std::string dir_ = FreshTestDir("tool");
  std::string stdout_, stderr_;
};

// Every file's bytes under `dir`, by path.
std::map<std::string, std::string> FolderBytes(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file()) files[entry.path()] = base::ReadFile(entry.path()).value_or("");
  }
  return files;
}

std::map<std::string, at::Tensor> ReadAll(const std::string& path) {
  auto file = models::SafetensorsFile::Open(path);
  EXPECT_THAT(file, IsOk());
  std::map<std::string, at::Tensor> tensors;
  for (const auto& [name, entry] : (*file)->entries()) tensors[name] = *(*file)->Read(name);
  return tensors;
}

TEST_F(CheckpointToolTest, InfoVerifyAndExportOfAnFsdpCheckpoint) {
  absl::StatusOr<plan::Plan> plan = CheckpointingFsdpPlan();
  ASSERT_THAT(plan, IsOk());
  plan->mutable_training()->set_save_hf_dir(dir_ + "/run_hf");
  // The run starts from an earlier plait export, which the checkpoint records as read.
  const std::string base = dir_ + "/base";
  const std::shared_ptr<models::CausalLM> initial =
      models::CausalLM::Create(trainer::testing::ConfigOf(plan->model()), plan->model().init())
          .value();
  ASSERT_THAT(models::SaveHfModel(*initial, base), IsOk());
  plan->set_hf_weights_dir(base);
  trainer::testing::TrainOnRanks(*plan, 2);
  const std::string checkpoint = dir_ + "/ckpt/step-00000002";

  ASSERT_EQ(Run({"info", checkpoint}), 0) << stderr_;
  EXPECT_THAT(stdout_, HasSubstr("step 2, saved by 2 ranks (mesh dp=2)"));
  EXPECT_THAT(stdout_, HasSubstr("layout: fsdp { mesh_dim: \"dp\" }"));
  EXPECT_THAT(stdout_, HasSubstr("data position: 32"));  // 2 steps of 16 sequences
  EXPECT_THAT(stdout_,
              HasSubstr("param/model.embed_tokens.weight Float [4096, 256] 4.0 MiB in 2 slices "
                        "(rank-00000-of-00002.safetensors, rank-00001-of-00002.safetensors)"));
  EXPECT_THAT(stdout_, HasSubstr("optim/model.norm.weight:step Long [] 0.0 MiB in 1 slice "
                                 "(rank-00000-of-00002.safetensors)"));

  ASSERT_EQ(Run({"verify", checkpoint}), 0) << stderr_;
  EXPECT_THAT(stdout_, HasSubstr("every checksum matches"));
  EXPECT_THAT(stdout_, HasSubstr("Not checked without the run's plan: the fingerprint"));

  // verify refuses what a resume refuses: a data position that is not the step's, a missing
  // optimizer update count, a missing parameter.
  const std::string manifest = checkpoint + "/checkpoint.json";
  const std::string saved = base::ReadFile(manifest).value();
  nlohmann::json mutated = nlohmann::json::parse(saved);
  mutated["data_position"] = 33;
  ASSERT_THAT(base::WriteFileAtomically(manifest, mutated.dump()), IsOk());
  EXPECT_EQ(Run({"verify", checkpoint}), 1);
  EXPECT_THAT(stderr_, HasSubstr("cannot resume from it:\n  data_position: 33 in the file, 32 "
                                 "expected after step 2 (16 per step)"));
  mutated = nlohmann::json::parse(saved);
  mutated["metadata"].erase("optimizer_step");
  ASSERT_THAT(base::WriteFileAtomically(manifest, mutated.dump()), IsOk());
  EXPECT_EQ(Run({"verify", checkpoint}), 1);
  EXPECT_THAT(stderr_, HasSubstr(manifest + ": metadata.optimizer_step: missing"));
  // A model config that does not parse is named with where its text is wrong.
  mutated = nlohmann::json::parse(saved);
  mutated["fingerprint"]["plan.model"] = "hidden_size: nan";
  ASSERT_THAT(base::WriteFileAtomically(manifest, mutated.dump()), IsOk());
  EXPECT_EQ(Run({"verify", checkpoint}), 1);
  EXPECT_THAT(stderr_, HasSubstr(manifest + ": fingerprint.plan.model:1:14: Expected integer"));
  EXPECT_THAT(stderr_, Not(HasSubstr("libprotobuf")));
  mutated = nlohmann::json::parse(saved);
  mutated["tensors"].erase("param/model.norm.weight");
  ASSERT_THAT(base::WriteFileAtomically(manifest, mutated.dump()), IsOk());
  EXPECT_EQ(Run({"verify", checkpoint}), 1);
  EXPECT_THAT(stderr_, HasSubstr("tensors.param/model.norm.weight: missing"));
  ASSERT_THAT(base::WriteFileAtomically(manifest, saved), IsOk());

  ASSERT_EQ(Run({"export-hf", checkpoint, dir_ + "/exported"}), 0) << stderr_;
  const auto want = ReadAll(dir_ + "/run_hf/model.safetensors");
  const auto have = ReadAll(dir_ + "/exported/model.safetensors");
  ASSERT_EQ(have.size(), want.size());
  for (const auto& [name, tensor] : want) {
    ASSERT_EQ(have.count(name), 1u) << name;
    EXPECT_TRUE(have.at(name).equal(tensor)) << name;
  }
  EXPECT_EQ(base::ReadFile(dir_ + "/exported/config.json").value_or("exported"),
            base::ReadFile(dir_ + "/run_hf/config.json").value_or("run"));

  // An earlier export is replaced; no other folder gets a byte written into it: the
  // checkpoint's own, the export its run started from, one of the user's files, a downloaded
  // model's (names an export writes, without plait's mark).
  ASSERT_EQ(Run({"export-hf", checkpoint, dir_ + "/exported"}), 0) << stderr_;
  ASSERT_EQ(Run({"export-hf", checkpoint, dir_ + "/run_hf"}), 0) << stderr_;
  const std::string notes = dir_ + "/notes";
  fs::create_directories(notes);
  ASSERT_THAT(base::WriteFileAtomically(notes + "/todo.txt", "mine"), IsOk());
  const std::string downloaded = dir_ + "/downloaded";
  fs::create_directories(downloaded);
  fs::copy_file(dir_ + "/run_hf/config.json", downloaded + "/config.json");
  ASSERT_THAT(
      models::WriteSafetensors(downloaded + "/model.safetensors",
                               {{"model.norm.weight", torch::ones({256})}}, {{"format", "pt"}}),
      IsOk());
  for (const std::string& refused : {checkpoint, base, notes, downloaded}) {
    const std::map<std::string, std::string> before = FolderBytes(refused);
    EXPECT_EQ(Run({"export-hf", checkpoint, refused}), 1) << refused;
    EXPECT_THAT(stderr_, HasSubstr("checkpoint export-hf: OUT_DIR: \"" + refused + "\""));
    EXPECT_EQ(FolderBytes(refused), before) << refused;
  }
  EXPECT_EQ(Run({"export-hf", checkpoint, dir_ + "/./base"}), 1);
  EXPECT_THAT(stderr_, HasSubstr("is also plan.hf_weights_dir of the run that saved the "
                                 "checkpoint (\"" +
                                 fs::canonical(base).string() +
                                 "\"), an input: writing there would overwrite it"));

  // One changed byte at the end of rank 1's data.
  const std::string file = checkpoint + "/rank-00001-of-00002.safetensors";
  {
    std::fstream stream(file, std::ios::in | std::ios::out | std::ios::binary);
    stream.seekp(static_cast<std::streamoff>(fs::file_size(file)) - 3);
    stream.put('\x7f');
  }
  EXPECT_EQ(Run({"verify", checkpoint}), 1);
  EXPECT_THAT(stderr_, HasSubstr(".checksum: "));
  EXPECT_THAT(stderr_, HasSubstr("computed from " + file + "; the checkpoint is corrupt"));

  EXPECT_EQ(Run({"info"}), 2);
  EXPECT_THAT(stderr_, HasSubstr("usage: checkpoint info CHECKPOINT"));
  EXPECT_EQ(Run({"info", "--step=2", checkpoint}), 2);
  EXPECT_THAT(stderr_, HasSubstr("Unknown command line flag 'step'"));
  EXPECT_EQ(Run({"info", dir_ + "/none"}), 1);
  EXPECT_THAT(stderr_, HasSubstr(dir_ + "/none/checkpoint.json: missing or unreadable"));
}

// A LoRA run's checkpoint holds its adapters alone: verify checks them; export-hf refuses it,
// naming the run's own export, which merges them into the base.
TEST_F(CheckpointToolTest, ALoraCheckpointVerifiesAndIsNoModelToExport) {
  absl::StatusOr<plan::Plan> plan = CheckpointingFsdpPlan();
  ASSERT_THAT(plan, IsOk());
  google::protobuf::RepeatedPtrField<wrap::PrepareStep> steps;
  ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(
      R"pb(lora { rank: 2 alpha: 4 target: "*q_proj" })pb", steps.Add()));
  for (const wrap::PrepareStep& step : plan->prepare()) *steps.Add() = step;
  *plan->mutable_prepare() = steps;
  trainer::testing::TrainOnRanks(*plan, 2);
  const std::string checkpoint = dir_ + "/ckpt/step-00000002";

  ASSERT_EQ(Run({"verify", checkpoint}), 0) << stderr_;
  EXPECT_THAT(stdout_, HasSubstr("every checksum matches"));
  EXPECT_EQ(Run({"export-hf", checkpoint, dir_ + "/exported"}), 1);
  EXPECT_THAT(stderr_, HasSubstr("fingerprint.plan.hf_weights_dir: \"none: plan.model.init {"));
  EXPECT_THAT(stderr_, HasSubstr("saves its adapters alone"));
  EXPECT_FALSE(fs::exists(dir_ + "/exported/model.safetensors"));
}

}  // namespace
}  // namespace plait::tools
