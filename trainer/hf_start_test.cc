// Every shipped layout whose ranks hold parts of the model starts from a Hugging Face folder and
// trains as one process started from the same folder: the pipelines llama_pp (2 stages) and
// llama_3d (2 stages x FSDP 2 x TP 2), expert parallelism (qwen3_moe_ep: each rank keeps half of
// every layer's experts), context parallelism (llama_long, on a shorter sequence) and LoRA over
// a pipeline starting from a PEFT adapter folder; 10 steps, every loss, gradient norm and
// evaluation within 1e-5 relative. (Each rank reads the tensors of what it holds and checks the
// rest of the folder against the whole model: models/hf_checkpoint_test.cc.)
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ATen/Context.h"
#include "ATen/core/Tensor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/status_matchers.h"
#include "gtest/gtest.h"
#include "models/causal_lm.h"
#include "models/hf_checkpoint.h"
#include "models/parameter_shapes.h"
#include "torch/csrc/autograd/generated/variable_factories.h"
#include "trainer/testing_plan_space.h"
#include "trainer/testing_ranks.h"
#include "trainer/trainer.h"
#include "wrap/lora/peft_adapter.h"

namespace plait::trainer {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::trainer::testing::ConfigOf;
using ::plait::trainer::testing::ExpectSameSteps;
using ::plait::trainer::testing::OneProcessPlan;
using ::plait::trainer::testing::ShortShippedPlan;
using ::plait::trainer::testing::TrainOnRanks;

std::string TestDir(const std::string& name) {
  return absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
}

// A Hugging Face folder of the model `plan` describes, with values of another seed than the
// plan's own initialisation, so that a run that ignored the folder would differ.
std::string SavePretrained(const plan::Plan& plan, const std::string& name) {
  const std::string dir = TestDir(name);
  models::InitConfig init = plan.model().init();
  init.set_seed(init.seed() + 1000);
  absl::StatusOr<std::shared_ptr<models::CausalLM>> model =
      models::CausalLM::Create(ConfigOf(plan.model()), init);
  EXPECT_THAT(model, IsOk());
  if (model.ok()) {
    EXPECT_THAT(models::SaveHfModel(**model, dir), IsOk());
  }
  return dir;
}

// `plan` started from the folder `dir` on `ranks` ranks trains as one process started there.
void ExpectOneProcessRunFrom(plan::Plan plan, int ranks, const std::string& dir,
                             const std::string& layout) {
  plan.set_hf_weights_dir(dir);
  const TrainReport run = TrainOnRanks(plan, ranks);
  const TrainReport one_process =
      TrainOnRanks(OneProcessPlan(plan, plan.training().global_batch()), 1);
  ASSERT_EQ(run.steps.size(), 10u) << layout;
  ASSERT_EQ(one_process.steps.size(), 10u) << layout;
  ExpectSameSteps(run, one_process, layout);
}

TEST(HfStartTest, PipelinesStartFromAFolder) {
  const plan::Plan pp = ShortShippedPlan("llama_pp");
  const std::string dir = SavePretrained(pp, "tiny_llama");
  ExpectOneProcessRunFrom(pp, 2, dir, "llama_pp");
  ExpectOneProcessRunFrom(ShortShippedPlan("llama_3d"), 8, dir, "llama_3d");
}

TEST(HfStartTest, ExpertParallelismStartsFromAFolder) {
  const plan::Plan ep = ShortShippedPlan("qwen3_moe_ep");
  ExpectOneProcessRunFrom(ep, 2, SavePretrained(ep, "tiny_qwen3_moe"), "qwen3_moe_ep");
}

TEST(HfStartTest, ContextParallelismStartsFromAFolder) {
  plan::Plan cp = ShortShippedPlan("llama_long");
  cp.mutable_training()->set_seq_len(512);  // the layout's, at a test's cost
  ExpectOneProcessRunFrom(cp, 2, SavePretrained(cp, "long_llama"), "llama_long");
}

// LoRA over llama_pp's two stages from a base folder and a PEFT adapter folder holding both
// stages' adapters: each stage reads its own.
TEST(HfStartTest, LoraOverAPipelineStartsFromFolders) {
  plan::Plan plan = ShortShippedPlan("llama_pp");
  const models::ModelConfig config = ConfigOf(plan.model());
  wrap::LoraConfig& lora = *plan.add_prepare()->mutable_lora();
  lora.set_rank(4);
  lora.set_alpha(8);
  lora.add_target("*q_proj");
  lora.add_target("*down_proj");
  std::vector<std::pair<std::string, at::Tensor>> adapters;
  for (const models::ParameterShape& parameter : models::ParameterShapes(config)) {
    if (!absl::EndsWith(parameter.name, "q_proj.weight") &&
        !absl::EndsWith(parameter.name, "down_proj.weight")) {
      continue;
    }
    const std::string module = parameter.name.substr(0, parameter.name.size() - 7);
    at::manual_seed(static_cast<uint64_t>(adapters.size()));
    adapters.emplace_back(module + ".lora_A.weight",
                          0.1 * torch::randn({lora.rank(), parameter.shape[1]}));
    adapters.emplace_back(module + ".lora_B.weight",
                          0.1 * torch::randn({parameter.shape[0], lora.rank()}));
  }
  const std::string adapter_dir = TestDir("starting_adapter");
  ASSERT_THAT(wrap::lora::SavePeftAdapter(adapter_dir, lora, adapters, "tiny"), IsOk());
  lora.set_initial_adapter_dir(adapter_dir);
  ExpectOneProcessRunFrom(plan, 2, SavePretrained(plan, "tiny_llama_for_lora"),
                          "LoRA over llama_pp");
}

}  // namespace
}  // namespace plait::trainer
