// Training throughput of plait's CausalLM on one CPU thread: forward + backward tokens/s
// for the tiny preset, a medium shape and a real one (Qwen2.5-0.5B's widths and vocabulary,
// 2 layers), and two mixtures of experts (the tiny Qwen3-MoE; Qwen3-30B-A3B's widths with 32
// experts, 2 layers), with fp32 and with bf16 parameters, and model FLOPs utilisation (MFU)
// against the matmul ceiling of the same dtype (a 1024^3 at::mm on the same thread: OpenBLAS
// in fp32 under both LibTorch builds, oneDNN in bf16). A mixture of experts' FLOPs are its
// active ones (the experts a token chooses), as its MFU in a run is.
//
//   bazel run --config=opt //benchmarks:model_bench
//
// BM_TrainStepThreads times the medium step by the wall clock on 1 and on 2 compute threads
// (what a one-process run gains from a second core; see it for the load it needs):
//
//   bazel run --config=opt //benchmarks:model_bench -- --benchmark_filter=Threads
//
// The ceiling is measured right after every timed step, and a step's MFU is
// TrainingFlopsPerToken (models/estimates.h: 6N + 6Lsh, the run's and plan_check's count too)
// * tokens / step time / that ceiling; the reported MFU
// is the median over the steps. Both are timed in the thread's CPU time (bench_setup.h), which
// on a quiet machine equals wall time: on a shared 2-core machine wall time counts the
// other processes' turns too. Both rates still drift by 5-10% within a minute there (caches
// and memory bandwidth are shared), and a ratio of two rates measured seconds apart carries
// that drift, one measured side by side does not.
//
// The context names the libraries that run the matmuls: LibTorch's ("matmuls") and those
// plait's attention kernels call ("attention's matmuls").
//
// Both of LibTorch's thread pools are pinned to one thread before anything runs: its
// intra-op pool (at::set_num_threads) and OpenBLAS's, which does its matmuls and ignores
// the former.
//
// BM_PackedTrainStep times a step on rows that pack short documents against one of the same
// rows as single sequences:
//
//   bazel run --config=opt //benchmarks:model_bench -- --benchmark_filter=Packed
//
// BM_SeededInit times start-up's seeded draw of one FSDP rank's shards of a real model:
//
//   bazel run --config=opt //benchmarks:model_bench -- --benchmark_filter=Seeded
//
// BM_TrainStepCuda measures the same step on cuda:0 in bf16 (a binary built with
// --config=gpu; it skips elsewhere) for Llama-3.1-8B's shape at 8192 tokens a step: its
// embedding and output projection and as many of its 32 decoder layers as the GPU's free
// memory holds with the step's gradients and activations (models::ActivationBytes, the
// estimate of the generic ops a GPU runs). It reports tokens/s, TFLOP/s, the MFU against the
// GPU's dense bf16 peak from NVIDIA's datasheet (kGpuPeaks; "no bf16 peak known" and no MFU
// for a GPU not listed) and the step's peak memory from the CUDA caching allocator:
//
//   tools/torch_cuda run --config=opt //benchmarks:model_bench -- --benchmark_filter=Cuda
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ATen/Context.h"
#include "ATen/Parallel.h"
#include "ATen/core/Tensor.h"
#include "ATen/ops/mm.h"
#include "absl/strings/str_cat.h"
#include "base/threads.h"
#include "benchmark/benchmark.h"
#include "benchmarks/bench_setup.h"
#include "models/causal_lm.h"
#include "models/estimates.h"
#include "models/internal/gemm.h"
#include "models/model_config.h"
#include "parallel/device.h"
#include "parallel/tensor_slice.h"
#include "torch/csrc/autograd/generated/variable_factories.h"
#include "torch/cuda.h"

#ifdef PLAIT_GPU
#include <cuda_runtime.h>
#endif

namespace plait::models {
namespace {

// The matmul ceiling: the FLOP/s of a 1024^3 at::mm of `dtype` on this thread.
class MatmulCeiling {
 public:
  explicit MatmulCeiling(at::ScalarType dtype)
      : a_(torch::randn({kSize, kSize}, dtype)),
        b_(torch::randn({kSize, kSize}, dtype)),
        c_(torch::empty({kSize, kSize}, dtype)) {}

