#include "data/tokenizer/text_pairs.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "base/file.h"
#include "base/hash.h"
#include "base/json.h"
#include "base/status.h"
#include "nlohmann/json.hpp"

namespace plait::data::tokenizer {
namespace {

using json = nlohmann::json;

// Changes whenever the ids a text gives change, so that caches written before are rebuilt.
constexpr int kCacheVersion = 1;

// An example's ids and the line of the text file it was read from.
struct LineExample {
  int64_t line = 0;
  PairExample example;
};

absl::StatusOr<std::vector<int32_t>> EncodeField(const Tokenizer& tokenizer, absl::string_view text,
                                                 const char* field, const std::string& where) {
  absl::StatusOr<std::vector<int32_t>> ids = tokenizer.Encode(text, /*add_special_tokens=*/true);
  if (!ids.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": ", field, ": ", ids.status().message()));
  }
  return ids;
}

// The ids of one line of the text file, tokenized as TRL does (text_pairs.h); `eos` is the
// text of the tokenizer's EOS token.
absl::StatusOr<PairExample> TokenizeLine(absl::string_view line, const std::string& where,
                                         PairKind kind, const Tokenizer& tokenizer,
                                         const std::string& eos) {
  PLAIT_ASSIGN_OR_RETURN(const json object, base::ParseJson(where, line));
  if (!object.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": expected a JSON object"));
  }
  const base::JsonFields fields(object, where);
  PLAIT_ASSIGN_OR_RETURN(const std::string prompt, fields.String("prompt"));
  PLAIT_ASSIGN_OR_RETURN(const std::vector<int32_t> prompt_ids,
                         EncodeField(tokenizer, prompt, "prompt", where));
  PairExample example;
  const auto completions = Completions(kind, example);
  std::vector<std::vector<int32_t>> sequences;  // prompt + each completion
  size_t completion_start = prompt_ids.size();
  for (const auto& [field, ids] : completions) {
    PLAIT_ASSIGN_OR_RETURN(std::string completion, fields.String(field));
    if (completion.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": ", field, ": is empty; every completion needs text"));
    }
    if (!absl::EndsWith(completion, eos)) completion += eos;
    PLAIT_ASSIGN_OR_RETURN(std::vector<int32_t> sequence,
                           EncodeField(tokenizer, prompt + completion, field, where));
    const size_t common =
        std::mismatch(prompt_ids.begin(), prompt_ids.end(), sequence.begin(), sequence.end())
            .first -
        prompt_ids.begin();
    completion_start = std::min(completion_start, common);
    sequences.push_back(std::move(sequence));
  }
  example.prompt.assign(prompt_ids.begin(), prompt_ids.begin() + completion_start);
  for (size_t i = 0; i < completions.size(); ++i) {
    completions[i].second->assign(sequences[i].begin() + completion_start, sequences[i].end());
  }
  return example;
}

absl::StatusOr<std::vector<LineExample>> TokenizeText(absl::string_view text,
                                                      const std::string& path, PairKind kind,
                                                      const Tokenizer& tokenizer,
                                                      int64_t max_line_bytes) {
  if (!tokenizer.eos_id().has_value()) {
    return absl::InvalidArgumentError(
        "the tokenizer names no EOS token (tokenizer_config.json's eos_token), which ends "
        "every completion");
  }
  PLAIT_ASSIGN_OR_RETURN(const std::string eos, tokenizer.Decode({*tokenizer.eos_id()}));
  std::vector<LineExample> examples;
  int64_t number = 0;
  for (const absl::string_view line : absl::StrSplit(text, '\n')) {
    ++number;
    PLAIT_RETURN_IF_ERROR(CheckJsonlLineLength(path, number, line.size(), max_line_bytes));
    if (line.find_first_not_of(" \t\r") == absl::string_view::npos) continue;
    PLAIT_ASSIGN_OR_RETURN(PairExample example, TokenizeLine(line, absl::StrCat(path, ":", number),
                                                             kind, tokenizer, eos));
    examples.push_back({number, std::move(example)});
  }
  return examples;
}

// The cache's first line: what it was made from, and the checksum of the lines after it.
std::string CacheHeader(PairKind kind, const Tokenizer& tokenizer, uint64_t text_hash,
                        absl::string_view body) {
  return json{{"plait_text_pairs", kCacheVersion},
              {"kind", kind == PairKind::kSft ? "sft" : "preference"},
              {"tokenizer", tokenizer.hash()},
              {"text", absl::StrFormat("%016x", text_hash)},
              {"checksum", absl::StrFormat("%016x", base::Fnv1a64Words(base::kFnv1a64OffsetBasis,
                                                                       body.data(), body.size()))}}
      .dump();
}

