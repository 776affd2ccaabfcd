// The checkpoint layout and protocol on ranks as threads over TCP, with plain tensors: a
// round trip on 2 ranks, resuming on 1 and 3 ranks (padding and an empty slice), the files'
// exact contents, when a step is due, keep_last and interrupted saves, and every way a
// checkpoint can fail to fit the run, each built here by damaging a real checkpoint.
#include "checkpoint/checkpointer.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "base/status_matchers.h"
#include "base/test_paths.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/safetensors.h"
#include "nlohmann/json.hpp"
#include "parallel/device_mesh.h"
#include "parallel/test_ranks.h"
#include "torch/csrc/autograd/generated/variable_factories.h"

namespace plait::checkpoint {
namespace {

namespace fs = std::filesystem;
using ::plait::base::testing::FolderEntries;
using ::plait::base::testing::FreshTestDir;
using ::plait::base::testing::IsOk;
using ::plait::base::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// `ranks` ranks along one dimension "dp"; one rank is the mesh without dimensions ("world=1").
parallel::MeshLayout Layout(int ranks) {
  parallel::MeshConfig config;
  if (ranks > 1) {
    parallel::MeshConfig::Dimension* dim = config.add_dims();
    dim->set_name("dp");
    dim->set_size(ranks);
  }
  return parallel::MeshLayout::Create(config, ranks).value();
}

CheckpointConfig Config(const std::string& dir, bool resume = false) {
  CheckpointConfig config;
  config.set_dir(dir);
  config.set_every(3);
  config.set_resume(resume);
  return config;
}

RunInfo TestRun(int64_t steps = 8) {
  RunInfo run;
  run.config_field = "run.checkpoint";
  run.steps = steps;
  run.steps_field = "run.steps";
  run.position_per_step = 2;
  run.fingerprint = {{"run.model", "tiny"}, {"run.batch", "4"}};
  return run;
}

// A rank's state on `ranks` ranks: its rows of a weight of 4 rows sharded as FSDP does (2
// rows to a rank, the last ranks' padded or empty), a moment every rank holds whole (rank 0
// saves it), and a counter.
RankState State(int rank, int ranks) {
  const at::Tensor weight = torch::arange(12, at::kFloat).reshape({4, 3});
  const int64_t rows = (4 + ranks - 1) / ranks;
  const int64_t first = std::min<int64_t>(4, rank * rows);
  const int64_t count = std::min<int64_t>(4, first + rows) - first;
  at::Tensor shard = torch::zeros({rows, 3});
  shard.narrow(0, 0, count).copy_(weight.narrow(0, first, count));
  RankState state;
  state.tensors["w/a"] = {shard, parallel::TensorSlice::Whole({4, 3}).Narrow(0, first, count)};
  state.tensors["m/a"] = Whole(torch::full({4}, 7, at::kLong));
  state.tensors["m/a"].slice.replica = rank;
  state.metadata["counter"] = "10";
  return state;
}
RankState State(int rank) { return State(rank, 2); }

// Saves State(rank) of every one of `ranks` ranks after `step` into `dir`.
void SaveOnRanks(const std::string& dir, int ranks, int64_t step,
                 const CheckpointConfig& config = {}) {
  CheckpointConfig with_dir = config;
  with_dir.set_dir(dir);
  parallel::testing::RunOnRingMesh(Layout(ranks), [&](int rank, parallel::DeviceMesh& mesh) {
    absl::StatusOr<Checkpointer> checkpointer = Checkpointer::Open(with_dir, dir, TestRun(), mesh);
    ASSERT_THAT(checkpointer, IsOk());
    ASSERT_THAT(checkpointer->Save(step, /*position=*/2 * step, State(rank, ranks)), IsOk());
  });
}

// What Open and then Restore (expecting State(rank)'s tensors) return on each of `ranks`
// ranks resuming from `dir` with `run`.
std::vector<absl::Status> ResumeStatuses(const std::string& dir, int ranks,
                                         RunInfo run = TestRun()) {
  std::vector<absl::Status> statuses(ranks);
  parallel::testing::RunOnRingMesh(Layout(ranks), [&](int rank, parallel::DeviceMesh& mesh) {
    absl::StatusOr<Checkpointer> checkpointer =
        Checkpointer::Open(Config(dir, /*resume=*/true), dir, run, mesh);
    if (!checkpointer.ok()) {
      statuses[rank] = checkpointer.status();
      return;
    }
    statuses[rank] = checkpointer->Restore(State(rank, ranks).tensors,
                                           [](RankState) { return absl::OkStatus(); });
  });
  return statuses;
}

// Saved on 2 ranks, resumed on 1, 2 and 3: every rank gets back the rows it holds (zero
// padding after them), the moment and the metadata.
TEST(CheckpointerTest, EveryRankOfAnyWorldSizeGetsBackItsPartsMetadataAndThePosition) {
  const std::string dir = FreshTestDir("round_trip");
  SaveOnRanks(dir, 2, 3);
  EXPECT_THAT(FolderEntries(dir), ElementsAre(".lock", "step-00000003"));
  EXPECT_THAT(FolderEntries(dir + "/step-00000003"),
              ElementsAre("checkpoint.json", "rank-00000-of-00002.safetensors",
                          "rank-00001-of-00002.safetensors"));
  for (int ranks : {2, 1, 3}) {
    SCOPED_TRACE(absl::StrCat(ranks, " ranks"));
    parallel::testing::RunOnRingMesh(Layout(ranks), [&](int rank, parallel::DeviceMesh& mesh) {
      absl::StatusOr<Checkpointer> checkpointer =
          Checkpointer::Open(Config(dir, /*resume=*/true), dir, TestRun(), mesh);
      ASSERT_THAT(checkpointer, IsOk());
      EXPECT_EQ(checkpointer->resume_step(), 3);
      EXPECT_EQ(checkpointer->resume_position(), 6);
      RankState restored;
      const RankState want = State(rank, ranks);
      ASSERT_THAT(checkpointer->Restore(want.tensors,
                                        [&](RankState saved) {
                                          restored = std::move(saved);
                                          return absl::OkStatus();
                                        }),
                  IsOk());
      EXPECT_EQ(restored.metadata, want.metadata);
      ASSERT_EQ(restored.tensors.size(), want.tensors.size());
      for (const auto& [name, tensor] : want.tensors) {
        EXPECT_TRUE(restored.tensors.at(name).tensor.equal(tensor.tensor)) << name;
      }
    });
  }
}

// What TheFilesHoldTheManifestMetadataAndChecksumsOfTheFormat saves: the manifest, and rank
// 1's description of its one slice.
constexpr char kExpectedManifest[] = R"json({
  "data_position": 6,
  "fingerprint": {
    "run.model": "tiny"
  },
  "format": "plait-checkpoint-2",
  "layout": "fsdp over dp",
  "mesh": "dp=2",
  "metadata": {
    "optimizer_step": "5"
  },
  "step": 3,
  "tensors": {
    "m/a": {
      "dtype": "I64",
      "shape": [
        4
      ],
      "slices": [
        {
          "checksum": "41e9706682a7c661",
          "file": "rank-00000-of-00002.safetensors",
          "lengths": [
            4
          ],
          "offsets": [
            0
          ]
        }
      ]
    },
    "w/a": {
      "dtype": "F32",
      "shape": [
        4,
        3
      ],
      "slices": [
        {
          "checksum": "0cadca75128f2fb7",
          "file": "rank-00000-of-00002.safetensors",
          "lengths": [
            2,
            3
          ],
          "offsets": [
            0,
            0
          ]
        },
        {
          "checksum": "c50b7b0451ef2fb7",
          "file": "rank-00001-of-00002.safetensors",
          "lengths": [
            2,
            3
          ],
          "offsets": [
            2,
            0
          ]
        }
      ]
    }
  },
  "world_size": 2
}
)json";
constexpr char kExpectedSlicesOfRank1[] =
    R"json({"w/a":{"checksum":"c50b7b0451ef2fb7","offsets":[2,0],"shape":[4,3]}})json";

