// Training throughput of plait's CausalLM on one CPU thread: forward + backward tokens/s
// for the tiny preset and a medium shape, with fp32 and with bf16 parameters, and model
// FLOPs utilisation (MFU) against the matmul ceiling of the same dtype (a 1024^3 torch::mm
// on the same thread: OpenBLAS or MKL in fp32, oneDNN in bf16).
//
//   bazel run --config=opt //benchmarks:model_bench
//
// The ceiling is measured right after every timed step, and a step's MFU is
// TrainingFlopsPerToken (causal_lm.h) * tokens / step time / that ceiling; the reported MFU
// is the median over the steps. Both are timed in the thread's CPU time (bench_setup.h), which
// on a quiet machine equals wall time: on a shared 2-core machine wall time counts the
// other processes' turns too. Both rates still drift by 5-10% within a minute there (caches
// and memory bandwidth are shared), and a ratio of two rates measured seconds apart carries
// that drift, one measured side by side does not.
//
// Both of LibTorch's thread pools are pinned to one thread before anything runs: its
// intra-op pool (at::set_num_threads) and OpenBLAS's, which does its matmuls and ignores
// the former.
//
// BM_TrainStepCuda measures the same step on cuda:0 in bf16 (a binary built with
// --config=gpu; it skips elsewhere) for a stack of Llama-3.1-8B's blocks with its embedding
// and output projection, and its MFU against the GPU's dense bf16 peak from NVIDIA's
// datasheet (kGpuPeaks; no MFU for a GPU not listed), with the step's peak memory:
//
//   tools/torch_cuda run --config=opt //benchmarks:model_bench -- --benchmark_filter=Cuda
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "benchmarks/bench_setup.h"
#include "models/causal_lm.h"
#include "models/model_config.h"
#include "parallel/device.h"
#include "torch/torch.h"

namespace plait::models {
namespace {

// The matmul ceiling: the FLOP/s of a 1024^3 torch::mm of `dtype` on this thread.
class MatmulCeiling {
 public:
  explicit MatmulCeiling(torch::ScalarType dtype)
      : a_(torch::randn({kSize, kSize}, dtype)),
        b_(torch::randn({kSize, kSize}, dtype)),
        c_(torch::empty({kSize, kSize}, dtype)) {}

  // Runs one untimed product (it brings the operands back into cache), then times kReps.
  double Measure() {
    torch::mm_out(c_, a_, b_);
    const double start = benchmarks::ThreadCpuSeconds();
    for (int i = 0; i < kReps; ++i) torch::mm_out(c_, a_, b_);
    const double seconds = benchmarks::ThreadCpuSeconds() - start;
    benchmark::DoNotOptimize(c_.data_ptr());
    return 2.0 * kSize * kSize * kSize * kReps / seconds;
  }

 private:
  static constexpr int64_t kSize = 1024;
  // About 0.15 s on one core: long enough for a stable rate, short next to a medium step.
  static constexpr int kReps = 10;
  torch::Tensor a_, b_, c_;
};

// range(0): 0 = tiny preset, 1 = medium; range(1): batch; range(2): sequence length;
// range(3): 0 = fp32, 1 = bf16 parameters (the model's own bf16 path: fp32 softmax, norms
// and loss).
void BM_TrainStep(benchmark::State& state) {
  const ModelConfig config =
      state.range(0) == 0 ? PresetConfig("tiny").value() : benchmarks::MediumModel();
  const int64_t batch = state.range(1);
  const int64_t seq = state.range(2);
  const torch::ScalarType dtype = state.range(3) == 0 ? torch::kFloat32 : torch::kBFloat16;
  state.SetLabel(absl::StrCat(state.range(0) == 0 ? "tiny " : "medium ",
                              state.range(3) == 0 ? "fp32" : "bf16"));
  InitConfig init;
  init.set_seed(1);
  std::shared_ptr<CausalLM> model = CausalLM::Create(config, init).value();
  model->to(dtype);
  torch::manual_seed(2);
  const torch::Tensor tokens = torch::randint(config.vocab_size(), {batch, seq + 1});
  const torch::Tensor inputs = tokens.narrow(1, 0, seq);
  const torch::Tensor targets = tokens.narrow(1, 1, seq);
  const double flops_per_step =
      static_cast<double>(batch * seq) * TrainingFlopsPerToken(config, seq);
  MatmulCeiling ceiling(dtype);
  // One untimed step first: it faults the step's memory in, which a training run pays once,
  // not every step.
  model->Loss(inputs, targets).backward();
  std::vector<double> mfu;
  std::vector<double> ceilings;
  for (auto _ : state) {
    const double start = benchmarks::ThreadCpuSeconds();
    model->zero_grad(/*set_to_none=*/true);
    model->Loss(inputs, targets).backward();
    const double seconds = benchmarks::ThreadCpuSeconds() - start;
    state.SetIterationTime(seconds);
    ceilings.push_back(ceiling.Measure());
    mfu.push_back(flops_per_step / seconds / ceilings.back());
  }
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(batch * seq),
                                                  benchmark::Counter::kIsIterationInvariantRate);
  state.counters["params_M"] = static_cast<double>(NumParameters(config)) / 1e6;
  state.counters["ceiling_GFLOP/s"] = benchmarks::Median(ceilings) / 1e9;
  state.counters["MFU"] = benchmarks::Median(mfu);
}

// Fixed step counts, so that each shape is set up and warmed up once.
BENCHMARK(BM_TrainStep)
    ->Args({0, 8, 256, 0})
    ->Args({0, 8, 256, 1})
    ->Iterations(10)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_TrainStep)
    ->Args({1, 8, 256, 0})
    ->Args({1, 8, 256, 1})
    ->Iterations(7)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// The dense bf16 tensor-core FLOP/s of the GPUs plait is measured on, by a part of the name
