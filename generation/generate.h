// Completions of prompts by a model, decoded with a KV cache (models::KvCache) and drawn as a
// SamplingConfig says (Sampler): every prompt's num_samples completions in one batch, the
// prompts left-padded to the longest, each completion stopping at one of the model's
// end-of-sequence ids, at a stop string or at max_new_tokens. Runs under no-grad, in eval
// mode (no dropout; the model's mode restored after), on the model as it is: one process, or a rank
// of a prepared model with its peers (GenerateOptions::any_rank_open; generation/on_mesh.h does
// both).
//
//   PLAIT_ASSIGN_OR_RETURN(std::vector<Completion> completions,
//                          Generate(*model, {{1, 15043}, {1, 450, 4996}}, config,
//                                   {.end_of_sequence = {2}}));
#ifndef PLAIT_GENERATION_GENERATE_H_
#define PLAIT_GENERATION_GENERATE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "generation/sampler.h"
#include "generation/sampling.pb.h"
#include "models/causal_lm.h"

namespace plait::generation {

enum class StopReason {
  kEndOfSequence,  // it drew an end-of-sequence id (the completion keeps it)
  kStopString,     // its text came to contain a stop string (it keeps it)
  kMaxNewTokens,   // it reached max_new_tokens
};

// "end_of_sequence", "stop_string", "max_new_tokens".
std::string StopReasonName(StopReason reason);

// One completion: sample `sample` of prompt `prompt`.
struct Completion {
  int64_t prompt = 0;
  int64_t sample = 0;
  std::vector<int64_t> tokens;
  // Each token's log-probability under the model (temperature 1, unfiltered) and under the
  // distribution it was drawn from (Draws).
  std::vector<float> logprobs;
  std::vector<float> sampling_logprobs;
  StopReason stop = StopReason::kMaxNewTokens;
};

struct GenerateOptions {
  // The ids that end a completion: the model's (EndOfSequenceIds).
  std::vector<int64_t> end_of_sequence;
  // The index of prompts[0] among all the prompts generated for, in batches: it seeds the
  // draws of prompt p as prompt first_prompt + p, and so numbers its completions.
  int64_t first_prompt = 0;
  // The text of a completion's tokens, where config.stop_strings names any.
  std::function<absl::StatusOr<std::string>(const std::vector<int64_t>&)> detokenize;
  // Where the model's forwards run collectives with other ranks' (a prepared model's FSDP
  // gathers, its tensor-parallel sums): called once per decoded token with whether this rank
  // still has a completion drawing and whether it failed, it says whether any of those ranks
  // has one drawing (every one of them calling it), or an error where one failed; each
  // decodes until none has, and all stop together when one fails. A rank without prompts
  // decodes a placeholder row meanwhile. Unset: this rank decodes alone.
  std::function<absl::StatusOr<bool>(bool open_here, bool failed_here)> any_rank_open;
};

// The ids that end a completion of the model in Hugging Face folder `dir`: eos_token_id (an id
// or a list of them) of its generation_config.json, else of its config.json; none where
// neither names one. InvalidArgument, naming the file (and the entry), for one that is not
// JSON or whose eos_token_id is not an id or a list of ids.
absl::StatusOr<std::vector<int64_t>> EndOfSequenceIds(const std::string& dir);

// Why Generate would refuse `prompts` (numbered from options.first_prompt) for `model` with
// `config` and `options`, or OK: the checks of Generate, for a caller that splits the prompts
// over ranks to make on every rank before any decodes.
absl::Status CheckGeneration(const models::CausalLM& model,
                             const std::vector<std::vector<int64_t>>& prompts,
                             const SamplingConfig& config, const GenerateOptions& options);

// The completions of `prompts` (each a nonempty list of token ids below the model's
// vocabulary), prompt by prompt and sample by sample. InvalidArgument naming what is wrong for
// an invalid `config`, an empty prompt, an id out of the vocabulary, or stop strings without
// `options.detokenize`; FailedPrecondition for a model that cannot decode
// (CausalLM::DecodeRefusal says why).
absl::StatusOr<std::vector<Completion>> Generate(models::CausalLM& model,
                                                 const std::vector<std::vector<int64_t>>& prompts,
                                                 const SamplingConfig& config,
                                                 const GenerateOptions& options = {});

}  // namespace plait::generation

#endif  // PLAIT_GENERATION_GENERATE_H_