// The bytes that make the format: names, manifest keys, metadata keys and checksums. Rank 1
// saves its rows only: the moment is rank 0's, and padding is never saved.
TEST(CheckpointerTest, TheFilesHoldTheManifestMetadataAndChecksumsOfTheFormat) {
  const std::string dir = FreshTestDir("format");
  parallel::testing::RunOnRingMesh(Layout(2), [&](int rank, parallel::DeviceMesh& mesh) {
    RunInfo run = TestRun();
    run.fingerprint = {{"run.model", "tiny"}};
    run.layout = "fsdp over dp";
    absl::StatusOr<Checkpointer> checkpointer = Checkpointer::Open(Config(dir), dir, run, mesh);
    ASSERT_THAT(checkpointer, IsOk());
    RankState state = State(rank, 2);
    state.metadata = {{"optimizer_step", "5"}};
    ASSERT_THAT(checkpointer->Save(3, /*position=*/6, state), IsOk());
  });
  EXPECT_EQ(ReadText(dir + "/step-00000003/" + kManifest), kExpectedManifest);
  auto file = models::SafetensorsFile::Open(dir + "/step-00000003/" + RankFileName(1, 2));
  ASSERT_THAT(file, IsOk());
  EXPECT_THAT((*file)->entries(), ElementsAre(::testing::Key("w/a")));
  EXPECT_EQ((*file)->entries().at("w/a").shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ((*file)->metadata(),
            (std::map<std::string, std::string>{{"format", "plait-checkpoint-2"},
                                                {"rank", "1"},
                                                {"slices", kExpectedSlicesOfRank1},
                                                {"step", "3"},
                                                {"world_size", "2"}}));
}

// A slice that its local tensor cannot hold is refused before anything is written.
TEST(CheckpointerTest, ASliceThatDoesNotFitItsTensorIsRefused) {
  const std::string dir = FreshTestDir("misfit_slice");
  parallel::testing::RunOnRingMesh(Layout(1), [&](int, parallel::DeviceMesh& mesh) {
    absl::StatusOr<Checkpointer> checkpointer =
        Checkpointer::Open(Config(dir), dir, TestRun(), mesh);
    ASSERT_THAT(checkpointer, IsOk());
    RankState state = State(0, 1);
    state.tensors["w/a"].slice = parallel::TensorSlice::Whole({8, 3});
    EXPECT_THAT(checkpointer->Save(1, 0, state),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("w/a: the slice [0:8, 0:3] of [8, 3] does not fit its local "
                                   "tensor of shape [4, 3]")));
  });
  // Nothing of the failed save is left, not even its temporary folder.
  EXPECT_THAT(FolderEntries(dir), ElementsAre(".lock"));
}

