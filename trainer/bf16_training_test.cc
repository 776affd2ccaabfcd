// bf16 with fp32 master weights trains as well as fp32: //trainer:llama_fsdp's plan, all its
// 100 steps on 2 FSDP ranks, ends within 0.02 nats of the fp32 run's evaluation loss, and so
// does //trainer:llama_pp's on 2 pipeline stages. The
// shipped jobs compute in bf16 wherever the CPU has it natively (DTYPE_AUTO); this is what
// they give up for the speed. Not timed: on a CPU without native bf16 it runs, slowly.
#include <iostream>
#include <string>

#include "gtest/gtest.h"
#include "plan/plan.h"
#include "trainer/testing_ranks.h"
#include "trainer/trainer.h"

namespace plait::trainer {
namespace {

using ::plait::trainer::testing::LoadShippedPlan;
using ::plait::trainer::testing::TrainOnRanks;

// `job`'s plan in bf16 against the same in fp32, both on 2 ranks.
void ExpectBf16WithinTwoHundredthsOfANatOfFp32(const std::string& job) {
  SCOPED_TRACE(job);
  plan::Plan fp32 = LoadShippedPlan(job);
  ASSERT_TRUE(plan::ApplyOverride("training.metrics_file=", fp32).ok());
  plan::Plan bf16 = fp32;
  bf16.mutable_model()->set_dtype(base::DTYPE_BFLOAT16);

  const TrainReport fp32_run = TrainOnRanks(fp32, 2);
  const TrainReport bf16_run = TrainOnRanks(bf16, 2);
  ASSERT_EQ(fp32_run.steps.size(), 100u);
  ASSERT_EQ(bf16_run.steps.size(), 100u);
  ASSERT_TRUE(fp32_run.steps.back().eval_loss.has_value());
  ASSERT_TRUE(bf16_run.steps.back().eval_loss.has_value());
  const double fp32_eval = *fp32_run.steps.back().eval_loss;
  const double bf16_eval = *bf16_run.steps.back().eval_loss;
  EXPECT_NEAR(bf16_eval, fp32_eval, 0.02);
  // Both learned (from ln 4096 = 8.3 nats), and the bf16 run did compute in bf16: its very
  // first loss, on the same weights and batch, already differs by bf16 rounding.
  EXPECT_LT(fp32_eval, 2.0);
  EXPECT_NE(bf16_run.steps.front().loss, fp32_run.steps.front().loss);
  EXPECT_NEAR(bf16_run.steps.front().loss, fp32_run.steps.front().loss, 0.05);
  std::cout << job << ": evaluation loss after 100 steps: fp32 " << fp32_eval << ", bf16 "
            << bf16_eval << "\n";
}

TEST(Bf16TrainingTest, Bf16WithFp32MastersEndsWithinTwoHundredthsOfANatOfFp32) {
  ExpectBf16WithinTwoHundredthsOfANatOfFp32("llama_fsdp");
}

// The same through a pipeline of 2 stages, which sends bf16 hidden states between them.
TEST(Bf16TrainingTest, APipelineInBf16EndsWithinTwoHundredthsOfANatOfFp32) {
  ExpectBf16WithinTwoHundredthsOfANatOfFp32("llama_pp");
}

}  // namespace
}  // namespace plait::trainer
