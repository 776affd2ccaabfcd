#include "data/pairs.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/json.h"
#include "base/status.h"
#include "data/jsonl_lines.h"
#include "nlohmann/json.hpp"
#include "torch/csrc/autograd/generated/variable_factories.h"

namespace plait::data {
namespace {

using Json = nlohmann::json;

// A sequence cut to seq_len tokens, and where its completion starts.
struct Cut {
  std::vector<int64_t> tokens;
  int64_t completion_start = 0;
};

// How many of `prompt`'s ids a sequence keeps (its last max_prompt_length, 0 meaning all).
int64_t KeptPromptLength(const std::vector<int64_t>& prompt, const PairFiles& files) {
  const int64_t prompt_size = static_cast<int64_t>(prompt.size());
  return files.max_prompt_length() > 0 ? std::min(prompt_size, files.max_prompt_length())
                                       : prompt_size;
}

Cut CutSequence(const std::vector<int64_t>& prompt, const std::vector<int64_t>& completion,
                const PairFiles& files, int64_t seq_len) {
  const int64_t kept_prompt = KeptPromptLength(prompt, files);
  Cut cut;
  cut.tokens.assign(prompt.end() - kept_prompt, prompt.end());
  cut.tokens.insert(cut.tokens.end(), completion.begin(), completion.end());
  cut.completion_start = kept_prompt;
  const int64_t excess = static_cast<int64_t>(cut.tokens.size()) - seq_len;
  if (excess > 0) {
    if (files.truncation() == TRUNCATION_KEEP_END) {
      cut.tokens.erase(cut.tokens.begin(), cut.tokens.begin() + excess);
      cut.completion_start = std::max<int64_t>(0, cut.completion_start - excess);
    } else {
      cut.tokens.resize(seq_len);
    }
  }
  return cut;
}

// The token ids of `line`'s key `key`, each below `vocab_size`.
absl::StatusOr<std::vector<int64_t>> TokenIds(const Json& line, const char* key, int64_t vocab_size,
                                              const std::string& where) {
  const base::JsonFields fields(line, where);
  if (!fields.Has(key)) return fields.Error(key, "is missing");
  const Json& list = line[key];
  if (list.is_string()) {
    return fields.Error(key,
                        "is text, not a list of token ids; set format: PAIR_FORMAT_TEXT to "
                        "tokenize it with the model's tokenizer");
  }
  if (!list.is_array()) {
    return fields.Error(key, absl::StrCat(base::DescribeJson(list), " is not a list of token ids"));
  }
  std::vector<int64_t> ids;
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string at = absl::StrCat(key, "[", i, "]");
    const absl::StatusOr<int64_t> id = fields.IntValue(list[i], at);
    if (!id.ok() || *id < 0) {
      return fields.Error(at, absl::StrCat(base::DescribeJson(list[i]), " is not a token id"));
    }
    if (*id >= vocab_size) {
      return fields.Error(at, absl::StrCat(*id, " is not below the vocabulary size ", vocab_size));
    }
    ids.push_back(*id);
  }
  return ids;
}

}  // namespace

int64_t ScoredTokens(const std::vector<int64_t>& prompt, const std::vector<int64_t>& completion,
                     const PairFiles& files, int64_t seq_len) {
  const Cut cut = CutSequence(prompt, completion, files, seq_len);
  // Position t predicts token t + 1: the first token of a sequence is never scored.
  return std::max<int64_t>(
      0, static_cast<int64_t>(cut.tokens.size()) - std::max<int64_t>(cut.completion_start, 1));
}

absl::Status AddPairExample(PairExample example, PairKind kind, const PairFiles& files,
                            int64_t seq_len, absl::string_view where, PairExamples& pairs) {
  bool long_prompt = false;
  for (const auto& [key, completion] : Completions(kind, std::as_const(example))) {
    if (completion->empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": ", key, ": is empty; every completion needs a token"));
    }
    if (ScoredTokens(example.prompt, *completion, files, seq_len) == 0) {
      if (!files.skip_long_prompts()) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": prompt: its ", example.prompt.size(), " tokens leave no ", key,
            " token within seq_len ", seq_len,
            "; shorten it, set max_prompt_length, or set skip_long_prompts to skip such "
            "examples"));
      }
      long_prompt = true;
    }
  }
  if (long_prompt) {
    ++pairs.skipped;
  } else {
    pairs.examples.push_back(std::move(example));
  }
  return absl::OkStatus();
}

absl::Status CheckHasExamples(absl::string_view path, const PairExamples& pairs) {
  if (!pairs.examples.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(path, ": holds no example", pairs.skipped > 0 ? " that fits seq_len" : ""));
}

