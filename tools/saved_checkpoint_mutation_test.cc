// Seeded mutations of a training run's checkpoint (a tiny Llama, 2 steps on 2 FSDP ranks), each
// checked three ways: tools/checkpoint's verify and export-hf (VerifySavedCheckpoint,
// ExportSavedCheckpoint) and a resume on one rank (RunCheckpoints::Open, then Restore). The
// manifest's bytes, numbers, lines, JSON values, step, data position, fingerprint and metadata
// are mutated, and the rank files' bytes, headers and slice data. Every outcome must be:
//   - verify: the same tensors (the mutation was harmless), or an error naming the manifest
//     and its field, or the rank file;
//   - export-hf: the same parameters written, or an error as verify's and the output folder as
//     it was (missing, or an earlier export byte for byte);
//   - a resume refuses whatever verify refuses, and verify whatever a resume refuses without
//     the plan (SavedStepProblems' lines appear in both errors).
// A crash, an abort, an escaping exception or a hang fails the test, naming the case.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "base/file.h"
#include "base/status.h"
#include "base/status_matchers.h"
#include "base/test_paths.h"
#include "base/testing_mutations.h"
#include "checkpoint/checkpointer.h"
#include "checkpoint/manifest.h"
#include "data/data_config.h"
#include "data/data_loader.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/safetensors.h"
#include "nlohmann/json.hpp"
#include "parallel/device_mesh.h"
#include "plan/plan.h"
#include "plan/testing_resolved.h"
#include "prepared/prepared_model.h"
#include "tools/saved_checkpoint.h"
#include "trainer/run_checkpoints.h"
#include "trainer/testing_ranks.h"

namespace plait::tools {
namespace {

namespace fs = std::filesystem;
using ::plait::base::testing::FreshTestDir;
using ::plait::base::testing::IsOk;
using ::plait::base::testing::MutationCases;
using ::plait::base::testing::Mutator;
using ::plait::base::testing::WriteCaseFile;
using ::plait::prepared::PreparedModel;
using ::plait::prepared::Role;
using ::plait::trainer::kGlobalBatchField;
using ::plait::trainer::kModelField;
using ::plait::trainer::kParameterPrefix;
using ::plait::trainer::RunCheckpoints;
using ::plait::trainer::testing::ConfigOf;
using ::plait::trainer::testing::TrainOnRanks;
using ::plait::trainer::testing::WithMesh;
using Json = nlohmann::json;

constexpr uint32_t kSeed = 20240613;
constexpr int64_t kStep = 2;
constexpr int64_t kGlobalBatch = 4;
// Deep enough to overflow the stack of code that walks the manifest recursively.
constexpr int kDeepNesting = 100000;

// The saving run: a tiny Llama (a few thousand parameters, so a case reads and writes
// kilobytes), 2 steps of 4 sequences on 2 FSDP ranks, saved after step 2.
constexpr char kPlan[] = R"pb(
  model {
    config {
      model_type: "llama"
      hidden_size: 16
      intermediate_size: 32
      num_hidden_layers: 2
      num_attention_heads: 2
      num_key_value_heads: 1
      rms_norm_eps: 1e-5
      rope_theta: 10000
      vocab_size: 64
      max_position_embeddings: 32
    }
    init { seed: 1 std: 0.05 }
  }
  mesh { dims { name: "dp" size: 2 } }
  prepare { fsdp { mesh_dim: "dp" } }
  optimizer {
    adamw { beta2: 0.95 }
    weight_decay: 0.0
  }
  schedule {
    lr: 3e-3
    constant {}
  }
  data { synthetic { seed: 7 } }
  training { steps: 2 micro_batch: 2 seq_len: 16 global_batch: 4 eval_every: 0 eval_batches: 1 }
)pb";

std::map<std::string, std::string> FolderBytes(const std::string& dir) {
  std::map<std::string, std::string> files;
  std::error_code error;
  if (!fs::exists(dir, error)) return files;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file()) files[entry.path()] = base::ReadFile(entry.path()).value_or("");
  }
  return files;
}

