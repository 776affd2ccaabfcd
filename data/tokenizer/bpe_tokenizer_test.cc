// Malformed and unsupported tokenizer.json files: each a change to a valid file
// (testdata/tiny/tokenizer.json, byte-level; testdata/tiny_gemma/tokenizer.json, with byte
// fallback) that must fail with an error naming the field.
#include "data/tokenizer/bpe_tokenizer.h"

#include <functional>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/file.h"
#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace plait::data::tokenizer {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::base::testing::IsOkAndHolds;
using ::plait::base::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using json = nlohmann::json;

absl::StatusOr<std::unique_ptr<Tokenizer>> ParseChangedFile(
    const std::string& name, const std::function<void(json&)>& change, const std::string& config) {
  json file = json::parse(
      base::ReadFile(absl::StrCat("data/tokenizer/testdata/", name, "/tokenizer.json")).value());
  change(file);
  return ParseBpeTokenizer("tokenizer.json", file.dump(), config);
}

absl::StatusOr<std::unique_ptr<Tokenizer>> ParseChanged(const std::function<void(json&)>& change,
                                                        const std::string& config = "") {
  return ParseChangedFile("tiny", change, config);
}

// The same for the byte-fallback file, laid out as Gemma 3's.
absl::StatusOr<std::unique_ptr<Tokenizer>> ParseChangedGemma(
    const std::function<void(json&)>& change) {
  return ParseChangedFile("tiny_gemma", change, "");
}

TEST(BpeTokenizerTest, TheUnchangedFileLoads) {
  EXPECT_THAT(ParseChanged([](json&) {}), IsOk());
}

TEST(BpeTokenizerTest, NotJsonNamesTheByte) {
  EXPECT_THAT(ParseBpeTokenizer("tokenizer.json", "{\"model\": [1, 2", ""),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("tokenizer.json: not valid JSON at byte")));
}

TEST(BpeTokenizerTest, AnotherModelTypeIsUnsupported) {
  EXPECT_THAT(ParseChanged([](json& f) { f["model"]["type"] = "Unigram"; }),
              StatusIs(absl::StatusCode::kUnimplemented,
                       HasSubstr("tokenizer.json: model.type: \"Unigram\" is not supported")));
}

TEST(BpeTokenizerTest, AMergeNamingAnUnknownTokenIsNamed) {
  EXPECT_THAT(ParseChanged([](json& f) {
                f["model"]["merges"][3] = json::array({"a", "zzqq"});
              }),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("model.merges[3]: names \"zzqq\", which is not in model.vocab")));
  EXPECT_THAT(ParseChanged([](json& f) { f["model"]["merges"][0] = "a b c"; }),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("model.merges[0]: \"a b c\" is not two tokens")));
}

TEST(BpeTokenizerTest, AVocabularyWithoutEveryByteIsNamed) {
  EXPECT_THAT(ParseChanged([](json& f) { f["model"]["vocab"].erase("A"); }),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("model.vocab: has no token \"A\" for byte 0x41")));
}

TEST(BpeTokenizerTest, IdsOutOfRangeOrRepeatedAreNamed) {
  EXPECT_THAT(ParseChanged([](json& f) { f["model"]["vocab"]["A"] = int64_t{1} << 40; }),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("model.vocab[\"A\"]: id 1099511627776 is out of range")));
  EXPECT_THAT(ParseChanged([](json& f) { f["model"]["vocab"]["A"] = f["model"]["vocab"]["B"]; }),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("is also the id of")));
}

// A JSON object may repeat a key (nlohmann's values cannot, so the text is edited).
TEST(BpeTokenizerTest, ATokenRepeatedInTheVocabularyLoadsOnlyWithOneId) {
  const json file =
      json::parse(base::ReadFile("data/tokenizer/testdata/tiny/tokenizer.json").value());
  const int64_t id = file["model"]["vocab"]["A"].get<int64_t>();
  const std::string text = file.dump();
  const auto with_first_entry = [&](int64_t a_id) {
    std::string changed = text;
    const size_t vocab = changed.find("\"vocab\":{");
    changed.insert(vocab + 9, absl::StrCat("\"A\":", a_id, ","));
    return ParseBpeTokenizer("tokenizer.json", changed, "");
  };
  EXPECT_THAT(with_first_entry(id), IsOk());
  EXPECT_THAT(with_first_entry(id + 1),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr(absl::StrCat("model.vocab[\"A\"]: appears twice in model.vocab, "
                                              "with ids ",
                                              id + 1, " and ", id))));
}

