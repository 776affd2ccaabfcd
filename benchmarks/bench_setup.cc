#include "benchmarks/bench_setup.h"

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <vector>

#include "base/heap.h"
#include "base/threads.h"
#include "base/torch_compat.h"
#include "models/model_config.h"

namespace plait::benchmarks {

int BenchmarkMain(int argc, char** argv, benchmark::BenchmarkReporter* reporter) {
  const bool thread_waits = base::SetIdleThreadWaits(argv);
  const bool huge_pages = base::UseHugePagesForHeap(argv);
  const bool heap_retained = base::RetainFreedHeapMemory();
  if (!base::SetComputeThreads(1)) {
    std::fprintf(stderr,
                 "LibTorch runs on neither OpenBLAS nor MKL (run tools/setup.sh), so the "
                 "figures would not be comparable\n");
    return 1;
  }
  benchmark::Initialize(&argc, argv);
  benchmark::AddCustomContext("libtorch", base::kTorchVersion);
  benchmark::AddCustomContext(
      "heap", heap_retained ? "freed memory retained (base/heap.h)" : "the C library's default");
  benchmark::AddCustomContext("heap pages", huge_pages ? "2 MiB (base/heap.h)" : "4 KiB");
  benchmark::AddCustomContext("matmuls", base::DescribeMatmulLibraries());
  benchmark::AddCustomContext("idle threads", thread_waits ? "plait's waits (base/threads.h)"
                                                           : "as the environment sets them");
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks(reporter);
  benchmark::Shutdown();
  return 0;
}

double ThreadCpuSeconds() {
  timespec now;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

models::ModelConfig MediumModel() {
  models::ModelConfig config = models::PresetConfig("tiny").value();
  config.set_hidden_size(512);
  config.set_intermediate_size(1376);
  config.set_num_hidden_layers(8);
  config.set_num_attention_heads(8);
  config.set_num_key_value_heads(8);
  config.set_vocab_size(4096);
  return config;
}

}  // namespace plait::benchmarks
