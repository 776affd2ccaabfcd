// Tokenizes text with a model's own tokenizer into token shards for training:
//
//   bazel run //tools:tokenize -- --tokenizer=path/to/hf_model --input=a.jsonl,b.txt
//       --output=data/corpus [--jsonl_field=text] [--val_fraction=0.005]
//
// writes data/corpus_train_000000.bin, ... and data/corpus_val_000000.bin (llm.c's format:
// uint16 ids for vocabularies of at most 65,536 tokens, else uint32 ids under llm.c's Llama 3
// header), showing a progress bar on stderr
// and a summary (documents, tokens, bytes per token, the format to give the data plan), and
// lists them in data/corpus_shards.json. A rerun under the same prefix replaces the shards that
// list names (and removes those it no longer writes); any other file named as a shard is
// refused before anything is read.
#include <unistd.h>

#include <algorithm>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/file.h"
#include "base/guarded_main.h"
#include "base/human.h"
#include "data/data.pb.h"
#include "data/tokenizer/corpus_tokenizer.h"
#include "data/tokenizer/load_tokenizer.h"

ABSL_FLAG(std::string, tokenizer, "",
          "The model's folder (with tokenizer.json or tokenizer.model), or a tokenizer file.");
ABSL_FLAG(std::vector<std::string>, input, {},
          "Comma-separated input files: *.jsonl (a document per line) or plain text.");
ABSL_FLAG(std::string, output, "", "Prefix of the shards: PREFIX_{train,val}_NNNNNN.bin.");
ABSL_FLAG(std::string, jsonl_field, "text", "The field of a JSONL line that holds the text.");
ABSL_FLAG(std::string, split_text_at, "",
          "Separator of documents in plain text files (e.g. a blank line, \"\\n\\n\"); by "
          "default a text file is one document.");
ABSL_FLAG(double, val_fraction, 0, "Fraction of documents held out for validation, in [0, 1).");
ABSL_FLAG(int64_t, shard_tokens, 100'000'000, "Tokens per shard.");
ABSL_FLAG(int, threads, static_cast<int>(std::max(1u, std::thread::hardware_concurrency())),
          "Threads encoding documents (default: every core).");
ABSL_FLAG(std::string, eos_token, "",
          "The token written before each document; by default the tokenizer's EOS.");
ABSL_FLAG(std::string, invalid_utf8, "refuse",
          "Text that is not valid UTF-8: refuse (stop, naming the file, line and byte, as an SFT "
          "run does) or replace (encode each ill-formed sequence as U+FFFD, as Python's "
          "errors=\"replace\" does, and count the documents).");

namespace {

using plait::base::HumanBytes;
using plait::base::HumanCount;
namespace tokenizer = plait::data::tokenizer;

// Unescapes \n, \t and \\ in a flag, so that a separator can be given on a command line.
std::string Unescape(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\\' && i + 1 < text.size()) {
      const char next = text[++i];
      out += next == 'n' ? '\n' : next == 't' ? '\t' : next;
    } else {
      out += text[i];
    }
  }
  return out;
}

// A progress line on stderr: redrawn in place on a terminal, else printed every 10 seconds.
class ProgressBar {
 public:
  ProgressBar() : terminal_(isatty(STDERR_FILENO)), start_(absl::Now()) {}

  void Update(const tokenizer::CorpusProgress& progress) {
    const absl::Time now = absl::Now();
    if (now - last_ < (terminal_ ? absl::Milliseconds(200) : absl::Seconds(10))) return;
    last_ = now;
    const double seconds = std::max(1e-3, absl::ToDoubleSeconds(now - start_));
    const double done = progress.bytes_total > 0
                            ? static_cast<double>(progress.bytes_read) / progress.bytes_total
                            : 1.0;
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(done * kWidth);
    const double eta = done > 0 ? seconds * (1 - done) / done : 0;
    std::cerr << absl::StrFormat(
        "%s[%s%s] %3.0f%% %s / %s  %s documents  %s tokens/s  ETA %d:%02d:%02d%s",
        terminal_ ? "\r" : "", std::string(filled, '#'), std::string(kWidth - filled, '.'),
        100 * done, HumanBytes(progress.bytes_read), HumanBytes(progress.bytes_total),
        HumanCount(progress.documents), HumanCount(progress.tokens / seconds),
        static_cast<int>(eta) / 3600, static_cast<int>(eta) / 60 % 60, static_cast<int>(eta) % 60,
        terminal_ ? "" : "\n");
  }

