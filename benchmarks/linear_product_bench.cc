// Decoding's products (wrap::LinearProduct) against LibTorch's matrix product on the same
// operands: fp32, one thread, 1 and 16 rows, on Qwen2.5-0.5B's output projection [151936,
// 896] and MLP projections, and the medium model's. Counters: the weight's bytes read a second
// (a product of few rows streams its weight once) and the FLOP/s.
//
//   bazel run --config=opt //benchmarks:linear_product_bench
#include <cstdint>
#include <optional>

#include "ATen/ATen.h"
#include "benchmark/benchmark.h"
#include "benchmarks/bench_setup.h"
#include "torch/csrc/autograd/grad_mode.h"
#include "wrap/seams.h"

namespace plait::benchmarks {
namespace {

// range(0) outputs, range(1) inputs, range(2) rows; `decoding`: LinearProduct in decoding (a
// DecodingProducts alive), else at::linear.
void Product(benchmark::State& state, bool decoding) {
  at::NoGradGuard no_grad;
  at::manual_seed(1);
  const at::Tensor weight = at::randn({state.range(0), state.range(1)});
  const at::Tensor x = at::randn({state.range(2), state.range(1)});
  std::optional<wrap::DecodingProducts> decoding_products;
  if (decoding) decoding_products.emplace();
  for (auto _ : state) {
    benchmark::DoNotOptimize(decoding ? wrap::LinearProduct(x, weight, at::Tensor())
                                      : at::linear(x, weight));
  }
  const double bytes = static_cast<double>(weight.nbytes());
  state.counters["weight_bytes_per_s"] =
      benchmark::Counter(bytes, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["flops"] =
      benchmark::Counter(2.0 * static_cast<double>(x.size(0)) * static_cast<double>(weight.numel()),
                         benchmark::Counter::kIsIterationInvariantRate);
}

void BM_LinearProduct(benchmark::State& state) { Product(state, /*decoding=*/true); }
void BM_MatrixProduct(benchmark::State& state) { Product(state, /*decoding=*/false); }

void Shapes(benchmark::internal::Benchmark* bench) {
  for (const int64_t rows : {1, 16}) {
    bench->Args({151936, 896, rows});  // Qwen2.5-0.5B's output projection
    bench->Args({4864, 896, rows});    // its gate and up projections
    bench->Args({896, 4864, rows});    // its down projection
    bench->Args({1376, 512, rows});    // the medium model's gate and up projections
    bench->Args({512, 1376, rows});    // its down projection
  }
  bench->ArgNames({"outputs", "inputs", "rows"})->Unit(benchmark::kMillisecond);
}

BENCHMARK(BM_LinearProduct)->Apply(Shapes);
BENCHMARK(BM_MatrixProduct)->Apply(Shapes);

}  // namespace
}  // namespace plait::benchmarks

int main(int argc, char** argv) { return plait::benchmarks::BenchmarkMain(argc, argv); }
