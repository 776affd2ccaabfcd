#include "data/tokenizer/corpus_tokenizer.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/file.h"
#include "base/json.h"
#include "base/own_output.h"
#include "base/status.h"
#include "data/token_file.h"
#include "nlohmann/json.hpp"

namespace plait::data::tokenizer {
namespace {

// Documents are encoded in batches of about this many bytes of text, and a round encodes
// kBatchesPerThread batches per thread before writing them: enough work per thread to keep
// every core busy, little enough memory.
constexpr size_t kBatchBytes = 1 << 20;
constexpr int kBatchesPerThread = 4;

// The largest id uint16 shards hold.
constexpr int64_t kUint16Vocab = 1 << 16;

struct Document {
  std::string text;  // the raw text, or a JSONL line
  int input;         // index into options.inputs
  int64_t line;      // 1-based, for JSONL; 0 for text
};

struct Encoded {
  std::vector<int32_t> ids;  // EOS, then the document's ids
  int64_t text_bytes = 0;
  bool invalid_utf8 = false;
};

// Writes one split (train or val) as numbered shards of at most shard_tokens ids in llm.c's
// format, uint16 ids or (`wide`) uint32 ones, each under a temporary name until Finish renames
// them all.
class ShardWriter {
 public:
  ShardWriter(std::string prefix, bool wide, int64_t shard_tokens)
      : prefix_(std::move(prefix)), wide_(wide), shard_tokens_(shard_tokens) {}

  absl::Status Append(const std::vector<int32_t>& ids) {
    for (size_t done = 0; done < ids.size();) {
      if (!file_.is_open() || in_shard_ == shard_tokens_) PLAIT_RETURN_IF_ERROR(NextShard());
      const size_t count =
          std::min<size_t>(ids.size() - done, static_cast<size_t>(shard_tokens_ - in_shard_));
      if (wide_) {
        file_.write(reinterpret_cast<const char*>(ids.data() + done), count * 4);
      } else {
        buffer16_.assign(ids.begin() + done, ids.begin() + done + count);
        file_.write(reinterpret_cast<const char*>(buffer16_.data()), count * 2);
      }
      in_shard_ += count;
      done += count;
    }
    return file_ ? absl::OkStatus() : WriteError();
  }

  // The shards' final names, in order.
  const std::vector<std::string>& Names() const { return names_; }

  // Completes the last shard and gives every shard its final name.
  absl::Status Finish() {
    PLAIT_RETURN_IF_ERROR(CloseShard());
    for (const std::string& name : names_) {
      std::error_code error;
      std::filesystem::rename(name + ".tmp", name, error);
      if (error) {
        return absl::InternalError(
            absl::StrCat(name, ".tmp: could not rename to ", name, ": ", error.message()));
      }
    }
    return absl::OkStatus();
  }

  // Removes the shards written so far (after an error).
  void Abandon() {
    file_.close();
    for (const std::string& name : names_) std::remove((name + ".tmp").c_str());
  }

 private:
  absl::Status NextShard() {
    PLAIT_RETURN_IF_ERROR(CloseShard());
    names_.push_back(absl::StrFormat("%s_%06d.bin", prefix_, names_.size()));
    file_.open(names_.back() + ".tmp", std::ios::binary | std::ios::trunc);
    if (!file_) return WriteError();
    in_shard_ = 0;
    // The header is written when the shard is complete (CloseShard), with its count.
    const std::vector<int32_t> header(kLlmcHeaderInts, 0);
    file_.write(reinterpret_cast<const char*>(header.data()), kLlmcHeaderInts * 4);
    return absl::OkStatus();
  }

  absl::Status CloseShard() {
    if (!file_.is_open()) return absl::OkStatus();
    const int32_t header[3] = {wide_ ? kLlmcUint32Magic : kLlmcMagic,
                               wide_ ? kLlmcUint32Version : kLlmcVersion,
                               static_cast<int32_t>(in_shard_)};
    file_.seekp(0);
    file_.write(reinterpret_cast<const char*>(header), sizeof(header));
    file_.close();
    return file_ ? absl::OkStatus() : WriteError();
  }

  absl::Status WriteError() const {
    return absl::InternalError(absl::StrCat(names_.back(), ".tmp: could not be written"));
  }

  std::string prefix_;
  bool wide_;
  int64_t shard_tokens_;
  std::ofstream file_;
  int64_t in_shard_ = 0;
  std::vector<uint16_t> buffer16_;
  std::vector<std::string> names_;
};

// The list of the shards that tokenize wrote under a prefix, PREFIX_shards.json: what makes
// them recognisably its own output, which a later run under the prefix replaces (and only
// them: any other file named as a shard is refused before any work).
class ShardList {
 public:
  static constexpr char kWriter[] = "plait tokenize";

