#include "base/cpus.h"

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "absl/algorithm/container.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/file.h"
#include "base/status.h"

namespace plait::base {
namespace {

// A positive count of microseconds, as the cgroup files write them.
std::optional<int64_t> ParseMicroseconds(absl::string_view text) {
  int64_t value = 0;
  if (!absl::SimpleAtoi(text, &value) || value <= 0) return std::nullopt;
  return value;
}

// A mountinfo field with its octal escapes (a space is "\040") undone.
std::string Unescape(absl::string_view field) {
  std::string out;
  for (size_t i = 0; i < field.size(); ++i) {
    if (field[i] == '\\' && i + 3 < field.size() &&
        std::all_of(field.begin() + i + 1, field.begin() + i + 4,
                    [](char c) { return c >= '0' && c <= '7'; })) {
      out.push_back(static_cast<char>((field[i + 1] - '0') * 64 + (field[i + 2] - '0') * 8 +
                                      (field[i + 3] - '0')));
      i += 3;
    } else {
      out.push_back(field[i]);
    }
  }
  return out;
}

// Where a hierarchy is mounted, and which of its folders the mount shows ("/" for all).
struct Mount {
  std::string point;
  std::string root;
};

// The mount of the v2 hierarchy (`version` 2) or of v1's hierarchy with the "cpu" controller.
std::optional<Mount> FindMount(absl::string_view mountinfo, int version) {
  for (absl::string_view line : absl::StrSplit(mountinfo, '\n', absl::SkipEmpty())) {
    // "36 25 0:32 ROOT POINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER_OPTIONS"
    const std::vector<absl::string_view> fields = absl::StrSplit(line, ' ', absl::SkipEmpty());
    const auto separator = std::find(fields.begin(), fields.end(), "-");
    if (fields.size() < 5 || fields.end() - separator < 4) continue;
    const absl::string_view type = separator[1];
    const bool matches =
        version == 2
            ? type == "cgroup2"
            : type == "cgroup" && absl::c_linear_search(absl::StrSplit(separator[3], ','), "cpu");
    if (matches) return Mount{Unescape(fields[4]), Unescape(fields[3])};
  }
  return std::nullopt;
}

// `folder` and its ancestors up to `mount.point`, nearest first.
void AddWithAncestors(const Mount& mount, absl::string_view cgroup_path, int version,
                      std::vector<CgroupFolder>& folders) {
  absl::string_view below = cgroup_path;
  if (mount.root != "/" && !absl::ConsumePrefix(&below, mount.root)) {
    below = "";  // a cgroup outside what the mount shows: only the mount's own folder
  }
  std::string point = mount.point;
  while (point.size() > 1 && point.back() == '/') point.pop_back();
  std::string path = absl::StrCat(point, below);
  while (path.size() > point.size() && path.back() == '/') path.pop_back();
  for (;;) {
    folders.push_back(CgroupFolder{path, version});
    if (path.size() <= point.size()) break;
    path.resize(path.rfind('/'));
    if (path.size() < point.size()) path = point;
  }
}

// The quota the folder's files set, nullopt when they set none or are missing.
absl::StatusOr<std::optional<double>> ReadQuota(const CgroupFolder& folder) {
  if (folder.version == 2) {
    const std::string file = absl::StrCat(folder.path, "/cpu.max");
    absl::StatusOr<std::string> text = ReadFile(file);
    if (absl::IsNotFound(text.status())) return std::nullopt;
    PLAIT_RETURN_IF_ERROR(text.status());
    absl::StatusOr<std::optional<double>> quota = ParseCpuMax(*text);
    if (!quota.ok())
      return absl::InvalidArgumentError(absl::StrCat(file, ": ", quota.status().message()));
    return quota;
  }
  const std::string quota_file = absl::StrCat(folder.path, "/cpu.cfs_quota_us");
  const std::string period_file = absl::StrCat(folder.path, "/cpu.cfs_period_us");
  absl::StatusOr<std::string> quota_text = ReadFile(quota_file);
  if (absl::IsNotFound(quota_text.status())) return std::nullopt;
  PLAIT_RETURN_IF_ERROR(quota_text.status());
  PLAIT_ASSIGN_OR_RETURN(const std::string period_text, ReadFile(period_file));
  absl::StatusOr<std::optional<double>> quota = ParseCfsQuota(*quota_text, period_text);
  if (!quota.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(quota_file, ", ", period_file, ": ", quota.status().message()));
  }
  return quota;
}

}  // namespace

