// Thousands of seeded mutations of valid plans (plan/examples/*.textproto and a plan that
// sets nearly every field), each checked the way //tools:plan_check checks a plan, in
// memory and without training: the command line (ParsePlanArguments, with --set overrides
// and --world_size), the plan's text (LoadPlanFromArguments), Resolve, and ExplainPlan
// for a valid plan. Mutations: the text's bytes, numbers and lines, and fields through
// reflection (a number set to an extreme, a field cleared, a repeated element deleted or
// duplicated, an enum value swapped, a oneof member switched, a string replaced by a mesh
// dimension's name, a path or garbage). Every outcome must be valid or an error each of
// whose lines says where (`source:line:col`, a field path such as
// `plan.training.micro_batch`, the override, the argument); a crash, an abort, an escaping
// exception or a hang fails the test (naming the case).
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "base/status.h"
#include "base/test_paths.h"
#include "base/testing_mutations.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "parallel/device_mesh.h"
#include "plan/explain.h"
#include "plan/plan.h"
#include "plan/validate.h"

namespace plait::plan {
namespace {

using ::google::protobuf::FieldDescriptor;
using ::google::protobuf::Message;
using ::google::protobuf::Reflection;
using ::plait::base::testing::MutationCases;
using ::plait::base::testing::Mutator;
using ::plait::base::testing::TestPath;

constexpr uint32_t kSeed = 20240613;

// A plan that sets nearly every field, valid on 2 ranks; @TMP@ is a folder holding its data
// files and a Hugging Face config.
constexpr char kRichPlan[] = R"pb(
  model {
    config {
      model_type: "llama"
      hidden_size: 64
      intermediate_size: 128
      num_hidden_layers: 2
      num_attention_heads: 4
      num_key_value_heads: 2
      rms_norm_eps: 1e-5
      rope_theta: 10000
      rope_scaling {
        rope_type: "llama3"
        factor: 8
        low_freq_factor: 1
        high_freq_factor: 4
        original_max_position_embeddings: 64
      }
      vocab_size: 256
      max_position_embeddings: 128
      attention_bias: true
    }
    init { seed: 3 std: 0.02 scaled_residual_init: true }
    dtype: DTYPE_BFLOAT16
  }
  mesh { dims { name: "dp" size: 2 } }
  prepare {
    fsdp {
      mesh_dim: "dp"
      reshard_after_forward: true
      param_dtype: DTYPE_BFLOAT16
      reduce_dtype: DTYPE_FLOAT32
    }
  }
  optimizer {
    adamw { beta1: 0.9 beta2: 0.95 eps: 1e-8 }
    weight_decay: 0.1
    param_groups { name: "no_decay" glob: "*norm*" weight_decay: 0 }
    param_groups { name: "embed" regex: "model\\.embed_tokens\\..*" lr_scale: 0.5 }
    clipping { max_norm: 1.0 non_finite: FAIL }
  }
  schedule {
    lr: 1e-3
    warmup { ratio: 0.1 shape: SHAPE_COSINE }
    warmup_stable_decay {
      stable_ratio: 0.5
      decay_steps: 10
      decay_shape: SHAPE_LINEAR
      min_lr_ratio: 0.1
    }
  }
  data {
    token_files {
      train_path: "@TMP@/train.bin"
      eval_path: "@TMP@/eval.bin"
      format: TOKEN_FORMAT_UINT16
      shuffle: true
      shuffle_seed: 5
    }
  }
  training {
    steps: 40
    micro_batch: 2
    seq_len: 32
    grad_accumulation: 2
    global_batch: 8
    eval_every: 10
    eval_batches: 2
    log_every: 5
    metrics_file: "@TMP@/metrics.jsonl"
    peak_flops_per_rank: 1e11
    save_hf_dir: "@TMP@/export"
    checkpoint { dir: "@TMP@/checkpoints" every: 10 keep_last: 2 resume: true }
    max_skipped_steps: 3
  }
  frozen {
    name: "reference"
    model { hf_config_path: "@TMP@/config.json" }
    prepare { ddp { mesh_dim: "dp" bucket_cap_mb: 25 first_bucket_cap_mb: 1 } }
    hf_weights_dir: "@TMP@"
  }
)pb";

constexpr char kHfConfig[] = R"json({"model_type": "llama", "hidden_size": 64,
  "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
  "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 128})json";

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A plan to mutate: its name in errors and its text.
struct Seed {
  std::string source;
  std::string text;
};

// The plan's way through //tools:plan_check: its command line (`args`, the overrides and
// --world_size), the plan text (given in memory, as the training binaries embed theirs),
// the world (the mesh's unless --world_size says otherwise), validation, then the
// explanation a valid plan gets. A plan that validates but cannot be explained fails the
// test: validation let through a plan it should have named.
absl::Status CheckPlan(const std::vector<std::string>& args, const Seed& plan,
                       const std::string& what) {
  std::vector<char*> argv = {const_cast<char*>("plan_check")};
  for (const std::string& arg : args) argv.push_back(const_cast<char*>(arg.c_str()));
  PLAIT_ASSIGN_OR_RETURN(
      const PlanArguments arguments,
      ParsePlanArguments(static_cast<int>(argv.size()), argv.data(), PlanCommand::kCheck));
  PLAIT_ASSIGN_OR_RETURN(const Plan parsed,
                         LoadPlanFromArguments(arguments, plan.text, plan.source));
  const int ranks =
      arguments.world_size.value_or(static_cast<int>(parallel::MeshRanks(parsed.mesh())));
  PLAIT_ASSIGN_OR_RETURN(const ResolvedPlan resolved, Resolve(parsed, ranks));
  const absl::StatusOr<std::string> explained = ExplainPlan(resolved);
  EXPECT_TRUE(explained.ok()) << what << "\n  validated, but: " << explained.status();
  return explained.status();
}

// Whether `line` of an error says where the problem is.
bool SaysWhere(absl::string_view line, const std::string& source) {
  return (absl::StartsWith(line, absl::StrCat(source, ":")) || absl::StartsWith(line, "plan.") ||
          absl::StartsWith(line, "--") || absl::StartsWith(line, "unexpected argument \"") ||
          absl::StartsWith(line, "Unknown command line flag '")) &&
         absl::StrContains(line, ": ");
}

// The strings a mutation puts into a string field: mesh dimension names, preset and model
// names, paths of every kind, patterns that do not compile, and garbage.
std::vector<std::string> StringValues(const std::string& tmp) {
  return {"",
          "dp",
          "tp",
          "world",
          "a b",
          "tiny",
          "llama3.2-1b",
          "qwen2",
          "llama3",
          "dynamic",
          "reference",
          std::string(5000, 'x'),
          "/",
          "/dev/null",
          "/dev/zero",
          "/nonexistent/plait",
          "../../..",
          tmp,
          absl::StrCat(tmp, "/train.bin"),
          absl::StrCat(tmp, "/config.json"),
          "*",
          "[",
          "(",
          "\\",
          "\xff\xfe",
          std::string("a\0b", 3)};
}

// Every message in `message` (itself first, then those of its set fields, repeated ones
// element by element) with its field path.
void CollectMessages(Message& message, const std::string& path,
                     std::vector<std::pair<Message*, std::string>>& out) {
  out.emplace_back(&message, path);
  const Reflection* reflection = message.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  reflection->ListFields(message, &fields);
  for (const FieldDescriptor* field : fields) {
    if (field->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE) continue;
    const std::string here = absl::StrCat(path, ".", field->name());
    if (!field->is_repeated()) {
      CollectMessages(*reflection->MutableMessage(&message, field), here, out);
      continue;
    }
    for (int i = 0; i < reflection->FieldSize(message, field); ++i) {
      CollectMessages(*reflection->MutableRepeatedMessage(&message, field, i),
                      absl::StrCat(here, "[", i, "]"), out);
    }
  }
}

// Changes one field of one message of `plan`, set or not, and says how.
std::string MutateField(Plan& plan, Mutator& mutator, const std::vector<std::string>& strings) {
  std::vector<std::pair<Message*, std::string>> messages;
  CollectMessages(plan, "plan", messages);
  auto [message, path] = mutator.Pick(messages);
  const google::protobuf::Descriptor* descriptor = message->GetDescriptor();
  if (descriptor->field_count() == 0) return absl::StrCat(path, ": has no fields");
  const FieldDescriptor* field = descriptor->field(
      static_cast<int>(mutator.Below(static_cast<size_t>(descriptor->field_count()))));
  const Reflection* reflection = message->GetReflection();
  const std::string where = absl::StrCat(path, ".", field->name());
  if (field->is_repeated()) {
    const int size = reflection->FieldSize(*message, field);
    if (size > 0 && mutator.Below(2) == 0) {
      const int i = static_cast<int>(mutator.Below(static_cast<size_t>(size)));
      reflection->SwapElements(message, field, i, size - 1);
      reflection->RemoveLast(message, field);
      return absl::StrCat(where, "[", i, "]: deleted");
    }
    if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      Message* added = reflection->AddMessage(message, field);
      if (size == 0) return absl::StrCat(where, ": an empty element added");
      const int i = static_cast<int>(mutator.Below(static_cast<size_t>(size)));
      added->CopyFrom(reflection->GetRepeatedMessage(*message, field, i));
      return absl::StrCat(where, "[", i, "]: duplicated");
    }
    const int64_t value = mutator.Pick(base::testing::ExtremeIntegers());
    reflection->AddInt64(message, field, value);  // plans repeat only int64 scalars
    return absl::StrCat(where, ": ", value, " added");
  }
  if (mutator.Below(4) == 0) {
    reflection->ClearField(message, field);
    return absl::StrCat(where, ": cleared");
  }
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32: {
      const auto value = static_cast<int32_t>(mutator.Pick(base::testing::ExtremeIntegers()));
      reflection->SetInt32(message, field, value);
      return absl::StrCat(where, " = ", value);
    }
    case FieldDescriptor::CPPTYPE_INT64: {
      const int64_t value = mutator.Pick(base::testing::ExtremeIntegers());
      reflection->SetInt64(message, field, value);
      return absl::StrCat(where, " = ", value);
    }
    case FieldDescriptor::CPPTYPE_UINT32:
    case FieldDescriptor::CPPTYPE_UINT64: {
      const auto value = static_cast<uint64_t>(mutator.Pick(base::testing::ExtremeIntegers()));
      if (field->cpp_type() == FieldDescriptor::CPPTYPE_UINT32) {
        reflection->SetUInt32(message, field, static_cast<uint32_t>(value));
      } else {
        reflection->SetUInt64(message, field, value);
      }
      return absl::StrCat(where, " = ", value);
    }
    case FieldDescriptor::CPPTYPE_DOUBLE:
    case FieldDescriptor::CPPTYPE_FLOAT: {
      const double value = mutator.Pick(base::testing::ExtremeDoubles());
      if (field->cpp_type() == FieldDescriptor::CPPTYPE_FLOAT) {
        reflection->SetFloat(message, field, static_cast<float>(value));
      } else {
        reflection->SetDouble(message, field, value);
      }
      return absl::StrCat(where, " = ", value);
    }
    case FieldDescriptor::CPPTYPE_BOOL:
      reflection->SetBool(message, field, !reflection->GetBool(*message, field));
      return absl::StrCat(where, " flipped");
    case FieldDescriptor::CPPTYPE_ENUM: {
      const google::protobuf::EnumDescriptor* type = field->enum_type();
      if (mutator.Below(8) == 0) {  // a number the enum does not declare
        reflection->SetEnumValue(message, field, 12345);
        return absl::StrCat(where, " = 12345");
      }
      const google::protobuf::EnumValueDescriptor* value =
          type->value(static_cast<int>(mutator.Below(static_cast<size_t>(type->value_count()))));
      reflection->SetEnum(message, field, value);
      return absl::StrCat(where, " = ", value->name());
    }
    case FieldDescriptor::CPPTYPE_STRING: {
      const std::string& value = mutator.Pick(strings);
      reflection->SetString(message, field, value);
      return absl::StrCat(where, " = \"", absl::CEscape(value.substr(0, 40)), "\"");
    }
    case FieldDescriptor::CPPTYPE_MESSAGE:
      // Sets an unset message (switching its oneof, when it is in one) to its defaults.
      reflection->MutableMessage(message, field);
      return absl::StrCat(where, ": set");
  }
  return where;
}

