// What the benchmarks share: a main() that pins LibTorch's two thread pools to one thread
// each, with plait's waits for their idle threads (base/threads.h), and sets up the heap as the
// training jobs do (huge pages, freed memory kept; base/heap.h) before running; and the
// medium model shape the models and wrap issues measure.
//
//   int main(int argc, char** argv) { return plait::benchmarks::BenchmarkMain(argc, argv); }
#ifndef PLAIT_BENCHMARKS_BENCH_SETUP_H_
#define PLAIT_BENCHMARKS_BENCH_SETUP_H_

#include <vector>

#include "ATen/Parallel.h"
#include "benchmark/benchmark.h"
#include "models/model.pb.h"

namespace plait::benchmarks {

// Sets how idle threads wait and puts the heap on huge pages, either of which may
// execute the program again first, and retains freed heap memory (reported in the benchmark
// context as "idle threads", "heap pages" and "heap", beside the libraries that run
// the matmuls), sets LibTorch's intra-op pool (at::set_num_threads) and OpenBLAS's, which
// does LibTorch's fp32 matmuls and ignores the former, to one thread, then runs the
// benchmarks the command line selects, reported through `reporter` (the console's when
// null). Fails (returns 1) when LibTorch does not run on OpenBLAS or MKL (tools/setup.sh
// installs OpenBLAS), since the figures would not be comparable.
int BenchmarkMain(int argc, char** argv, benchmark::BenchmarkReporter* reporter = nullptr);

// The CPU time this thread has used, in seconds: what a single-threaded step costs, whatever
// else the machine runs meanwhile (wall time on a shared 2-core machine doubles under load).
double ThreadCpuSeconds();

// The median of `values` (the mean of the middle two for an even count), for per-step figures
// that one step disturbed by the shared machine should not move. `values` is not empty.
double Median(std::vector<double> values);

// hidden 512, 8 layers, 8 heads (head_dim 64), SwiGLU width 1376 (~8/3 * 512, as Llama sizes
// it), vocab 4096: about 29M parameters.
models::ModelConfig MediumModel();

}  // namespace plait::benchmarks

#endif  // PLAIT_BENCHMARKS_BENCH_SETUP_H_