absl::StatusOr<PairExamples> ReadPairFile(const std::string& path, PairKind kind,
                                          const PairFiles& files, int64_t vocab_size,
                                          int64_t seq_len, int64_t max_line_bytes) {
  PairExamples pairs;
  const auto add_line = [&](const std::string& text, int64_t line_number) -> absl::Status {
    if (text.find_first_not_of(" \t\r") == std::string::npos) return absl::OkStatus();
    const std::string where = absl::StrCat(path, ":", line_number);
    PLAIT_ASSIGN_OR_RETURN(const Json line, base::ParseJson(where, text));
    if (!line.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": not a JSON object"));
    }
    PairExample example;
    PLAIT_ASSIGN_OR_RETURN(example.prompt, TokenIds(line, "prompt", vocab_size, where));
    for (const auto& [key, ids] : Completions(kind, example)) {
      PLAIT_ASSIGN_OR_RETURN(*ids, TokenIds(line, key, vocab_size, where));
    }
    return AddPairExample(std::move(example), kind, files, seq_len, where, pairs);
  };
  PLAIT_RETURN_IF_ERROR(ForEachJsonlLine(path, add_line, max_line_bytes));
  PLAIT_RETURN_IF_ERROR(CheckHasExamples(path, pairs));
  return pairs;
}

int64_t SequenceLength(const std::vector<int64_t>& prompt, const std::vector<int64_t>& completion,
                       const PairFiles& files, int64_t seq_len) {
  // CutSequence's length, without building the sequence: either truncation cuts to seq_len.
  return std::min(KeptPromptLength(prompt, files) + static_cast<int64_t>(completion.size()),
                  seq_len);
}

std::vector<Sequence> SequencesOf(const std::vector<const PairExample*>& examples, PairKind kind) {
  std::vector<Sequence> sequences;
  for (const PairExample* example : examples)
    sequences.push_back({&example->prompt, &example->chosen});
  if (kind == PairKind::kPreference) {
    for (const PairExample* example : examples) {
      sequences.push_back({&example->prompt, &example->rejected});
    }
  }
  return sequences;
}

Batch RowsOf(const std::vector<std::vector<Sequence>>& rows, const PairFiles& files,
             int64_t seq_len, bool packed) {
  const int64_t count = static_cast<int64_t>(rows.size());
  Batch batch{torch::zeros({count, seq_len}, at::kLong),
              torch::full({count, seq_len}, kIgnoreTarget, at::kLong)};
  if (packed) batch.positions = torch::empty({count, seq_len}, at::kLong);
  for (int64_t r = 0; r < count; ++r) {
    auto inputs = batch.inputs.accessor<int64_t, 2>()[r];
    auto targets = batch.targets.accessor<int64_t, 2>()[r];
    int64_t* positions = packed ? batch.positions[r].data_ptr<int64_t>() : nullptr;
    int64_t offset = 0;
    int64_t start = 0;  // where the row's last sequence starts
    for (const auto& [prompt, completion] : rows[r]) {
      const Cut cut = CutSequence(*prompt, *completion, files, seq_len);
      const int64_t size = static_cast<int64_t>(cut.tokens.size());
      for (int64_t t = 0; t < size; ++t) {
        inputs[offset + t] = cut.tokens[t];
        if (t + 1 < size && t + 1 >= cut.completion_start) targets[offset + t] = cut.tokens[t + 1];
        if (packed) positions[offset + t] = t;
      }
      start = offset;
      offset += size;
    }
    // The padding after the row's last sequence continues that sequence's positions: it attends
    // to that sequence, but causally nothing attends to it, and nothing scores it.
    for (int64_t t = offset; packed && t < seq_len; ++t) positions[t] = t - start;
  }
  return batch;
}

Batch PairRows(const std::vector<const PairExample*>& examples, PairKind kind,
               const PairFiles& files, int64_t seq_len) {
  std::vector<std::vector<Sequence>> rows;
  for (const Sequence& sequence : SequencesOf(examples, kind)) rows.push_back({sequence});
  return RowsOf(rows, files, seq_len, /*packed=*/false);
}

std::vector<std::vector<Sequence>> PaddingFreeRows(const std::vector<const PairExample*>& examples,
                                                   PairKind kind, const PairFiles& files,
                                                   int64_t seq_len) {
  std::vector<std::vector<Sequence>> rows;
  int64_t used = seq_len;  // of the last row: none yet
  for (const Sequence& sequence : SequencesOf(examples, kind)) {
    const int64_t size = SequenceLength(*sequence.first, *sequence.second, files, seq_len);
    if (used + size > seq_len) {
      rows.emplace_back();
      used = 0;
    }
    rows.back().push_back(sequence);
    used += size;
  }
  return rows;
}

}  // namespace plait::data
