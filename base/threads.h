// The compute thread pools of a LibTorch process. LibTorch runs its CPU kernels on its own
// intra-op pool, but Debian's LibTorch hands its matmuls to OpenBLAS, whose pool ignores
// at::set_num_threads (PyTorch's wheels link MKL, whose pool follows it). A training rank that sets only the former
// still runs one OpenBLAS thread per core, and ranks sharing the cores then oversubscribe
// them: OpenBLAS's idle workers spin in sched_yield, and `llama_fsdp` (2 ranks, 2 cores) made
// 2.2 million context switches in 30 steps.
#ifndef PLAIT_BASE_THREADS_H_
#define PLAIT_BASE_THREADS_H_

namespace plait::base {

// Sets LibTorch's intra-op pool and its BLAS's to `count` threads each: OpenBLAS's where
// LibTorch's matmuls run on OpenBLAS (Debian's), MKL's through at::set_num_threads where they
// run on MKL (PyTorch's wheels). Returns false where LibTorch uses neither, whose pool is
// then left alone.
bool SetComputeThreads(int count);

}  // namespace plait::base

#endif  // PLAIT_BASE_THREADS_H_
