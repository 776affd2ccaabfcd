// Seeded mutations of a model folder's tokenizer files (testdata/tiny: a byte-level BPE
// tokenizer.json and its tokenizer_config.json), each folder loaded as a run loads it
// (LoadTokenizer): byte, number and line edits of either file, JSON values changed anywhere and
// in each section, the split regex edited, the BOS / EOS tokens set to what is not a token,
// and nesting far deeper than any real file. Every outcome must be a refusal naming the file
// that was mutated, or a tokenizer that encodes and decodes a fixed text: to the text itself
// when the vocabulary, the added tokens and the normalizer are the file's, and to the valid
// files' ids when the mutation left the JSON as it was. A crash, an abort, an escaping
// exception or a hang fails the test, naming the case.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "base/file.h"
#include "base/status.h"
#include "base/test_paths.h"
#include "base/testing_mutations.h"
#include "data/tokenizer/load_tokenizer.h"
#include "data/tokenizer/tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace plait::data::tokenizer {
namespace {

using ::plait::base::testing::FreshTestDir;
using ::plait::base::testing::MutationCases;
using ::plait::base::testing::Mutator;
using ::plait::base::testing::WriteCaseFile;
using Json = nlohmann::json;

constexpr uint32_t kSeed = 20240614;
// Deep enough to overflow the stack of code that walks the parsed file recursively.
constexpr int kDeepNesting = 100000;
// What each accepted tokenizer encodes: ASCII words and code, digit runs, whitespace runs and
// newlines, accented Latin (composed, so NFC leaves it), CJK, an emoji with a joiner, and the
// file's special tokens written in the text.
constexpr char kText[] =
    "Hello, world! It's 2024: x = f(12345) + 0.5;\n\n  indented\ttabs\r\n"
    "caf\xC3\xA9 na\xC3\xAFve \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E "
    "\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x92\xBB <|begin_of_text|>x<|end_of_text|>   ";

// The node at `keys` under `json`, or nullptr where a key is missing or a node on the way is
// not an object.
const Json* Find(const Json& json, const std::vector<std::string>& keys) {
  const Json* node = &json;
  for (const std::string& key : keys) {
    if (!node->is_object()) return nullptr;
    const auto it = node->find(key);
    if (it == node->end()) return nullptr;
    node = &*it;
  }
  return node;
}

// Whether `a` and `b` have the same node at `keys` (both missing counts as the same).
bool SameAt(const Json& a, const Json& b, const std::vector<std::string>& keys) {
  const Json* x = Find(a, keys);
  const Json* y = Find(b, keys);
  return x == nullptr || y == nullptr ? x == y : *x == *y;
}

// `json` as text, indented by `indent`; bytes that are not UTF-8 (a byte edit of a string, a
// key renamed to its tail) are written as U+FFFD.
std::string Text(const Json& json, int indent = 2) {
  return json.dump(indent, ' ', false, Json::error_handler_t::replace);
}

// The text of `file` with its member `key` replaced by `depth` levels of a Sequence (whose
// list is `list`: "normalizers", "processors") around the member's value. Written as text:
// nlohmann's dump recurses once per level.
std::string WithDeepSequence(const Json& file, const char* key, const char* list, int depth) {
  constexpr char kPlaceholder[] = "deep sequence";
  Json json = file;
  json[key] = kPlaceholder;
  std::string deep;
  for (int i = 0; i < depth; ++i) absl::StrAppend(&deep, "{\"type\":\"Sequence\",\"", list, "\":[");
  deep += file[key].dump();
  for (int i = 0; i < depth; ++i) deep += "]}";
  std::string text = json.dump();
  const std::string quoted = Json(kPlaceholder).dump();
  text.replace(text.find(quoted), quoted.size(), deep);
  return text;
}

TEST(TokenizerFilesMutationTest, EveryMutationIsANamedErrorOrATokenizerThatRoundTrips) {
  const std::string valid_json =
      base::ReadFile("data/tokenizer/testdata/tiny/tokenizer.json").value();
  const std::string valid_config =
      base::ReadFile("data/tokenizer/testdata/tiny/tokenizer_config.json").value();
  const Json file = Json::parse(valid_json);
  const Json config = Json::parse(valid_config);
  const std::string folder = FreshTestDir("tokenizer");
  std::filesystem::create_directories(folder);
  const std::string json_path = folder + "/tokenizer.json";
  const std::string config_path = folder + "/tokenizer_config.json";

  WriteCaseFile(json_path, valid_json);
  WriteCaseFile(config_path, valid_config);
  absl::StatusOr<std::unique_ptr<Tokenizer>> valid = LoadTokenizer(folder);
  ASSERT_TRUE(valid.ok()) << valid.status();
  const absl::StatusOr<std::vector<int32_t>> valid_ids = (*valid)->Encode(kText);
  ASSERT_TRUE(valid_ids.ok()) << valid_ids.status();
  ASSERT_EQ((*valid)->Decode(*valid_ids).value_or(""), kText);
  ASSERT_TRUE((*valid)->bos_id().has_value() && (*valid)->eos_id().has_value());

  Mutator mutator(kSeed);
  // A mutation of one of the files: it edits `text` (the file's valid text when it starts)
  // and says what it did.
  struct Kind {
    const char* name;
    bool config;  // tokenizer_config.json, else tokenizer.json
    int count;
    std::function<std::string(std::string& text)> mutate;
  };
  // Sections and settings of tokenizer.json, each small next to the vocabulary and merges,
  // which a mutation anywhere in the file mostly lands in.
  const std::vector<std::vector<std::string>> sections = {{"added_tokens"},
                                                          {"normalizer"},
                                                          {"pre_tokenizer"},
                                                          {"post_processor"},
                                                          {"decoder"},
                                                          {"truncation"},
                                                          {"padding"},
                                                          {"model", "type"},
                                                          {"model", "dropout"},
                                                          {"model", "byte_fallback"},
                                                          {"model", "ignore_merges"},
                                                          {"model", "continuing_subword_prefix"},
                                                          {"model", "end_of_word_suffix"}};
  const std::vector<std::string> config_values = {"\"<|end_of_text|>\"",
                                                  "\"a\"",
                                                  "\"zzz-not-a-token\"",
                                                  "\"\"",
                                                  "null",
                                                  "5",
                                                  "[]",
                                                  "{\"content\": \"<|begin_of_text|>\"}",
                                                  "{\"content\": 5}",
                                                  "{}",
                                                  "true"};
  const std::vector<Kind> kinds = {
      {"tokenizer.json bytes", false, 60,
       [&](std::string& text) { return mutator.MutateBytes(text); }},
      {"tokenizer.json number", false, 30,
       [&](std::string& text) { return mutator.ReplaceNumber(text); }},
      {"tokenizer.json line", false, 30,
       [&](std::string& text) { return mutator.MutateLines(text); }},
      {"tokenizer.json JSON value", false, 40,
       [&](std::string& text) {
         Json json = file;
         const std::string what = mutator.MutateJson(json);
         text = Text(json);
         return what;
       }},
      {"tokenizer.json section value", false, 70,
       [&](std::string& text) {
         Json json = file;
         const std::vector<std::string>& keys = mutator.Pick(sections);
         Json* node = &json;
         for (const std::string& key : keys) node = &(*node)[key];
         const std::string what = mutator.MutateJson(*node);
         text = Text(json);
         return absl::StrCat("/", absl::StrJoin(keys, "/"), what);
       }},
      {"tokenizer.json split regex", false, 30,
       [&](std::string& text) {
         Json json = file;
         Json& regex = json["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"];
         std::string pattern = regex;
         const std::string what =
             mutator.Below(4) == 0 ? mutator.DuplicateSpan(pattern) : mutator.MutateBytes(pattern);
         regex = pattern;
         text = Text(json);
         return absl::StrCat("regex: ", what);
       }},
      {"tokenizer.json whitespace", false, 4,
       [&](std::string& text) {
         const int indent = mutator.Pick(std::vector<int>{-1, 0, 1, 4});
         text = absl::StrCat(" \n", Text(file, indent), "\r\n\t");
         return absl::StrCat("written with indent ", indent);
       }},
      {"tokenizer.json deep nesting", false, 6,
       [&](std::string& text) {
         switch (mutator.Below(3)) {
           case 0:
             text = WithDeepSequence(file, "normalizer", "normalizers", kDeepNesting);
             return absl::StrCat("normalizer: a Sequence ", kDeepNesting, " deep");
           case 1:
             text = WithDeepSequence(file, "post_processor", "processors", kDeepNesting);
             return absl::StrCat("post_processor: a Sequence ", kDeepNesting, " deep");
           default:
             return mutator.Below(2) == 0 ? mutator.NestNumber(text, kDeepNesting, "[", "]")
                                          : mutator.NestNumber(text, kDeepNesting, "{\"a\":", "}");
         }
       }},
      {"tokenizer_config.json bytes", true, 40,
       [&](std::string& text) { return mutator.MutateBytes(text); }},
      {"tokenizer_config.json JSON value", true, 30,
       [&](std::string& text) {
         Json json = config;
         const std::string what = mutator.MutateJson(json);
         text = Text(json);
         return what;
       }},
      {"tokenizer_config.json token", true, 30,
       [&](std::string& text) {
         const char* key = mutator.Below(2) == 0 ? "bos_token" : "eos_token";
         const std::string& value = mutator.Pick(config_values);
         Json json = config;
         json[key] = Json::parse(value);
         text = Text(json);
         return absl::StrCat(key, " = ", value);
       }},
      {"tokenizer_config.json not an object", true, 8,
       [&](std::string& text) {
         text = mutator.Pick(std::vector<std::string>{"", " ", "null", "[]", "4", "\"x\"", "{",
                                                      std::string(8, '\0'), valid_config + "}"});
         return absl::StrCat("tokenizer_config.json: ", absl::CHexEscape(text));
       }},
  };

  MutationCases cases(absl::Seconds(10));
  for (const Kind& kind : kinds) {
    for (int i = 0; i < kind.count; ++i) {
      std::string json_text = valid_json;
      std::string config_text = valid_config;
      const std::string description = kind.mutate(kind.config ? config_text : json_text);
      const std::string what = absl::StrCat(kind.name, " #", i, ": ", description);
      WriteCaseFile(json_path, json_text);
      WriteCaseFile(config_path, config_text);
      // Whether the files say what the valid ones do, whatever their bytes.
      const Json json = Json::parse(json_text, nullptr, /*allow_exceptions=*/false);
      const Json parsed_config = Json::parse(config_text, nullptr, /*allow_exceptions=*/false);
      const bool same_json = !json.is_discarded() && json == file;
      const bool same_meaning =
          same_json && !parsed_config.is_discarded() && parsed_config == config;
      const bool round_trips = !json.is_discarded() && SameAt(json, file, {"model", "vocab"}) &&
                               SameAt(json, file, {"added_tokens"}) &&
                               SameAt(json, file, {"normalizer"});

      const absl::Status status = cases.Run(kind.name, what, [&]() -> absl::Status {
        PLAIT_ASSIGN_OR_RETURN(const std::unique_ptr<Tokenizer> tokenizer, LoadTokenizer(folder));
        const absl::StatusOr<std::vector<int32_t>> ids = tokenizer->Encode(kText);
        EXPECT_TRUE(ids.ok()) << what << ": accepted, but Encode fails: " << ids.status();
        if (!ids.ok()) return absl::OkStatus();
        const absl::StatusOr<std::string> decoded = tokenizer->Decode(*ids);
        EXPECT_TRUE(decoded.ok()) << what << ": accepted, but Decode fails: " << decoded.status();
        const absl::StatusOr<std::vector<int32_t>> with_special =
            tokenizer->Encode(kText, /*add_special_tokens=*/true);
        EXPECT_TRUE(with_special.ok() && tokenizer->Decode(*with_special).ok()) << what;
        for (const std::optional<int32_t> id : {tokenizer->bos_id(), tokenizer->eos_id()}) {
          if (id.has_value()) {
            EXPECT_TRUE(tokenizer->Decode({*id}).ok()) << what << ": " << *id;
          }
        }
        if (round_trips) {
          EXPECT_EQ(decoded.value_or(""), kText) << what;
        }
        if (same_meaning) {
          EXPECT_EQ(*ids, *valid_ids) << what;
          EXPECT_EQ(tokenizer->bos_id(), (*valid)->bos_id()) << what;
          EXPECT_EQ(tokenizer->eos_id(), (*valid)->eos_id()) << what;
        }
        // A cache of ids is keyed by the hash: it changes with the files' bytes.
        EXPECT_EQ(tokenizer->hash() == (*valid)->hash(),
                  json_text == valid_json && config_text == valid_config)
            << what;
        return absl::OkStatus();
      });
      if (status.ok()) continue;
      EXPECT_FALSE(same_meaning) << what << ": the same files refused: " << status;
      // The file that was mutated, by its name: tokenizer.json's errors start with its path.
      if (kind.config) {
        EXPECT_THAT(std::string(status.message()), ::testing::HasSubstr("tokenizer_config.json"))
            << what;
      } else {
        EXPECT_THAT(std::string(status.message()), ::testing::StartsWith(json_path + ": ")) << what;
      }
    }
  }
  std::cout << cases.Summary("tokenizer.json and tokenizer_config.json mutations");
  ::testing::Test::RecordProperty("accepted", cases.accepted());
  ::testing::Test::RecordProperty("rejected", cases.rejected());
}

}  // namespace
}  // namespace plait::data::tokenizer
