// generate: completions of prompts by a model in a Hugging Face folder (one a run saved with
// training.save_hf_dir, or one downloaded), a run's folder holding such a folder (or the
// run_dir of its runs: the latest), or a run's checkpoint (a step-NNNNNNNN folder, whose
// trained parameters are exported to a temporary folder first), with the model's own
// tokenizer (a checkpoint has none: give --tokenizer).
//
//   bazel run //tools:generate -- --model=runs/llama_sft_text \
//       --tokenizer=data/tokenizer/testdata/tiny --prompts=prompts.jsonl \
//       --out=completions.jsonl --temperature=0.7 --top_p=0.9 --max_new_tokens=64
//
// Each line of --prompts is a JSON object with `prompt` (text, encoded with the tokenizer's
// special tokens, as transformers' tokenizer(prompt) does) or `prompt_ids` (token ids). Each
// line of --out is one completion: `prompt_index`, `sample`, `text`, `token_ids`,
// `logprobs` (each token's log-probability under the model), `sampling_logprobs` (under the
// distribution it was drawn from) and `stop_reason` (end_of_sequence, stop_string or
// max_new_tokens), prompt by prompt and sample by sample; an id the tokenizer has no token for
// (a model's vocabulary padded beyond it) adds no text. A completion ends at the model's
// end-of-sequence ids (generation_config.json's or config.json's eos_token_id, and the
// tokenizer's eos token). --out must not exist: a finished file is never overwritten. The
// last line on stderr gives the tokens generated a second.
#include "generation/generate.h"

#include <stdlib.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "ATen/Parallel.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/file.h"
#include "base/guarded_main.h"
#include "base/status.h"
#include "checkpoint/manifest.h"
#include "data/tokenizer/load_tokenizer.h"
#include "data/tokenizer/prompts.h"
#include "data/tokenizer/tokenizer.h"
#include "generation/completion_text.h"
#include "generation/sampling.pb.h"
#include "generation/sampling_config.h"
#include "models/causal_lm.h"
#include "models/hf_checkpoint.h"
#include "tools/saved_checkpoint.h"

ABSL_FLAG(std::string, model, "",
          "The model: a Hugging Face folder (config.json and weights), a run's folder holding "
          "one (its run_dir: the latest run), or a checkpoint (a step-NNNNNNNN folder).");
ABSL_FLAG(std::string, tokenizer, "",
          "The tokenizer's folder or file; empty: the model's Hugging Face folder.");
ABSL_FLAG(std::string, prompts, "",
          "A JSONL file of prompts: {\"prompt\": text} or "
          "{\"prompt_ids\": [ids]} a line.");
ABSL_FLAG(std::string, out, "", "The JSONL file of completions to write; must not exist.");
ABSL_FLAG(double, temperature, 1.0, "0: greedy; else the logits are divided by it.");
ABSL_FLAG(int32_t, top_k, 0, "Keep the k most likely tokens; 0: off.");
ABSL_FLAG(double, top_p, 1.0, "Keep the most likely tokens of this much probability; 1: off.");
ABSL_FLAG(double, min_p, 0.0, "Keep the tokens at least this times the most likely's; 0: off.");
ABSL_FLAG(int32_t, max_new_tokens, 128, "The most tokens a completion has.");
ABSL_FLAG(uint64_t, seed, 0, "Seeds every completion's draws (with its prompt and sample).");
ABSL_FLAG(int32_t, num_samples, 1, "Completions of each prompt.");
ABSL_FLAG(std::vector<std::string>, stop, {}, "Texts that end a completion, comma-separated.");
ABSL_FLAG(int32_t, batch_size, 16, "Prompts decoded together.");
ABSL_FLAG(int32_t, threads, 0, "Compute threads; 0: LibTorch's default.");

