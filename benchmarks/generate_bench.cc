// Decoding speed: greedy generation::Generate of 128 new tokens after prompts of 128 tokens,
// for a batch of 1 and of 16 prompts, on the medium model (bench_setup.h) and on Qwen2.5-0.5B's
// widths and 151,936-token vocabulary with 2 of its 24 layers, fp32, one compute thread.
// Counters: new tokens a second over the whole generation (the prompts' forward included) and
// the share of its time the prompts' forward took. benchmarks/compare_generate.py runs it
// beside transformers' generate on the same shapes and prints the ratios.
//
//   bazel run --config=opt //benchmarks:generate_bench
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "benchmark/benchmark.h"
#include "benchmarks/bench_setup.h"
#include "generation/generate.h"
#include "models/causal_lm.h"
#include "models/kv_cache.h"
#include "models/model_config.h"
#include "torch/csrc/autograd/grad_mode.h"

namespace plait::benchmarks {
namespace {

constexpr int64_t kPromptTokens = 128;
constexpr int kNewTokens = 128;

// range(0): 0 the medium model, 1 Qwen2.5-0.5B's widths with 2 layers.
models::ModelConfig BenchModel(int64_t which) {
  if (which == 0) return MediumModel();
  models::ModelConfig qwen = models::PresetConfig("qwen2.5-0.5b").value();
  qwen.set_num_hidden_layers(2);
  return qwen;
}

// range(0) the model, range(1) the prompts in the batch.
void BM_GreedyDecode(benchmark::State& state) {
  const models::ModelConfig config = BenchModel(state.range(0));
  state.SetLabel(state.range(0) == 0 ? "medium" : "Qwen2.5-0.5B widths, 2 layers");
  models::InitConfig init;
  init.set_seed(1);
  const std::shared_ptr<models::CausalLM> model = models::CausalLM::Create(config, init).value();
  const int64_t batch = state.range(1);
  at::manual_seed(2);
  const at::Tensor ids = at::randint(config.vocab_size(), {batch, kPromptTokens}, at::kLong);
  std::vector<std::vector<int64_t>> prompts;
  for (int64_t r = 0; r < batch; ++r) {
    prompts.emplace_back(ids[r].data_ptr<int64_t>(), ids[r].data_ptr<int64_t>() + kPromptTokens);
  }
  generation::SamplingConfig sampling;
  sampling.set_max_new_tokens(kNewTokens);
  double prefill_seconds = 0.0;
  for (auto _ : state) {
    // The prompts' forward alone (their last position's logits, as Generate computes them),
    // timed apart, then the whole generation.
    {
      at::NoGradGuard no_grad;
      models::KvCache cache(at::zeros({batch}, at::kLong), kPromptTokens);
      const absl::Time start = absl::Now();
      benchmark::DoNotOptimize(model->Decode(ids, cache, /*logits_to_keep=*/1));
      prefill_seconds += absl::ToDoubleSeconds(absl::Now() - start);
    }
    const absl::Time start = absl::Now();
    absl::StatusOr<std::vector<generation::Completion>> completions =
        generation::Generate(*model, prompts, sampling);
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    if (!completions.ok()) {
      state.SkipWithError(std::string(completions.status().message()).c_str());
      return;
    }
    state.SetIterationTime(seconds);
  }
  const double iterations = static_cast<double>(state.iterations());
  state.counters["new_tokens_per_s"] = benchmark::Counter(
      static_cast<double>(batch * kNewTokens) * iterations, benchmark::Counter::kIsRate);
  state.counters["prompt_share"] = benchmark::Counter(prefill_seconds, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_GreedyDecode)
    ->ArgsProduct({{0, 1}, {1, 16}})
    ->UseManualTime()
    ->Iterations(1)
    ->Unit(benchmark::kSecond);

}  // namespace
}  // namespace plait::benchmarks

int main(int argc, char** argv) { return plait::benchmarks::BenchmarkMain(argc, argv); }
