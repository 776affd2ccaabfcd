// How fast the DataLoader hands out micro-batches, on one thread, at the tiny plan's shape
// (plan/examples/llama_fsdp.textproto: micro-batch 8 x seq_len 64, rank 0 of 2 data-parallel
// ranks), for the synthetic Markov source (seed 7, the defaults) and for an llm.c token file
// of 8M tokens written into a temporary folder (removed once the file is opened), read in
// order and shuffled:
//   tokens/s: input tokens of the micro-batches Next returns per second of this thread's CPU
//     time;
//   x_training: that rate / what one rank's training consumes (kJobTokensPerSecond over
//     kDpSize ranks): how many times faster than needed the loader is; its inverse is the
//     share of a training step the loader takes on the training thread.
//
//   bazel run --config=opt //benchmarks:data_bench
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "benchmarks/bench_setup.h"
#include "data/data.pb.h"
#include "data/data_config.h"
#include "data/data_loader.h"
#include "data/testing_token_files.h"
#include "models/model_config.h"

namespace plait::data {
namespace {

// The tiny plan's micro-batch, sequence length and data-parallel width.
constexpr int64_t kMicroBatch = 8;
constexpr int64_t kSeqLen = 64;
constexpr int kDpSize = 2;

// What `bazel run //trainer:llama_fsdp` trains, all ranks together, on the 2-core machine
// these figures come from (the tok/s of its progress lines); each rank's loader must supply
// 1/kDpSize of it.
constexpr double kJobTokensPerSecond = 6500.0;

// Tokens in the benchmark's token file: 16 MiB of uint16, 8K windows of one world batch
// (8 x 64 x 2 tokens) for the shuffled order to range over.
constexpr int64_t kFileTokens = int64_t{1} << 23;

int64_t VocabSize() { return models::PresetConfig("tiny").value().vocab_size(); }

// Rank 0's training loader for `data`.
DataLoader Loader(const DataConfig& data, int64_t vocab_size) {
  return DataLoader::Create(data, Split::kTrain, vocab_size, kMicroBatch, kSeqLen,
                            /*dp_rank=*/0, kDpSize, "data")
      .value();
}

// kFileTokens random ids below `vocab_size`.
std::vector<uint16_t> RandomTokens(int64_t vocab_size) {
  std::vector<uint16_t> tokens(kFileTokens);
  std::mt19937 random(1);
  std::uniform_int_distribution<int> id(0, static_cast<int>(vocab_size) - 1);
  for (uint16_t& token : tokens) token = static_cast<uint16_t>(id(random));
  return tokens;
}

// Times Next on `loader` in CPU time: the loader runs on the training thread, so what it
// costs a training step is its CPU time.
void RunLoader(benchmark::State& state, DataLoader& loader) {
  const double start = benchmarks::ThreadCpuSeconds();
  for (auto _ : state) {
    const absl::StatusOr<Batch> batch = loader.Next();
    if (!batch.ok()) {
      state.SkipWithError(batch.status().ToString().c_str());
      break;
    }
    benchmark::DoNotOptimize(batch->inputs.data_ptr());
    benchmark::DoNotOptimize(batch->targets.data_ptr());
  }
  const double tokens_per_second = static_cast<double>(state.iterations() * kMicroBatch * kSeqLen) /
                                   (benchmarks::ThreadCpuSeconds() - start);
  state.counters["tokens/s"] = tokens_per_second;
  state.counters["x_training"] = tokens_per_second / (kJobTokensPerSecond / kDpSize);
}

void BM_Synthetic(benchmark::State& state) {
  DataConfig data;
  data.mutable_synthetic()->set_seed(7);
  DataLoader loader = Loader(ResolvedDataConfig(data), VocabSize());
  RunLoader(state, loader);
}
BENCHMARK(BM_Synthetic);

// range(0): 0 = read in order, 1 = shuffled windows.
void BM_LlmcFile(benchmark::State& state) {
  const int64_t vocab_size = VocabSize();
  // The loader opens the file when it is created, and reads it through its descriptor, so
  // the folder can go before the timing.
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("plait_data_bench_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "train.bin").string();
  testing::WriteLlmcFile(path, RandomTokens(vocab_size));
  DataConfig data;
  TokenFiles& files = *data.mutable_token_files();
  files.set_train_path(path);
  files.set_eval_path(path);
  files.set_format(TOKEN_FORMAT_LLMC);
  files.set_shuffle(state.range(0) == 1);
  files.set_shuffle_seed(3);
  DataLoader loader = Loader(data, vocab_size);
  std::filesystem::remove_all(dir);
  state.SetLabel(state.range(0) == 1 ? "shuffled" : "in order");
  RunLoader(state, loader);
}
BENCHMARK(BM_LlmcFile)->Arg(0)->Arg(1);

}  // namespace
}  // namespace plait::data

int main(int argc, char** argv) { return plait::benchmarks::BenchmarkMain(argc, argv); }
