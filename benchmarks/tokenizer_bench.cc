// Tokenizer throughput: MB of text encoded per second and per core, for each test tokenizer
// (data/tokenizer/testdata: GPT-2, Qwen3 and the Llama 3-style tiny BPE, byte-level; Mistral
// 7B v0.1, SentencePiece) on a multi-MB mixed corpus, on 1 and 2 threads (each thread
// encoding the whole corpus with its own freshly loaded tokenizer, so each pass starts with
// a cold cache, as a large corpus would). Counters:
//   MB/s/core: text bytes encoded per second of wall time, per thread;
//   MB/cpu_s: text bytes encoded per second of the encoding thread's CPU time: the speed of
//     one core whatever else the machine runs;
//   bytes/token: how much text a token carries on this corpus.
//
// The corpus is --corpus=FILE (documents separated by blank lines), or by default a seeded
// synthetic one of 4 MB: prose from a Zipf-distributed lexicon of 50,000 made-up words (a
// long tail like real text's, so the BPE cache does not see only a few words), C++-like
// code, CJK, Cyrillic, digits and emoji. --write_corpus=FILE writes the corpus used, so that
// benchmarks/tokenizer_bench_hf.py can measure Hugging Face's tokenizers on the same text:
//
//   bazel run --config=opt //benchmarks:tokenizer_bench -- --write_corpus=/tmp/corpus.txt
//   /opt/plait/venv/bin/python benchmarks/tokenizer_bench_hf.py /tmp/corpus.txt
#include <time.h>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_split.h"
#include "benchmark/benchmark.h"
#include "data/tokenizer/load_tokenizer.h"
#include "data/tokenizer/tokenizer.h"

