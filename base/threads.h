// The compute thread pools of a LibTorch process. LibTorch runs its CPU kernels on its own
// intra-op pool (OpenMP), oneDNN's bf16 matmuls included; its fp32 matmuls run on OpenBLAS
// (both of plait's builds bind LibTorch's BLAS calls to Debian's OpenBLAS,
// third_party/libtorch.BUILD), whose pthread pool ignores at::set_num_threads. The two pools
// take turns (LibTorch waits for each matmul), so a process gives both its compute threads,
// and sets how their idle threads wait, measured on the medium model (2 threads against 1 on
// 2 quiet cores):
// - OpenBLAS's sleep at once (OPENBLAS_THREAD_TIMEOUT=4, 2^4 cycles, its least) rather than
//   spin through the OpenMP pool's turns (about 0.1 s by default). With both pools spinning,
//   a bf16 step at 2 threads on a busy 2-core machine took over ten times its 1-thread time.
// - OpenMP's spin about 3 ms before they sleep (GOMP_SPINCOUNT=300000, libgomp's documented
//   default, which measured better set than left unset here): the next of a step's thousands
//   of small kernels usually starts within it. bf16 at 2 threads: 1.58-1.65x its 1-thread rate
//   with it, 0.98x when they sleep at once (OMP_WAIT_POLICY=passive), 1.10-1.33x unset;
//   fp32: 1.26-1.41x with it, 1.60x passive (OpenMP's spinning thread then holds a core
//   OpenBLAS's second thread could use).
//
//   int main(int argc, char** argv) {
//     plait::base::SetIdleThreadWaits(argv);  // first thing: it may execute main() again
//     ...
//     plait::base::SetComputeThreads(threads);
//   }
#ifndef PLAIT_BASE_THREADS_H_
#define PLAIT_BASE_THREADS_H_

#include <string>

#include "ATen/Parallel.h"

namespace plait::base {

// Sets LibTorch's intra-op pool to `count` threads, and OpenBLAS's pool, where LibTorch's
// matmuls run on OpenBLAS (Debian's), to `count` too. Returns false where LibTorch runs on
// neither OpenBLAS nor MKL, whose BLAS pool is then left alone.
bool SetComputeThreads(int count);

// What runs LibTorch's CPU matmuls in this process, for benchmarks to report: the library
// whose BLAS sgemm_ the calls bind to (fp32), and oneDNN or LibTorch's own kernels (bf16):
// "fp32 libopenblas.so.0 (sgemm_), bf16 oneDNN".
std::string DescribeMatmulLibraries();

// Sets how the idle threads of both pools wait (OPENBLAS_THREAD_TIMEOUT=4 and
// GOMP_SPINCOUNT=300000, above). The libraries read the variables once, as LibTorch loads
// them before main(), so when one is unset this sets it and executes the program again
// (base/exec_again.h); the processes it starts inherit them. A value already set is kept, as
// is OpenMP's wait when OMP_WAIT_POLICY is set. Returns whether both are as above: false when
// another value was set or the re-execution failed.
bool SetIdleThreadWaits(char** argv);

}  // namespace plait::base

#endif  // PLAIT_BASE_THREADS_H_
