// The compute thread pools of a LibTorch process. LibTorch runs its CPU kernels on its own
// intra-op pool (OpenMP), oneDNN's bf16 matmuls included, but Debian's LibTorch hands its
// fp32 matmuls to OpenBLAS, whose pthread pool ignores at::set_num_threads (PyTorch's wheels
// link MKL, which runs on LibTorch's OpenMP pool). Two pools that each keep a thread per
// core spin against each other: OpenBLAS's idle workers in sched_yield, OpenMP's at their
// barriers. `llama_fsdp` (2 ranks, 2 cores) made 2.2 million context switches in 30 steps,
// and a bf16 step with both pools at 2 threads on a busy 2-core machine took over ten times
// its 1-thread time. So a process computes on one pool, LibTorch's, whose idle threads
// sleep (OMP_WAIT_POLICY=passive) rather than spin through a descheduled partner's turn:
//
//   int main(int argc, char** argv) {
//     plait::base::UsePassiveOpenMpWait(argv);  // first thing: it may execute main() again
//     ...
//     plait::base::SetComputeThreads(threads);
//   }
#ifndef PLAIT_BASE_THREADS_H_
#define PLAIT_BASE_THREADS_H_

namespace plait::base {

// Sets LibTorch's intra-op pool to `count` threads, and OpenBLAS's pool, where LibTorch's
// matmuls run on OpenBLAS (Debian's), to one: its fp32 matmuls then run on the calling
// thread, never beside a busy OpenMP pool. Returns false where LibTorch runs on neither
// OpenBLAS nor MKL, whose BLAS pool is then left alone.
bool SetComputeThreads(int count);

// Makes the OpenMP runtime's idle threads sleep at once instead of spinning
// (OMP_WAIT_POLICY=passive). libgomp reads the variable once, as LibTorch loads it before
// main(), so when it is unset this sets it and executes the program again (base/exec_again.h);
// the processes it starts inherit it. A value already set is kept. Returns whether the
// policy is passive: false when another policy was set or the re-execution failed.
bool UsePassiveOpenMpWait(char** argv);

}  // namespace plait::base

#endif  // PLAIT_BASE_THREADS_H_