int UsableCpus::count() const {
  int cpus = std::max(1, affinity);
  if (quota.has_value()) cpus = std::min(cpus, static_cast<int>(std::ceil(*quota)));
  return std::max(1, cpus);
}

int UsableCpus::PerRank(int local_ranks) const {
  return std::max(1, count() / std::max(1, local_ranks));
}

std::string UsableCpus::Describe() const {
  const int cpus = count();
  return absl::StrCat(cpus, cpus == 1 ? " usable CPU" : " usable CPUs", ": affinity ", affinity,
                      quota.has_value()
                          ? absl::StrFormat(", cgroup quota %g (%s)", *quota, quota_file)
                          : std::string(", no cgroup quota"));
}

std::vector<CgroupFolder> CpuCgroupFolders(absl::string_view proc_cgroup,
                                           absl::string_view mountinfo) {
  std::vector<CgroupFolder> folders;
  for (absl::string_view line : absl::StrSplit(proc_cgroup, '\n', absl::SkipEmpty())) {
    // "HIERARCHY_ID:CONTROLLERS:PATH"; the path may itself hold ':'.
    const std::vector<absl::string_view> parts = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (parts.size() != 3) continue;
    int version = 0;
    if (parts[0] == "0" && parts[1].empty()) {
      version = 2;
    } else if (absl::c_linear_search(absl::StrSplit(parts[1], ','), "cpu")) {
      version = 1;
    } else {
      continue;
    }
    if (std::optional<Mount> mount = FindMount(mountinfo, version)) {
      AddWithAncestors(*mount, parts[2], version, folders);
    }
  }
  return folders;
}

absl::StatusOr<std::optional<double>> ParseCpuMax(absl::string_view text) {
  const std::vector<absl::string_view> fields =
      absl::StrSplit(absl::StripAsciiWhitespace(text), ' ', absl::SkipEmpty());
  const std::optional<int64_t> period =
      fields.size() == 2 ? ParseMicroseconds(fields[1]) : std::nullopt;
  if (!period.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", text, "\" is not \"QUOTA PERIOD\" (microseconds, or max for QUOTA)"));
  }
  if (fields[0] == "max") return std::nullopt;
  const std::optional<int64_t> quota = ParseMicroseconds(fields[0]);
  if (!quota.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", text, "\": the quota is neither max nor a positive count"));
  }
  return static_cast<double>(*quota) / static_cast<double>(*period);
}

absl::StatusOr<std::optional<double>> ParseCfsQuota(absl::string_view quota_us,
                                                    absl::string_view period_us) {
  quota_us = absl::StripAsciiWhitespace(quota_us);
  period_us = absl::StripAsciiWhitespace(period_us);
  const std::optional<int64_t> period = ParseMicroseconds(period_us);
  if (!period.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("period \"", period_us, "\" is not a positive count of microseconds"));
  }
  if (quota_us == "-1") return std::nullopt;
  const std::optional<int64_t> quota = ParseMicroseconds(quota_us);
  if (!quota.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "quota \"", quota_us, "\" is neither -1 nor a positive count of microseconds"));
  }
  return static_cast<double>(*quota) / static_cast<double>(*period);
}

absl::StatusOr<UsableCpus> ReadUsableCpus() {
  UsableCpus cpus;
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof(mask), &mask) != 0) {
    return absl::InternalError("sched_getaffinity failed");
  }
  cpus.affinity = CPU_COUNT(&mask);
  // Without /proc (or cgroups) nothing caps the CPU time but the mask.
  const absl::StatusOr<std::string> proc_cgroup = ReadFile("/proc/self/cgroup");
  const absl::StatusOr<std::string> mountinfo = ReadFile("/proc/self/mountinfo");
  if (!proc_cgroup.ok() || !mountinfo.ok()) return cpus;
  for (const CgroupFolder& folder : CpuCgroupFolders(*proc_cgroup, *mountinfo)) {
    PLAIT_ASSIGN_OR_RETURN(const std::optional<double> quota, ReadQuota(folder));
    if (quota.has_value() && (!cpus.quota.has_value() || *quota < *cpus.quota)) {
      cpus.quota = quota;
      cpus.quota_file = folder.path + (folder.version == 2 ? "/cpu.max" : "/cpu.cfs_quota_us");
    }
  }
  return cpus;
}

}  // namespace plait::base
