#include "metrics/curves_svg.h"

#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "base/file.h"
#include "base/status_matchers.h"
#include "base/test_paths.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace plait::metrics {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::base::testing::StatusIs;
using ::plait::base::testing::TestPath;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::Optional;
using ::testing::Pair;
using ::testing::SizeIs;

// The points attribute of the polyline of `metric` of `run` in `svg`, split into its points;
// empty when there is none.
std::vector<std::string> PolylinePoints(const std::string& svg, const std::string& run,
                                        const std::string& metric) {
  const std::regex polyline("<polyline class=\"series\" data-run=\"" + run + "\" data-metric=\"" +
                            metric + "\"[^>]* points=\"([^\"]*)\"/>");
  std::smatch match;
  if (!std::regex_search(svg, match, polyline)) return {};
  return absl::StrSplit(match[1].str(), ' ');
}

// The elements of `svg` nest and close, and no '<' or '&' stands unescaped in its text: the
// structure of XML (the reference test parses the picture of a real run with Python's
// xml.etree).
void ExpectWellFormed(const std::string& svg) {
  std::vector<std::string> open;
  const std::regex token("<(/?)([a-zA-Z?][^ />]*)[^>]*?(/?)>|&(?!(amp|lt|gt|quot|apos);)");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), token); it != std::sregex_iterator();
       ++it) {
    const std::smatch& match = *it;
    ASSERT_TRUE(match[2].matched) << "an unescaped & at " << match.position();
    const std::string name = match[2].str();
    if (name[0] == '?') continue;  // the XML declaration
    if (!match[1].str().empty()) {
      ASSERT_FALSE(open.empty()) << "</" << name << "> closes nothing";
      ASSERT_EQ(open.back(), name) << "at " << match.position();
      open.pop_back();
    } else if (match[3].str().empty()) {
      open.push_back(name);
    }
  }
  EXPECT_THAT(open, IsEmpty());
  EXPECT_THAT(std::regex_replace(svg, std::regex("<[^>]*>"), ""), Not(HasSubstr("<")));
}

RunCurves Curves(const std::string& name, int64_t steps, std::optional<double> floor) {
  RunCurves run;
  run.name = name;
  run.entropy_floor = floor;
  for (int64_t step = 1; step <= steps; ++step) {
    run.series["loss"].emplace_back(step, 4.0 / step);
    run.series["lr"].emplace_back(step, 1e-3);
    run.series["tokens_per_s"].emplace_back(step, 1000.0 + step);
    if (step % 2 == 0) run.series["eval_loss"].emplace_back(step, 4.5 / step);
  }
  return run;
}

TEST(CurvesSvgTest, DrawsAPointPerStepOfEachRunWithTheFloorAndALegend) {
  const std::string svg = CurvesSvg({Curves("a", 7, 1.25), Curves("b<&>", 3, std::nullopt)});
  ExpectWellFormed(svg);
  EXPECT_THAT(PolylinePoints(svg, "a", "loss"), SizeIs(7));
  EXPECT_THAT(PolylinePoints(svg, "a", "eval_loss"), SizeIs(3));
  EXPECT_THAT(PolylinePoints(svg, "a", "lr"), SizeIs(7));
  EXPECT_THAT(PolylinePoints(svg, "a", "tokens_per_s"), SizeIs(7));
  EXPECT_THAT(PolylinePoints(svg, "a", "grad_norm"), IsEmpty());  // not logged
  EXPECT_THAT(PolylinePoints(svg, "b&lt;&amp;&gt;", "loss"), SizeIs(3));
  EXPECT_THAT(svg, HasSubstr(">b&lt;&amp;&gt;</text>"));  // in the legend
  EXPECT_THAT(svg, HasSubstr("<line class=\"floor\" data-run=\"a\""));
  EXPECT_THAT(svg, Not(HasSubstr("<line class=\"floor\" data-run=\"b")));
}

// Step 1 at the left edge of the plotting area and the last step at its right, the largest
// loss near the top: the points are where the numbers say.
TEST(CurvesSvgTest, PlacesThePointsOnTheAxes) {
  const std::vector<std::string> points =
      PolylinePoints(CurvesSvg({Curves("a", 5, 1.0)}), "a", "loss");
  ASSERT_THAT(points, SizeIs(5));
  // x: the left margin. y: the frame's top (legend 36 + margin 28 = 64) plus its height (236)
  // times the padding over the top value, 5% of the losses' range (4 - 0.8) over the padded
  // range: 64 + 236 * 0.16 / 3.52.
  EXPECT_EQ(points.front(), "64.0,74.73");
  EXPECT_THAT(points.back(), testing::StartsWith("464.0,"));
}

TEST(CurvesSvgTest, OneStepOrNoRunsStillMakeAPicture) {
  ExpectWellFormed(CurvesSvg({Curves("a", 1, std::nullopt)}));
  ExpectWellFormed(CurvesSvg({}));
}

// What a rerun of tools/plot may replace: its own pictures, no other SVG.
TEST(CurvesSvgTest, KnowsItsOwnPictures) {
  EXPECT_TRUE(IsCurvesSvg(CurvesSvg({})));
  EXPECT_FALSE(IsCurvesSvg("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg/>\n"));
  EXPECT_FALSE(IsCurvesSvg(""));
}

TEST(ReadRunCurvesTest, ReadsTheRowsAndTheFloorOfTheSummaryBeside) {
  const std::string path = TestPath("curves.jsonl");
  ASSERT_THAT(base::WriteFileAtomically(
                  path,
                  "{\"step\":1,\"loss\":3.5,\"lr\":0.1}\n"
                  "{\"step\":2,\"loss\":null,\"lr\":0.2,\"eval_loss\":3.0,\"skipped\":true}\n"
                  "{\"step\":3,\"loss\":2"),
              IsOk());
  ASSERT_THAT(
      base::WriteFileAtomically(TestPath("curves.run_summary.json"), "{\"entropy_floor\": 1.5}\n"),
      IsOk());
  absl::StatusOr<RunCurves> run = ReadRunCurves(path, "curves");
  ASSERT_THAT(run, IsOk());
  EXPECT_EQ(run->name, "curves");
  EXPECT_THAT(run->series, ElementsAre(Pair("eval_loss", ElementsAre(Pair(2, 3.0))),
                                       Pair("loss", ElementsAre(Pair(1, 3.5))),
                                       Pair("lr", ElementsAre(Pair(1, 0.1), Pair(2, 0.2)))));
  EXPECT_THAT(run->entropy_floor, Optional(1.5));
}

TEST(ReadRunCurvesTest, AFileWithoutRowsIsNamed) {
  const std::string path = TestPath("notes.txt");
  ASSERT_THAT(base::WriteFileAtomically(path, "my notes\n"), IsOk());
  EXPECT_THAT(ReadRunCurves(path, "notes"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("\"" + path + "\" holds no metrics row")));
  EXPECT_THAT(ReadRunCurves(TestPath("missing.jsonl"), "missing"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("missing.jsonl")));
}

}  // namespace
}  // namespace plait::metrics
