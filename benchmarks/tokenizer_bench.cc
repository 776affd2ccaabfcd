// Tokenizer speed for each test tokenizer (data/tokenizer/testdata: GPT-2, Qwen3 and the
// Llama 3-style tiny BPE, byte-level; Mistral 7B v0.1's SentencePiece model and its
// tokenizer.json conversion, byte fallback) on a multi-MB mixed corpus.
//
// BM_SideBySide/NAME: plait against the reference implementation in one run, passes
// alternating (plait, reference, plait, reference ...) so that a machine busy with something
// else slows both alike. A reference pass is benchmarks/tokenizer_bench_hf.py in a child
// process (Hugging Face's `tokenizers` for tokenizer.json, Google's `sentencepiece` for
// tokenizer.model, one thread), loading the tokenizer and encoding every document, one call
// per document, as plait's pass does. Counters, all from CPU time (the process's for the
// reference, the thread's for plait), so that what else the machine runs counts little:
//   MB/cpu_s, ref_MB/cpu_s: text encoded per CPU second; speed_vs_ref: their ratio (above 1:
//     plait is faster);
//   load_cpu_s, ref_load_cpu_s: loading the tokenizer; load_vs_ref: plait's over the
//     reference's (below 1: plait loads faster);
//   wall_vs_cpu: plait's encoding wall time over its CPU time (near 1 on an idle core).
// A pass whose token count differs from the reference's stops the benchmark with an error.
//
// BM_Encode/NAME/threads:N: plait alone on 1 and 2 threads (each thread encoding the whole
// corpus with its own freshly loaded tokenizer, so each pass starts with a cold cache, as a
// large corpus would): MB/s/core (wall time, per thread), MB/cpu_s and bytes/token.
//
// The corpus is --corpus=FILE (documents separated by blank lines), or by default a seeded
// synthetic one of 4 MB: prose from a Zipf-distributed lexicon of 50,000 made-up words (a
// long tail like real text's, so the BPE cache does not see only a few words), C++-like
// code, CJK, Cyrillic, digits and emoji. The reference runs in --python (the venv
// tools/setup.sh builds); without it BM_SideBySide reports that it was skipped.
//
// --tokenizers=DIR,... adds other tokenizer folders (a model's own files) to both benchmarks.
//
//   bazel run --config=opt //benchmarks:tokenizer_bench [-- --corpus=FILE --tokenizers=DIR]
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

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
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/json.h"
#include "base/status.h"
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

// The test tokenizers, as the benchmark's runfiles hold them.
constexpr char kTestdata[] = "data/tokenizer/testdata/";
constexpr const char* kTestTokenizers[] = {"gpt2", "qwen3", "tiny", "mistral", "mistral_json"};

// The interpreter and the file of the reference's passes, set by main.
struct Reference {
  std::string python;       // --python; empty: no reference passes
  std::string corpus_path;  // the corpus, written for the child process
};
Reference& TheReference() {
  static Reference* const reference = new Reference;
  return *reference;
}

// What one pass over the corpus took: loading the tokenizer, then encoding every document.
struct Pass {
  double load_cpu_seconds = 0;
  double encode_cpu_seconds = 0;
  double encode_wall_seconds = 0;
  int64_t tokens = 0;

  Pass& operator+=(const Pass& other) {
    load_cpu_seconds += other.load_cpu_seconds;
    encode_cpu_seconds += other.encode_cpu_seconds;
    encode_wall_seconds += other.encode_wall_seconds;
    tokens += other.tokens;
    return *this;
  }
};

absl::StatusOr<Pass> PlaitPass(const std::string& folder) {
  Pass pass;
  double start = ThreadCpuSeconds();
  PLAIT_ASSIGN_OR_RETURN(const std::unique_ptr<Tokenizer> tokenizer, LoadTokenizer(folder));
  pass.load_cpu_seconds = ThreadCpuSeconds() - start;
  start = ThreadCpuSeconds();
  const absl::Time start_wall = absl::Now();
  for (const absl::string_view document : Documents()) {
    PLAIT_ASSIGN_OR_RETURN(const std::vector<int32_t> ids, tokenizer->Encode(document));
    pass.tokens += static_cast<int64_t>(ids.size());
  }
  pass.encode_cpu_seconds = ThreadCpuSeconds() - start;
  pass.encode_wall_seconds = absl::ToDoubleSeconds(absl::Now() - start_wall);
  return pass;
}

std::string ShellQuoted(absl::string_view text) {
  return absl::StrCat("'", absl::StrReplaceAll(text, {{"'", "'\\''"}}), "'");
}

// benchmarks/tokenizer_bench_hf.py's pass, in a child process.
absl::StatusOr<Pass> ReferencePass(const std::string& folder) {
  const Reference& reference = TheReference();
  const std::string command =
      absl::StrCat(ShellQuoted(reference.python), " benchmarks/tokenizer_bench_hf.py ",
                   ShellQuoted(folder), " ", ShellQuoted(reference.corpus_path), " 2>&1");
  FILE* child = popen(command.c_str(), "r");
  if (child == nullptr) return absl::InternalError(absl::StrCat("cannot run ", command));
  std::string output;
  char buffer[4096];
  for (size_t got; (got = fread(buffer, 1, sizeof(buffer), child)) > 0;) output.append(buffer, got);
  if (pclose(child) != 0) {
    return absl::InternalError(absl::StrCat(command, " failed: ", output));
  }
  PLAIT_ASSIGN_OR_RETURN(const nlohmann::json result, base::ParseJson(command, output));
  Pass pass;
  pass.load_cpu_seconds = result.value("load_cpu_s", 0.0);
  pass.encode_cpu_seconds = result.value("encode_cpu_s", 0.0);
  pass.encode_wall_seconds = result.value("encode_wall_s", 0.0);
  pass.tokens = result.value("tokens", int64_t{0});
  return pass;
}