TEST(BpeTokenizerTest, UnsupportedComponentsAreNamed) {
  const struct {
    std::function<void(json&)> change;
    const char* message;
  } cases[] = {
      {[](json& f) { f["model"]["byte_fallback"] = true; }, "model.byte_fallback: true"},
      {[](json& f) { f["model"]["dropout"] = 0.1; }, "model.dropout: 0.1"},
      {[](json& f) { f["model"]["continuing_subword_prefix"] = "##"; },
       "model.continuing_subword_prefix: \"##\""},
      {[](json& f) {
         f["normalizer"] = {{"type", "Lowercase"}};
       },
       "normalizer.type"},
      {[](json& f) { f["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed"; },
       "pre_tokenizer.pretokenizers[0].behavior: \"Removed\""},
      {[](json& f) { f["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = true; },
       "pre_tokenizer.pretokenizers[1].add_prefix_space: true"},
      {[](json& f) {
         f["pre_tokenizer"] = {{"type", "Whitespace"}};
       },
       "pre_tokenizer.type"},
      {[](json& f) { f["added_tokens"][0]["lstrip"] = true; }, "added_tokens[0].lstrip: true"},
      {[](json& f) {
         f["post_processor"] = {{"type", "BertProcessing"}};
       },
       "post_processor.type: \"BertProcessing\""},
      {[](json& f) {
         f["decoder"] = {{"type", "Metaspace"}};
       },
       "decoder.type: \"Metaspace\""},
      {[](json& f) {
         f["truncation"] = {{"max_length", 512}};
       },
       "truncation: is set"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.message);
    EXPECT_THAT(ParseChanged(c.change),
                StatusIs(absl::StatusCode::kUnimplemented, HasSubstr(c.message)));
  }
}

TEST(BpeTokenizerTest, ARegexThatDoesNotCompileIsNamed) {
  EXPECT_THAT(ParseChanged([](json& f) {
                f["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(a";
              }),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("pre_tokenizer.pretokenizers[0].pattern.Regex: the regex does not "
                                 "compile at offset 2")));
}

TEST(BpeTokenizerTest, TemplateNamingAnUnlistedTokenIsNamed) {
  EXPECT_THAT(ParseChanged([](json& f) { f["post_processor"]["special_tokens"] = json::object(); }),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("post_processor.single[0]: names \"<|begin_of_text|>\"")));
}

TEST(BpeTokenizerTest, ConfigTokensMustBeTokens) {
  EXPECT_THAT(ParseChanged([](json&) {}, R"({"eos_token": "<|not a token|>"})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("tokenizer_config.json: eos_token: \"<|not a token|>\" is not "
                                 "a token")));
  // A config that is not an object would be read as naming no BOS or EOS.
  for (const char* config : {"null", "[]", "4", "\"<|end_of_text|>\""}) {
    EXPECT_THAT(ParseChanged([](json&) {}, config),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("tokenizer.json (tokenizer_config.json): expected a JSON "
                                   "object, got ")))
        << config;
  }
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = ParseChanged(
      [](json&) {}, R"({"bos_token": null, "eos_token": {"content": "<|end_of_text|>"}})");
  ASSERT_THAT(tokenizer, IsOk());
  EXPECT_EQ((*tokenizer)->bos_id(), std::nullopt);
  EXPECT_EQ((*tokenizer)->eos_id(), 1);
}

// A Split with a String pattern splits on the literal text, regex characters included.
TEST(BpeTokenizerTest, StringPatternsAreLiteral) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = ParseChanged([](json& f) {
    f["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {{"String", "."}};
    f["model"]["ignore_merges"] = false;
  });
  ASSERT_THAT(tokenizer, IsOk());
  absl::StatusOr<std::vector<int32_t>> dotted = (*tokenizer)->Encode("a.b");
  ASSERT_THAT(dotted, IsOk());
  // "a", ".", "b" are pieces of their own: three byte tokens.
  EXPECT_THAT((*tokenizer)->Encode("a.b"),
              IsOkAndHolds(ElementsAre(*(*tokenizer)->TokenToId("a"), *(*tokenizer)->TokenToId("."),
                                       *(*tokenizer)->TokenToId("b"))));
}

