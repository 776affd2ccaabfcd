#include "base/heap.h"

#include <climits>
#include <cstdlib>
#include <fstream>
#include <string>

#include "base/exec_again.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace plait::base {
namespace {

constexpr char kHugePageTunable[] = "glibc.malloc.hugetlb=";

// The kernel's transparent huge page mode, the bracketed word in its setting ("always",
// "madvise" or "never"); empty where the setting cannot be read.
std::string TransparentHugePageMode() {
  std::ifstream setting("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string text;
  std::getline(setting, text);
  const size_t open = text.find('[');
  const size_t close = text.find(']', open);
  if (open == std::string::npos || close == std::string::npos) return "";
  return text.substr(open + 1, close - open - 1);
}

}  // namespace

bool RetainFreedHeapMemory() {
#if defined(__GLIBC__)
  // Setting either also turns off glibc's adaptive threshold, which would lower them again.
  const bool mmap_set = mallopt(M_MMAP_THRESHOLD, 1 << 30) == 1;
  const bool trim_set = mallopt(M_TRIM_THRESHOLD, INT_MAX) == 1;
  // Threads otherwise get arenas of their own, built of 64 MiB mappings: a larger block is
  // mapped for itself and unmapped when freed, whatever the thresholds say.
  const bool one_arena = mallopt(M_ARENA_MAX, 1) == 1;
  return mmap_set && trim_set && one_arena;
#else
  return false;
#endif
}

std::optional<int64_t> HeapBytesInUse() {
#if defined(__GLIBC__)
  const struct mallinfo2 info = mallinfo2();
  return static_cast<int64_t>(info.uordblks + info.hblkhd);
#else
  return std::nullopt;
#endif
}

bool UseHugePagesForHeap([[maybe_unused]] char** argv) {
#if defined(__GLIBC__)
  const std::string mode = TransparentHugePageMode();
  if (mode == "always") return true;
  if (mode != "madvise") return false;
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  const std::string previous = tunables == nullptr ? "" : tunables;
  const size_t at = previous.find(kHugePageTunable);
  if (at != std::string::npos) {
    const size_t value_at = at + sizeof(kHugePageTunable) - 1;
    const std::string value = previous.substr(value_at, previous.find(':', value_at) - value_at);
    return !value.empty() && value != "0";
  }
  const std::string updated = previous.empty() ? std::string(kHugePageTunable) + "1"
                                               : previous + ":" + kHugePageTunable + "1";
  ExecAgainWith(argv, {{"GLIBC_TUNABLES", updated}});
#endif
  return false;
}

}  // namespace plait::base