// The paths of the singular scalar fields an override may set ("training.steps"), from
// `descriptor` down through singular message fields.
void OverridablePaths(const google::protobuf::Descriptor* descriptor, const std::string& prefix,
                      int depth, std::vector<std::string>& out) {
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const FieldDescriptor* field = descriptor->field(i);
    if (field->is_repeated()) continue;
    const std::string path = absl::StrCat(prefix, prefix.empty() ? "" : ".", field->name());
    if (field->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE) {
      out.push_back(path);
    } else if (depth < 4) {
      OverridablePaths(field->message_type(), path, depth + 1, out);
    }
  }
}

TEST(PlanMutationTest, EveryMutationIsValidOrAnErrorSayingWhere) {
  const std::string tmp = TestPath("plan_files");
  std::filesystem::create_directories(tmp);
  std::ofstream(absl::StrCat(tmp, "/train.bin")) << std::string(64, '\0');
  std::ofstream(absl::StrCat(tmp, "/eval.bin")) << std::string(64, '\0');
  std::ofstream(absl::StrCat(tmp, "/config.json")) << kHfConfig;

  std::vector<Seed> seeds;
  for (const char* name : {"llama_single", "llama_ddp", "llama_fsdp"}) {
    const std::string path = absl::StrCat("plan/examples/", name, ".textproto");
    seeds.push_back({path, ReadText(absl::StrCat(std::getenv("TEST_SRCDIR"), "/plait/", path))});
    ASSERT_FALSE(seeds.back().text.empty()) << path;
  }
  seeds.push_back({"rich.textproto", absl::StrReplaceAll(kRichPlan, {{"@TMP@", tmp}})});
  std::vector<Plan> parsed;
  for (const Seed& seed : seeds) {
    const absl::Status valid = CheckPlan({}, seed, seed.source);
    ASSERT_TRUE(valid.ok()) << seed.source << ": " << valid;
    parsed.push_back(ParsePlan(seed.text, seed.source).value());
  }
  const std::vector<std::string> strings = StringValues(tmp);
  std::vector<std::string> overridable;
  OverridablePaths(Plan::descriptor(), "", 0, overridable);

  Mutator mutator(kSeed);
  // Each case mutates one seed, chosen at random, into a plan (text) and a command line.
  struct Case {
    Seed plan;
    std::vector<std::string> args;
  };
  struct Kind {
    const char* name;
    int count;
    std::function<std::string(size_t seed, Case& mutated)> mutate;
  };
  const std::vector<Kind> kinds = {
      {"byte edit", 1000,
       [&](size_t, Case& mutated) { return mutator.MutateBytes(mutated.plan.text); }},
      {"number", 1000,
       [&](size_t, Case& mutated) { return mutator.ReplaceNumber(mutated.plan.text); }},
      {"line edit", 500,
       [&](size_t, Case& mutated) { return mutator.MutateLines(mutated.plan.text); }},
      {"field", 2000,
       [&](size_t seed, Case& mutated) {
         // One to three field changes, each on the plan the last one left.
         Plan plan = parsed[seed];
         std::vector<std::string> changes;
         for (size_t n = 1 + mutator.Below(3); n > 0; --n) {
           changes.push_back(MutateField(plan, mutator, strings));
         }
         google::protobuf::TextFormat::PrintToString(plan, &mutated.plan.text);
         return absl::StrJoin(changes, "; ");
       }},
      {"override", 500,
       [&](size_t, Case& mutated) {
         std::vector<std::string> values = base::testing::ExtremeNumberTexts();
         values.insert(values.end(), strings.begin(), strings.end());
         for (const char* value : {"true", "false", "1 2", "DTYPE_FLOAT16", "TOKEN_FORMAT_LLMC",
                                   "SHAPE_COSINE", "FAIL", "\"quoted\""}) {
           values.push_back(value);
         }
         const std::vector<std::string> paths = {"training.stepz", "training", "prepare",
                                                 "mesh.dims",      "",         "training.steps.x"};
         const std::string& path =
             mutator.Below(10) == 0 ? mutator.Pick(paths) : mutator.Pick(overridable);
         mutated.args.push_back(absl::StrCat("--set=", path, "=", mutator.Pick(values)));
         if (mutator.Below(4) == 0) {
           mutated.args.push_back(
               absl::StrCat("--world_size=", mutator.Pick(base::testing::ExtremeNumberTexts())));
         }
         return absl::StrJoin(mutated.args, " ");
       }},
  };

  MutationCases cases(absl::Seconds(10));
  for (const Kind& kind : kinds) {
    for (int i = 0; i < kind.count; ++i) {
      const size_t seed = mutator.Below(seeds.size());
      Case mutated = {{absl::StrCat("mutated/", seeds[seed].source), seeds[seed].text}, {}};
      const std::string what = absl::StrCat(kind.name, " #", i, " of ", seeds[seed].source, ": ",
                                            kind.mutate(seed, mutated));
      const absl::Status status =
          cases.Run(kind.name, what, [&] { return CheckPlan(mutated.args, mutated.plan, what); });
      if (status.ok()) continue;
      for (absl::string_view line : absl::StrSplit(status.message(), '\n')) {
        EXPECT_TRUE(SaysWhere(line, mutated.plan.source))
            << what << "\n  this line of the error does not say where: " << line << "\n  "
            << status;
      }
    }
  }
  std::cout << cases.Summary("plan mutations");
  ::testing::Test::RecordProperty("accepted", cases.accepted());
  ::testing::Test::RecordProperty("rejected", cases.rejected());
}

}  // namespace
}  // namespace plait::plan