TEST(CheckpointerTest, EveryMultipleOfEveryAndTheLastStepAreDue) {
  parallel::testing::RunOnRingMesh(Layout(1), [&](int, parallel::DeviceMesh& mesh) {
    const std::string dir = FreshTestDir("due");
    {
      Checkpointer every_three = Checkpointer::Open(Config(dir), dir, TestRun(8), mesh).value();
      std::vector<int64_t> due;
      for (int64_t step = 1; step <= 8; ++step) {
        if (every_three.IsDue(step)) due.push_back(step);
      }
      EXPECT_THAT(due, ElementsAre(3, 6, 8));
    }
    CheckpointConfig last_only = Config(dir);
    last_only.set_every(0);
    Checkpointer last = Checkpointer::Open(last_only, dir, TestRun(8), mesh).value();
    EXPECT_FALSE(last.IsDue(3));
    EXPECT_TRUE(last.IsDue(8));

    Checkpointer off = Checkpointer::Open(CheckpointConfig(), "", TestRun(8), mesh).value();
    EXPECT_FALSE(off.IsDue(3));
    EXPECT_FALSE(off.IsDue(8));
  });
}

// A second run on a folder in use fails at its start, naming the run that holds it; the
// folder is free again once that run ends.
TEST(CheckpointerTest, AFolderInUseByAnotherRunIsRefused) {
  const std::string dir = FreshTestDir("in_use");
  parallel::testing::RunOnRingMesh(Layout(1), [&](int, parallel::DeviceMesh& mesh) {
    std::optional<Checkpointer> first =
        Checkpointer::Open(Config(dir), dir, TestRun(), mesh).value();
    EXPECT_THAT(Checkpointer::Open(Config(dir), dir, TestRun(), mesh),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         AllOf(HasSubstr("run.checkpoint.dir: \"" + dir +
                                         "\" is in use by another run (pid " +
                                         std::to_string(getpid()) + " on "),
                               HasSubstr("choose another dir"))));
    first.reset();
    EXPECT_THAT(Checkpointer::Open(Config(dir), dir, TestRun(), mesh), IsOk());
  });
}