// A safetensors file's 8-byte little-endian header length.
std::string LengthPrefix(uint64_t length) {
  std::string bytes;
  for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>((length >> (8 * i)) & 0xff));
  return bytes;
}

// A safetensors file's header text and the data after it.
std::pair<std::string, std::string> SplitSafetensors(const std::string& file) {
  uint64_t length = 0;
  for (int i = 0; i < 8; ++i) length |= uint64_t{static_cast<unsigned char>(file[i])} << (8 * i);
  return {file.substr(8, length), file.substr(8 + length)};
}

// Every tensor of the checkpoint `folder` as a whole, by the manifest there.
absl::StatusOr<std::map<std::string, at::Tensor>> ReadTensors(const std::string& folder) {
  PLAIT_ASSIGN_OR_RETURN(const checkpoint::Manifest manifest,
                         checkpoint::ReadManifest(folder + "/" + checkpoint::kManifest));
  checkpoint::SliceReader reader(folder, manifest);
  std::map<std::string, at::Tensor> tensors;
  for (const auto& [name, stored] : manifest.tensors) {
    PLAIT_ASSIGN_OR_RETURN(tensors[name], reader.ReadWhole(name));
  }
  return tensors;
}

// Whether `have` holds the tensors of `want`, and no others, with the same dtypes and values.
bool SameTensors(const std::map<std::string, at::Tensor>& have,
                 const std::map<std::string, at::Tensor>& want) {
  if (have.size() != want.size()) return false;
  for (const auto& [name, tensor] : want) {
    const auto it = have.find(name);
    if (it == have.end() || it->second.scalar_type() != tensor.scalar_type() ||
        !it->second.equal(tensor)) {
      return false;
    }
  }
  return true;
}

// The lines of a resume's error that list its problems ("  step: 3 in the file, ...").
std::vector<std::string> ProblemLines(absl::string_view message) {
  std::vector<std::string> lines;
  for (absl::string_view line : absl::StrSplit(message, '\n')) {
    if (absl::ConsumePrefix(&line, "  ")) lines.emplace_back(line);
  }
  return lines;
}

// Whether a resume refused for what only the run's plan shows: a fingerprint that is not the
// plan's, a step past its steps, the optimizer state against its optimizer.
bool RefusedForThePlanOnly(absl::string_view message) {
  const std::vector<std::string> lines = ProblemLines(message);
  // The optimizer's own check of the state it loads (Optimizer::LoadState) is one line.
  if (lines.empty()) return absl::StrContains(message, "optimizer state");
  for (const std::string& line : lines) {
    if (!absl::StartsWith(line, "fingerprint.") && !absl::StartsWith(line, "optim/") &&
        !absl::StrContains(line, "past plan.training.steps")) {
      return false;
    }
  }
  return true;
}