  // Runs one untimed product (it brings the operands back into cache), then times kReps.
  double Measure() {
    at::mm_out(c_, a_, b_);
    const double start = benchmarks::ThreadCpuSeconds();
    for (int i = 0; i < kReps; ++i) at::mm_out(c_, a_, b_);
    const double seconds = benchmarks::ThreadCpuSeconds() - start;
    benchmark::DoNotOptimize(c_.data_ptr());
    return 2.0 * kSize * kSize * kSize * kReps / seconds;
  }

 private:
  static constexpr int64_t kSize = 1024;
  // About 0.15 s on one core: long enough for a stable rate, short next to a medium step.
  static constexpr int kReps = 10;
  at::Tensor a_, b_, c_;
};

// The model of BM_TrainStep's range(0) and its name: 0 the tiny preset, 1 the medium shape,
// 2 a real one: Qwen2.5-0.5B's widths and 151,936-token vocabulary (tied embeddings, q/k/v
// biases) with 2 of its 24 layers, whose step the embeddings and the loss dominate as they do
// the whole model's (about a third of its FLOPs a token at 512 tokens); 3 the tiny Qwen3-MoE
// (8 experts of 128, 2 a token); 4 Qwen3-30B-A3B's layers (hidden 2048, experts of 768, 8 a
// token) with 32 of its 128 experts, 2 layers and a vocabulary of 4,096, whose step the experts
// dominate.
std::pair<ModelConfig, std::string> BenchModel(int64_t which) {
  if (which == 0) return {PresetConfig("tiny").value(), "tiny"};
  if (which == 1) return {benchmarks::MediumModel(), "medium"};
  if (which == 3) return {PresetConfig("qwen3-moe-tiny").value(), "Qwen3-MoE tiny"};
  if (which == 4) {
    ModelConfig moe = PresetConfig("qwen3-30b-a3b").value();
    moe.set_num_hidden_layers(2);
    moe.set_num_experts(32);
    moe.set_vocab_size(4096);
    return {moe, "Qwen3-30B-A3B widths, 32 experts, 2 layers"};
  }
  ModelConfig qwen = PresetConfig("qwen2.5-0.5b").value();
  qwen.set_num_hidden_layers(2);
  return {qwen, "Qwen2.5-0.5B widths, 2 layers"};
}

// A training step of a model of `config` in `dtype`, seeded as every row's, on a fixed batch;
// one untimed step has run (it faults the step's memory in, which a training run pays once,
// not every step). With `document` > 0 each row packs documents of that many tokens
// (CausalLM::Forward's positions), else each row is one sequence.
class TrainStep {
 public:
  TrainStep(const ModelConfig& config, at::ScalarType dtype, int64_t batch, int64_t seq,
            int64_t document = 0) {
    InitConfig init;
    init.set_seed(1);
    model_ = CausalLM::Create(config, init).value();
    model_->to(dtype);
    at::manual_seed(2);
    const at::Tensor tokens = torch::randint(config.vocab_size(), {batch, seq + 1});
    inputs_ = tokens.narrow(1, 0, seq);
    targets_ = tokens.narrow(1, 1, seq);
    if (document > 0) positions_ = (torch::arange(seq) % document).expand({batch, seq});
    Run();
  }

  void Run() {
    model_->zero_grad(/*set_to_none=*/true);
    model_->Loss(inputs_, targets_, kIgnoreIndex, positions_).backward();
  }