// A flag that is neither true nor false is refused, naming it, not read as false (which
// changed the ids: ignore_merges, an added token's normalized, use_regex).
TEST(BpeTokenizerTest, FlagsMustBeBooleans) {
  EXPECT_THAT(ParseChanged([](json& f) { f["model"]["ignore_merges"] = 1; }),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("tokenizer.json: model.ignore_merges: expected true or false, "
                                 "got 1")));
  EXPECT_THAT(ParseChanged([](json& f) { f["added_tokens"][1]["normalized"] = "false"; }),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("added_tokens[1].normalized: expected true or false, got "
                                 "\"false\"")));
  EXPECT_THAT(ParseChanged([](json& f) { f["added_tokens"][0]["special"] = json::array(); }),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("added_tokens[0].special: expected true or false, got an array")));
  EXPECT_THAT(
      ParseChanged([](json& f) { f["pre_tokenizer"]["pretokenizers"][1]["use_regex"] = 0; }),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("pre_tokenizer.pretokenizers[1].use_regex: expected true or "
                         "false, got 0")));
  // Absent or null, each is its default.
  EXPECT_THAT(ParseChanged([](json& f) {
                f["model"].erase("ignore_merges");
                f["added_tokens"][1]["normalized"] = nullptr;
                f["pre_tokenizer"]["pretokenizers"][1].erase("use_regex");
              }),
              IsOk());
}

// Normalizer and post-processor Sequences may nest 64 deep; a file nesting them deeper (which
// Hugging Face's parser refuses too) is an error naming the field, where the loader's recursion
// used to overflow the stack.
TEST(BpeTokenizerTest, SequencesNestedDeeperThan64AreRefused) {
  const auto nested = [](const char* key, const char* list, int depth) {
    return ParseChanged([=](json& f) {
      for (int i = 0; i < depth; ++i) f[key] = {{"type", "Sequence"}, {list, {f[key]}}};
    });
  };
  EXPECT_THAT(nested("normalizer", "normalizers", 64), IsOk());
  EXPECT_THAT(nested("post_processor", "processors", 64), IsOk());
  EXPECT_THAT(nested("normalizer", "normalizers", 65),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("tokenizer.json: normalizer.normalizers[0].normalizers[0]"),
                             HasSubstr(": a Sequence nested in 64 others"))));
  EXPECT_THAT(nested("post_processor", "processors", 65),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("tokenizer.json: post_processor.processors[0]"),
                             HasSubstr(": a Sequence nested in 64 others"))));
}

// With ignore_merges (Llama 3's files), a piece that is itself a token is that token, even
// where the merges would not build it.
TEST(BpeTokenizerTest, IgnoreMergesTakesWholePiecesFromTheVocabulary) {
  const auto with_token = [](bool ignore_merges) {
    return ParseChanged([=](json& f) {
      f["model"]["vocab"]["zqzq"] = 5000;  // no merge makes it
      f["model"]["ignore_merges"] = ignore_merges;
    });
  };
  absl::StatusOr<std::unique_ptr<Tokenizer>> ignoring = with_token(true);
  absl::StatusOr<std::unique_ptr<Tokenizer>> merging = with_token(false);
  ASSERT_THAT(ignoring, IsOk());
  ASSERT_THAT(merging, IsOk());
  EXPECT_THAT((*ignoring)->Encode("zqzq"), IsOkAndHolds(ElementsAre(5000)));
  absl::StatusOr<std::vector<int32_t>> merged = (*merging)->Encode("zqzq");
  ASSERT_THAT(merged, IsOk());
  EXPECT_GT(merged->size(), 1u);
  EXPECT_THAT((*merging)->Decode(*merged), IsOkAndHolds("zqzq"));
}

TEST(BpeTokenizerTest, AByteFallbackFileNeedsEveryByteToken) {
  EXPECT_THAT(ParseChangedGemma([](json&) {}), IsOk());
  EXPECT_THAT(ParseChangedGemma([](json& f) { f["model"]["vocab"].erase("<0x41>"); }),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("tokenizer.json: model.vocab: has no token \"<0x41>\"; with "
                                 "byte_fallback plait needs one for each of the 256 bytes")));
}

TEST(BpeTokenizerTest, UnsupportedByteFallbackComponentsAreNamed) {
  const json metaspace = {{"type", "Metaspace"},
                          {"replacement", "\u2581"},
                          {"prepend_scheme", "first"},
                          {"split", false}};
  const struct {
    std::function<void(json&)> change;
    const char* message;
  } cases[] = {
      {[&](json& f) {
         f["pre_tokenizer"] = metaspace;
         f["pre_tokenizer"]["prepend_scheme"] = nullptr;
       },
       "pre_tokenizer.prepend_scheme: null is not supported"},
      {[&](json& f) {
         f["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", {metaspace}}};
       },
       "pre_tokenizer.pretokenizers[0].type: \"Metaspace\""},
      {[&](json& f) { f["decoder"] = metaspace; }, "decoder.type: \"Metaspace\""},
      {[](json& f) {
         f["decoder"]["decoders"].push_back({{"type", "ByteFallback"}});
       },
       "decoder.decoders[3].type: \"ByteFallback\" is not supported (supported: after Fuse"},
      {[](json& f) {
         f["normalizer"]["pattern"] = {{"Regex", " +"}};
       },
       "normalizer.pattern: an object"},
      {[](json& f) { f["pre_tokenizer"]["behavior"] = "Contiguous"; },
       "pre_tokenizer.behavior: \"Contiguous\""},
      {[](json& f) {
         f["normalizer"] = {{"type", "Lowercase"}};
       },
       "normalizer.type"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.message);
    EXPECT_THAT(ParseChangedGemma(c.change),
                StatusIs(absl::StatusCode::kUnimplemented, HasSubstr(c.message)));
  }
}

