// Training throughput of plait's CausalLM on one CPU thread: forward + backward tokens/s
// for the tiny preset and a medium shape, and model FLOPs utilisation (MFU) against the
// matmul ceiling measured in the same run (a 1024^3 fp32 torch::mm on the same thread).
// MFU = TrainingFlopsPerToken (causal_lm.h) * tokens/s / ceiling FLOP/s.
//
//   bazel run --config=opt //benchmarks:model_bench
//
// Both of LibTorch's thread pools are pinned to one thread before anything runs: its
// intra-op pool (at::set_num_threads) and OpenBLAS's, which does its matmuls and ignores
// the former (../shared/BUILDING.md). The ceiling benchmark runs first; the MFU counters of
// the model benchmarks divide by it.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <vector>

#include "benchmark/benchmark.h"
#include "benchmarks/bench_setup.h"
#include "models/causal_lm.h"
#include "models/model_config.h"
#include "torch/torch.h"

namespace plait::models {
namespace {

// The matmul ceiling measured by BM_MatmulCeiling, in FLOP/s.
double g_ceiling_flops = 0.0;

void BM_MatmulCeiling(benchmark::State& state) {
  const int64_t n = state.range(0);
  torch::manual_seed(0);
  const torch::Tensor a = torch::randn({n, n});
  const torch::Tensor b = torch::randn({n, n});
  torch::Tensor c = torch::empty({n, n});
  for (auto _ : state) {
    torch::mm_out(c, a, b);
    benchmark::DoNotOptimize(c.data_ptr());
  }
  const double flops = 2.0 * static_cast<double>(n) * n * n;
  state.counters["FLOP/s"] =
      benchmark::Counter(flops * state.iterations(), benchmark::Counter::kIsRate);
}

// Runs after BM_MatmulCeiling's timing to record the rate it measured.
class CeilingReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& run : runs) {
      if (run.benchmark_name().rfind("BM_MatmulCeiling", 0) == 0 && !run.error_occurred) {
        g_ceiling_flops = run.counters.at("FLOP/s");
      }
    }
    ConsoleReporter::ReportRuns(runs);
  }
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
  // One untimed step first: it faults the step's memory in, which a training run pays once,
  // not every step. Without it the medium shape, whose first step outlasts MinTime, would be
  // timed on that step alone.
  model->Loss(inputs, targets).backward();
  double seconds = 0.0;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    model->zero_grad(/*set_to_none=*/true);
    model->Loss(inputs, targets).backward();
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  const double tokens_per_step = static_cast<double>(batch * seq);
  const double flops_per_token = TrainingFlopsPerToken(config, seq);
  state.counters["tokens/s"] =
      benchmark::Counter(tokens_per_step * state.iterations(), benchmark::Counter::kIsRate);
  state.counters["params_M"] = static_cast<double>(NumParameters(config)) / 1e6;
  // The model's FLOP/s over the ceiling's, a plain ratio (not a rate).
  const double model_flops = tokens_per_step * flops_per_token * state.iterations() / seconds;
  state.counters["MFU"] = g_ceiling_flops > 0 ? model_flops / g_ceiling_flops : 0.0;
}

BENCHMARK(BM_MatmulCeiling)->Arg(1024)->MinTime(2.0)->UseRealTime();
BENCHMARK(BM_TrainStep)
    ->Args({0, 8, 256})
    ->Args({1, 8, 256})
    ->MinTime(5.0)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace plait::models

int main(int argc, char** argv) {
  plait::models::CeilingReporter reporter;
  return plait::benchmarks::BenchmarkMain(argc, argv, &reporter);
}