namespace plait::tools {
namespace {

using data::tokenizer::Tokenizer;

// A model folder, and the folder it may have been written to for the purpose (a
// checkpoint's export), removed when it goes.
struct ModelFolder {
  std::string path;
  std::string temporary;
  ~ModelFolder() {
    if (temporary.empty()) return;
    std::error_code ignored;
    std::filesystem::remove_all(temporary, ignored);
  }
};

// The Hugging Face folder of the model at `path` (--model): the folder itself, where it holds
// config.json; a checkpoint's (checkpoint.json), exported to a temporary folder; a run folder's
// only subfolder that is a Hugging Face folder (its save_hf_dir); for a run_dir, that of its
// latest run.
absl::Status FindModelFolder(const std::string& path, ModelFolder& folder) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(path)) {
    return absl::NotFoundError(absl::StrCat("--model: ", path, " is not a folder"));
  }
  if (fs::exists(fs::path(path) / "config.json")) {
    folder.path = path;
    return absl::OkStatus();
  }
  if (fs::exists(fs::path(path) / "checkpoint.json")) {
    PLAIT_ASSIGN_OR_RETURN(const checkpoint::Manifest manifest,
                           checkpoint::ReadManifest(path + "/checkpoint.json"));
    std::string temporary = (fs::temp_directory_path() / "plait-generate-XXXXXX").string();
    if (mkdtemp(temporary.data()) == nullptr) {
      return absl::InternalError(
          absl::StrCat("cannot create a folder for the checkpoint's model "
                       "in ",
                       fs::temp_directory_path().string()));
    }
    folder.temporary = temporary;
    PLAIT_RETURN_IF_ERROR(
        base::Annotate(ExportSavedCheckpoint(path, manifest, temporary, "--model").status(),
                       absl::StrCat("--model: the checkpoint ", path)));
    folder.path = temporary;
    return absl::OkStatus();
  }
  if (fs::exists(fs::path(path) / "latest")) {
    return FindModelFolder((fs::path(path) / "latest").string(), folder);
  }
  std::vector<std::string> exports;
  for (const fs::directory_entry& entry : fs::directory_iterator(path)) {
    if (entry.is_directory() && fs::exists(entry.path() / "config.json")) {
      exports.push_back(entry.path().string());
    }
  }
  std::sort(exports.begin(), exports.end());
  if (exports.size() == 1) {
    folder.path = exports.front();
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--model: ", path,
      exports.empty()
          ? " holds no model: neither a Hugging Face folder (config.json), a checkpoint "
            "(checkpoint.json), a run's folder with one (training.save_hf_dir) nor a run_dir "
            "(latest)"
          : absl::StrCat(" is a run's folder with ", exports.size(),
                         " Hugging Face folders; name one: ", absl::StrJoin(exports, ", "))));
}