std::string CacheBody(const std::vector<LineExample>& examples, PairKind kind) {
  std::string body;
  for (const LineExample& line : examples) {
    json object = {{"line", line.line}, {"prompt", line.example.prompt}};
    for (const auto& [field, ids] : Completions(kind, line.example)) object[field] = *ids;
    absl::StrAppend(&body, object.dump(), "\n");
  }
  return body;
}

// The ids `value` holds, each a token of `tokenizer`; nullopt when it holds anything else.
std::optional<std::vector<int64_t>> CachedIds(const json& value, const Tokenizer& tokenizer) {
  if (!value.is_array()) return std::nullopt;
  std::vector<int64_t> ids;
  for (const json& id : value) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
        id.get<int64_t>() >= tokenizer.vocab_size()) {
      return std::nullopt;
    }
    ids.push_back(id.get<int64_t>());
  }
  return ids;
}

// The examples of the cache `cache_path`; nullopt when there is none or it does not match its
// header (a torn write, another tokenizer, another text, an older format): it is then rebuilt.
std::optional<std::vector<LineExample>> ReadCache(const std::string& cache_path, PairKind kind,
                                                  const Tokenizer& tokenizer, uint64_t text_hash) {
  absl::StatusOr<std::string> contents = base::ReadFile(cache_path);
  if (!contents.ok()) return std::nullopt;
  const size_t header_end = contents->find('\n');
  if (header_end == std::string::npos) return std::nullopt;
  const absl::string_view body = absl::string_view(*contents).substr(header_end + 1);
  if (absl::string_view(*contents).substr(0, header_end) !=
      CacheHeader(kind, tokenizer, text_hash, body)) {
    return std::nullopt;
  }
  std::vector<LineExample> examples;
  for (const absl::string_view line : absl::StrSplit(body, '\n', absl::SkipEmpty())) {
    const absl::StatusOr<json> parsed = base::ParseJson(cache_path, line);
    if (!parsed.ok()) return std::nullopt;
    const json& object = *parsed;
    if (!object.is_object() || !object.contains("line") || !object["line"].is_number_integer()) {
      return std::nullopt;
    }
    LineExample example{object["line"].get<int64_t>(), {}};
    std::optional<std::vector<int64_t>> prompt =
        CachedIds(object.value("prompt", json()), tokenizer);
    if (!prompt.has_value()) return std::nullopt;
    example.example.prompt = *std::move(prompt);
    for (const auto& [field, ids] : Completions(kind, example.example)) {
      std::optional<std::vector<int64_t>> cached =
          CachedIds(object.value(field, json()), tokenizer);
      if (!cached.has_value()) return std::nullopt;
      *ids = *std::move(cached);
    }
    examples.push_back(std::move(example));
  }
  return examples;
}

// Publishes `contents` as `cache_path`. Ranks that build the same cache at once each write a
// temporary file of their own (WriteFileAtomically's is one per path) and rename it into
// place; the contents are the same. A cache that cannot be written is not an error: the text
// is tokenized again next time.
void WriteCache(const std::string& cache_path, absl::string_view contents) {
  const std::string own = absl::StrCat(cache_path, ".", getpid(), "-",
                                       std::hash<std::thread::id>()(std::this_thread::get_id()));
  if (!base::WriteFileAtomically(own, contents).ok() ||
      std::rename(own.c_str(), cache_path.c_str()) != 0) {
    std::remove(own.c_str());
  }
}

}  // namespace

absl::StatusOr<PairExamples> ReadTextPairFile(const std::string& path, PairKind kind,
                                              const PairFiles& files, const Tokenizer& tokenizer,
                                              int64_t seq_len, int64_t max_line_bytes) {
  PLAIT_ASSIGN_OR_RETURN(const std::string text, base::ReadFile(path));
  const uint64_t text_hash =
      base::Fnv1a64Words(base::kFnv1a64OffsetBasis, text.data(), text.size());
  const std::string cache_path =
      absl::StrFormat("%s.%s-%016x.ids.jsonl", path, tokenizer.hash(), text_hash);
  std::optional<std::vector<LineExample>> examples =
      ReadCache(cache_path, kind, tokenizer, text_hash);
  if (!examples.has_value()) {
    PLAIT_ASSIGN_OR_RETURN(examples, TokenizeText(text, path, kind, tokenizer, max_line_bytes));
    const std::string body = CacheBody(*examples, kind);
    WriteCache(cache_path, absl::StrCat(CacheHeader(kind, tokenizer, text_hash, body), "\n", body));
  }
  PairExamples pairs;
  for (LineExample& line : *examples) {
    PLAIT_RETURN_IF_ERROR(AddPairExample(std::move(line.example), kind, files, seq_len,
                                         absl::StrCat(path, ":", line.line), pairs));
  }
  PLAIT_RETURN_IF_ERROR(CheckHasExamples(path, pairs));
  return pairs;
}

}  // namespace plait::data::tokenizer
