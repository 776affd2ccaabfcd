// Heap settings for training processes. A training step allocates and frees the same large
// tensors every time (activations, logits, their gradients) and streams them through GEMMs
// and elementwise kernels. Two of glibc's defaults slow that down:
// - It hands blocks from 128 KiB up to an adaptive threshold (at most 32 MiB) back to the
//   kernel when they are freed, and the next step faults them in again, zero-filled, page by
//   page: on one CPU core that cost about a third of the fused kernels' time on the medium
//   model.
// - Where the kernel gives transparent huge pages only on request ("madvise" in
//   /sys/kernel/mm/transparent_hugepage/enabled, Debian's default), the heap lives on 4 KiB
//   pages and the step spends much of its time on TLB misses: on this project's 2-core VM the
//   medium model's step took 4.6 to 8.8 s on 4 KiB pages and 3.1 to 3.5 s on 2 MiB pages.
// The main() of a training job or benchmark calls both, first thing:
//
//   int main(int argc, char** argv) {
//     plait::base::UseHugePagesForHeap(argv);
//     plait::base::RetainFreedHeapMemory();
//     ...
//   }
#ifndef PLAIT_BASE_HEAP_H_
#define PLAIT_BASE_HEAP_H_

#include <cstdint>
#include <optional>

namespace plait::base {

// Keeps freed blocks below 1 GiB in the heap for reuse and never trims its top, so the
// process holds on to its peak heap, and has every thread allocate from that one heap
// (ranks run as threads in tests and benchmarks; the allocations are few and large, so they
// contend little for it). Returns whether the C library took the settings (false
// on a C library other than glibc, where it does nothing).
bool RetainFreedHeapMemory();

// Makes glibc's malloc ask for transparent huge pages for the memory it takes from the kernel
// (its tunable glibc.malloc.hugetlb=1). glibc reads its tunables once, as the process starts,
// so when GLIBC_TUNABLES does not name glibc.malloc.hugetlb yet, this adds it there and
// re-executes the program (/proc/self/exe) with the same arguments and environment; processes
// the program starts inherit the setting. Call it before anything else in main(): nothing done
// before the re-execution survives it. A glibc.malloc.hugetlb already in GLIBC_TUNABLES is
// kept as it is (=0 turns this off). Returns whether the heap gets huge pages: false where the
// kernel has them off ("never"), the tunable is 0, the C library is not glibc, or the
// re-execution failed (then nothing changed).
bool UseHugePagesForHeap(char** argv);

// The bytes this process's heap has handed out and not had back (glibc's mallinfo2: the
// arenas' blocks in use and the blocks mapped for themselves); nullopt on a C library other
// than glibc. Ranks that run as threads share one heap.
std::optional<int64_t> HeapBytesInUse();

}  // namespace plait::base

#endif  // PLAIT_BASE_HEAP_H_