absl::Status Generate() {
  for (const auto& [flag, value] : {std::pair{"--model", absl::GetFlag(FLAGS_model)},
                                    {"--prompts", absl::GetFlag(FLAGS_prompts)},
                                    {"--out", absl::GetFlag(FLAGS_out)}}) {
    if (value.empty()) return absl::InvalidArgumentError(absl::StrCat(flag, " is required"));
  }
  // Under `bazel run`, relative paths are the user's working directory's.
  ModelFolder model_folder;
  PLAIT_RETURN_IF_ERROR(FindModelFolder(base::UserPath(absl::GetFlag(FLAGS_model)), model_folder));
  const std::string& model_dir = model_folder.path;
  const std::string prompts_path = base::UserPath(absl::GetFlag(FLAGS_prompts));
  const std::string out = base::UserPath(absl::GetFlag(FLAGS_out));
  if (std::filesystem::exists(out)) {
    return absl::AlreadyExistsError(
        absl::StrCat("--out: ", out,
                     " exists; give a new file (completions are never written "
                     "over a file)"));
  }
  if (absl::GetFlag(FLAGS_batch_size) < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--batch_size must be at least 1, not ", absl::GetFlag(FLAGS_batch_size)));
  }
  generation::SamplingConfig config;
  config.set_temperature(absl::GetFlag(FLAGS_temperature));
  config.set_top_k(absl::GetFlag(FLAGS_top_k));
  config.set_top_p(absl::GetFlag(FLAGS_top_p));
  config.set_min_p(absl::GetFlag(FLAGS_min_p));
  config.set_max_new_tokens(absl::GetFlag(FLAGS_max_new_tokens));
  config.set_seed(absl::GetFlag(FLAGS_seed));
  config.set_num_samples(absl::GetFlag(FLAGS_num_samples));
  for (const std::string& stop : absl::GetFlag(FLAGS_stop)) config.add_stop_strings(stop);
  if (const std::vector<base::Violation> violations =
          generation::CheckSamplingConfig(config, "flags");
      !violations.empty()) {
    return absl::InvalidArgumentError(violations.front().ToString());
  }
  if (absl::GetFlag(FLAGS_threads) > 0) at::set_num_threads(absl::GetFlag(FLAGS_threads));

  const std::string tokenizer_path = absl::GetFlag(FLAGS_tokenizer).empty()
                                         ? model_dir
                                         : base::UserPath(absl::GetFlag(FLAGS_tokenizer));
  PLAIT_ASSIGN_OR_RETURN(
      const std::unique_ptr<Tokenizer> tokenizer,
      base::Annotate(data::tokenizer::LoadTokenizer(tokenizer_path),
                     "--tokenizer (a tokenizer.json or tokenizer.model, or their folder)"));
  PLAIT_ASSIGN_OR_RETURN(const std::vector<data::tokenizer::Prompt> read,
                         data::tokenizer::ReadPrompts(prompts_path, *tokenizer));
  std::vector<std::vector<int64_t>> prompts;
  for (const data::tokenizer::Prompt& prompt : read) prompts.push_back(prompt.ids);
  PLAIT_ASSIGN_OR_RETURN(const std::shared_ptr<models::CausalLM> model,
                         models::LoadHfModel(model_dir));
  generation::GenerateOptions options;
  PLAIT_ASSIGN_OR_RETURN(options.end_of_sequence, generation::EndOfSequenceIds(model_dir));
  options.end_of_sequence = generation::WithTokenizerEnd(options.end_of_sequence, *tokenizer);
  options.detokenize = [&](const std::vector<int64_t>& ids) {
    return generation::CompletionText(*tokenizer, ids);
  };

  std::string lines;
  int64_t tokens = 0;
  const absl::Time start = absl::Now();
  const auto batch_size = static_cast<size_t>(absl::GetFlag(FLAGS_batch_size));
  for (size_t first = 0; first < prompts.size(); first += batch_size) {
    const std::vector<std::vector<int64_t>> batch(
        prompts.begin() + first, prompts.begin() + std::min(prompts.size(), first + batch_size));
    options.first_prompt = static_cast<int64_t>(first);
    PLAIT_ASSIGN_OR_RETURN(const std::vector<generation::Completion> completions,
                           generation::Generate(*model, batch, config, options));
    PLAIT_ASSIGN_OR_RETURN(const std::string batch_lines,
                           generation::CompletionLines(completions, *tokenizer));
    absl::StrAppend(&lines, batch_lines);
    for (const generation::Completion& completion : completions) {
      tokens += static_cast<int64_t>(completion.tokens.size());
    }
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    std::cerr << absl::StrFormat("generate: %d of %d prompts, %d tokens in %.1f s: %.1f tokens/s\n",
                                 std::min(prompts.size(), first + batch_size), prompts.size(),
                                 tokens, seconds, tokens / std::max(seconds, 1e-9));
  }
  return base::WriteFileAtomically(out, lines);
}

}  // namespace
}  // namespace plait::tools

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "generate --model=HF_DIR --prompts=PROMPTS.jsonl --out=COMPLETIONS.jsonl "
      "[--tokenizer=PATH] [--temperature --top_k --top_p --min_p --max_new_tokens --seed "
      "--num_samples --stop]");
  absl::ParseCommandLine(argc, argv);
  return plait::base::RunCatchingExceptions("generate", [] {
    const absl::Status status = plait::tools::Generate();
    if (!status.ok()) {
      std::cerr << "generate: " << status.message() << "\n";
      return 1;
    }
    return 0;
  });
}
