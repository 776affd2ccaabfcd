#include "wrap/checkpointing/activation_checkpointing.h"

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ATen/Context.h"
#include "ATen/core/Tensor.h"
#include "ATen/ops/equal.h"
#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/causal_lm.h"
#include "models/model_config.h"
#include "models/testing_models.h"
#include "torch/csrc/autograd/generated/variable_factories.h"
#include "wrap/internal/torch_internals.h"

namespace plait::wrap::checkpointing {
namespace {

using ::plait::base::testing::StatusIs;
using ::testing::HasSubstr;
using Policy = ActivationCheckpointingConfig::Policy;

constexpr int kSteps = 10;

std::pair<at::Tensor, at::Tensor> Batch(int step, int64_t vocab) {
  at::manual_seed(200 + step);
  const at::Tensor sequence = torch::randint(vocab, {4, 33});
  return {sequence.narrow(1, 0, 32), sequence.narrow(1, 1, 32)};
}

struct TrainingRun {
  std::vector<double> losses;
  std::map<std::string, at::Tensor> first_gradients;  // of step 0
};

// kSteps of plain SGD on `preset`, with `policy` (none when nullopt).
TrainingRun Train(const std::string& preset, std::optional<Policy> policy) {
  std::shared_ptr<models::CausalLM> model = models::testing::SeededModel(preset, 5);
  std::unique_ptr<ActivationCheckpointing> checkpointing;
  if (policy.has_value())
    checkpointing = std::make_unique<ActivationCheckpointing>(*model, *policy);
  TrainingRun run;
  for (int step = 0; step < kSteps; ++step) {
    auto [tokens, targets] = Batch(step, model->config().vocab_size());
    at::Tensor loss = model->Loss(tokens, targets);
    loss.backward();
    run.losses.push_back(loss.item<double>());
    at::NoGradGuard no_grad;
    for (const auto& named : model->NamedParameters()) {
      if (step == 0) run.first_gradients[named.name] = named.parameter.grad().clone();
      named.parameter.sub_(0.05 * named.parameter.grad());
      named.parameter.mutable_grad().reset();
    }
  }
  return run;
}

class CheckpointingParityTest : public ::testing::TestWithParam<std::string> {};

// FULL recomputes exactly what the forward computed: the same gradients and losses, bit for
// bit.
TEST_P(CheckpointingParityTest, FullEqualsNoCheckpointingBitwise) {
  const TrainingRun expected = Train(GetParam(), std::nullopt);
  const TrainingRun actual = Train(GetParam(), ActivationCheckpointingConfig::FULL);
  for (const auto& [name, want] : expected.first_gradients) {
    EXPECT_TRUE(at::equal(actual.first_gradients.at(name), want)) << name;
  }
  EXPECT_EQ(actual.losses, expected.losses);
}

// SELECTIVE back-propagates through the kept projections with its own products: the same as
// LibTorch's linear backward, within 1e-6 relative.
TEST_P(CheckpointingParityTest, SelectiveEqualsNoCheckpointing) {
  const TrainingRun expected = Train(GetParam(), std::nullopt);
  const TrainingRun actual = Train(GetParam(), ActivationCheckpointingConfig::SELECTIVE);
  for (const auto& [name, want] : expected.first_gradients) {
    const double error = (actual.first_gradients.at(name) - want).norm().item<double>();
    EXPECT_LE(error, 1e-6 * want.norm().item<double>()) << name;
  }
  for (int step = 0; step < kSteps; ++step) {
    EXPECT_NEAR(actual.losses[step], expected.losses[step], 1e-6 * expected.losses[step])
        << "step " << step;
  }
}

// The tiny Llama, and the tiny Qwen2 (q/k/v biases, tied embeddings).
INSTANTIATE_TEST_SUITE_P(Models, CheckpointingParityTest, ::testing::Values("tiny", "qwen2-tiny"),
                         [](const auto& info) { return info.param == "tiny" ? "llama" : "qwen2"; });

// DDP and FSDP act on each parameter's accumulated gradient, tensor parallelism on its
// gradient through a tensor hook: every parameter's must pass each once per backward, as
// without checkpointing (LibTorch 2.x would also run the tensor hooks on the gradients the
// recomputation captures).
TEST(ActivationCheckpointingTest, EveryGradientIsAccumulatedOnce) {
  for (Policy policy :
       {ActivationCheckpointingConfig::FULL, ActivationCheckpointingConfig::SELECTIVE}) {
    std::shared_ptr<models::CausalLM> model = models::testing::SeededModel("tiny", 5);
    ActivationCheckpointing checkpointing(*model, policy);
    std::map<std::string, int> accumulated;
    std::map<std::string, int> hooked;
    std::vector<internal::HookHandle> hooks;
    for (const auto& named : model->NamedParameters()) {
      hooks.push_back(internal::AddPostAccumulateHook(
          named.parameter, [&accumulated, name = named.name] { ++accumulated[name]; }));
      named.parameter.register_hook([&hooked, name = named.name](at::Tensor grad) {
        ++hooked[name];
        return grad;
      });
    }
    auto [tokens, targets] = Batch(0, model->config().vocab_size());
    model->Loss(tokens, targets).backward();
    for (const auto& named : model->NamedParameters()) {
      EXPECT_EQ(accumulated[named.name], 1) << named.name;
      EXPECT_EQ(hooked[named.name], 1) << named.name;
    }
  }
}

// Without autograd (evaluation) a block just runs: the same logits, and nothing is kept.
TEST(ActivationCheckpointingTest, NoGradForwardRunsTheBlocksDirectly) {
  std::shared_ptr<models::CausalLM> model = models::testing::SeededModel("tiny", 5);
  auto [tokens, targets] = Batch(0, model->config().vocab_size());
  at::NoGradGuard no_grad;
  const at::Tensor expected = model->Forward(tokens);
  ActivationCheckpointing checkpointing(*model, ActivationCheckpointingConfig::SELECTIVE);
  EXPECT_TRUE(at::equal(model->Forward(tokens), expected));
}

// Kept projection outputs serve one backward; a second one through the same forward is an
// error, not wrong gradients.
TEST(ActivationCheckpointingTest, SelectiveRefusesASecondBackward) {
  std::shared_ptr<models::CausalLM> model = models::testing::SeededModel("tiny", 5);
  ActivationCheckpointing checkpointing(*model, ActivationCheckpointingConfig::SELECTIVE);
  auto [tokens, targets] = Batch(0, model->config().vocab_size());
  at::Tensor loss = model->Loss(tokens, targets);
  loss.backward({}, /*retain_graph=*/true);
  EXPECT_THROW(
      {
        try {
          loss.backward();
        } catch (const c10::Error& error) {
          EXPECT_THAT(error.what(), HasSubstr("a second backward"));
          throw;
        }
      },
      c10::Error);
}

TEST(ActivationCheckpointingStrategyTest, NeedsAPolicy) {
  EXPECT_THAT(ValidateActivationCheckpointingConfig(ActivationCheckpointingConfig()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("activation_checkpointing.policy is not set")));
}

// Full: every block keeps its input and one recomputes the rest; selective keeps the
// projections' outputs too.
TEST(ActivationCheckpointingStrategyTest, EstimatesTheActivationsItSaves) {
  ModelShape shape;
  shape.num_blocks = 4;
  shape.block_input_bytes = 320;
  shape.block_activation_bytes = 5000;
  shape.block_projection_output_bytes = 1000;
  const auto saved = [&](ActivationCheckpointingConfig::Policy policy) {
    ActivationCheckpointingConfig config;
    config.set_policy(policy);
    const StepEstimate estimate =
        ActivationCheckpointingStrategy(config).Estimate(shape, parallel::MeshConfig());
    EXPECT_EQ(estimate.memory.size(), 1u);
    if (estimate.memory.empty()) return 0.0;
    EXPECT_EQ(estimate.memory[0].part, MemoryTerm::Part::kActivations);
    return -estimate.memory[0].bytes;
  };
  EXPECT_DOUBLE_EQ(saved(ActivationCheckpointingConfig::FULL), 3 * (5000 - 320));
  EXPECT_DOUBLE_EQ(saved(ActivationCheckpointingConfig::SELECTIVE), 3 * (5000 - 320 - 1000));
}

}  // namespace
}  // namespace plait::wrap::checkpointing
