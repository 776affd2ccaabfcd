// Cost of asking a schedule for the learning rate, per schedule kind, against a hand-inlined
// warmup + cosine (the floor any schedule abstraction is measured against): the ratio of
// BM_LearningRate/cosine to BM_InlineWarmupCosine is the price of the composable form.
// Also the cost of building a schedule from its config (validation included).
//
//   bazel run --config=opt //benchmarks:sched_bench
#include <cmath>
#include <cstdint>
#include <string>

#include "benchmark/benchmark.h"
#include "google/protobuf/text_format.h"
#include "sched/schedule.h"
#include "sched/schedule_builder.h"

namespace plait::sched {
namespace {

constexpr int64_t kRunSteps = 10000;

// One config per schedule kind, on a run of kRunSteps with a 5% warmup.
constexpr const char* kConfigs[] = {
    "constant_with_warmup {}",
    "linear {}",
    "cosine {}",
    "cosine_with_restarts { num_cycles: 4 }",
    "cosine_with_min_lr { min_lr_rate: 0.1 }",
    "polynomial { power: 2 }",
    "inverse_sqrt {}",
    "warmup_stable_decay { decay_ratio: 0.2 min_lr_ratio: 0.1 }",
    "step { step_size: 1000 gamma: 0.5 }",
    "multistep { milestones: [3000, 6000, 9000] gamma: 0.3 }",
    "exponential { gamma: 0.9995 }",
};

ScheduleConfig Config(int index) {
  ScheduleConfig config;
  const std::string text =
      std::string("lr: 3e-4 total_steps: 10000 warmup { steps: 500 } ") + kConfigs[index];
  if (!google::protobuf::TextFormat::ParseFromString(text, &config)) std::abort();
  return config;
}

void BM_LearningRate(benchmark::State& state) {
  const ScheduleConfig config = Config(static_cast<int>(state.range(0)));
  const Schedule schedule = BuildSchedule(config).value();
  state.SetLabel(config.GetReflection()
                     ->GetOneofFieldDescriptor(config, config.GetDescriptor()->oneof_decl(0))
                     ->name());
  for (auto _ : state) {
    for (int64_t step = 0; step < kRunSteps; ++step) {
      benchmark::DoNotOptimize(schedule.LearningRate(step));
    }
  }
  state.SetItemsProcessed(state.iterations() * kRunSteps);
}
BENCHMARK(BM_LearningRate)->DenseRange(0, std::size(kConfigs) - 1);

// The same values as BM_LearningRate/2 (cosine), written out by hand.
void BM_InlineWarmupCosine(benchmark::State& state) {
  constexpr double kPeak = 3e-4;
  constexpr int64_t kWarmup = 500;
  const double pi = std::acos(-1.0);
  for (auto _ : state) {
    for (int64_t step = 0; step < kRunSteps; ++step) {
      const double lr = step < kWarmup
                            ? kPeak * static_cast<double>(step) / kWarmup
                            : kPeak * 0.5 *
                                  (1.0 + std::cos(pi * static_cast<double>(step - kWarmup) /
                                                  static_cast<double>(kRunSteps - kWarmup)));
      benchmark::DoNotOptimize(lr);
    }
  }
  state.SetItemsProcessed(state.iterations() * kRunSteps);
}
BENCHMARK(BM_InlineWarmupCosine);

void BM_BuildSchedule(benchmark::State& state) {
  const ScheduleConfig config = Config(static_cast<int>(state.range(0)));
  for (auto _ : state) benchmark::DoNotOptimize(BuildSchedule(config));
}
BENCHMARK(BM_BuildSchedule)->Arg(2)->Arg(7);

}  // namespace
}  // namespace plait::sched