 private:
  std::shared_ptr<CausalLM> model_;
  at::Tensor inputs_, targets_, positions_;
};

// range(0): BenchModel's; range(1): batch; range(2): sequence length; range(3): 0 = fp32,
// 1 = bf16 parameters (the model's own bf16 path: fp32 softmax, norms and loss).
void BM_TrainStep(benchmark::State& state) {
  const auto [config, name] = BenchModel(state.range(0));
  const int64_t batch = state.range(1);
  const int64_t seq = state.range(2);
  const at::ScalarType dtype = state.range(3) == 0 ? at::kFloat : at::kBFloat16;
  state.SetLabel(
      absl::StrCat(name, " ", state.range(3) == 0 ? "fp32" : "bf16", ", MFU by ", kFlopConvention));
  TrainStep step(config, dtype, batch, seq);
  const double flops_per_step =
      static_cast<double>(batch * seq) * TrainingFlopsPerToken(config, seq);
  MatmulCeiling ceiling(dtype);
  std::vector<double> mfu;
  std::vector<double> ceilings;
  for (auto _ : state) {
    const double start = benchmarks::ThreadCpuSeconds();
    step.Run();
    const double seconds = benchmarks::ThreadCpuSeconds() - start;
    state.SetIterationTime(seconds);
    ceilings.push_back(ceiling.Measure());
    mfu.push_back(flops_per_step / seconds / ceilings.back());
  }
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(batch * seq),
                                                  benchmark::Counter::kIsIterationInvariantRate);
  state.counters["params_M"] = static_cast<double>(NumParameters(config)) / 1e6;
  state.counters["active_params_M"] = static_cast<double>(NumActiveParameters(config)) / 1e6;
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
// One sequence of 512 tokens, as a fine-tuning step of the real model would take.
BENCHMARK(BM_TrainStep)
    ->Args({2, 1, 512, 0})
    ->Args({2, 1, 512, 1})
    ->Iterations(3)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
// Mixtures of experts: the tiny one as the tiny model, the real widths on 512 tokens.
BENCHMARK(BM_TrainStep)
    ->Args({3, 8, 256, 0})
    ->Args({3, 8, 256, 1})
    ->Iterations(10)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_TrainStep)
    ->Args({4, 1, 512, 0})
    ->Args({4, 1, 512, 1})
    ->Iterations(3)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// Packed rows (sequence packing, padding-free): the tiny model's fp32 step on 2 rows of 2,048
// tokens, each one sequence (range(0) = 0) or documents of range(0) tokens, whose attention
// skips the keys of the documents before (fused_kernels.h). The matmuls outside attention are
// the same; tokens/s shows what attention's triangle costs at this length and what packing
// saves of it.
void BM_PackedTrainStep(benchmark::State& state) {
  const ModelConfig config = PresetConfig("tiny").value();
  const int64_t batch = 2;
  const int64_t seq = 2048;
  const int64_t document = state.range(0);
  state.SetLabel(document == 0 ? "tiny fp32, one sequence a row"
                               : absl::StrCat("tiny fp32, documents of ", document, " tokens"));
  TrainStep step(config, at::kFloat, batch, seq, document);
  for (auto _ : state) {
    const double start = benchmarks::ThreadCpuSeconds();
    step.Run();
    state.SetIterationTime(benchmarks::ThreadCpuSeconds() - start);
  }
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(batch * seq),
                                                  benchmark::Counter::kIsIterationInvariantRate);
}

BENCHMARK(BM_PackedTrainStep)
    ->Arg(0)
    ->Arg(256)
    ->Iterations(3)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// The medium step on 1 and on 2 compute threads (base::SetComputeThreads), timed by the wall
// clock, since CPU time counts every thread's turn: what a one-process run gains from a
// second core. On a machine other jobs share the second thread gets what they leave, so the
// ratio of the two rates is only meaningful while the load (reported in the context) is
// below the core count. range(0): 0 = fp32, 1 = bf16; range(1): threads.
void BM_TrainStepThreads(benchmark::State& state) {
  const ModelConfig config = benchmarks::MediumModel();
  const int64_t batch = 8;
  const int64_t seq = 256;
  const at::ScalarType dtype = state.range(0) == 0 ? at::kFloat : at::kBFloat16;
  const int threads = static_cast<int>(state.range(1));
  state.SetLabel(absl::StrCat("medium ", state.range(0) == 0 ? "fp32" : "bf16", ", ", threads,
                              threads == 1 ? " thread" : " threads", ", wall time"));
  base::SetComputeThreads(threads);
  TrainStep step(config, dtype, batch, seq);
  std::vector<double> rates;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    step.Run();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    state.SetIterationTime(seconds);
    rates.push_back(static_cast<double>(batch * seq) / seconds);
  }
  base::SetComputeThreads(1);
  // The median step's rate: one step slowed by another job's burst moves it least.
  state.counters["tokens/s"] = benchmarks::Median(rates);
}

BENCHMARK(BM_TrainStepThreads)
    ->ArgsProduct({{0, 1}, {1, 2}})
    ->Iterations(5)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// Start-up's seeded draw: one rank's part of every parameter of the whole Qwen2.5-0.5B model
