// Training throughput of plait's CausalLM on one CPU thread: forward + backward tokens/s
// for the tiny preset and a medium shape, and model FLOPs utilisation (MFU) against the
// matmul ceiling (a 1024^3 fp32 torch::mm on the same thread).
//
//   bazel run --config=opt //benchmarks:model_bench
//
// The ceiling is measured right after every timed step, and a step's MFU is
// TrainingFlopsPerToken (causal_lm.h) * tokens / step time / that ceiling; the reported MFU
// is the median over the steps. On a shared machine both rates drift by 5-10% within a
// minute, and a ratio of two rates measured seconds apart carries that drift, one measured
// side by side does not.
//
// Both of LibTorch's thread pools are pinned to one thread before anything runs: its
// intra-op pool (at::set_num_threads) and OpenBLAS's, which does its matmuls and ignores
// the former.
#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "benchmark/benchmark.h"
#include "benchmarks/bench_setup.h"
#include "models/causal_lm.h"
#include "models/model_config.h"
#include "torch/torch.h"

namespace plait::models {
namespace {

// The matmul ceiling: the FLOP/s of a 1024^3 fp32 torch::mm on this thread.
class MatmulCeiling {
 public:
  MatmulCeiling()
      : a_(torch::randn({kSize, kSize})),
        b_(torch::randn({kSize, kSize})),
        c_(torch::empty({kSize, kSize})) {}

  // Runs one untimed product (it brings the operands back into cache), then times kReps.
  double Measure() {
    torch::mm_out(c_, a_, b_);
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kReps; ++i) torch::mm_out(c_, a_, b_);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    benchmark::DoNotOptimize(c_.data_ptr());
    return 2.0 * kSize * kSize * kSize * kReps / seconds;
  }

 private:
  static constexpr int64_t kSize = 1024;
  // About 0.15 s on one core: long enough for a stable rate, short next to a medium step.
  static constexpr int kReps = 10;
  torch::Tensor a_, b_, c_;
};

// range(0): 0 = tiny preset, 1 = medium; range(1): batch; range(2): sequence length.
void BM_TrainStep(benchmark::State& state) {
  const ModelConfig config =
      state.range(0) == 0 ? PresetConfig("tiny").value() : benchmarks::MediumModel();
  const int64_t batch = state.range(1);
  const int64_t seq = state.range(2);
  state.SetLabel(state.range(0) == 0 ? "tiny" : "medium");
  InitConfig init;
  init.set_seed(1);
  std::shared_ptr<CausalLM> model = CausalLM::Create(config, init).value();
  torch::manual_seed(2);
  const torch::Tensor tokens = torch::randint(config.vocab_size(), {batch, seq + 1});
  const torch::Tensor inputs = tokens.narrow(1, 0, seq);
  const torch::Tensor targets = tokens.narrow(1, 1, seq);
  const double flops_per_step =
      static_cast<double>(batch * seq) * TrainingFlopsPerToken(config, seq);
  MatmulCeiling ceiling;
  // One untimed step first: it faults the step's memory in, which a training run pays once,
  // not every step.
  model->Loss(inputs, targets).backward();
  std::vector<double> mfu;
  std::vector<double> ceilings;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    model->zero_grad(/*set_to_none=*/true);
    model->Loss(inputs, targets).backward();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
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
    ->Args({0, 8, 256})
    ->Iterations(10)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_TrainStep)
    ->Args({1, 8, 256})
    ->Iterations(7)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace plait::models

int main(int argc, char** argv) { return plait::benchmarks::BenchmarkMain(argc, argv); }