// Older files write Metaspace's add_prefix_space instead of prepend_scheme; Hugging Face reads
// them with the scheme "always" and refuses add_prefix_space false beside any other scheme.
TEST(BpeTokenizerTest, MetaspaceWithoutPrependSchemePrependsAlways) {
  const json always = {{"type", "Metaspace"},
                       {"replacement", "\u2581"},
                       {"prepend_scheme", "always"},
                       {"split", true}};
  const auto with_pre_tokenizer = [](const json& pre_tokenizer) {
    return ParseChangedGemma([&](json& f) { f["pre_tokenizer"] = pre_tokenizer; });
  };
  absl::StatusOr<std::unique_ptr<Tokenizer>> expected = with_pre_tokenizer(always);
  ASSERT_THAT(expected, IsOk());
  // Text after a special token is prepended "\u2581" by "always", not by "first".
  const std::string text = "hello world<eos>again";
  json first = always;
  first["prepend_scheme"] = "first";
  ASSERT_NE(with_pre_tokenizer(first).value()->Encode(text).value(),
            (*expected)->Encode(text).value());
  for (const json& legacy_field : {json::object(), json{{"add_prefix_space", true}}}) {
    json legacy = always;
    legacy.erase("prepend_scheme");
    legacy.update(legacy_field);
    absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = with_pre_tokenizer(legacy);
    ASSERT_THAT(tokenizer, IsOk()) << legacy.dump();
    EXPECT_EQ((*tokenizer)->Encode(text).value(), (*expected)->Encode(text).value())
        << legacy.dump();
  }
  json never = always;
  never["prepend_scheme"] = "never";
  never["add_prefix_space"] = false;
  EXPECT_THAT(with_pre_tokenizer(never), IsOk());
  json refused = always;
  refused.erase("prepend_scheme");
  refused["add_prefix_space"] = false;
  EXPECT_THAT(with_pre_tokenizer(refused),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("pre_tokenizer.add_prefix_space: false does not match "
                                 "prepend_scheme \"always\"")));
}

// A character that is no token becomes its UTF-8 bytes' tokens, which decode to the bytes.
TEST(BpeTokenizerTest, CharactersOutsideTheVocabularyFallBackToBytes) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = ParseChangedGemma([](json&) {});
  ASSERT_THAT(tokenizer, IsOk());
  ASSERT_EQ((*tokenizer)->TokenToId("\xE4\xA8\xBA"), std::nullopt);  // U+4A3A
  EXPECT_THAT((*tokenizer)->Encode("\xE4\xA8\xBA"),
              IsOkAndHolds(ElementsAre(*(*tokenizer)->TokenToId("<0xE4>"),
                                       *(*tokenizer)->TokenToId("<0xA8>"),
                                       *(*tokenizer)->TokenToId("<0xBA>"))));
  EXPECT_THAT((*tokenizer)->Decode({*(*tokenizer)->TokenToId("<0xE4>")}), IsOkAndHolds("\xE4"));
}

// Strip after Fuse (Llama 2's decoder) takes its spaces off the decoded text's ends, not
// each token's.
TEST(BpeTokenizerTest, StripTakesSpacesOffTheDecodedText) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = ParseChangedGemma([](json& f) {
    f["decoder"]["decoders"].push_back(
        {{"type", "Strip"}, {"content", " "}, {"start", 2}, {"stop", 1}});
  });
  ASSERT_THAT(tokenizer, IsOk());
  absl::StatusOr<std::vector<int32_t>> ids = (*tokenizer)->Encode("   a b  ");
  ASSERT_THAT(ids, IsOk());
  EXPECT_THAT((*tokenizer)->Decode(*ids), IsOkAndHolds(" a b "));
}

}  // namespace
}  // namespace plait::data::tokenizer
