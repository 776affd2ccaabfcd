#include "generation/sampling_config.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace plait::generation {
namespace {

using ::testing::ElementsAre;
using ::testing::Field;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

TEST(CheckSamplingConfigTest, NamesEachBadField) {
  SamplingConfig config;
  config.set_temperature(-1.0);
  config.set_top_k(-2);
  config.set_top_p(1.5);
  config.set_min_p(-0.1);
  config.add_stop_strings("");
  EXPECT_THAT(CheckSamplingConfig(config, "sampling"),
              ElementsAre(Field(&base::Violation::field, "sampling.temperature"),
                          Field(&base::Violation::field, "sampling.top_k"),
                          Field(&base::Violation::field, "sampling.top_p"),
                          Field(&base::Violation::field, "sampling.min_p"),
                          Field(&base::Violation::field, "sampling.max_new_tokens"),
                          Field(&base::Violation::field, "sampling.stop_strings[0]")));
  SamplingConfig valid;
  valid.set_max_new_tokens(1);
  EXPECT_THAT(CheckSamplingConfig(valid, "sampling"), IsEmpty());
}

TEST(CheckSamplesConfigTest, NamesEachBadField) {
  SamplesConfig config;
  config.add_prompts("Q: 1 + 1?");
  config.add_prompts("");
  config.set_every_steps(-3);
  EXPECT_THAT(CheckSamplesConfig(config, "plan.training.samples"),
              ElementsAre(Field(&base::Violation::field, "plan.training.samples.prompts[1]"),
                          Field(&base::Violation::field, "plan.training.samples.every_steps"),
                          Field(&base::Violation::field, "plan.training.samples.sampling")));
  config.clear_prompts();
  config.set_every_steps(0);
  config.mutable_sampling()->set_top_k(-1);
  EXPECT_THAT(
      CheckSamplesConfig(config, "plan.training.samples"),
      ElementsAre(Field(&base::Violation::field, "plan.training.samples.prompts"),
                  Field(&base::Violation::field, "plan.training.samples.sampling.top_k"),
                  Field(&base::Violation::field, "plan.training.samples.sampling.max_new_tokens")));
  config.add_prompts("Q: 2 + 2?");
  config.mutable_sampling()->set_top_k(0);
  config.mutable_sampling()->set_max_new_tokens(8);
  EXPECT_THAT(CheckSamplesConfig(config, "plan.training.samples"), IsEmpty());
}

TEST(SamplesFileTest, DefaultsToSamplesJsonl) {
  SamplesConfig config;
  EXPECT_EQ(SamplesFile(config), "samples.jsonl");
  config.set_file("out/s.jsonl");
  EXPECT_EQ(SamplesFile(config), "out/s.jsonl");
}

TEST(FeaturesOfTest, SamplesGenerate) {
  EXPECT_THAT(FeaturesOf(SamplesConfig(), "plan.training.samples"),
              ElementsAre(AllOf(Field(&base::PlanFeature::name, "generates"),
                                Field(&base::PlanFeature::field, "plan.training.samples"),
                                Field(&base::PlanFeature::what, HasSubstr("token at a time")))));
}

}  // namespace
}  // namespace plait::generation