TEST(CheckpointerTest, KeepsTheNewestAndRemovesAnInterruptedSave) {
  const std::string dir = FreshTestDir("keep_last");
  CheckpointConfig config;
  config.set_keep_last(2);
  config.set_resume(true);  // each save is a run resumed from the one before
  for (int64_t step : {2, 4, 6}) SaveOnRanks(dir, 1, step, config);
  EXPECT_THAT(FolderEntries(dir), ElementsAre(".lock", "step-00000004", "step-00000006"));

  // A run killed while saving step 8 left its temporary folder with part of a file.
  fs::create_directories(dir + "/.tmp-step-00000008");
  std::ofstream(dir + "/.tmp-step-00000008/" + RankFileName(0, 1)) << "partial";
  SaveOnRanks(dir, 1, 8, config);
  EXPECT_THAT(FolderEntries(dir), ElementsAre(".lock", "step-00000006", "step-00000008"));
}

TEST(CheckpointerTest, ResumingWithoutACheckpointStartsFresh) {
  const std::string dir = FreshTestDir("nothing_yet");
  parallel::testing::RunOnRingMesh(Layout(1), [&](int, parallel::DeviceMesh& mesh) {
    absl::StatusOr<Checkpointer> checkpointer =
        Checkpointer::Open(Config(dir, /*resume=*/true), dir, TestRun(), mesh);
    ASSERT_THAT(checkpointer, IsOk());
    EXPECT_EQ(checkpointer->resume_step(), 0);
    EXPECT_EQ(checkpointer->resume_position(), 0);
    bool loaded = false;
    EXPECT_THAT(checkpointer->Restore({},
                                      [&](RankState) {
                                        loaded = true;
                                        return absl::OkStatus();
                                      }),
                IsOk());
    EXPECT_FALSE(loaded);
  });
}

TEST(CheckpointerTest, AFreshRunNeverOverwritesCheckpoints) {
  const std::string dir = FreshTestDir("fresh");
  fs::create_directories(dir + "/step-00000003");
  parallel::testing::RunOnRingMesh(Layout(1), [&](int, parallel::DeviceMesh& mesh) {
    EXPECT_THAT(
        Checkpointer::Open(Config(dir), dir, TestRun(), mesh),
        StatusIs(absl::StatusCode::kFailedPrecondition,
                 "run.checkpoint.dir: \"" + dir + "\" already holds checkpoints (newest " + dir +
                     "/step-00000003); set run.checkpoint.resume to continue from it, "
                     "or choose another dir"));
  });
}

TEST(CheckpointErrorsTest, AChangedFingerprintNamesTheFieldAndBothValues) {
  const std::string dir = FreshTestDir("fingerprint");
  SaveOnRanks(dir, 1, 1);
  RunInfo run = TestRun();
  run.fingerprint["run.batch"] = "8";
  run.fingerprint["run.data"] = "tokens";
  EXPECT_THAT(ResumeStatuses(dir, 1, run)[0],
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(dir + "/step-00000001/checkpoint.json: cannot resume"),
                             HasSubstr("fingerprint.run.batch: \"4\" in the checkpoint, \"8\" in "
                                       "this plan; a resume must not change it"),
                             HasSubstr("fingerprint.run.data: \"(none)\" in the checkpoint, "
                                       "\"tokens\" in this plan"),
                             Not(HasSubstr("run.model")))));
}

TEST(CheckpointErrorsTest, ACheckpointPastTheRunsStepsIsRefused) {
  const std::string dir = FreshTestDir("past_steps");
  SaveOnRanks(dir, 1, 5);
  EXPECT_THAT(ResumeStatuses(dir, 1, TestRun(/*steps=*/4))[0],
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("step: 5 in the checkpoint, past run.steps (4)")));
  EXPECT_THAT(ResumeStatuses(dir, 1, TestRun(/*steps=*/5))[0], IsOk());
}