// (24 layers, 494M values), as FSDP over range(0) ranks shards it (rank 0's first rows of
// each), on range(1) compute threads, by the wall clock. "drawn / model" is the values the
// tiles it touches cost over the model's (1 / ranks where every shard falls on tile edges;
// norms are not drawn), and values/s the kept ones a second.
void BM_SeededInit(benchmark::State& state) {
  const ModelConfig config = PresetConfig("qwen2.5-0.5b").value();
  const int64_t ranks = state.range(0);
  const int threads = static_cast<int>(state.range(1));
  state.SetLabel(absl::StrCat("Qwen2.5-0.5B, rank 0 of ", ranks, ", ", threads,
                              threads == 1 ? " thread" : " threads", ", wall time"));
  InitConfig init;
  init.set_seed(1);
  std::shared_ptr<CausalLM> model = CausalLM::CreateDeferred(config, at::TensorOptions()).value();
  std::vector<std::pair<std::string, parallel::TensorSlice>> slices;
  int64_t held = 0;
  for (const auto& item : model->named_parameters()) {
    const parallel::TensorSlice whole = parallel::TensorSlice::Whole(item.value().sizes());
    const int64_t rows = whole.global_shape[0];
    slices.emplace_back(item.key(), whole.Narrow(0, 0, (rows + ranks - 1) / ranks));
    held += slices.back().second.box.numel();
  }
  base::SetComputeThreads(threads);
  const int64_t drawn_before = internal::SeededDraws();
  double total_seconds = 0;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    for (const auto& [name, slice] : slices) {
      benchmark::DoNotOptimize(CausalLM::InitialValues(config, init, name, slice).data_ptr());
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    state.SetIterationTime(seconds);
    total_seconds += seconds;
  }
  base::SetComputeThreads(1);
  state.counters["drawn / model"] = static_cast<double>(internal::SeededDraws() - drawn_before) /
                                    static_cast<double>(NumParameters(config) * state.iterations());
  state.counters["values/s"] = static_cast<double>(held * state.iterations()) / total_seconds;
}

BENCHMARK(BM_SeededInit)
    ->ArgsProduct({{1, 2, 8}, {1, 2}})
    ->Iterations(2)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// The dense bf16 tensor-core FLOP/s of the GPUs plait is measured on, by a part of the name
// CUDA reports, first match wins (NVIDIA's datasheets give twice these "with sparsity").
struct GpuPeak {
  const char* name;
  double bf16_flops;
};
constexpr GpuPeak kGpuPeaks[] = {
    {"H100 PCIe", 756e12}, {"H100 NVL", 835e12}, {"H100", 989e12}, {"H200 NVL", 835e12},
    {"H200", 989e12},      {"B200", 2250e12},    {"A100", 312e12}, {"L40S", 362e12},
};

std::optional<double> Bf16Peak(const std::string& device_description) {
  for (const GpuPeak& peak : kGpuPeaks) {
    if (device_description.find(peak.name) != std::string::npos) return peak.bf16_flops;
  }
  return std::nullopt;
}

// The bytes free on `device` now (cudaMemGetInfo: what neither this process nor any other
// holds); nullopt without CUDA.
std::optional<int64_t> FreeDeviceMemory(const at::Device& device) {
#ifdef PLAIT_GPU
  size_t free_bytes = 0;
  size_t total_bytes = 0;
  if (cudaSetDevice(device.index()) != cudaSuccess ||
      cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
    (void)cudaGetLastError();  // LibTorch would take it for its next kernel's failure
    return std::nullopt;
  }
  return static_cast<int64_t>(free_bytes);
#else
  return std::nullopt;
#endif
}

// The bytes a training step of `config` holds on the GPU at its peak for `batch` sequences of
// `seq_len` tokens: bf16 parameters and their gradients, and the activations.
double StepBytes(const ModelConfig& config, int64_t batch, int64_t seq_len) {
  return 4.0 * static_cast<double>(NumParameters(config)) +
         ActivationBytes(config, batch, seq_len, at::kBFloat16, at::kCUDA);
}

// How many of `config`'s decoder layers (at most its own count) a step of `batch` x `seq_len`
// tokens fits in `free_bytes`, less a tenth for the allocator's rounding and fragmentation and
// the libraries' workspaces; 0 when not even one does.
int64_t LayersThatFit(ModelConfig config, int64_t batch, int64_t seq_len, double free_bytes) {
  const int64_t layers = config.num_hidden_layers();
  config.set_num_hidden_layers(0);
  const double root = StepBytes(config, batch, seq_len);
  config.set_num_hidden_layers(1);
  const double per_layer = StepBytes(config, batch, seq_len) - root;
  const double fit = std::floor((0.9 * free_bytes - root) / per_layer);
  return std::clamp<int64_t>(static_cast<int64_t>(fit), 0, layers);
}