  // The shards and the list already under `prefix`, each checked to be this writer's own
  // (base/own_output.h).
  static absl::StatusOr<ShardList> CheckEarlier(const std::string& prefix) {
    ShardList list(prefix);
    PLAIT_RETURN_IF_ERROR(
        base::CheckOutputFile(
            list.path_, [&list](const std::string& path) { return list.ReadNames(path); },
            "tokenize")
            .status());
    const std::filesystem::path folder = std::filesystem::path(prefix).parent_path();
    const std::string stem = std::filesystem::path(prefix).filename().string();
    std::error_code error;
    for (std::filesystem::directory_iterator it(folder.empty() ? "." : folder, error), end;
         !error && it != end; it.increment(error)) {
      const std::string name = it->path().filename().string();
      if (!absl::EndsWith(name, ".bin") ||
          !(absl::StartsWith(name, stem + "_train_") || absl::StartsWith(name, stem + "_val_"))) {
        continue;
      }
      PLAIT_RETURN_IF_ERROR(base::CheckOutputFile(
                                it->path().string(),
                                [&](const std::string&) { return list.names_.count(name) > 0; },
                                "tokenize")
                                .status());
      list.earlier_.push_back(it->path().string());
    }
    return list;
  }

  // Before the new shards take their names: the list names the earlier ones and the new ones,
  // so whatever a crash leaves is listed.
  absl::Status Extend(const std::vector<std::string>& shards) {
    Add(shards);
    return Write();
  }

  // After they have: removes the earlier shards the new ones did not replace and lists only
  // the new ones. The number of earlier shards replaced or removed.
  absl::StatusOr<int64_t> Settle(const std::vector<std::string>& shards) {
    names_.clear();
    Add(shards);
    for (const std::string& earlier : earlier_) {
      if (names_.count(std::filesystem::path(earlier).filename().string()) > 0) continue;
      std::error_code error;
      std::filesystem::remove(earlier, error);
      if (error) {
        return absl::InternalError(absl::StrCat(earlier,
                                                ": a shard of an earlier run under the "
                                                "prefix could not be removed: ",
                                                error.message()));
      }
    }
    PLAIT_RETURN_IF_ERROR(Write());
    return static_cast<int64_t>(earlier_.size());
  }

 private:
  explicit ShardList(const std::string& prefix) : path_(prefix + "_shards.json") {}

  // Whether the file `path` is a list this writer wrote; when it is, the names it lists are
  // now in names_.
  bool ReadNames(const std::string& path) {
    const absl::StatusOr<std::string> text = base::ReadFile(path);
    if (!text.ok()) return false;
    const absl::StatusOr<nlohmann::json> json = base::ParseJson(path, *text);
    if (!json.ok() || !json->is_object() || json->value("writer", "") != kWriter) return false;
    const auto files = json->find("files");
    if (files == json->end() || !files->is_array()) return false;
    for (const auto& name : *files) {
      if (!name.is_string()) return false;
    }
    for (const auto& name : *files) names_.insert(name.get<std::string>());
    return true;
  }

  // Lists `shards` by file name.
  void Add(const std::vector<std::string>& shards) {
    for (const std::string& shard : shards) {
      names_.insert(std::filesystem::path(shard).filename().string());
    }
  }

  absl::Status Write() const {
    const nlohmann::json json = {{"writer", kWriter}, {"files", names_}};
    return base::WriteFileAtomically(path_, json.dump(2) + "\n");
  }