// A resume trusts the manifest's position only where it is what the step implies.
TEST(CheckpointErrorsTest, AnImpossiblePositionOrStepIsRefused) {
  const std::string dir = FreshTestDir("position");
  SaveOnRanks(dir, 1, 3);
  const std::string manifest = dir + "/step-00000003/" + kManifest;
  const std::string text = ReadText(manifest);
  std::ofstream(manifest) << absl::StrReplaceAll(
      text, {{"\"data_position\": 6", "\"data_position\": -4"}});
  EXPECT_THAT(ResumeStatuses(dir, 1)[0],
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("data_position: -4 in the file, 6 expected after step 3 (2 per "
                                 "step)")));
  std::ofstream(manifest) << text;
  EXPECT_THAT(ResumeStatuses(dir, 1)[0], IsOk());
}

// Without position_per_step the position goes unchecked against the step, but it is a count.
TEST(CheckpointErrorsTest, ANegativePositionIsRefusedWhereThePositionIsUnchecked) {
  const std::string dir = FreshTestDir("negative_position");
  SaveOnRanks(dir, 1, 3);
  const std::string manifest = dir + "/step-00000003/" + kManifest;
  const std::string text = ReadText(manifest);
  std::ofstream(manifest) << absl::StrReplaceAll(
      text, {{"\"data_position\": 6", "\"data_position\": -4"}});
  RunInfo run = TestRun();
  run.position_per_step = 0;
  EXPECT_THAT(ResumeStatuses(dir, 1, run)[0],
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("data_position: -4 in the file; must be >= 0")));
  std::ofstream(manifest) << absl::StrReplaceAll(
      text, {{"\"step\": 3", "\"step\": 18446744073709551615"}});
  EXPECT_THAT(ResumeStatuses(dir, 1, run)[0],
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("checkpoint.json: step: 18446744073709551615 is past 2^63 - 1")));
}

// A manifest value of another type, or nested deeper than any real one, is named by its
// type: a mesh that was not a string threw out of Open, and a format or fingerprint nested
// 100000 deep overflowed the stack when written out or copied.
TEST(CheckpointErrorsTest, ManifestValuesOfAnotherTypeOrNestedDeepNameTheField) {
  const std::string dir = FreshTestDir("manifest_types");
  SaveOnRanks(dir, 1, 3);
  const std::string manifest = dir + "/step-00000003/" + kManifest;
  const nlohmann::json valid = nlohmann::json::parse(ReadText(manifest));
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  // The manifest with `field` set to `value`, given as JSON text.
  auto resume_with = [&](const std::string& field, const std::string& value) {
    nlohmann::json json = valid;
    json[field] = "@value@";
    std::ofstream(manifest) << absl::StrReplaceAll(json.dump(2), {{"\"@value@\"", value}});
    return ResumeStatuses(dir, 1)[0];
  };
  EXPECT_THAT(
      resume_with("mesh", "1"),
      StatusIs(absl::StatusCode::kDataLoss, HasSubstr("checkpoint.json: mesh: expected a string, "
                                                      "got 1; the file is corrupt")));
  EXPECT_THAT(
      resume_with("mesh", deep),
      StatusIs(absl::StatusCode::kDataLoss, HasSubstr("mesh: expected a string, got an array")));
  EXPECT_THAT(resume_with("tensors", deep),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("checkpoint.json: tensors: missing or not an object")));
  EXPECT_THAT(resume_with("fingerprint", deep),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("fingerprint.run.batch: \"(none)\" in the checkpoint")));
  EXPECT_THAT(resume_with("format", deep),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("checkpoint.json: format: an array in the file")));
}

// Rewrites the rank file `path` with its tensors and metadata passed through `edit`.
void RewriteRankFile(const std::string& path,
                     const std::function<void(std::map<std::string, at::Tensor>&)>& edit) {
  auto file = models::SafetensorsFile::Open(path);
  ASSERT_THAT(file, IsOk());
  const std::map<std::string, std::string> metadata = (*file)->metadata();
  std::map<std::string, at::Tensor> tensors;
  for (const auto& [name, entry] : (*file)->entries()) tensors[name] = *(*file)->Read(name);
  file->reset();
  edit(tensors);
  ASSERT_THAT(models::WriteSafetensors(path, {tensors.begin(), tensors.end()}, metadata), IsOk());
}

