// Optimizer step throughput on 1 thread: plait's fused AdamW, Adam, SGD (momentum 0.9) and
// Lion against the torch::optim equivalent (for Lion, which torch::optim lacks, the published
// update written with tensor operations), over a model of 100 tensors (75 matrices holding
// almost all parameters, 25 small vectors) of 1M, 10M and 50M parameters in all.
//   params_per_second: plait's step throughput;
//   speedup: torch's step time / plait's, measured alternately in the same iterations.
//
//   bazel run --config=opt //benchmarks:optim_bench
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ATen/Context.h"
#include "ATen/core/Tensor.h"
#include "benchmark/benchmark.h"
#include "benchmarks/bench_setup.h"
#include "google/protobuf/text_format.h"
#include "optim/optimizer.h"
#include "torch/csrc/autograd/generated/variable_factories.h"
#include "torch/optim/adam.h"
#include "torch/optim/adamw.h"
#include "torch/optim/sgd.h"

namespace plait::optim {
namespace {

constexpr int kMatrices = 75;
constexpr int kVectors = 25;
constexpr int64_t kVectorNumel = 1024;

// 100 tensors with `total` parameters in all, each with a gradient.
std::vector<at::Tensor> Model(int64_t total) {
  at::manual_seed(0);
  std::vector<at::Tensor> tensors;
  const int64_t matrix_numel = (total - kVectors * kVectorNumel) / kMatrices;
  for (int i = 0; i < kMatrices; ++i) tensors.push_back(torch::randn({matrix_numel / 256, 256}));
  for (int i = 0; i < kVectors; ++i) tensors.push_back(torch::randn({kVectorNumel}));
  for (at::Tensor& tensor : tensors) tensor.mutable_grad() = torch::randn_like(tensor) * 1e-2;
  return tensors;
}

enum class Algorithm { kAdamW, kAdam, kSgd, kLion };

const char* ConfigText(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::kAdamW:
      return "adamw {} weight_decay: 0.1";
    case Algorithm::kAdam:
      return "adam {} weight_decay: 0.1";
    case Algorithm::kSgd:
      return "sgd { momentum: 0.9 } weight_decay: 0.1";
    case Algorithm::kLion:
      return "lion {} weight_decay: 0.1";
  }
  return "";
}

// The reference step for `algorithm` on `tensors`.
std::function<void()> TorchStep(Algorithm algorithm, std::vector<at::Tensor>& tensors) {
  switch (algorithm) {
    case Algorithm::kAdamW: {
      auto optimizer = std::make_shared<torch::optim::AdamW>(
          tensors, torch::optim::AdamWOptions(1e-3).weight_decay(0.1));
      return [optimizer] { optimizer->step(); };
    }
    case Algorithm::kAdam: {
      auto optimizer = std::make_shared<torch::optim::Adam>(
          tensors, torch::optim::AdamOptions(1e-3).weight_decay(0.1));
      return [optimizer] { optimizer->step(); };
    }
    case Algorithm::kSgd: {
      auto optimizer = std::make_shared<torch::optim::SGD>(
          tensors, torch::optim::SGDOptions(1e-3).momentum(0.9).weight_decay(0.1));
      return [optimizer] { optimizer->step(); };
    }
    case Algorithm::kLion:
      break;
  }
  auto momenta = std::make_shared<std::vector<at::Tensor>>();
  for (const at::Tensor& tensor : tensors) momenta->push_back(torch::zeros_like(tensor));
  return [tensors, momenta] {
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < tensors.size(); ++i) {
      const at::Tensor& grad = tensors[i].grad();
      at::Tensor& m = (*momenta)[i];
      const at::Tensor update = (m * 0.9 + grad * 0.1).sign_();
      tensors[i].mul_(1 - 1e-3 * 0.1).sub_(update, 1e-3);
      m.mul_(0.99).add_(grad, 0.01);
    }
  };
}

template <Algorithm kAlgorithm>
void BM_Step(benchmark::State& state) {
  const int64_t total = state.range(0);
  std::vector<at::Tensor> ours = Model(total);
  std::vector<at::Tensor> theirs = Model(total);
  std::vector<parallel::TrainableParameter> parameters;
  for (size_t i = 0; i < ours.size(); ++i) {
    parameters.push_back({"p" + std::to_string(i), ours[i], {}});
  }
  OptimizerConfig config;
  google::protobuf::TextFormat::ParseFromString(ConfigText(kAlgorithm), &config);
  std::unique_ptr<Optimizer> optimizer = Optimizer::Create(parameters, config).value();
  const std::function<void()> torch_step = TorchStep(kAlgorithm, theirs);

  using Clock = std::chrono::steady_clock;
  double torch_seconds = 0.0;
  double plait_seconds = 0.0;
  for (auto _ : state) {
    const auto start = Clock::now();
    if (!optimizer->Step(1e-3).ok()) state.SkipWithError("step failed");
    const auto middle = Clock::now();
    torch_step();
    const auto end = Clock::now();
    const double ours_seconds = std::chrono::duration<double>(middle - start).count();
    plait_seconds += ours_seconds;
    torch_seconds += std::chrono::duration<double>(end - middle).count();
    state.SetIterationTime(ours_seconds);
  }
  state.counters["params_per_second"] =
      benchmark::Counter(static_cast<double>(total), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["speedup"] = torch_seconds / plait_seconds;
}

void Sizes(benchmark::internal::Benchmark* benchmark) {
  benchmark->Arg(1'000'000)
      ->Arg(10'000'000)
      ->Arg(50'000'000)
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
}

BENCHMARK_TEMPLATE(BM_Step, Algorithm::kAdamW)->Apply(Sizes);
BENCHMARK_TEMPLATE(BM_Step, Algorithm::kAdam)->Apply(Sizes);
BENCHMARK_TEMPLATE(BM_Step, Algorithm::kSgd)->Apply(Sizes);
BENCHMARK_TEMPLATE(BM_Step, Algorithm::kLion)->Apply(Sizes);

}  // namespace
}  // namespace plait::optim

int main(int argc, char** argv) { return plait::benchmarks::BenchmarkMain(argc, argv); }
