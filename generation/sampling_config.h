// What sampling.proto's configs may hold, checked before anything runs, and what a plan's
// samples (SamplesConfig) ask of the rest of the plan.
#ifndef PLAIT_GENERATION_SAMPLING_CONFIG_H_
#define PLAIT_GENERATION_SAMPLING_CONFIG_H_

#include <string>
#include <vector>

#include "base/violation.h"
#include "generation/sampling.pb.h"

namespace plait::generation {

// The violations of `config`, each naming its field under `field_path`.
std::vector<base::Violation> CheckSamplingConfig(const SamplingConfig& config,
                                                 const std::string& field_path);

// The violations of `config` (its prompts, steps and sampling; not its tokenizer, which the
// plan resolves), each naming its field under `field_path`.
std::vector<base::Violation> CheckSamplesConfig(const SamplesConfig& config,
                                                const std::string& field_path);

// The file `config` writes: its `file`, or "samples.jsonl".
std::string SamplesFile(const SamplesConfig& config);

// What samples ask of the model's preparation: "generates", decoding a token at a time,
// which a model cut into stages or whose ranks split its tokens cannot (the preparation
// rules' feature rules refuse it there).
std::vector<base::PlanFeature> FeaturesOf(const SamplesConfig& config,
                                          const std::string& field_path);

}  // namespace plait::generation

#endif  // PLAIT_GENERATION_SAMPLING_CONFIG_H_