// Rewrites the manifest `path` passed through `edit`.
void RewriteManifest(const std::string& path, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json manifest = nlohmann::json::parse(ReadText(path));
  edit(manifest);
  std::ofstream(path) << manifest.dump(2);
}

TEST(CheckpointErrorsTest, MissingExtraAndMisfitTensorsNameTheManifestTheTensorAndWhatItIs) {
  const std::string dir = FreshTestDir("tensors");
  SaveOnRanks(dir, 1, 1);
  const std::string manifest = dir + "/step-00000001/" + kManifest;
  const std::string valid = ReadText(manifest);
  RewriteManifest(manifest, [](nlohmann::json& json) {
    nlohmann::json& tensors = json["tensors"];
    tensors.erase("w/a");
    const nlohmann::json empty = {
        {"dtype", "F32"}, {"shape", {0}}, {"slices", nlohmann::json::array()}};
    tensors["w/bogus"] = empty;
    tensors["bogus"] = empty;
    tensors["m/a"]["shape"] = {3};
    tensors["m/a"]["slices"][0]["lengths"] = {3};
  });
  EXPECT_THAT(ResumeStatuses(dir, 1)[0],
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(manifest + ": does not fit this rank's tensors:"),
                             HasSubstr("w/a: missing; this rank has it with shape [4, 3]"),
                             HasSubstr("w/bogus: in the checkpoint, but no rank has such "
                                       "tensor"),
                             HasSubstr("m/a: shape [3] in the checkpoint, [4] here"))));

  RunInfo run = TestRun();
  run.contents = "weights and moments";
  run.kind_by_prefix = {{"", "moment"}, {"w/", "weight"}};
  EXPECT_THAT(
      ResumeStatuses(dir, 1, run)[0],
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr(manifest + ": does not fit this rank's weights and moments:"),
                     HasSubstr("w/bogus: in the checkpoint, but no rank has such weight"),
                     HasSubstr("bogus: in the checkpoint, but no rank has such moment"))));

  std::ofstream(manifest) << valid;
  RewriteManifest(manifest, [](nlohmann::json& json) { json["tensors"]["w/a"]["dtype"] = "I64"; });
  EXPECT_THAT(ResumeStatuses(dir, 1)[0],
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("w/a: dtype Long in the checkpoint, Float here")));

  // Slices that do not tile their tensor: a manifest no save writes.
  std::ofstream(manifest) << valid;
  RewriteManifest(manifest, [](nlohmann::json& json) {
    json["tensors"]["w/a"]["slices"][0]["lengths"] = {2, 3};
  });
  EXPECT_THAT(ResumeStatuses(dir, 1)[0],
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr(manifest + ": tensors.w/a.slices: they hold 6 of the tensor's "
                                            "12 elements; the file is corrupt")));
}

TEST(CheckpointErrorsTest, TruncatedOrCorruptRankFilesNameTheFile) {
  const std::string dir = FreshTestDir("corrupt");
  SaveOnRanks(dir, 1, 1);
  const std::string path = dir + "/step-00000001/" + RankFileName(0, 1);
  const std::string manifest = dir + "/step-00000001/" + kManifest;
  const std::string backup = path + ".good";
  fs::copy_file(path, backup);
  const auto size = fs::file_size(path);

  fs::resize_file(path, size / 2);
  EXPECT_THAT(ResumeStatuses(dir, 1)[0],
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(path)));

  // One flipped byte in the data section, which the header cannot notice.
  fs::copy_file(backup, path, fs::copy_options::overwrite_existing);
  {
    std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(size - 5);
    file.put('\x7f');
  }
  EXPECT_THAT(ResumeStatuses(dir, 1)[0],
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr(manifest + ": tensors.w/a.slices[0].checksum: "),
                             HasSubstr("computed from " + path + "; the checkpoint is corrupt"))));

  // A damaged header.
  fs::copy_file(backup, path, fs::copy_options::overwrite_existing);
  {
    std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(8);
    file.write("garbage!", 8);
  }
  EXPECT_THAT(ResumeStatuses(dir, 1)[0],
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(path)));

  // A file whose tensor is not the slice the manifest lists.
  fs::copy_file(backup, path, fs::copy_options::overwrite_existing);
  RewriteRankFile(path, [](std::map<std::string, at::Tensor>& tensors) {
    tensors["w/a"] = torch::zeros({3, 4});
  });
  EXPECT_THAT(ResumeStatuses(dir, 1)[0],
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr(path + " holds it as Float [3, 4], the manifest says Float [4, "
                                        "3]; the checkpoint is corrupt")));

  std::ofstream(manifest) << "{";
  EXPECT_THAT(ResumeStatuses(dir, 1)[0],
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr(manifest + ": not a JSON object; the file is corrupt")));
}

