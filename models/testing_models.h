// For tests: a preset model with its seeded initialisation, the start most tests of a model's
// computations share. Failures are test failures (and give a null model).
//
//   std::shared_ptr<CausalLM> model = testing::SeededModel("qwen3-tiny", /*seed=*/5);
#ifndef PLAIT_MODELS_TESTING_MODELS_H_
#define PLAIT_MODELS_TESTING_MODELS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "models/causal_lm.h"

namespace plait::models::testing {

// The model of preset `preset` (model_config.h's PresetConfig), drawn from `seed`.
std::shared_ptr<CausalLM> SeededModel(const std::string& preset, uint64_t seed);

}  // namespace plait::models::testing

#endif  // PLAIT_MODELS_TESTING_MODELS_H_
