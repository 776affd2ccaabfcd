#include "base/memory.h"

#include <sys/resource.h>

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/file.h"

namespace plait::base {
namespace {

constexpr char kMeminfo[] = "/proc/meminfo";

// cgroup v1 writes "no limit" as 2^63 rounded down to a page; anything this large is no limit.
constexpr int64_t kNoLimit = int64_t{1} << 62;

// The limit files of `cgroup`, most specific first: its own folder, then the hierarchy's
// root, which is the cgroup itself when the process runs in a cgroup namespace.
std::vector<std::string> LimitFiles(const CgroupPath& cgroup) {
  const std::string root = cgroup.v1 ? "/sys/fs/cgroup/memory" : "/sys/fs/cgroup";
  const std::string file = cgroup.v1 ? "/memory.limit_in_bytes" : "/memory.max";
  return {root + cgroup.path + file, root + file};
}

}  // namespace

int64_t PeakResidentBytes() {
  struct rusage usage = {};
  getrusage(RUSAGE_SELF, &usage);          // fails only for a bad argument
  return int64_t{usage.ru_maxrss} * 1024;  // Linux counts it in KiB
}

std::optional<int64_t> MemAvailableBytes(absl::string_view meminfo) {
  for (absl::string_view line : absl::StrSplit(meminfo, '\n')) {
    if (!absl::ConsumePrefix(&line, "MemAvailable:")) continue;
    line = absl::StripAsciiWhitespace(line);
    int64_t kib = 0;
    if (absl::ConsumeSuffix(&line, "kB") &&
        absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &kib) && kib >= 0 &&
        kib <= std::numeric_limits<int64_t>::max() / 1024) {
      return kib * 1024;
    }
    return std::nullopt;
  }
  return std::nullopt;
}

std::optional<CgroupPath> MemoryCgroup(absl::string_view proc_self_cgroup) {
  std::optional<CgroupPath> unified;
  for (absl::string_view line : absl::StrSplit(proc_self_cgroup, '\n', absl::SkipEmpty())) {
    const std::vector<absl::string_view> parts = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (parts.size() != 3) continue;
    if (parts[0] == "0" && parts[1].empty()) unified = CgroupPath{std::string(parts[2]), false};
    for (absl::string_view controller : absl::StrSplit(parts[1], ',')) {
      if (controller == "memory") return CgroupPath{std::string(parts[2]), true};
    }
  }
  return unified;
}

std::optional<int64_t> CgroupLimitBytes(absl::string_view limit) {
  int64_t bytes = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(limit), &bytes) || bytes < 0 ||
      bytes >= kNoLimit) {
    return std::nullopt;
  }
  return bytes;
}

absl::StatusOr<int64_t> AvailableMemoryBytes() {
  absl::StatusOr<std::string> meminfo = ReadFile(kMeminfo);
  if (!meminfo.ok()) return meminfo.status();
  std::optional<int64_t> available = MemAvailableBytes(*meminfo);
  if (!available.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat(kMeminfo, " has no MemAvailable line (a kernel older than 3.14?)"));
  }
  absl::StatusOr<std::string> cgroups = ReadFile("/proc/self/cgroup");
  const std::optional<CgroupPath> cgroup = cgroups.ok() ? MemoryCgroup(*cgroups) : std::nullopt;
  if (!cgroup.has_value()) return *available;
  for (const std::string& file : LimitFiles(*cgroup)) {
    absl::StatusOr<std::string> limit = ReadFile(file);
    if (!limit.ok()) continue;
    if (std::optional<int64_t> bytes = CgroupLimitBytes(*limit)) {
      return std::min(*available, *bytes);
    }
    return *available;
  }
  return *available;
}

}  // namespace plait::base