// Rank 1 reads its rows from rank 1's file of the checkpoint, which is gone.
TEST(CheckpointErrorsTest, AMissingRankFileFailsEveryRank) {
  const std::string dir = FreshTestDir("missing_rank");
  SaveOnRanks(dir, 2, 1);
  const std::string missing = dir + "/step-00000001/" + RankFileName(1, 2);
  ASSERT_TRUE(fs::remove(missing));
  const std::vector<absl::Status> statuses = ResumeStatuses(dir, 2);
  EXPECT_THAT(statuses[1], StatusIs(absl::StatusCode::kNotFound,
                                    AllOf(HasSubstr("checkpoint.json: tensors.w/a.slices[1].file"),
                                          HasSubstr(missing))));
  EXPECT_THAT(statuses[0],
              StatusIs(absl::StatusCode::kAborted,
                       HasSubstr("resuming from " + dir + "/step-00000001: rank 1 failed")));
}

// A checkpoint saved by a run that had diverged: rank 1's rows hold a NaN. Rank 1, which
// reads them, names its file and the tensor; rank 0 stops too, naming rank 1.
TEST(CheckpointErrorsTest, ANonFiniteValueNamesTheFileAndTensorAndFailsEveryRank) {
  const std::string dir = FreshTestDir("non_finite");
  parallel::testing::RunOnRingMesh(Layout(2), [&](int rank, parallel::DeviceMesh& mesh) {
    absl::StatusOr<Checkpointer> checkpointer =
        Checkpointer::Open(Config(dir), dir, TestRun(), mesh);
    ASSERT_THAT(checkpointer, IsOk());
    RankState state = State(rank);
    if (rank == 1) state.tensors["w/a"].tensor[1][2] = std::numeric_limits<float>::quiet_NaN();
    ASSERT_THAT(checkpointer->Save(1, /*position=*/2, state), IsOk());
  });
  const std::vector<absl::Status> statuses = ResumeStatuses(dir, 2);
  EXPECT_THAT(statuses[1],
              StatusIs(absl::StatusCode::kInvalidArgument,
                       dir + "/step-00000001/" + RankFileName(1, 2) + ": w/a: holds NaN"));
  EXPECT_THAT(statuses[0],
              StatusIs(absl::StatusCode::kAborted,
                       HasSubstr("resuming from " + dir + "/step-00000001: rank 1 failed")));
}

TEST(CheckpointErrorsTest, ALoadErrorNamesTheCheckpointAndFailsEveryRank) {
  const std::string dir = FreshTestDir("load_error");
  SaveOnRanks(dir, 2, 1);
  std::vector<absl::Status> statuses(2);
  parallel::testing::RunOnRingMesh(Layout(2), [&](int rank, parallel::DeviceMesh& mesh) {
    absl::StatusOr<Checkpointer> checkpointer =
        Checkpointer::Open(Config(dir, /*resume=*/true), dir, TestRun(), mesh);
    ASSERT_THAT(checkpointer, IsOk());
    statuses[rank] = checkpointer->Restore(State(rank).tensors, [&](RankState) {
      return rank == 1 ? absl::DataLossError("counter: not what this rank counts")
                       : absl::OkStatus();
    });
  });
  EXPECT_THAT(statuses[1], StatusIs(absl::StatusCode::kDataLoss,
                                    dir + "/step-00000001: counter: not what this rank counts"));
  EXPECT_THAT(statuses[0],
              StatusIs(absl::StatusCode::kAborted,
                       HasSubstr("resuming from " + dir + "/step-00000001: rank 1 failed")));
}

}  // namespace
}  // namespace plait::checkpoint
