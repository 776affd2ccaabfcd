#include "tools/heap/heap.h"

#include <climits>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace plait::heap {

bool RetainFreedHeapMemory() {
#if defined(__GLIBC__)
  // Setting either also turns off glibc's adaptive threshold, which would lower them again.
  const bool mmap_set = mallopt(M_MMAP_THRESHOLD, 1 << 30) == 1;
  const bool trim_set = mallopt(M_TRIM_THRESHOLD, INT_MAX) == 1;
  return mmap_set && trim_set;
#else
  return false;
#endif
}

}  // namespace plait::heap
