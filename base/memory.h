// How much memory this machine can still give the processes of a job: the kernel's
// MemAvailable, lowered to the memory limit of the cgroup the process runs in (a container's
// or a scheduler's), so that a plan that cannot fit is refused before training starts; and
// how much a process has used at most, for a run's summary:
//
//   PLAIT_ASSIGN_OR_RETURN(int64_t bytes, AvailableMemoryBytes());
//   int64_t peak = PeakResidentBytes();
#ifndef PLAIT_BASE_MEMORY_H_
#define PLAIT_BASE_MEMORY_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace plait::base {

// The memory available to this process: MemAvailable from /proc/meminfo, or the limit of
// the process's memory cgroup (v2 memory.max, v1 memory.limit_in_bytes) when that is lower.
// The cgroup's own usage is not subtracted: it counts page cache the kernel would reclaim.
// An error naming /proc/meminfo when that cannot be read or has no MemAvailable.
absl::StatusOr<int64_t> AvailableMemoryBytes();

// The most memory this process has held resident so far (getrusage's ru_maxrss).
int64_t PeakResidentBytes();

// MemAvailable of /proc/meminfo's text, in bytes; nullopt when there is no such line.
std::optional<int64_t> MemAvailableBytes(absl::string_view meminfo);

// The memory cgroup of /proc/self/cgroup's text: its path, under the v2 hierarchy ("0::/a/b")
// or the v1 memory controller ("4:memory:/a/b"), and whether it is v1.
struct CgroupPath {
  std::string path;
  bool v1 = false;
};
std::optional<CgroupPath> MemoryCgroup(absl::string_view proc_self_cgroup);

// A cgroup limit file's value in bytes; nullopt for "max" and the near-2^63 values that v1
// writes for "no limit".
std::optional<int64_t> CgroupLimitBytes(absl::string_view limit);

}  // namespace plait::base

#endif  // PLAIT_BASE_MEMORY_H_