TEST(SavedCheckpointMutationTest, VerifyExportAndResumeAgreeOnEveryMutation) {
  const std::string dir = FreshTestDir("mutations");
  const std::string checkpoints = dir + "/ckpt";
  const std::string folder = absl::StrCat(checkpoints, "/", checkpoint::CheckpointName(kStep));
  const std::string manifest_path = absl::StrCat(folder, "/", checkpoint::kManifest);
  absl::StatusOr<plan::Plan> saving = plan::ParsePlan(kPlan, "kPlan");
  ASSERT_THAT(saving, IsOk());
  saving->mutable_training()->mutable_checkpoint()->set_dir(checkpoints);
  TrainOnRanks(*saving, 2);
  ASSERT_FALSE(::testing::Test::HasFailure());

  // The resuming run: the same plan on one rank, without the mesh and preparation (a run
  // resumes on any layout).
  plan::Plan resuming = *saving;
  resuming.clear_mesh();
  resuming.clear_prepare();
  resuming.mutable_training()->set_grad_accumulation(2);
  resuming.mutable_training()->mutable_checkpoint()->set_resume(true);
  const plan::ResolvedPlan resolved = plan::testing::Resolved(resuming, 1);
  ASSERT_FALSE(::testing::Test::HasFailure());

  const std::string valid_manifest = base::ReadFile(manifest_path).value();
  const Json manifest_json = Json::parse(valid_manifest);
  std::vector<std::string> rank_files;
  std::map<std::string, std::string> valid_rank_bytes;
  for (int rank = 0; rank < 2; ++rank) {
    rank_files.push_back(absl::StrCat(folder, "/", checkpoint::RankFileName(rank, 2)));
    valid_rank_bytes[rank_files.back()] = base::ReadFile(rank_files.back()).value();
  }
  const absl::StatusOr<std::map<std::string, at::Tensor>> want = ReadTensors(folder);
  ASSERT_THAT(want, IsOk());
  std::map<std::string, at::Tensor> want_parameters;
  for (const auto& [name, tensor] : *want) {
    absl::string_view hf_name = name;
    if (absl::ConsumePrefix(&hf_name, kParameterPrefix)) {
      want_parameters[std::string(hf_name)] = tensor;
    }
  }
  // An earlier export, which a refused export must leave byte for byte.
  const std::string earlier = dir + "/earlier_export";
  {
    absl::StatusOr<checkpoint::Manifest> manifest = checkpoint::ReadManifest(manifest_path);
    ASSERT_THAT(manifest, IsOk());
    ASSERT_THAT(VerifySavedCheckpoint(folder, *manifest), IsOk());
    ASSERT_THAT(ExportSavedCheckpoint(folder, *manifest, earlier, "OUT_DIR"), IsOk());
  }
  const std::map<std::string, std::string> earlier_bytes = FolderBytes(earlier);
  const std::string valid_config_json = base::ReadFile(earlier + "/config.json").value();
  const std::string saved_model = manifest_json["fingerprint"][kModelField];

  WithMesh(resuming, 1, [&](int, const parallel::DeviceMesh& mesh) {
    absl::StatusOr<std::unique_ptr<PreparedModel>> prepared =
        PreparedModel::Prepare(resuming.model(), ConfigOf(resuming.model()), "", resuming.prepare(),
                               mesh, Role::kTrained, "plan");
    ASSERT_THAT(prepared, IsOk());
    absl::StatusOr<std::unique_ptr<optim::Optimizer>> optimizer =
        BuildOptimizer(**prepared, resuming.optimizer());
    ASSERT_THAT(optimizer, IsOk());
    absl::StatusOr<data::DataLoader> loader = data::DataLoader::Create(
        data::ResolvedDataConfig(resuming.data()), data::Split::kTrain, resolved.model.vocab_size(),
        resuming.training().micro_batch(), resuming.training().seq_len(), /*dp_rank=*/0,
        /*dp_size=*/1, "plan.data");
    ASSERT_THAT(loader, IsOk());

    Mutator mutator(kSeed);
    auto extreme = [&] { return mutator.Pick(base::testing::ExtremeIntegers()); };
    // The manifest with `field` (a JSON pointer) set to `value`, removed when it is discarded.
    auto set_manifest = [&](const std::string& field, const Json& value, std::string& text) {
      Json json = manifest_json;
      const Json::json_pointer pointer(field);
      if (value.is_discarded()) {
        json[pointer.parent_pointer()].erase(pointer.back());
      } else {
        json[pointer] = value;
      }
      // Bytes that are not UTF-8 (a byte edit of a string) written as U+FFFD.
      text = json.dump(2, ' ', false, Json::error_handler_t::replace);
      return absl::StrCat(field,
                          value.is_discarded()
                              ? " removed"
                              : " = " + value.dump(-1, ' ', false, Json::error_handler_t::replace));
    };

    // A mutation of the checkpoint: it edits the manifest's text or one rank file's bytes
    // (`files`, by path, as valid when the case starts) and says what it did.
    struct Kind {
      const char* name;
      int count;
      std::function<std::string(std::map<std::string, std::string>& files)> mutate;
    };
    auto manifest_edit = [&](std::function<std::string(std::string&)> edit) {
      return [&, edit](std::map<std::string, std::string>& files) {
        return edit(files[manifest_path]);
      };
    };
    auto rank_file_edit = [&](std::function<std::string(std::string&)> edit) {
      return [&, edit](std::map<std::string, std::string>& files) {
        const std::string& file = mutator.Pick(rank_files);
        return absl::StrCat(fs::path(file).filename().string(), ": ", edit(files[file]));
      };
    };
    const std::vector<Kind> kinds = {
        {"manifest bytes", 60,
         manifest_edit([&](std::string& text) { return mutator.MutateBytes(text); })},
        {"manifest number", 40,
         manifest_edit([&](std::string& text) { return mutator.ReplaceNumber(text); })},
        {"manifest line", 30,
         manifest_edit([&](std::string& text) { return mutator.MutateLines(text); })},
        {"manifest JSON value", 60, manifest_edit([&](std::string& text) {
           Json json = manifest_json;
           const std::string what = mutator.MutateJson(json);
           text = json.dump(2);
           return what;
         })},
        {"manifest whitespace", 8, manifest_edit([&](std::string& text) {
           const int indent = mutator.Pick(std::vector<int>{-1, 0, 1, 4, 8});
           text = absl::StrCat(mutator.Pick(std::vector<std::string>{"", " ", "\n", "\t\r\n "}),
                               manifest_json.dump(indent), "\n\n");
           return absl::StrCat("written with indent ", indent);
         })},
        {"step and data position", 30, manifest_edit([&](std::string& text) {
           switch (mutator.Below(3)) {
             case 0:
               return set_manifest("/step", mutator.Pick(std::vector<Json>{1, 3, 0, -2, extreme()}),
                                   text);
             case 1:
               return set_manifest("/data_position",
                                   mutator.Pick(std::vector<Json>{kStep * kGlobalBatch - 1,
                                                                  kStep * kGlobalBatch + 1, kStep,
                                                                  0, -8, extreme()}),
                                   text);
             default:
               return set_manifest(absl::StrCat("/fingerprint/", kGlobalBatchField),
                                   mutator.Pick(std::vector<Json>{"2", "8", "0", "-4", "x", "",
                                                                  " 4", "4.0", extreme()}),
                                   text);
           }
         })},
        {"fingerprint model", 30, manifest_edit([&](std::string& text) {
           std::string model = manifest_json["fingerprint"][kModelField];
           const std::string what =
               mutator.Below(3) == 0 ? mutator.MutateBytes(model) : mutator.ReplaceNumber(model);
           set_manifest(absl::StrCat("/fingerprint/", kModelField), model, text);
           return absl::StrCat("fingerprint.", kModelField, ": ", what);
         })},
        {"metadata", 20, manifest_edit([&](std::string& text) {
           return set_manifest("/metadata/optimizer_step",
                               mutator.Pick(std::vector<Json>{
                                   Json::value_t::discarded, "", "x", "-1", "1.5", " 2", "2", "3",
                                   absl::StrCat(extreme()), "99999999999999999999", 2}),
                               text);
         })},
        {"rank file bytes", 60,
         rank_file_edit([&](std::string& bytes) { return mutator.MutateBytes(bytes); })},
        {"rank file header", 40, rank_file_edit([&](std::string& bytes) {
           auto [header, data] = SplitSafetensors(bytes);
           Json json = Json::parse(header);
           const std::string what = mutator.MutateJson(json);
           header = json.dump();
           bytes = absl::StrCat(LengthPrefix(header.size()), header, data);
           return absl::StrCat("header ", what);
         })},
        {"slice data", 20, rank_file_edit([&](std::string& bytes) {
           const size_t data_start = 8 + SplitSafetensors(bytes).first.size();
           const size_t at = data_start + mutator.Below(bytes.size() - data_start);
           const char flip = static_cast<char>(1 + mutator.Below(255));
           bytes[at] = static_cast<char>(bytes[at] ^ flip);
           return absl::StrCat("data byte ", at, " xor ", static_cast<int>(flip) & 0xff);
         })},
        {"deep nesting", 4, manifest_edit([&](std::string& text) {
           return mutator.Below(2) == 0 ? mutator.NestNumber(text, kDeepNesting, "[", "]")
                                        : mutator.NestNumber(text, kDeepNesting, "{\"a\":", "}");
         })},
    };

    // An error about the checkpoint names the manifest and its field, or a rank file.
    const std::vector<std::string> manifest_fields = {
        "format: ",          "step: ",         "world_size: ",
        "data_position: ",   "mesh: ",         "layout: ",
        "metadata",          "tensors",        "fingerprint.",
        "not a JSON object", "not valid JSON", "cannot resume from it"};
    auto expect_names_the_file = [&](const absl::Status& status, const std::string& what) {
      bool names_a_field = false;
      for (const std::string& field : manifest_fields) {
        names_a_field = names_a_field || absl::StrContains(status.message(), field);
      }
      const bool about_the_manifest =
          absl::StartsWith(status.message(), manifest_path + ": ") && names_a_field;
      bool about_a_rank_file = false;
      for (const std::string& file : rank_files) {
        about_a_rank_file = about_a_rank_file || absl::StrContains(status.message(), file);
      }
      EXPECT_TRUE(about_the_manifest || about_a_rank_file) << what << "\n  " << status;
    };

    MutationCases cases(absl::Seconds(10));
    int export_index = 0;
    for (const Kind& kind : kinds) {
      for (int i = 0; i < kind.count; ++i) {
        std::map<std::string, std::string> files = valid_rank_bytes;
        files[manifest_path] = valid_manifest;
        const std::string what = absl::StrCat(kind.name, " #", i, ": ", kind.mutate(files));
        for (const auto& [path, bytes] : files) WriteCaseFile(path, bytes);
        const absl::StatusOr<checkpoint::Manifest> mutated =
            checkpoint::ReadManifest(manifest_path);

        const absl::Status verified =
            cases.Run(absl::StrCat("verify: ", kind.name), what, [&]() -> absl::Status {
              PLAIT_ASSIGN_OR_RETURN(const checkpoint::Manifest manifest,
                                     checkpoint::ReadManifest(manifest_path));
              PLAIT_RETURN_IF_ERROR(VerifySavedCheckpoint(folder, manifest));
              const absl::StatusOr<std::map<std::string, at::Tensor>> have = ReadTensors(folder);
              EXPECT_TRUE(have.ok() && SameTensors(*have, *want))
                  << what << ": verified, with other tensors";
              EXPECT_EQ(manifest.step, kStep) << what;
              EXPECT_EQ(manifest.data_position, kStep * kGlobalBatch) << what;
              return absl::OkStatus();
            });
        if (!verified.ok()) expect_names_the_file(verified, what);

        // Half the exports go to a new folder, half over the earlier export.
        const bool over_earlier = export_index % 2 == 1;
        const std::string out =
            over_earlier ? earlier : absl::StrCat(dir, "/export-", export_index);
        ++export_index;
        const absl::Status exported =
            cases.Run(absl::StrCat("export-hf: ", kind.name), what, [&]() -> absl::Status {
              PLAIT_ASSIGN_OR_RETURN(const checkpoint::Manifest manifest,
                                     checkpoint::ReadManifest(manifest_path));
              return ExportSavedCheckpoint(folder, manifest, out, "OUT_DIR").status();
            });
        if (exported.ok()) {
          std::map<std::string, at::Tensor> have;
          absl::StatusOr<std::unique_ptr<models::SafetensorsFile>> file =
              models::SafetensorsFile::Open(out + "/model.safetensors");
          ASSERT_THAT(file, IsOk()) << what;
          for (const auto& [name, entry] : (*file)->entries()) {
            absl::StatusOr<at::Tensor> tensor = (*file)->Read(name);
            ASSERT_THAT(tensor, IsOk()) << what;
            have[name] = *std::move(tensor);
          }
          EXPECT_TRUE(SameTensors(have, want_parameters)) << what << ": exported other parameters";
          // The config.json of the model the fingerprint records: the saved one when it is
          // the saved text.
          if (mutated.ok() && mutated->fingerprint.count(kModelField) == 1 &&
              mutated->fingerprint.at(kModelField) == saved_model) {
            EXPECT_EQ(base::ReadFile(out + "/config.json").value_or(""), valid_config_json) << what;
          }
        } else {
          expect_names_the_file(exported, what);
          if (over_earlier) {
            EXPECT_EQ(FolderBytes(out), earlier_bytes) << what << ": a refused export wrote";
          } else {
            EXPECT_FALSE(fs::exists(out)) << what << ": a refused export wrote " << out;
          }
        }
        EXPECT_TRUE(exported.ok() || !verified.ok())
            << what << ": verified, but not exported: " << exported;
        // Leave the earlier export as it was and no new folder behind for the next cases.
        if (over_earlier) {
          fs::remove_all(earlier);
          fs::create_directories(earlier);
          for (const auto& [path, bytes] : earlier_bytes) WriteCaseFile(path, bytes);
        } else {
          fs::remove_all(out);
        }

        const absl::Status resumed =
            cases.Run(absl::StrCat("resume: ", kind.name), what, [&]() -> absl::Status {
              PLAIT_ASSIGN_OR_RETURN(const RunCheckpoints checkpoints,
                                     RunCheckpoints::Open(resolved, mesh));
              EXPECT_EQ(checkpoints.resume_step(), kStep) << what;
              return checkpoints.Restore(**optimizer, *loader);
            });
        // Verify is a resume without the plan: a resume refuses what verify refuses, and
        // verify what a resume refuses for anything but the plan.
        EXPECT_TRUE(!verified.ok() || resumed.ok() || RefusedForThePlanOnly(resumed.message()))
            << what << ": verified, but a resume refuses it: " << resumed;
        EXPECT_TRUE(verified.ok() || !resumed.ok())
            << what << ": a resume accepts it, but verify refuses it: " << verified;
        if (!mutated.ok()) {
          EXPECT_EQ(verified, mutated.status()) << what;
          EXPECT_EQ(resumed, mutated.status()) << what;
          continue;
        }
        // The checks a resume and verify share (SavedStepProblems) give both the same lines;
        // verify's per-step position is the fingerprint's global batch.
        const std::vector<std::string> problems =
            checkpoint::SavedStepProblems(*mutated, kStep, kGlobalBatch);
        const auto batch = mutated->fingerprint.find(kGlobalBatchField);
        const bool batch_kept =
            batch != mutated->fingerprint.end() && batch->second == absl::StrCat(kGlobalBatch);
        for (const std::string& problem : problems) {
          EXPECT_THAT(resumed.message(), ::testing::HasSubstr(problem)) << what;
          if (batch_kept) {
            EXPECT_THAT(verified.message(), ::testing::HasSubstr(problem)) << what;
          }
        }
      }
    }
    for (const auto& [path, bytes] : valid_rank_bytes) WriteCaseFile(path, bytes);
    WriteCaseFile(manifest_path, valid_manifest);
    std::cout << cases.Summary("checkpoint verify, export-hf and resume of mutated checkpoints");
    ::testing::Test::RecordProperty("accepted", cases.accepted());
    ::testing::Test::RecordProperty("rejected", cases.rejected());
  });
}

}  // namespace
}  // namespace plait::tools