void BM_SideBySide(benchmark::State& state, const std::string& folder) {
  if (TheReference().python.empty()) {
    state.SkipWithError("no reference: --python is empty or not executable");
    return;
  }
  Pass plait, reference;
  for (auto _ : state) {
    absl::StatusOr<Pass> ours = PlaitPass(folder);
    absl::StatusOr<Pass> theirs = ours.ok() ? ReferencePass(folder) : ours;
    if (!theirs.ok()) {
      state.SkipWithError(std::string(theirs.status().message()).c_str());
      return;
    }
    if (ours->tokens != theirs->tokens) {
      state.SkipWithError(absl::StrCat(folder, ": plait encoded the corpus to ", ours->tokens,
                                       " tokens, the reference to ", theirs->tokens)
                              .c_str());
      return;
    }
    state.SetIterationTime(ours->encode_wall_seconds);
    plait += *ours;
    reference += *theirs;
  }
  const double megabytes = static_cast<double>(state.iterations()) * Corpus().size() / 1e6;
  const double passes = static_cast<double>(state.iterations());
  state.SetBytesProcessed(static_cast<int64_t>(megabytes * 1e6));
  state.counters["MB/cpu_s"] = megabytes / plait.encode_cpu_seconds;
  state.counters["ref_MB/cpu_s"] = megabytes / reference.encode_cpu_seconds;
  state.counters["speed_vs_ref"] = reference.encode_cpu_seconds / plait.encode_cpu_seconds;
  state.counters["load_cpu_s"] = plait.load_cpu_seconds / passes;
  state.counters["ref_load_cpu_s"] = reference.load_cpu_seconds / passes;
  state.counters["load_vs_ref"] = plait.load_cpu_seconds / reference.load_cpu_seconds;
  state.counters["wall_vs_cpu"] = plait.encode_wall_seconds / plait.encode_cpu_seconds;
}

void BM_Encode(benchmark::State& state, const std::string& folder) {
  int64_t tokens = 0;
  double cpu_seconds = 0;
  for (auto _ : state) {
    state.PauseTiming();
    absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = LoadTokenizer(folder);
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

// Registers both benchmarks for the test tokenizers, named by their folder's name, and for
// `more_folders`, named by their path.
void Register(const std::vector<std::string>& more_folders) {
  std::vector<std::pair<std::string, std::string>> tokenizers;  // (name, folder)
  for (const char* name : kTestTokenizers)
    tokenizers.emplace_back(name, kTestdata + std::string(name));
  for (const std::string& folder : more_folders) tokenizers.emplace_back(folder, folder);
  for (const auto& [name, folder] : tokenizers) {
    // Three passes each: plait, reference, plait, reference, plait, reference.
    benchmark::RegisterBenchmark(("BM_SideBySide/" + name).c_str(), BM_SideBySide, folder)
        ->Unit(benchmark::kMillisecond)
        ->Iterations(3)
        ->UseManualTime();
  }
  for (const auto& [name, folder] : tokenizers) {
    benchmark::RegisterBenchmark(("BM_Encode/" + name).c_str(), BM_Encode, folder)
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
ABSL_FLAG(std::vector<std::string>, tokenizers, {},
          "more tokenizer folders (tokenizer.json or tokenizer.model, beside "
          "tokenizer_config.json) to measure after the test tokenizers, comma-separated");
ABSL_FLAG(std::string, python, "/opt/plait/venv/bin/python",
          "the Python with `tokenizers` and `sentencepiece` that runs the reference's passes "
          "(benchmarks/tokenizer_bench_hf.py); empty: plait alone");

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);  // takes the --benchmark_* flags out of argv
  absl::SetProgramUsageMessage(
      "tokenizer speed of the test tokenizers, beside the reference's: tokenizer_bench "
      "[--corpus=FILE] [--tokenizers=DIR,...] [--python=PYTHON] [--benchmark_* flags]");
  absl::ParseCommandLine(argc, argv);
  const std::string corpus_path = absl::GetFlag(FLAGS_corpus);
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
  plait::data::tokenizer::Reference& reference = plait::data::tokenizer::TheReference();
  const std::string python = absl::GetFlag(FLAGS_python);
  if (!python.empty() && access(python.c_str(), X_OK) == 0) {
    char corpus_file[] = "/tmp/tokenizer_bench_corpus_XXXXXX";
    const int fd = mkstemp(corpus_file);
    if (fd < 0 || write(fd, corpus.data(), corpus.size()) != static_cast<ssize_t>(corpus.size())) {
      std::cerr << "tokenizer_bench: cannot write the corpus to " << corpus_file << "\n";
      return 1;
    }
    close(fd);
    reference = {python, corpus_file};
  }
  std::cerr << "corpus: " << corpus.size() << " bytes, "
            << plait::data::tokenizer::Documents().size() << " documents\n";
  plait::data::tokenizer::Register(absl::GetFlag(FLAGS_tokenizers));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  if (!reference.corpus_path.empty()) unlink(reference.corpus_path.c_str());
  return 0;
}
