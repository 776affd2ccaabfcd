// Thousands of seeded mutations of a saved checkpoint's manifest (checkpoint.json), each
// resumed from as a run does, without training: Checkpointer::Open checks the manifest
// against the run, then Restore reads the rank's file. The manifest's bytes, numbers, lines
// and JSON values are mutated, and its fields set to values a resume must refuse (a negative
// step or data position, a position that step x position_per_step does not give, huge or
// missing values, values of the wrong type, deep nesting). Every outcome must be a resume at
// the saved step and position or an error naming the manifest and the field; a crash, an
// abort, an escaping exception or a hang fails the test (naming the case).
#include <cstdint>
#include <functional>
#include <iostream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "ATen/ops/equal.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "base/file.h"
#include "base/status.h"
#include "base/test_paths.h"
#include "base/testing_mutations.h"
#include "checkpoint/checkpointer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "parallel/device_mesh.h"
#include "parallel/test_ranks.h"
#include "torch/csrc/autograd/generated/variable_factories.h"

namespace plait::checkpoint {
namespace {

using ::plait::base::testing::FreshTestDir;
using ::plait::base::testing::MutationCases;
using ::plait::base::testing::Mutator;
using ::plait::base::testing::WriteCaseFile;
using Json = nlohmann::json;

constexpr uint32_t kSeed = 20240612;
// The saved checkpoint: step 4 of 8, two micro-batches per step.
constexpr int64_t kStep = 4;
constexpr int64_t kPositionPerStep = 2;
constexpr int64_t kPosition = kStep * kPositionPerStep;
// Deep enough to overflow the stack of code that walks the manifest recursively.
constexpr int kDeepNesting = 100000;

// One rank, no mesh dimensions ("world=1").
parallel::MeshLayout OneRank() { return parallel::MeshLayout::Create({}, 1).value(); }

// The run; position_per_step 0 leaves the position unchecked, as RunInfo allows.
RunInfo TestRun(int64_t position_per_step) {
  RunInfo run;
  run.config_field = "run.checkpoint";
  run.steps = 8;
  run.steps_field = "run.steps";
  run.position_per_step = position_per_step;
  run.fingerprint = {{"run.model", "tiny"}, {"run.batch", "4"}};
  return run;
}

std::map<std::string, SlicedTensor> Tensors() {
  return {{"w", Whole(torch::arange(6, at::kFloat).reshape({2, 3}))},
          {"m", Whole(torch::full({4}, 3, at::kLong))}};
}

CheckpointConfig Config(const std::string& dir, bool resume) {
  CheckpointConfig config;
  config.set_dir(dir);
  config.set_resume(resume);
  return config;
}

// Resumes from `dir` as a run does (Open, then Restore), checking what an accepted manifest
// gives: the saved step, a position that is not negative and, when the run checks it, the
// saved one, and the saved tensors.
absl::Status Resume(const std::string& dir, const RunInfo& run, const parallel::DeviceMesh& mesh) {
  PLAIT_ASSIGN_OR_RETURN(const Checkpointer checkpointer,
                         Checkpointer::Open(Config(dir, /*resume=*/true), dir, run, mesh));
  EXPECT_EQ(checkpointer.resume_step(), kStep);
  EXPECT_GE(checkpointer.resume_position(), 0);
  if (run.position_per_step > 0) {
    EXPECT_EQ(checkpointer.resume_position(), kPosition);
  }
  return checkpointer.Restore(Tensors(), [](RankState saved) {
    EXPECT_TRUE(at::equal(saved.tensors.at("w").tensor, Tensors().at("w").tensor));
    return absl::OkStatus();
  });
}

// The manifest `json` as text, the member `deep` (if any) replaced by a value nested
// kDeepNesting levels deep.
std::string WithDeepMember(const Json& json, const std::string& deep, bool arrays) {
  std::vector<std::string> members;
  for (auto it = json.begin(); it != json.end(); ++it) {
    std::string value = it->dump();
    if (it.key() == deep) {
      value = arrays ? absl::StrCat(std::string(kDeepNesting, '['), std::string(kDeepNesting, ']'))
                     : absl::StrCat(
                           absl::StrJoin(std::vector<std::string>(kDeepNesting, "{\"a\":"), ""),
                           "1", std::string(kDeepNesting, '}'));
    }
    members.push_back(absl::StrCat(Json(it.key()).dump(), ": ", value));
  }
  return absl::StrCat("{", absl::StrJoin(members, ",\n"), "}");
}

TEST(CheckpointerMutationTest, EveryManifestMutationResumesOrIsANamedError) {
  const std::string dir = FreshTestDir("checkpoints");
  parallel::testing::RunOnRingMesh(OneRank(), [&](int, parallel::DeviceMesh& mesh) {
    {
      absl::StatusOr<Checkpointer> checkpointer =
          Checkpointer::Open(Config(dir, /*resume=*/false), dir, TestRun(kPositionPerStep), mesh);
      ASSERT_TRUE(checkpointer.ok()) << checkpointer.status();
      ASSERT_TRUE(checkpointer->Save(kStep, kPosition, {Tensors(), {}}).ok());
    }
    const std::string path = absl::StrCat(dir, "/", CheckpointName(kStep), "/", kManifest);
    const std::string valid = base::ReadFile(path).value();
    const Json manifest = Json::parse(valid);
    std::vector<std::string> fields;
    for (auto it = manifest.begin(); it != manifest.end(); ++it) fields.push_back(it.key());

    Mutator mutator(kSeed);
    auto extreme = [&] { return mutator.Pick(base::testing::ExtremeIntegers()); };
    // The manifest with `field` set to `value` (removed when `value` is discarded).
    auto set_field = [&](const std::string& field, const Json& value, std::string& text) {
      Json json = manifest;
      if (value.is_discarded()) {
        json.erase(field);
        text = json.dump(2);
        return absl::StrCat(field, " removed");
      }
      json[field] = value;
      text = json.dump(2);
      return absl::StrCat(field, " = ", value.dump());
    };

    struct Kind {
      const char* name;
      int count;
      std::function<std::string(std::string& text)> mutate;
    };
    const std::vector<Kind> kinds = {
        {"byte edit", 1000, [&](std::string& text) { return mutator.MutateBytes(text); }},
        {"number", 800, [&](std::string& text) { return mutator.ReplaceNumber(text); }},
        {"line edit", 400, [&](std::string& text) { return mutator.MutateLines(text); }},
        {"JSON value", 800,
         [&](std::string& text) {
           Json json = manifest;
           const std::string what = mutator.MutateJson(json);
           text = json.dump(2);
           return what;
         }},
        {"step", 300,
         [&](std::string& text) {
           return set_field("step",
                            mutator.Below(4) == 0
                                ? mutator.Pick(std::vector<Json>{Json::value_t::discarded, 4.0, "4",
                                                                 true, nullptr, Json::array({4})})
                                : Json(extreme()),
                            text);
         }},
        {"data_position", 400,
         [&](std::string& text) {
           switch (mutator.Below(3)) {
             case 0:  // not step x position_per_step
               return set_field("data_position",
                                mutator.Pick(std::vector<int64_t>{kPosition - 1, kPosition + 1,
                                                                  kStep, kStep - 1, -kPosition}),
                                text);
             case 1:
               return set_field("data_position",
                                mutator.Pick(std::vector<Json>{Json::value_t::discarded, 8.0, 8.5,
                                                               "8", nullptr}),
                                text);
             default:
               return set_field("data_position", extreme(), text);
           }
         }},
        {"world_size", 200,
         [&](std::string& text) {
           return set_field(
               "world_size",
               mutator.Below(4) == 0
                   ? mutator.Pick(std::vector<Json>{Json::value_t::discarded, 1.0, "1", nullptr})
                   : Json(extreme()),
               text);
         }},
        {"mesh", 200,
         [&](std::string& text) {
           return set_field("mesh",
                            mutator.Pick(std::vector<Json>{
                                Json::value_t::discarded, "", "world=2", "dp=1", 1, extreme(),
                                nullptr, true, Json::array({"world=1"}), Json::object()}),
                            text);
         }},
        {"format", 150,
         [&](std::string& text) {
           return set_field("format",
                            mutator.Pick(std::vector<Json>{
                                Json::value_t::discarded, "", "plait-checkpoint-3", 1, nullptr,
                                Json::array({"plait-checkpoint-1"}), Json::object()}),
                            text);
         }},
        {"tensors", 400,
         [&](std::string& text) {
           Json tensors = manifest["tensors"];
           Json& tensor = tensors[mutator.Pick(std::vector<std::string>{"w", "m"})];
           Json& slice = tensor["slices"][0];
           const std::string key = mutator.Pick(std::vector<std::string>{
               "file", "offsets", "lengths", "checksum", "shape", "dtype", "slices"});
           Json& target =
               key == "shape" || key == "dtype" || key == "slices" ? tensor[key] : slice[key];
           target = mutator.Pick(std::vector<Json>{
               nullptr, "", "..", "../rank-00000-of-00001.safetensors", "/etc/passwd", "F16", "I64",
               Json::array(), Json::array({0}), Json::array({1, 3}), Json::array({0, 0}),
               Json::array({2, 3}), Json::array({-1, 3}), Json::array({extreme(), 3}),
               Json::array({slice, slice}), Json::object(), 4, "0000000000000000"});
           set_field("tensors", tensors, text);
           return absl::StrCat("tensors.", key, " = ", target.dump());
         }},
        {"fingerprint", 200,
         [&](std::string& text) {
           Json fingerprint = manifest["fingerprint"];
           const std::string key = mutator.Pick(std::vector<std::string>{"run.model", "run.batch"});
           switch (mutator.Below(3)) {
             case 0:
               return set_field("fingerprint",
                                mutator.Pick(std::vector<Json>{Json::value_t::discarded, nullptr,
                                                               "tiny", 4, Json::array()}),
                                text);
             case 1:
               fingerprint.erase(key);
               return set_field("fingerprint", fingerprint, text);
             default:
               fingerprint[key] =
                   mutator.Pick(std::vector<Json>{"", "small", 4, nullptr, Json::array({"tiny"})});
               return set_field("fingerprint", fingerprint, text);
           }
         }},
        {"deep nesting", 10,
         [&](std::string& text) {
           const std::string& field = mutator.Pick(fields);
           const bool arrays = mutator.Below(2) == 0;
           text = WithDeepMember(manifest, field, arrays);
           return absl::StrCat(field, " nested ", kDeepNesting, " deep in ",
                               arrays ? "arrays" : "objects");
         }},
        {"not JSON", 50,
         [&](std::string& text) {
           text = mutator.Pick(std::vector<std::string>{"", " ", "null", "[]", "4", "{", "}",
                                                        std::string(16, '\0'), "{\"step\": }",
                                                        valid + valid});
           return absl::StrCat("manifest ", absl::CHexEscape(text.substr(0, 40)));
         }},
    };

    // The fields an error about the manifest may name.
    const std::vector<std::string> named = {
        "format: ", "step: ",   "world_size: ", "data_position: ", "mesh: ",
        "layout: ", "metadata", "tensors",      "fingerprint.",    "not a JSON object"};
    MutationCases cases(absl::Seconds(10));
    for (const Kind& kind : kinds) {
      for (int i = 0; i < kind.count; ++i) {
        std::string text = valid;
        const std::string what = absl::StrCat(kind.name, " #", i, ": ", kind.mutate(text));
        WriteCaseFile(path, text);
        // Half the runs check the position (as the trainer's do), half leave it unchecked.
        const RunInfo run = TestRun(i % 2 == 0 ? kPositionPerStep : 0);
        const absl::Status status =
            cases.Run(kind.name, what, [&] { return Resume(dir, run, mesh); });
        if (status.ok()) continue;
        bool names_a_field = false;
        for (const std::string& field : named) {
          names_a_field = names_a_field || absl::StrContains(status.message(), field);
        }
        EXPECT_TRUE(absl::StartsWith(status.message(), path + ": ") && names_a_field)
            << what << "\n  " << status;
      }
    }
    std::cout << cases.Summary("checkpoint manifest mutations");
    ::testing::Test::RecordProperty("accepted", cases.accepted());
    ::testing::Test::RecordProperty("rejected", cases.rejected());
  });
}

}  // namespace
}  // namespace plait::checkpoint
