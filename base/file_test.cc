#include "base/file.h"

#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "base/status_matchers.h"
#include "base/test_paths.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace plait::base {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::base::testing::IsOkAndHolds;
using ::plait::base::testing::StatusIs;
using ::plait::base::testing::TestPath;
using ::testing::HasSubstr;

TEST(FileTest, WriteAtomicallyThenReadRoundTripsBytes) {
  const std::string path = TestPath("roundtrip");
  const std::string bytes("a\0b\nc", 5);
  ASSERT_THAT(WriteFileAtomically(path, bytes), IsOk());
  EXPECT_THAT(ReadFile(path), IsOkAndHolds(bytes));
  ASSERT_THAT(WriteFileAtomically(path, "shorter"), IsOk());
  EXPECT_THAT(ReadFile(path), IsOkAndHolds(std::string("shorter")));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST(FileTest, ErrorsNameThePath) {
  EXPECT_THAT(ReadFile(TestPath("missing")),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("missing: cannot open")));
  EXPECT_THAT(WriteFileAtomically(TestPath("no/such/folder/file"), "x"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no/such/folder/file")));
  EXPECT_THAT(SyncToDisk(TestPath("missing")),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("missing")));
}

TEST(FileTest, AFolderIsWritableWhenItOrItsNearestExistingAncestorIs) {
  EXPECT_THAT(CheckFolderIsWritable(TestPath("")), IsOk());
  EXPECT_THAT(CheckFolderIsWritable(TestPath("not/yet/there")), IsOk());
  ASSERT_THAT(WriteFileAtomically(TestPath("a_file"), "x"), IsOk());
  EXPECT_THAT(
      CheckFolderIsWritable(TestPath("a_file/sub")),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               HasSubstr("cannot be created: \"" + TestPath("a_file") + "\" is not a folder")));
}

// A link to nothing, as the folder or on the way to it, cannot be created through: refused,
// naming the link and where it points.
TEST(FileTest, AFolderBehindADanglingLinkIsNotWritable) {
  const std::string link = TestPath("dangling");
  std::filesystem::remove(link);
  std::filesystem::create_symlink(TestPath("nowhere"), link);
  for (const std::string& dir : {link, link + "/sub"}) {
    EXPECT_THAT(
        CheckFolderIsWritable(dir),
        StatusIs(absl::StatusCode::kFailedPrecondition,
                 "\"" + dir + "\" cannot be created: \"" + link + "\" is a symbolic link to \"" +
                     TestPath("nowhere") + "\", which does not exist"))
        << dir;
  }
}

// A path given where a file belongs that names a FIFO, a folder or a device fails at once,
// saying what it is, rather than blocking for a writer or reading forever.
TEST(FileTest, ReadingRefusesWhatIsNotARegularFile) {
  const std::string fifo = TestPath("a_fifo");
  std::remove(fifo.c_str());
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_THAT(ReadFile(fifo), StatusIs(absl::StatusCode::kFailedPrecondition,
                                       fifo + ": is a FIFO, not a regular file"));
  EXPECT_THAT(ReadFile(TestPath("")), StatusIs(absl::StatusCode::kFailedPrecondition,
                                               HasSubstr("is a directory, not a regular file")));
  EXPECT_THAT(ReadFile("/dev/zero"), StatusIs(absl::StatusCode::kFailedPrecondition,
                                              "/dev/zero: is a device, not a regular file"));
  EXPECT_EQ(FileKind(S_IFSOCK), "a socket");
}

// A full disk is named as such, and the half-written temporary file does not stay.
TEST(FileTest, AFailedWriteSaysWhyAndLeavesNoTemporaryFile) {
  const std::string path = TestPath("full");
  std::filesystem::remove(path + ".tmp");
  std::filesystem::create_symlink("/dev/full", path + ".tmp");  // every write: ENOSPC
  EXPECT_THAT(WriteFileAtomically(path, std::string(1 << 16, 'x')),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("cannot write: No space left on device")));
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::symlink_status(path + ".tmp")));
  EXPECT_FALSE(std::filesystem::exists(path));
}

}  // namespace
}  // namespace plait::base
