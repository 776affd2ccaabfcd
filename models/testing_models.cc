#include "models/testing_models.h"

#include <cstdint>
#include <memory>
#include <string>

#include "base/status_matchers.h"
#include "gtest/gtest.h"
#include "models/model_config.h"

namespace plait::models::testing {

std::shared_ptr<CausalLM> SeededModel(const std::string& preset, uint64_t seed) {
  absl::StatusOr<ModelConfig> config = PresetConfig(preset);
  EXPECT_THAT(config, base::testing::IsOk());
  if (!config.ok()) return nullptr;
  InitConfig init;
  init.set_seed(seed);
  absl::StatusOr<std::shared_ptr<CausalLM>> model = CausalLM::Create(*config, init);
  EXPECT_THAT(model, base::testing::IsOk());
  return model.value_or(nullptr);
}

}  // namespace plait::models::testing
