// Useful tokens per second of SFT padded one example to a row against packed by best-fit
// decreasing (data.proto's PACKING_BFD), on the medium model in fp32 on one thread. 2,000
// examples have lengths drawn from a log-normal (median 256 tokens, sigma 1) clipped to
// [16, 2048], in rows of 2,048 tokens; each timed iteration trains on one row (forward and
// backward) through the data library's own rows: the padded row of one example, or a packed
// row with its positions (each sequence attends only to itself).
//   padding: the share of all rows' tokens that are padding, over the whole file;
//   useful_tokens/s: the example tokens (not padding) the file's rows hold, per second of
//     this thread's CPU time at the timed rows' median cost;
//   x_padded (on the packed row): its useful tokens/s over the padded one's.
//
//   bazel run --config=opt //benchmarks:packing_bench
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "benchmark/benchmark.h"
#include "benchmarks/bench_setup.h"
#include "data/batch.h"
#include "data/data.pb.h"
#include "data/packing.h"
#include "data/pairs.h"
#include "models/causal_lm.h"

namespace plait::data {
namespace {

constexpr int64_t kSeqLen = 2048;
constexpr int kExamples = 2000;

// The examples: an 8-token prompt and a completion making up a log-normal length.
const std::vector<PairExample>& Examples() {
  static const std::vector<PairExample>* examples = [] {
    auto* made = new std::vector<PairExample>();
    std::mt19937_64 random(7);
    std::lognormal_distribution<double> length(std::log(256.0), 1.0);
    std::uniform_int_distribution<int64_t> token(0, 4095);
    for (int i = 0; i < kExamples; ++i) {
      const int64_t total = std::clamp<int64_t>(std::llround(length(random)), 16, kSeqLen);
      PairExample example;
      for (int64_t t = 0; t < total; ++t) {
        (t < 8 ? example.prompt : example.chosen).push_back(token(random));
      }
      made->push_back(std::move(example));
    }
    return made;
  }();
  return *examples;
}

// The rows of the file: one example each, or the best-fit-decreasing rows.
std::vector<std::vector<const PairExample*>> Rows(bool packed) {
  const std::vector<PairExample>& examples = Examples();
  std::vector<std::vector<const PairExample*>> rows;
  if (!packed) {
    for (const PairExample& example : examples) rows.push_back({&example});
    return rows;
  }
  std::vector<int64_t> lengths;
  for (const PairExample& e : examples) lengths.push_back(e.prompt.size() + e.chosen.size());
  for (const std::vector<int64_t>& row : BestFitDecreasing(lengths, kSeqLen)) {
    rows.emplace_back();
    for (const int64_t index : row) rows.back().push_back(&examples[index]);
  }
  return rows;
}

// range(0): 0 padded, 1 packed.
void BM_SftRow(benchmark::State& state) {
  const bool packed = state.range(0) == 1;
  state.SetLabel(packed ? "packed (best-fit decreasing)" : "padded");
  const std::vector<std::vector<const PairExample*>> rows = Rows(packed);
  int64_t useful = 0;
  for (const std::vector<const PairExample*>& row : rows) {
    for (const PairExample* example : row)
      useful += example->prompt.size() + example->chosen.size();
  }
  const double padding = 1.0 - static_cast<double>(useful) / (rows.size() * kSeqLen);
  models::InitConfig init;
  init.set_seed(1);
  const std::shared_ptr<models::CausalLM> model =
      models::CausalLM::Create(benchmarks::MediumModel(), init).value();
  const PairFiles files;
  // The timed rows: evenly spaced through the file, so that they hold its spread of lengths.
  const auto batch_of = [&](int64_t i) {
    const int64_t r = (i * 7919) % static_cast<int64_t>(rows.size());
    std::vector<std::vector<Sequence>> sequences(1);
    for (const PairExample* example : rows[r]) {
      sequences[0].push_back({&example->prompt, &example->chosen});
    }
    return RowsOf(sequences, files, kSeqLen, packed);
  };
  const auto train = [&](const Batch& batch) {
    model->zero_grad(/*set_to_none=*/true);
    model->Loss(batch.inputs, batch.targets, kIgnoreTarget, batch.positions).backward();
  };
  train(batch_of(0));  // faults the step's memory in
  std::vector<double> seconds;
  int64_t i = 0;
  for (auto _ : state) {
    const Batch batch = batch_of(++i);
    const double start = benchmarks::ThreadCpuSeconds();
    train(batch);
    seconds.push_back(benchmarks::ThreadCpuSeconds() - start);
    state.SetIterationTime(seconds.back());
  }
  const double useful_per_s =
      static_cast<double>(useful) / rows.size() / benchmarks::Median(seconds);
  state.counters["padding"] = padding;
  state.counters["rows"] = static_cast<double>(rows.size());
  state.counters["useful_tokens/s"] = useful_per_s;
  static double padded_useful_per_s = 0;
  if (!packed) padded_useful_per_s = useful_per_s;
  if (packed && padded_useful_per_s > 0)
    state.counters["x_padded"] = useful_per_s / padded_useful_per_s;
}

BENCHMARK(BM_SftRow)->Arg(0)->Arg(1)->Iterations(5)->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace plait::data

int main(int argc, char** argv) { return plait::benchmarks::BenchmarkMain(argc, argv); }