  std::string path_;
  std::set<std::string> names_;       // listed, by file name
  std::vector<std::string> earlier_;  // shards found under the prefix before this run
};

// OK when the folder of the shards `prefix` names exists and this process may write in it;
// else an error naming it, before any input is read.
absl::Status CheckOutputFolder(const std::string& prefix) {
  const std::filesystem::path folder = std::filesystem::path(prefix).parent_path();
  const std::string shown = folder.empty() ? "the current folder" : folder.string();
  std::error_code error;
  if (!folder.empty() && !std::filesystem::is_directory(folder, error)) {
    return absl::InvalidArgumentError(
        absl::StrCat("output: ", prefix, ": the folder ", shown, " does not exist; create it"));
  }
  if (access(folder.empty() ? "." : folder.c_str(), W_OK | X_OK) != 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("output: ", prefix, ": cannot write in ", shown, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

class CorpusTokenizer {
 public:
  // `wide`: uint32 ids (ShardWriter).
  CorpusTokenizer(const Tokenizer& tokenizer, const CorpusOptions& options, int32_t eos, bool wide,
                  ShardList shard_list)
      : tokenizer_(tokenizer),
        options_(options),
        eos_(eos),
        train_(options.output_prefix + "_train", wide, options.shard_tokens),
        val_(options.output_prefix + "_val", wide, options.shard_tokens),
        shard_list_(std::move(shard_list)) {
    summary_.format = TOKEN_FORMAT_LLMC;
  }

  absl::StatusOr<CorpusSummary> Run(const std::function<void(const CorpusProgress&)>& progress) {
    absl::Status status = ReadAll(progress);
    if (status.ok()) status = Flush(progress);
    if (status.ok() && summary_.documents == 0) {
      status = absl::InvalidArgumentError(
          absl::StrCat("inputs: ", absl::StrJoin(options_.inputs, ", "),
                       " hold no document (empty, or blank lines only)"));
    }
    if (!status.ok()) {
      train_.Abandon();
      val_.Abandon();
      return status;
    }
    std::vector<std::string> shards = train_.Names();
    const std::vector<std::string>& val_shards = val_.Names();
    shards.insert(shards.end(), val_shards.begin(), val_shards.end());
    PLAIT_RETURN_IF_ERROR(shard_list_.Extend(shards));
    PLAIT_RETURN_IF_ERROR(train_.Finish());
    PLAIT_RETURN_IF_ERROR(val_.Finish());
    PLAIT_ASSIGN_OR_RETURN(summary_.replaced_files, shard_list_.Settle(shards));
    summary_.files = std::move(shards);
    return summary_;
  }

 private:
  absl::Status ReadAll(const std::function<void(const CorpusProgress&)>& progress) {
    for (const std::string& input : options_.inputs) {
      std::error_code error;
      const uintmax_t size = std::filesystem::file_size(input, error);
      if (error) return absl::NotFoundError(absl::StrCat(input, ": ", error.message()));
      progress_.bytes_total += size;
    }
    for (int input = 0; input < static_cast<int>(options_.inputs.size()); ++input) {
      const std::string& path = options_.inputs[input];
      if (absl::EndsWith(path, ".jsonl")) {
        PLAIT_RETURN_IF_ERROR(ForEachJsonlLine(
            path,
            [&](std::string& line, int64_t number) {
              progress_.bytes_read += line.size() + 1;
              if (line.empty()) return absl::OkStatus();
              return Add({std::move(line), input, number}, progress);
            },
            options_.max_jsonl_line_bytes));
      } else {
        PLAIT_ASSIGN_OR_RETURN(std::string text, base::ReadFile(path));
        progress_.bytes_read += text.size();
        if (options_.split_text_at.empty()) {
          PLAIT_RETURN_IF_ERROR(Add({std::move(text), input, 0}, progress));
          continue;
        }
        for (absl::string_view part : absl::StrSplit(text, options_.split_text_at)) {
          if (!part.empty()) PLAIT_RETURN_IF_ERROR(Add({std::string(part), input, 0}, progress));
        }
      }
    }
    return absl::OkStatus();
  }

  absl::Status Add(Document document, const std::function<void(const CorpusProgress&)>& progress) {
    batch_bytes_ += document.text.size();
    pending_.back().push_back(std::move(document));
    if (batch_bytes_ < kBatchBytes) return absl::OkStatus();
    batch_bytes_ = 0;
    if (static_cast<int>(pending_.size()) < options_.threads * kBatchesPerThread) {
      pending_.emplace_back();
      return absl::OkStatus();
    }
    return Flush(progress);
  }

  // Encodes the pending batches on options.threads threads and writes them in order.
  absl::Status Flush(const std::function<void(const CorpusProgress&)>& progress) {
    std::vector<std::vector<Encoded>> encoded(pending_.size());
    std::vector<absl::Status> errors(pending_.size());
    std::atomic<size_t> next{0};
    const auto work = [&] {
      for (size_t b = next++; b < pending_.size(); b = next++) {
        for (const Document& document : pending_[b]) {
          absl::StatusOr<Encoded> result = Encode(document);
          if (!result.ok()) {
            errors[b] = result.status();
            break;
          }
          encoded[b].push_back(*std::move(result));
        }
      }
    };
    std::vector<std::thread> threads;
    for (int t = 1; t < std::min<int>(options_.threads, pending_.size()); ++t) {
      threads.emplace_back(work);
    }
    work();
    for (std::thread& thread : threads) thread.join();
    for (size_t b = 0; b < pending_.size(); ++b) {
      PLAIT_RETURN_IF_ERROR(errors[b]);
      for (const Encoded& document : encoded[b]) PLAIT_RETURN_IF_ERROR(Write(document));
    }
    pending_.assign(1, {});
    if (progress) progress(progress_);
    return absl::OkStatus();
  }

  absl::StatusOr<Encoded> Encode(const Document& document) const {
    Encoded encoded;
    std::string replaced;
    absl::string_view raw = document.text;
    if (const std::optional<size_t> invalid = FirstInvalidUtf8(raw)) {
      if (!options_.replace_invalid_utf8) {
        return absl::InvalidArgumentError(absl::StrCat(
            options_.inputs[document.input],
            document.line > 0 ? absl::StrCat(":", document.line) : "",
            ": not valid UTF-8 at byte ", *invalid,
            " (replace_invalid_utf8, tokenize's --invalid_utf8=replace, encodes such bytes as "
            "U+FFFD)"));
      }
      replaced = ReplaceInvalidUtf8(raw);
      raw = replaced;
      encoded.invalid_utf8 = true;
    }
    std::string from_json;
    absl::string_view text = raw;
    if (document.line > 0) {
      const std::string where = absl::StrCat(options_.inputs[document.input], ":", document.line);
      PLAIT_ASSIGN_OR_RETURN(const nlohmann::json line, base::ParseJson(where, raw));
      if (!line.is_object()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": expected a JSON object, got ", base::DescribeJson(line)));
      }
      PLAIT_ASSIGN_OR_RETURN(from_json,
                             base::JsonFields(line, where).String(options_.jsonl_field.c_str()));
      text = from_json;
    }
    encoded.text_bytes = text.size();
    encoded.ids.push_back(eos_);
    PLAIT_ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                           tokenizer_.Encode(text, /*add_special_tokens=*/true));
    encoded.ids.insert(encoded.ids.end(), ids.begin(), ids.end());
    return encoded;
  }

  absl::Status Write(const Encoded& document) {
    const int64_t index = summary_.documents++;
    const double f = options_.val_fraction;
    // Document i is held out when floor((i + 1) f) > floor(i f): exactly f of them, evenly
    // spread, whatever the corpus's length.
    const bool val = std::floor((index + 1) * f) > std::floor(index * f);
    PLAIT_RETURN_IF_ERROR((val ? val_ : train_).Append(document.ids));
    const int64_t tokens = document.ids.size();
    summary_.tokens += tokens;
    summary_.text_bytes += document.text_bytes;
    summary_.invalid_utf8_documents += document.invalid_utf8;
    if (val) {
      ++summary_.val_documents;
      summary_.val_tokens += tokens;
    }
    ++progress_.documents;
    progress_.tokens += tokens;
    return absl::OkStatus();
  }

  const Tokenizer& tokenizer_;
  const CorpusOptions& options_;
  const int32_t eos_;
  ShardWriter train_;
  ShardWriter val_;
  ShardList shard_list_;
  std::vector<std::vector<Document>> pending_{1};
  size_t batch_bytes_ = 0;
  CorpusProgress progress_;
  CorpusSummary summary_;
};

}  // namespace

absl::StatusOr<CorpusSummary> TokenizeCorpus(
    const Tokenizer& tokenizer, const CorpusOptions& options,
    const std::function<void(const CorpusProgress&)>& on_progress) {
  if (options.inputs.empty()) return absl::InvalidArgumentError("inputs: none given");
  if (options.output_prefix.empty()) return absl::InvalidArgumentError("output: not given");
  if (!(options.val_fraction >= 0 && options.val_fraction < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("val_fraction: ", options.val_fraction, " is not in [0, 1)"));
  }
  if (options.shard_tokens < 1 || options.shard_tokens > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat("shard_tokens: ", options.shard_tokens,
                                                   " is not in 1..2147483647 (llm.c's header "
                                                   "counts tokens in an int32)"));
  }
  if (options.threads < 1) {
    return absl::InvalidArgumentError(absl::StrCat("threads: ", options.threads, " is below 1"));
  }
  std::optional<int32_t> eos = tokenizer.eos_id();
  if (!options.eos_token.empty()) {
    eos = tokenizer.TokenToId(options.eos_token);
    if (!eos) {
      return absl::InvalidArgumentError(
          absl::StrCat("eos_token: \"", options.eos_token, "\" is not a token of the tokenizer"));
    }
  }
  if (!eos) {
    return absl::InvalidArgumentError(
        "eos_token: the tokenizer names no EOS (tokenizer_config.json has no eos_token); "
        "name the token that separates documents");
  }
  PLAIT_RETURN_IF_ERROR(CheckOutputFolder(options.output_prefix));
  PLAIT_ASSIGN_OR_RETURN(ShardList shard_list, ShardList::CheckEarlier(options.output_prefix));
  const bool wide = tokenizer.vocab_size() > kUint16Vocab;
  return CorpusTokenizer(tokenizer, options, *eos, wide, std::move(shard_list)).Run(on_progress);
}

}  // namespace plait::data::tokenizer