// CUDA reports, first match wins (NVIDIA's datasheets give twice these "with sparsity").
struct GpuPeak {
  const char* name;
  double bf16_flops;
};
constexpr GpuPeak kGpuPeaks[] = {
    {"H100 PCIe", 756e12}, {"H100 NVL", 835e12}, {"H100", 989e12}, {"H200", 989e12},
    {"B200", 2250e12},     {"A100", 312e12},     {"L40S", 362e12},
};

std::optional<double> Bf16Peak(const std::string& device_description) {
  for (const GpuPeak& peak : kGpuPeaks) {
    if (device_description.find(peak.name) != std::string::npos) return peak.bf16_flops;
  }
  return std::nullopt;
}

// range(0): decoder layers of Llama-3.1-8B's shape; range(1): batch; range(2): sequence length.
void BM_TrainStepCuda(benchmark::State& state) {
  if (parallel::CudaDeviceCount() == 0) {
    state.SkipWithError("no GPU (or a binary built without --config=gpu)");
    return;
  }
  const torch::Device device(torch::kCUDA, 0);
  ModelConfig config = PresetConfig("llama3.1-8b").value();
  config.set_num_hidden_layers(state.range(0));
  const int64_t batch = state.range(1);
  const int64_t seq = state.range(2);
  const std::string description = parallel::DescribeDevice(device);
  state.SetLabel(description);
  InitConfig init;
  init.set_seed(1);
  std::shared_ptr<CausalLM> model = CausalLM::Create(config, init).value();
  model->to(device, torch::kBFloat16);
  torch::manual_seed(2);
  const torch::Tensor tokens = torch::randint(config.vocab_size(), {batch, seq + 1}).to(device);
  const torch::Tensor inputs = tokens.narrow(1, 0, seq);
  const torch::Tensor targets = tokens.narrow(1, 1, seq);
  const double flops_per_step =
      static_cast<double>(batch * seq) * TrainingFlopsPerToken(config, seq);
  // Untimed steps first: cuBLAS and the caching allocator warm up on the first ones.
  for (int i = 0; i < 2; ++i) {
    model->zero_grad(/*set_to_none=*/true);
    model->Loss(inputs, targets).backward();
  }
  torch::cuda::synchronize();
  parallel::ResetPeakMemory(device);
  std::vector<double> flops;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    model->zero_grad(/*set_to_none=*/true);
    model->Loss(inputs, targets).backward();
    torch::cuda::synchronize();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    state.SetIterationTime(seconds);
    flops.push_back(flops_per_step / seconds);
  }
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(batch * seq),
                                                  benchmark::Counter::kIsIterationInvariantRate);
  state.counters["params_M"] = static_cast<double>(NumParameters(config)) / 1e6;
  state.counters["TFLOP/s"] = benchmarks::Median(flops) / 1e12;
  if (const std::optional<double> peak = Bf16Peak(description)) {
    state.counters["MFU"] = benchmarks::Median(flops) / *peak;
  }
  state.counters["peak_memory_GiB"] =
      static_cast<double>(parallel::PeakMemory(device).value_or(0)) / (1 << 30);
}

// 16 of the model's 32 layers, so that their bf16 parameters, gradients and activations at
// 8192 tokens a step fit an 80 GB GPU; the embedding and output projection are the whole
// model's.
BENCHMARK(BM_TrainStepCuda)
    ->Args({16, 2, 4096})
    ->Iterations(10)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace plait::models

int main(int argc, char** argv) { return plait::benchmarks::BenchmarkMain(argc, argv); }