  void Finish() {
    if (terminal_) std::cerr << "\n";
  }

 private:
  bool terminal_;
  absl::Time start_;
  absl::Time last_ = absl::InfinitePast();
};

int Tokenize(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Tokenizes text or JSONL with a model's tokenizer into token shards.\n"
      "  tokenize --tokenizer=MODEL_DIR --input=FILES --output=PREFIX [--val_fraction=F]");
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_tokenizer).empty()) {
    std::cerr << "tokenize: --tokenizer: not given (the model's folder or tokenizer file)\n";
    return 1;
  }
  const absl::StatusOr<std::unique_ptr<tokenizer::Tokenizer>> loaded =
      tokenizer::LoadTokenizer(plait::base::UserPath(absl::GetFlag(FLAGS_tokenizer)));
  if (!loaded.ok()) {
    std::cerr << "tokenize: " << loaded.status().message() << "\n";
    return 1;
  }
  tokenizer::CorpusOptions options;
  for (const std::string& input : absl::GetFlag(FLAGS_input)) {
    options.inputs.push_back(plait::base::UserPath(input));
  }
  options.output_prefix =
      absl::GetFlag(FLAGS_output).empty() ? "" : plait::base::UserPath(absl::GetFlag(FLAGS_output));
  options.jsonl_field = absl::GetFlag(FLAGS_jsonl_field);
  options.split_text_at = Unescape(absl::GetFlag(FLAGS_split_text_at));
  options.val_fraction = absl::GetFlag(FLAGS_val_fraction);
  options.shard_tokens = absl::GetFlag(FLAGS_shard_tokens);
  options.threads = absl::GetFlag(FLAGS_threads);
  options.eos_token = absl::GetFlag(FLAGS_eos_token);
  const std::string invalid_utf8 = absl::GetFlag(FLAGS_invalid_utf8);
  if (invalid_utf8 != "refuse" && invalid_utf8 != "replace") {
    std::cerr << "tokenize: --invalid_utf8: \"" << invalid_utf8
              << "\" is neither refuse nor replace\n";
    return 1;
  }
  options.replace_invalid_utf8 = invalid_utf8 == "replace";

  ProgressBar bar;
  const absl::Time start = absl::Now();
  const absl::StatusOr<tokenizer::CorpusSummary> summary = tokenizer::TokenizeCorpus(
      **loaded, options, [&](const tokenizer::CorpusProgress& progress) { bar.Update(progress); });
  bar.Finish();
  if (!summary.ok()) {
    std::cerr << "tokenize: " << summary.status().message() << "\n";
    return 1;
  }
  const double seconds = std::max(1e-3, absl::ToDoubleSeconds(absl::Now() - start));
  std::cout << absl::StrFormat(
      "documents: %d (%d held out)\n"
      "tokens: %d (%d held out), EOS separators included\n"
      "text: %s, %.2f bytes per token\n"
      "time: %.1f s, %.2f MB/s on %d threads (%.2f MB/s per thread)\n",
      summary->documents, summary->val_documents, summary->tokens, summary->val_tokens,
      HumanBytes(summary->text_bytes),
      summary->tokens > 0 ? static_cast<double>(summary->text_bytes) / summary->tokens : 0.0,
      seconds, summary->text_bytes / seconds / 1e6, options.threads,
      summary->text_bytes / seconds / 1e6 / options.threads);
  if (summary->invalid_utf8_documents > 0) {
    std::cout << absl::StrFormat(
        "invalid UTF-8: %d documents had ill-formed bytes, encoded as U+FFFD\n",
        summary->invalid_utf8_documents);
  }
  std::cout << "tokenizer: " << (*loaded)->hash() << " (vocabulary " << (*loaded)->vocab_size()
            << ")\nformat: " << plait::data::TokenFormat_Name(summary->format) << "\nfiles:\n  "
            << absl::StrJoin(summary->files, "\n  ") << "\n";
  if (summary->replaced_files > 0) {
    std::cout << "replaced: " << summary->replaced_files << " shards of an earlier run under "
              << options.output_prefix << " (listed in " << options.output_prefix
              << "_shards.json)\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return plait::base::RunCatchingExceptions("tokenize", [&] { return Tokenize(argc, argv); });
}
