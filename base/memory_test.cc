#include "base/memory.h"

#include <vector>

#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace plait::base {
namespace {

using ::plait::base::testing::IsOk;
using ::testing::Optional;

TEST(PeakResidentBytesTest, GrowsWithMemoryTheProcessTouches) {
  const int64_t before = PeakResidentBytes();
  EXPECT_GT(before, 0);
  constexpr size_t kBytes = size_t{256} << 20;  // more than a test process holds before
  std::vector<char> touched(kBytes, 1);
  EXPECT_GE(PeakResidentBytes(), static_cast<int64_t>(kBytes));
  EXPECT_GE(PeakResidentBytes(), before);
}

TEST(MemAvailableBytesTest, ReadsTheLineInKibibytes) {
  EXPECT_THAT(MemAvailableBytes("MemTotal:       24683652 kB\n"
                                "MemFree:         3224560 kB\n"
                                "MemAvailable:   21876528 kB\n"),
              Optional(int64_t{21876528} * 1024));
}

TEST(MemAvailableBytesTest, MissingOrMalformedIsNullopt) {
  EXPECT_EQ(MemAvailableBytes("MemTotal: 100 kB\n"), std::nullopt);
  EXPECT_EQ(MemAvailableBytes("MemAvailable: lots kB\n"), std::nullopt);
  EXPECT_EQ(MemAvailableBytes("MemAvailable: 100\n"), std::nullopt);
  EXPECT_EQ(MemAvailableBytes("MemAvailable: 99999999999999999 kB\n"), std::nullopt);
}

TEST(MemoryCgroupTest, PrefersTheV1MemoryController) {
  const std::optional<CgroupPath> cgroup =
      MemoryCgroup("9:name=systemd:/\n4:cpu,memory:/jobs/a1\n0::/\n");
  ASSERT_TRUE(cgroup.has_value());
  EXPECT_EQ(cgroup->path, "/jobs/a1");
  EXPECT_TRUE(cgroup->v1);
}

TEST(MemoryCgroupTest, FallsBackToTheUnifiedHierarchy) {
  const std::optional<CgroupPath> cgroup = MemoryCgroup("0::/user.slice/job.scope\n");
  ASSERT_TRUE(cgroup.has_value());
  EXPECT_EQ(cgroup->path, "/user.slice/job.scope");
  EXPECT_FALSE(cgroup->v1);
  EXPECT_EQ(MemoryCgroup("garbage\n"), std::nullopt);
}

TEST(CgroupLimitBytesTest, NoLimitIsNullopt) {
  EXPECT_THAT(CgroupLimitBytes("8589934592\n"), Optional(int64_t{8589934592}));
  EXPECT_EQ(CgroupLimitBytes("max\n"), std::nullopt);
  EXPECT_EQ(CgroupLimitBytes("9223372036854771712\n"), std::nullopt);
  EXPECT_EQ(CgroupLimitBytes("-1"), std::nullopt);
}

TEST(AvailableMemoryBytesTest, ThisMachineHasSome) {
  absl::StatusOr<int64_t> bytes = AvailableMemoryBytes();
  ASSERT_THAT(bytes.status(), IsOk());
  EXPECT_GT(*bytes, 0);
}

}  // namespace
}  // namespace plait::base
