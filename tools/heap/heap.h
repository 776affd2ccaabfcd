// Heap settings for training processes. A training step allocates and frees the same large
// tensors every time (activations, logits, their gradients). By default glibc hands blocks
// from 128 KiB up to an adaptive threshold (at most 32 MiB) back to the kernel when they are
// freed, and the next step faults them in again, zero-filled, page by page: on one CPU core
// that costs about a third of the elementwise kernels' time on the medium model. The main()
// of a training job or benchmark calls RetainFreedHeapMemory once, first thing:
//
//   int main(int argc, char** argv) {
//     plait::heap::RetainFreedHeapMemory();
//     ...
//   }
#ifndef PLAIT_TOOLS_HEAP_HEAP_H_
#define PLAIT_TOOLS_HEAP_HEAP_H_

namespace plait::heap {

// Keeps freed blocks below 1 GiB in the heap for reuse and never trims its top, so the
// process holds on to its peak heap. Returns whether the C library took the settings (false
// on a C library other than glibc, where it does nothing).
bool RetainFreedHeapMemory();

}  // namespace plait::heap

#endif  // PLAIT_TOOLS_HEAP_HEAP_H_
