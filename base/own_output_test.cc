#include "base/own_output.h"

#include <sys/stat.h>

#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "base/file.h"
#include "base/status_matchers.h"
#include "base/test_paths.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace plait::base {
namespace {

using ::plait::base::testing::FreshTestDir;
using ::plait::base::testing::IsOk;
using ::plait::base::testing::IsOkAndHolds;
using ::plait::base::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// The writer of these tests marks what it writes with a first line "mine".
bool IsMine(const std::string& path) {
  return absl::StartsWith(ReadFile(path).value_or(""), "mine\n");
}

std::string FreshFolder(const std::string& name) {
  const std::string dir = FreshTestDir(name);
  std::filesystem::create_directories(dir);
  return dir;
}

TEST(OwnOutputTest, AFolderThatIsNewOrHoldsOnlyTheWritersOwnFilesIsWritten) {
  const std::string dir = FreshFolder("own_folder");
  EXPECT_THAT(CheckOutputFolder(dir + "/new/deeper", IsMine, "an export"),
              IsOkAndHolds(std::vector<std::string>{}));
  EXPECT_THAT(CheckOutputFolder(dir, IsMine, "an export"),
              IsOkAndHolds(std::vector<std::string>{}));
  ASSERT_THAT(WriteFileAtomically(dir + "/b.bin", "mine\n2"), IsOk());
  ASSERT_THAT(WriteFileAtomically(dir + "/a.bin", "mine\n1"), IsOk());
  EXPECT_THAT(CheckOutputFolder(dir, IsMine, "an export"),
              IsOkAndHolds(ElementsAre(dir + "/a.bin", dir + "/b.bin")));
}

TEST(OwnOutputTest, AFolderHoldingAnythingElseIsRefusedNamingIt) {
  const std::string dir = FreshFolder("foreign_folder");
  ASSERT_THAT(WriteFileAtomically(dir + "/a.bin", "mine\n1"), IsOk());
  ASSERT_THAT(WriteFileAtomically(dir + "/notes.txt", "the user's"), IsOk());
  EXPECT_THAT(CheckOutputFolder(dir, IsMine, "an export"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("\"" + dir +
                                 "\" holds \"notes.txt\", which an export did not write: choose "
                                 "a new or empty folder")));
  std::filesystem::remove(dir + "/notes.txt");
  std::filesystem::create_directory(dir + "/sub");
  EXPECT_THAT(CheckOutputFolder(dir, IsMine, "an export"),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("holds \"sub\"")));
  EXPECT_THAT(CheckOutputFolder(dir + "/a.bin", IsMine, "an export"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("a.bin\" exists and is a regular file, not a folder")));
  EXPECT_THAT(CheckOutputFolder(dir + "/a.bin/x", IsMine, "an export"),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("is not a folder")));
}

TEST(OwnOutputTest, AFileIsWrittenWhenNewOrTheWritersOwn) {
  const std::string dir = FreshFolder("own_file");
  EXPECT_THAT(CheckOutputFile(dir + "/out.bin", IsMine, "tokenize"), IsOkAndHolds(false));
  ASSERT_THAT(WriteFileAtomically(dir + "/out.bin", "mine\n"), IsOk());
  EXPECT_THAT(CheckOutputFile(dir + "/out.bin", IsMine, "tokenize"), IsOkAndHolds(true));
  ASSERT_THAT(WriteFileAtomically(dir + "/other.bin", "theirs"), IsOk());
  EXPECT_THAT(CheckOutputFile(dir + "/other.bin", IsMine, "tokenize"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("\"" + dir +
                                 "/other.bin\" exists and tokenize did not "
                                 "write it: choose another path")));
  EXPECT_THAT(CheckOutputFile(dir, IsMine, "tokenize"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("exists and is a directory, not a file")));
  EXPECT_THAT(CheckOutputFile(dir + "/out.bin/x", IsMine, "tokenize"),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("is not a folder")));
}

// Two spellings of one place resolve alike: through "." and "..", a link to a folder, and a link
// to nothing, which a writer would follow.
TEST(OwnOutputTest, APathResolvesThroughLinksDanglingOnesIncluded) {
  // Resolved already, so that only the links made here differ.
  const std::string dir = std::filesystem::canonical(FreshFolder("resolved")).string();
  std::filesystem::create_directory(dir + "/real");
  std::filesystem::create_symlink(dir + "/real", dir + "/link");
  std::filesystem::create_symlink("missing/deeper", dir + "/dangling");
  EXPECT_EQ(ResolvedPath(dir + "/./real/../real/"), dir + "/real");
  EXPECT_EQ(ResolvedPath(dir + "/link/model"), dir + "/real/model");
  EXPECT_EQ(ResolvedPath(dir + "/dangling"), dir + "/missing/deeper");
  EXPECT_EQ(ResolvedPath(dir + "/link/../dangling/.."), dir + "/missing");
}

// Outputs that are one place, one inside a folder whose writer holds it whole, or an input:
// each refused under the output's field, naming the other's field and both paths.
TEST(OwnOutputTest, OutputsThatMeetEachOtherOrAnInputAreRefused) {
  const std::string dir = std::filesystem::canonical(FreshFolder("apart")).string();
  std::filesystem::create_directory(dir + "/adapter");
  std::filesystem::create_symlink(dir + "/adapter", dir + "/link");
  std::filesystem::create_symlink(dir + "/later", dir + "/dangling");
  const auto messages = [](const std::vector<Violation>& violations) {
    std::vector<std::string> lines;
    for (const Violation& violation : violations) lines.push_back(violation.ToString());
    return lines;
  };
  EXPECT_THAT(
      messages(CheckOutputsApart({{"save_adapter_dir", dir + "/link", true}},
                                 {{"initial_adapter_dir", dir + "/adapter/."}})),
      ElementsAre("save_adapter_dir: \"" + dir + "/link\" (resolved: \"" + dir +
                  "/adapter\") is also initial_adapter_dir (\"" + dir +
                  "/adapter/.\"), an input: writing there would overwrite it; choose another "
                  "path"));
  EXPECT_THAT(
      messages(CheckOutputsApart(
          {{"save_hf_dir", dir + "/later", true}, {"save_adapter_dir", dir + "/dangling", true}},
          {})),
      ElementsAre("save_adapter_dir: \"" + dir + "/dangling\" (resolved: \"" + dir +
                  "/later\") is also save_hf_dir (\"" + dir +
                  "/later\"), an output too: one would overwrite the other; give each its own "
                  "path"));
  EXPECT_THAT(messages(CheckOutputsApart({{"metrics_file", dir + "/model/metrics.jsonl"},
                                          {"save_hf_dir", dir + "/model", true}},
                                         {})),
              ElementsAre("metrics_file: \"" + dir +
                          "/model/metrics.jsonl\" lies inside save_hf_dir (\"" + dir +
                          "/model\"), a folder that holds only its own writer's files: choose a "
                          "path outside it"));
  // Beside each other, inside a folder whose writer keeps to its own names, or holding an
  // input: apart.
  EXPECT_THAT(CheckOutputsApart({{"checkpoint_dir", dir + "/run"},
                                 {"metrics_file", dir + "/run/metrics.jsonl"},
                                 {"save_hf_dir", dir + "/model", true},
                                 {"unset", ""}},
                                {{"hf_weights_dir", dir + "/run/base"}, {"unset", ""}}),
              ::testing::IsEmpty());
}

}  // namespace
}  // namespace plait::base
