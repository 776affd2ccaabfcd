#include "base/file.h"

#include <cstdlib>
#include <filesystem>
#include <string>

#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace plait::base {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::base::testing::IsOkAndHolds;
using ::plait::base::testing::StatusIs;
using ::testing::HasSubstr;

std::string TempPath(const std::string& name) {
  return std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
}

TEST(FileTest, WriteAtomicallyThenReadRoundTripsBytes) {
  const std::string path = TempPath("roundtrip");
  const std::string bytes("a\0b\nc", 5);
  ASSERT_THAT(WriteFileAtomically(path, bytes), IsOk());
  EXPECT_THAT(ReadFile(path), IsOkAndHolds(bytes));
  ASSERT_THAT(WriteFileAtomically(path, "shorter"), IsOk());
  EXPECT_THAT(ReadFile(path), IsOkAndHolds(std::string("shorter")));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST(FileTest, ErrorsNameThePath) {
  EXPECT_THAT(ReadFile(TempPath("missing")),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("missing: cannot open")));
  EXPECT_THAT(WriteFileAtomically(TempPath("no/such/folder/file"), "x"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no/such/folder/file")));
  EXPECT_THAT(SyncToDisk(TempPath("missing")),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("missing")));
}

}  // namespace
}  // namespace plait::base