// range(0): batch; range(1): sequence length.
void BM_TrainStepCuda(benchmark::State& state) {
  if (parallel::CudaDeviceCount() == 0) {
    state.SkipWithError("no GPU (or a binary built without --config=gpu)");
    return;
  }
  const at::Device device(at::kCUDA, 0);
  const int64_t batch = state.range(0);
  const int64_t seq = state.range(1);
  ModelConfig config = PresetConfig("llama3.1-8b").value();
  const int64_t all_layers = config.num_hidden_layers();
  const std::optional<int64_t> free_bytes = FreeDeviceMemory(device);
  if (!free_bytes.has_value()) {
    state.SkipWithError("cudaMemGetInfo failed on cuda:0");
    return;
  }
  const int64_t layers = LayersThatFit(config, batch, seq, static_cast<double>(*free_bytes));
  if (layers == 0) {
    state.SkipWithError(absl::StrCat("not one layer of Llama-3.1-8B fits ", *free_bytes >> 20,
                                     " MiB free at ", batch, " x ", seq, " tokens")
                            .c_str());
    return;
  }
  config.set_num_hidden_layers(layers);
  const std::string description = parallel::DescribeDevice(device);
  const std::optional<double> peak = Bf16Peak(description);
  state.SetLabel(absl::StrCat(description, ", Llama-3.1-8B ", layers, "/", all_layers,
                              " layers, bf16 fwd+bwd, B", batch, " x T", seq, ", MFU by ",
                              kFlopConvention, peak.has_value() ? "" : ", no bf16 peak known"));
  InitConfig init;
  init.set_seed(1);
  // The host initialises the model in fp32 (32 GB with all 32 layers) and converts it: on
  // every core, a minute of the GPU's time less than on the benchmarks' one thread.
  base::SetComputeThreads(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  std::shared_ptr<CausalLM> model = CausalLM::Create(config, init).value();
  model->to(device, at::kBFloat16);
  base::SetComputeThreads(1);
  at::manual_seed(2);
  const at::Tensor tokens = torch::randint(config.vocab_size(), {batch, seq + 1}).to(device);
  const at::Tensor inputs = tokens.narrow(1, 0, seq);
  const at::Tensor targets = tokens.narrow(1, 1, seq);
  const double flops_per_step =
      static_cast<double>(batch * seq) * TrainingFlopsPerToken(config, seq);
  // Untimed steps first: cuBLAS, the attention kernels and the caching allocator warm up.
  for (int i = 0; i < 2; ++i) {
    model->zero_grad(/*set_to_none=*/true);
    model->Loss(inputs, targets).backward();
  }
  torch::cuda::synchronize();
  parallel::ResetPeakMemory(device);
  std::vector<double> flops;
  for (auto _ : state) {
    // The device is idle here (synchronized after the last step): the step's kernels are all
    // timed, from their launch to the last one's end.
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
  state.counters["layers"] = static_cast<double>(layers);
  state.counters["params_M"] = static_cast<double>(NumParameters(config)) / 1e6;
  state.counters["TFLOP/s"] = benchmarks::Median(flops) / 1e12;
  if (peak.has_value()) state.counters["MFU"] = benchmarks::Median(flops) / *peak;
  state.counters["peak_memory_GiB"] =
      static_cast<double>(parallel::PeakMemory(device).value_or(0)) / (1 << 30);
}

// One sequence of 8192 tokens, Llama 3.1's pre-training length: with all 32 layers about
// 100 GB, which an H200 (141 GB) holds; an 80 GB GPU runs fewer layers.
BENCHMARK(BM_TrainStepCuda)
    ->Args({1, 8192})
    ->Iterations(10)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace plait::models

int main(int argc, char** argv) {
  benchmark::AddCustomContext(
      "attention's matmuls",
      absl::StrCat("fp32 ", plait::models::internal::GemmLibrary<float>(), ", bf16 ",
                   plait::models::internal::GemmLibrary<c10::BFloat16>()));
  return plait::benchmarks::BenchmarkMain(argc, argv);
}
