#include "data/jsonl_lines.h"

#include <string>
#include <utility>
#include <vector>

#include "base/file.h"
#include "base/status_matchers.h"
#include "base/test_paths.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace plait::data {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::base::testing::IsOkAndHolds;
using ::plait::base::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

using Lines = std::vector<std::pair<int64_t, std::string>>;

// The lines ForEachJsonlLine gives for a file holding `text`, or its error.
absl::StatusOr<Lines> LinesOf(const std::string& text, int64_t max_line_bytes) {
  const std::string path = base::testing::TestPath("lines.jsonl");
  EXPECT_THAT(base::WriteFileAtomically(path, text), IsOk());
  Lines lines;
  const absl::Status status = ForEachJsonlLine(
      path,
      [&](std::string& line, int64_t number) {
        lines.emplace_back(number, std::move(line));
        return absl::OkStatus();
      },
      max_line_bytes);
  if (!status.ok()) return status;
  return lines;
}

TEST(JsonlLinesTest, GivesEveryLineWithItsNumberAsGetlineDoes) {
  EXPECT_THAT(LinesOf("{\"a\": 1}\n\n{\"b\": 2}\r\n{\"c\"", 16),
              IsOkAndHolds(ElementsAre(Pair(1, "{\"a\": 1}"), Pair(2, ""), Pair(3, "{\"b\": 2}\r"),
                                       Pair(4, "{\"c\""))));
  EXPECT_THAT(LinesOf("", 16), IsOkAndHolds(ElementsAre()));
}

// A line of exactly the bound is read; one byte more is refused, naming the file, the line
// and the bound, whether it ends with '\n' or the file ends first.
TEST(JsonlLinesTest, ALineOverTheBoundIsNamedByFileAndLine) {
  const std::string at_bound(64, 'x');
  EXPECT_THAT(LinesOf("1\n" + at_bound + "\n", 64),
              IsOkAndHolds(ElementsAre(Pair(1, "1"), Pair(2, at_bound))));
  for (const char* end : {"\n", "\n3\n", ""}) {
    EXPECT_THAT(LinesOf("1\n" + at_bound + "x" + end, 64),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("lines.jsonl:2: longer than 64 bytes, the most a JSONL line "
                                   "may hold")));
  }
}

// A line longer than a read's chunk (1 MiB) is joined across reads.
TEST(JsonlLinesTest, ALineLongerThanOneReadIsWhole) {
  const std::string long_line(3 << 20, 'y');
  EXPECT_THAT(LinesOf("a\n" + long_line + "\nb", kMaxJsonlLineBytes),
              IsOkAndHolds(ElementsAre(Pair(1, "a"), Pair(2, long_line), Pair(3, "b"))));
}

TEST(JsonlLinesTest, TheCallersErrorStopsTheReading) {
  const std::string path = base::testing::TestPath("stop.jsonl");
  ASSERT_THAT(base::WriteFileAtomically(path, "1\n2\n3\n"), IsOk());
  int calls = 0;
  EXPECT_THAT(ForEachJsonlLine(path,
                               [&](std::string&, int64_t number) {
                                 ++calls;
                                 return number == 2 ? absl::InvalidArgumentError("stop")
                                                    : absl::OkStatus();
                               }),
              StatusIs(absl::StatusCode::kInvalidArgument, "stop"));
  EXPECT_EQ(calls, 2);
  EXPECT_THAT(ForEachJsonlLine(base::testing::TestPath("absent.jsonl"),
                               [](std::string&, int64_t) { return absl::OkStatus(); }),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("absent.jsonl")));
}

}  // namespace
}  // namespace plait::data
