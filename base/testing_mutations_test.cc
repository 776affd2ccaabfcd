#include "base/testing_mutations.h"

#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest-spi.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace plait::base::testing {
namespace {

using ::testing::HasSubstr;

TEST(MutatorTest, TheSameSeedGivesTheSameMutations) {
  Mutator a(7), b(7);
  for (int i = 0; i < 200; ++i) {
    std::string x = "{\"step\": 4, \"mesh\": \"dp=2\"}", y = x;
    EXPECT_EQ(a.MutateBytes(x), b.MutateBytes(y));
    EXPECT_EQ(x, y);
  }
}

TEST(MutatorTest, ByteEditsChangeTheBytesTheWayTheySay) {
  Mutator mutator(1);
  const std::string valid = "0123456789abcdef";
  std::string bytes = valid;
  EXPECT_THAT(mutator.FlipByte(bytes), HasSubstr("flip byte"));
  EXPECT_EQ(bytes.size(), valid.size());
  EXPECT_NE(bytes, valid);
  bytes = valid;
  mutator.Truncate(bytes);
  EXPECT_LT(bytes.size(), valid.size());
  bytes = valid;
  mutator.DeleteRun(bytes);
  EXPECT_LT(bytes.size(), valid.size());
  bytes = valid;
  mutator.InsertRun(bytes);
  EXPECT_GT(bytes.size(), valid.size());
  bytes = valid;
  mutator.DuplicateSpan(bytes);
  EXPECT_GT(bytes.size(), valid.size());
  bytes = "";
  mutator.FlipByte(bytes);  // nothing to flip: a run is inserted
  EXPECT_FALSE(bytes.empty());
}

TEST(MutatorTest, ReplaceNumberChangesNumbersButNotNames) {
  Mutator mutator(3);
  for (int i = 0; i < 100; ++i) {
    std::string text = "dtype: F32 shape: [4, 2] lr: 3e-3 name: \"x2\"";
    const std::string what = mutator.ReplaceNumber(text);
    EXPECT_TRUE(absl::StrContains(text, "F32")) << what;
    EXPECT_TRUE(absl::StrContains(text, "x2")) << what;
    EXPECT_FALSE(absl::StrContains(text, "3e-3") && absl::StrContains(text, "[4, 2]")) << what;
    EXPECT_THAT(what, HasSubstr("number at"));
  }
  std::string no_numbers = "abc";
  EXPECT_THAT(mutator.ReplaceNumber(no_numbers), HasSubstr("flip byte"));
}

TEST(MutatorTest, NestNumberNestsOneNumber) {
  Mutator mutator(4);
  std::string text = "{\"a\": 5}";
  mutator.NestNumber(text, 3, "[", "]");
  EXPECT_EQ(text, "{\"a\": [[[5]]]}");
}

TEST(MutatorTest, LineEditsWorkOnLines) {
  Mutator mutator(5);
  std::string text = "a\nb\nc";
  EXPECT_THAT(mutator.DeleteLine(text), HasSubstr("delete line"));
  EXPECT_EQ(text.size(), 3u);  // two lines of one letter
  text = "a\nb\nc";
  mutator.DuplicateLine(text);
  EXPECT_EQ(text.size(), 7u);
  text = "a\nb\nc";
  mutator.SwapLines(text);
  EXPECT_EQ(text.size(), 5u);
  for (int i = 0; i < 20; ++i) {
    text = "a\nb\nc";
    EXPECT_THAT(mutator.MutateLines(text),
                ::testing::AnyOf(HasSubstr("delete line"), HasSubstr("duplicate line"),
                                 HasSubstr("swap lines")));
  }
}

TEST(MutatorTest, JsonEditsLeaveValidJsonAndNameTheNode) {
  Mutator mutator(6);
  for (int i = 0; i < 300; ++i) {
    nlohmann::json json = {{"step", 4}, {"shape", {2, 3}}, {"meta", {{"format", "pt"}}}};
    const std::string what = mutator.MutateJson(json);
    EXPECT_FALSE(nlohmann::json::parse(json.dump(), nullptr, false).is_discarded()) << what;
    EXPECT_TRUE(absl::StartsWith(what, "/") || absl::StartsWith(what, ":")) << what;
  }
}

TEST(MutationCasesTest, CountsOutcomesByKind) {
  MutationCases cases(absl::Seconds(5));
  EXPECT_TRUE(cases.Run("a", "first", [] { return absl::OkStatus(); }).ok());
  EXPECT_FALSE(cases.Run("a", "second", [] { return absl::InvalidArgumentError("x"); }).ok());
  EXPECT_FALSE(cases.Run("b", "third", [] { return absl::InvalidArgumentError("y"); }).ok());
  EXPECT_EQ(cases.accepted(), 1);
  EXPECT_EQ(cases.rejected(), 2);
  EXPECT_EQ(cases.Summary("t"),
            "t: 3 cases, 1 accepted, 2 rejected\n"
            "  a: 2 cases, 1 accepted, 1 rejected\n"
            "  b: 1 cases, 0 accepted, 1 rejected\n");
}

TEST(MutationCasesTest, AnEscapingExceptionFailsTheTestNamingTheCase) {
  MutationCases cases(absl::Seconds(5));
  absl::Status status;
  EXPECT_NONFATAL_FAILURE(
      status = cases.Run("a", "the case", []() -> absl::Status { throw std::out_of_range("x"); }),
      "in case: the case");
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
}

TEST(MutationCasesDeathTest, AHangAbortsNamingTheCase) {
  EXPECT_DEATH(
      {
        MutationCases cases(absl::Milliseconds(100));
        (void)cases.Run("a", "the slow case", [] {
          absl::SleepFor(absl::Seconds(10));
          return absl::OkStatus();
        });
      },
      "ran past 100ms: the slow case");
}

TEST(MutationCasesDeathTest, ACrashNamesTheCase) {
  EXPECT_DEATH(
      {
        MutationCases cases(absl::Seconds(5));
        (void)cases.Run("a", "the crashing case", []() -> absl::Status { std::abort(); });
      },
      "in mutation case: the crashing case");
}

// Recurses until the stack overflows.
int Recurse(int depth) {
  volatile char frame[1024];
  frame[0] = static_cast<char>(depth);
  return depth == 0 ? 0 : Recurse(depth - 1) + frame[0];
}

TEST(MutationCasesDeathTest, AStackOverflowNamesTheCase) {
  EXPECT_DEATH(
      {
        MutationCases cases(absl::Seconds(5));
        (void)cases.Run("a", "the deep case",
                        [] { return absl::InternalError(absl::StrCat(Recurse(1 << 30))); });
      },
      "in mutation case: the deep case");
}

}  // namespace
}  // namespace plait::base::testing