namespace plait::data::tokenizer {
namespace {

constexpr size_t kSyntheticBytes = 4 << 20;
constexpr uint64_t kSeed = 20261130;

std::string Utf8(char32_t c) {
  std::string out;
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
  return out;
}

std::string SyntheticCorpus() {
  std::mt19937_64 random(kSeed);
  const auto uniform = [&](int n) { return static_cast<int>(random() % n); };
  static const char* const kOnsets[] = {"b",  "c",  "d",  "f",  "g",  "h",  "j",  "k", "l",
                                        "m",  "n",  "p",  "r",  "s",  "t",  "v",  "w", "st",
                                        "th", "ch", "pr", "tr", "br", "sh", "qu", "",  ""};
  static const char* const kVowels[] = {"a", "e", "i", "o", "u", "ea", "ou", "ai", "y", "io"};
  static const char* const kCodas[] = {"", "", "", "n", "r", "s", "t", "l", "nd", "ng", "ck"};
  std::vector<std::string> lexicon(50000);
  for (std::string& word : lexicon) {
    for (int s = 0, n = 1 + uniform(3); s < n; ++s) {
      word += kOnsets[uniform(std::size(kOnsets))];
      word += kVowels[uniform(std::size(kVowels))];
      word += kCodas[uniform(std::size(kCodas))];
    }
  }
  // Zipf's law over the lexicon: P(rank r) ~ 1 / r.
  std::vector<double> weights(lexicon.size());
  for (size_t r = 0; r < weights.size(); ++r) weights[r] = 1.0 / (r + 1);
  std::discrete_distribution<size_t> zipf(weights.begin(), weights.end());

  std::string corpus;
  while (corpus.size() < kSyntheticBytes) {
    const int kind = uniform(100);
    if (kind < 70) {  // prose
      for (int sentence = 0, n = 2 + uniform(6); sentence < n; ++sentence) {
        for (int w = 0, words = 4 + uniform(16); w < words; ++w) {
          std::string word = lexicon[zipf(random)];
          if (w == 0) word[0] = static_cast<char>(std::toupper(word[0]));
          if (uniform(40) == 0) word = std::to_string(uniform(100000));
          if (uniform(200) == 0) word += Utf8(0x1F600 + uniform(80));  // an emoji
          corpus += word;
          corpus += w + 1 == words ? (uniform(5) == 0 ? "? " : ". ") : uniform(8) == 0 ? ", " : " ";
        }
      }
    } else if (kind < 82) {  // code
      for (int line = 0, n = 3 + uniform(10); line < n; ++line) {
        corpus += std::string(2 * uniform(4), ' ');
        corpus += "auto " + lexicon[zipf(random)] + "_" + lexicon[zipf(random)] + " = Compute(" +
                  std::to_string(uniform(1000)) + ", \"" + lexicon[zipf(random)] + "\");  // " +
                  lexicon[zipf(random)] + "\n";
      }
    } else if (kind < 92) {  // CJK: the 5,000 first unified ideographs and kana
      for (int c = 0, n = 50 + uniform(200); c < n; ++c) {
        corpus += uniform(10) < 7 ? Utf8(0x4E00 + uniform(5000)) : Utf8(0x3041 + uniform(86));
        if (uniform(30) == 0) corpus += Utf8(0x3002);  // 。
      }
    } else {  // Cyrillic words
      for (int w = 0, n = 10 + uniform(40); w < n; ++w) {
        for (const char c : lexicon[zipf(random)]) corpus += Utf8(0x430 + (c - 'a') % 32);
        corpus += ' ';
      }
    }
    corpus += "\n\n";
  }
  return corpus;
}

std::string& Corpus() {
  static std::string* const corpus = new std::string;
  return *corpus;
}

const std::vector<absl::string_view>& Documents() {
  static const auto* const documents =
      new std::vector<absl::string_view>(absl::StrSplit(Corpus(), "\n\n", absl::SkipEmpty()));
  return *documents;
}

double ThreadCpuSeconds() {
  timespec now;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return now.tv_sec + now.tv_nsec * 1e-9;
}

void BM_Encode(benchmark::State& state, const char* name) {
  int64_t tokens = 0;
  double cpu_seconds = 0;
  for (auto _ : state) {
    state.PauseTiming();
    absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer =
        LoadTokenizer(std::string("data/tokenizer/testdata/") + name);
    if (!tokenizer.ok()) {
      state.SkipWithError(std::string(tokenizer.status().message()).c_str());
      return;
    }
    state.ResumeTiming();
    const double start = ThreadCpuSeconds();
    for (const absl::string_view document : Documents()) {
      absl::StatusOr<std::vector<int32_t>> ids = (*tokenizer)->Encode(document);
      tokens += ids->size();
      benchmark::DoNotOptimize(ids);
    }
    cpu_seconds += ThreadCpuSeconds() - start;
  }
  const double bytes = static_cast<double>(state.iterations()) * Corpus().size();
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
  state.counters["MB/s/core"] =
      benchmark::Counter(bytes / 1e6, benchmark::Counter::kAvgThreadsRate);
  state.counters["MB/cpu_s"] =
      benchmark::Counter(bytes / 1e6 / cpu_seconds, benchmark::Counter::kAvgThreads);
  state.counters["bytes/token"] =
      benchmark::Counter(bytes / static_cast<double>(tokens), benchmark::Counter::kAvgThreads);
}

void Register() {
  for (const char* name : {"gpt2", "qwen3", "tiny", "mistral"}) {
    benchmark::RegisterBenchmark((std::string("BM_Encode/") + name).c_str(), BM_Encode, name)
        ->Unit(benchmark::kMillisecond)
        ->Iterations(2)
        ->UseRealTime()
        ->Threads(1)
        ->Threads(2);
  }
}

}  // namespace
}  // namespace plait::data::tokenizer

ABSL_FLAG(std::string, corpus, "",
          "the text to encode, documents separated by blank lines (default: a seeded synthetic "
          "4 MB corpus)");
ABSL_FLAG(std::string, write_corpus, "",
          "also write the corpus used to this file, for benchmarks/tokenizer_bench_hf.py");

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);  // takes the --benchmark_* flags out of argv
  absl::SetProgramUsageMessage(
      "tokenizer throughput of the test tokenizers: tokenizer_bench [--corpus=FILE] "
      "[--write_corpus=FILE] [--benchmark_* flags]");
  absl::ParseCommandLine(argc, argv);
  const std::string corpus_path = absl::GetFlag(FLAGS_corpus);
  const std::string write_path = absl::GetFlag(FLAGS_write_corpus);
  std::string& corpus = plait::data::tokenizer::Corpus();
  if (corpus_path.empty()) {
    corpus = plait::data::tokenizer::SyntheticCorpus();
  } else {
    std::ifstream file(corpus_path, std::ios::binary);
    if (!file) {
      std::cerr << "tokenizer_bench: --corpus: cannot read \"" << corpus_path << "\"\n";
      return 1;
    }
    std::stringstream text;
    text << file.rdbuf();
    corpus = plait::data::tokenizer::ReplaceInvalidUtf8(text.str());
  }
  if (!write_path.empty()) std::ofstream(write_path, std::ios::binary) << corpus;
  std::cerr << "corpus: " << corpus.size() << " bytes, "
            << plait::data::tokenizer::Documents().size() << " documents\n";
  plait::data::tokenizer::Register();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
