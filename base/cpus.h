// The CPUs this process may compute on, for sizing its compute thread pools: those its
// affinity mask allows (sched_getaffinity), fewer when a cgroup caps its CPU time (cgroup
// v2's cpu.max, v1's cpu.cfs_quota_us over cpu.cfs_period_us). A container given two CPUs'
// worth of time on a 64-core machine still sees 64 cores in its mask; 64 threads there would
// each get a thirty-second of a core and wait on each other. A training rank takes its share:
//
//   PLAIT_ASSIGN_OR_RETURN(const UsableCpus cpus, ReadUsableCpus());
//   const int threads = cpus.PerRank(local_ranks);
//   std::cout << cpus.Describe();  // "2 usable CPUs: affinity 2, no cgroup quota"
#ifndef PLAIT_BASE_CPUS_H_
#define PLAIT_BASE_CPUS_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace plait::base {

struct UsableCpus {
  int affinity = 1;  // CPUs in the affinity mask
  // The tightest CPU quota of this process's cgroup and its ancestors, in CPUs (quota /
  // period), and the file it was read from; nullopt when no cgroup caps the CPU time.
  std::optional<double> quota;
  std::string quota_file;

  // min(affinity, the quota rounded up), at least 1: a quota of 1.5 CPUs keeps two threads
  // busy half the time, as Go's and Java's runtimes size their pools.
  int count() const;
  // The share of `local_ranks` processes that split the CPUs: count() / local_ranks, at least 1.
  int PerRank(int local_ranks) const;
  // "2 usable CPUs: affinity 2, no cgroup quota", or "..., cgroup quota 1.5 (FILE)".
  std::string Describe() const;
};

// Reads them from the kernel: the affinity mask, /proc/self/cgroup, /proc/self/mountinfo and
// the cgroup files of the CPU controller. A cgroup file that is missing sets no quota (the root
// cgroup has none); one that exists but cannot be read or parsed is an error naming it.
absl::StatusOr<UsableCpus> ReadUsableCpus();

// The parts ReadUsableCpus reads the kernel's files with, for tests on fixture texts.

// A cgroup folder whose CPU controller files ReadUsableCpus reads.
struct CgroupFolder {
  std::string path;
  int version = 2;  // 2: cpu.max; 1: cpu.cfs_quota_us and cpu.cfs_period_us
};

// The folders of this process's cgroups that hold CPU controller files, each followed by its
// ancestors up to its hierarchy's mount point: from `proc_cgroup` (/proc/self/cgroup:
// "0::/path" for v2, "4:cpu,cpuacct:/path" for v1) and `mountinfo` (/proc/self/mountinfo: where
// each hierarchy is mounted, and which of its folders the mount shows).
std::vector<CgroupFolder> CpuCgroupFolders(absl::string_view proc_cgroup,
                                           absl::string_view mountinfo);

// The quota in CPUs of cgroup v2's cpu.max ("150000 100000": 1.5; "max 100000": nullopt).
// InvalidArgument for any other text.
absl::StatusOr<std::optional<double>> ParseCpuMax(absl::string_view text);

// The quota in CPUs of cgroup v1's cpu.cfs_quota_us over cpu.cfs_period_us ("-1": nullopt).
// InvalidArgument for any other text.
absl::StatusOr<std::optional<double>> ParseCfsQuota(absl::string_view quota_us,
                                                    absl::string_view period_us);

}  // namespace plait::base

#endif  // PLAIT_BASE_CPUS_H_
