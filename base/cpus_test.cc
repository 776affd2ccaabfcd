#include "base/cpus.h"

#include <optional>

#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace plait::base {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::base::testing::IsOkAndHolds;
using ::plait::base::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::Field;
using ::testing::HasSubstr;
using ::testing::Optional;

auto Folder(const std::string& path, int version) {
  return AllOf(Field(&CgroupFolder::path, path), Field(&CgroupFolder::version, version));
}

TEST(ParseCpuMaxTest, ReadsQuotaOverPeriod) {
  EXPECT_THAT(ParseCpuMax("150000 100000\n"), IsOkAndHolds(Optional(1.5)));
  EXPECT_THAT(ParseCpuMax("200000 100000"), IsOkAndHolds(Optional(2.0)));
  EXPECT_THAT(ParseCpuMax("max 100000\n"), IsOkAndHolds(std::nullopt));
}

TEST(ParseCpuMaxTest, RefusesOtherTexts) {
  for (const char* text : {"", "max", "150000", "150000 0", "-1 100000", "0 100000", "max max",
                           "1.5 100000", "150000 100000 7"}) {
    EXPECT_THAT(ParseCpuMax(text), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"")))
        << text;
  }
}

TEST(ParseCfsQuotaTest, ReadsQuotaOverPeriod) {
  EXPECT_THAT(ParseCfsQuota("50000\n", "100000\n"), IsOkAndHolds(Optional(0.5)));
  EXPECT_THAT(ParseCfsQuota("400000", "100000"), IsOkAndHolds(Optional(4.0)));
  EXPECT_THAT(ParseCfsQuota("-1\n", "100000\n"), IsOkAndHolds(std::nullopt));
}

TEST(ParseCfsQuotaTest, RefusesOtherTexts) {
  EXPECT_THAT(ParseCfsQuota("-2", "100000"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("quota \"-2\"")));
  EXPECT_THAT(ParseCfsQuota("max", "100000"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("quota \"max\"")));
  EXPECT_THAT(ParseCfsQuota("50000", "0"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("period \"0\"")));
  EXPECT_THAT(ParseCfsQuota("-1", ""),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("period \"\"")));
}

// A container on a cgroup v2 machine with its own cgroup namespace: it sees its cgroup as
// the root of what is mounted.
TEST(CpuCgroupFoldersTest, NamespacedV2) {
  EXPECT_THAT(CpuCgroupFolders("0::/\n",
                               "30 25 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 "
                               "rw,nsdelegate\n"),
              ElementsAre(Folder("/sys/fs/cgroup", 2)));
}

// A systemd service on a cgroup v2 host: its folder and every ancestor can cap it.
TEST(CpuCgroupFoldersTest, V2ServiceAndItsAncestors) {
  EXPECT_THAT(CpuCgroupFolders("0::/system.slice/train.service\n",
                               "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n"
                               "30 25 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"),
              ElementsAre(Folder("/sys/fs/cgroup/system.slice/train.service", 2),
                          Folder("/sys/fs/cgroup/system.slice", 2), Folder("/sys/fs/cgroup", 2)));
}

// A cgroup v1 (hybrid) machine, as Docker without cgroup namespaces mounts it: the cpu
// hierarchy shows only the container's folder, and /proc/self/cgroup names it in full.
TEST(CpuCgroupFoldersTest, V1MountOfTheContainersFolder) {
  const char* proc_cgroup =
      "12:memory:/docker/abc\n"
      "4:cpu,cpuacct:/docker/abc\n"
      "1:name=systemd:/docker/abc\n"
      "0::/docker/abc\n";
  const char* mountinfo =
      "40 31 0:35 /docker/abc /sys/fs/cgroup/cpu,cpuacct ro,nosuid master:17 - cgroup cgroup "
      "rw,cpu,cpuacct\n"
      "41 31 0:36 /docker/abc /sys/fs/cgroup/memory ro - cgroup cgroup rw,memory\n";
  EXPECT_THAT(CpuCgroupFolders(proc_cgroup, mountinfo),
              ElementsAre(Folder("/sys/fs/cgroup/cpu,cpuacct", 1)));
}

TEST(CpuCgroupFoldersTest, HybridWithBothHierarchies) {
  const char* proc_cgroup =
      "1:cpu:/jobs/a\n"
      "0::/jobs/a\n";
  const char* mountinfo =
      "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
      "33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct\n"
      "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";
  EXPECT_THAT(
      CpuCgroupFolders(proc_cgroup, mountinfo),
      ElementsAre(Folder("/sys/fs/cgroup/cpu/jobs/a", 1), Folder("/sys/fs/cgroup/cpu/jobs", 1),
                  Folder("/sys/fs/cgroup/cpu", 1), Folder("/sys/fs/cgroup/unified/jobs/a", 2),
                  Folder("/sys/fs/cgroup/unified/jobs", 2), Folder("/sys/fs/cgroup/unified", 2)));
}

TEST(CpuCgroupFoldersTest, UnescapesMountPointsAndSkipsWhatIsNotMounted) {
  EXPECT_THAT(CpuCgroupFolders("0::/a\n", "30 25 0:26 / /cg\\040root rw - cgroup2 none rw\n"),
              ElementsAre(Folder("/cg root/a", 2), Folder("/cg root", 2)));
  // No cpu controller in v1, and no v2 mount.
  EXPECT_THAT(CpuCgroupFolders("5:memory:/a\n0::/a\n",
                               "41 31 0:36 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"),
              ElementsAre());
  EXPECT_THAT(CpuCgroupFolders("", ""), ElementsAre());
}

TEST(UsableCpusTest, CountsTheTighterOfAffinityAndQuota) {
  UsableCpus cpus;
  cpus.affinity = 8;
  EXPECT_EQ(cpus.count(), 8);
  EXPECT_EQ(cpus.Describe(), "8 usable CPUs: affinity 8, no cgroup quota");
  cpus.quota = 1.5;
  cpus.quota_file = "/sys/fs/cgroup/cpu.max";
  EXPECT_EQ(cpus.count(), 2);
  EXPECT_EQ(cpus.Describe(),
            "2 usable CPUs: affinity 8, cgroup quota 1.5 (/sys/fs/cgroup/cpu.max)");
  cpus.quota = 0.25;
  EXPECT_EQ(cpus.count(), 1);
  EXPECT_EQ(cpus.Describe(),
            "1 usable CPU: affinity 8, cgroup quota 0.25 (/sys/fs/cgroup/cpu.max)");
  cpus.quota = 32;
  EXPECT_EQ(cpus.count(), 8);
}

TEST(UsableCpusTest, SplitsAmongLocalRanksKeepingOne) {
  UsableCpus cpus;
  cpus.affinity = 32;
  EXPECT_EQ(cpus.PerRank(1), 32);
  EXPECT_EQ(cpus.PerRank(4), 8);
  EXPECT_EQ(cpus.PerRank(3), 10);
  EXPECT_EQ(cpus.PerRank(64), 1);
}

// Whatever this machine allows, it allows at least one CPU.
TEST(ReadUsableCpusTest, ReadsThisMachine) {
  absl::StatusOr<UsableCpus> cpus = ReadUsableCpus();
  ASSERT_THAT(cpus, IsOk());
  EXPECT_GE(cpus->affinity, 1);
  EXPECT_GE(cpus->count(), 1);
}

}  // namespace
}  // namespace plait::base
