#include "objectives/objective_check.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace plait::objectives {
namespace {

using ::testing::ElementsAre;
using ::testing::Field;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

models::ModelConfig Vocab(int64_t size) {
  models::ModelConfig config;
  config.set_vocab_size(size);
  return config;
}

std::vector<std::string> Lines(const std::vector<base::Violation>& violations) {
  std::vector<std::string> lines;
  for (const base::Violation& v : violations) lines.push_back(v.ToString());
  return lines;
}

ObjectiveConfig Dpo(const std::string& reference) {
  ObjectiveConfig config;
  config.mutable_dpo()->set_reference(reference);
  return config;
}

data::DataConfig Pairs() {
  data::DataConfig data;
  data.mutable_synthetic_pairs()->set_prompt_length(8);
  return data;
}

TEST(ObjectiveCheckTest, AcceptsDpoAgainstAFrozenModelOfTheSameVocabulary) {
  EXPECT_THAT(CheckObjective(Dpo("ref"), Vocab(512), false, {{"ref", Vocab(512)}}, Pairs(),
                             "plan.objective"),
              IsEmpty());
  EXPECT_THAT(CheckObjective(ObjectiveConfig(), Vocab(512), false, {}, data::DataConfig(),
                             "plan.objective"),
              IsEmpty());
}

TEST(ObjectiveCheckTest, RejectsAReferenceThatIsNoFrozenModel) {
  EXPECT_THAT(Lines(CheckObjective(Dpo("policy"), Vocab(512), false, {{"ref", Vocab(512)}}, Pairs(),
                                   "plan.objective")),
              ElementsAre("plan.objective.dpo.reference: \"policy\" names no frozen model of the "
                          "plan (\"ref\"); DPO needs a frozen reference model in plan.frozen "
                          "(rule dpo_reference_frozen)"));
}

TEST(ObjectiveCheckTest, RejectsAReferenceWithAnotherVocabulary) {
  EXPECT_THAT(Lines(CheckObjective(Dpo("ref"), Vocab(512), false, {{"ref", Vocab(4096)}}, Pairs(),
                                   "plan.objective")),
              ElementsAre("plan.objective.dpo.reference: \"ref\" has vocab_size 4096, the policy "
                          "512; the reference must score the same token ids (rule "
                          "dpo_reference_vocab)"));
}

TEST(ObjectiveCheckTest, RejectsDataThatDoesNotFitTheObjective) {
  EXPECT_THAT(Lines(CheckObjective(Dpo("ref"), Vocab(512), false, {{"ref", Vocab(512)}},
                                   data::DataConfig(), "plan.objective")),
              ElementsAre("plan.objective.kind: trains on preference_files or synthetic_pairs, "
                          "but plan.data is synthetic (rule objective_data)"));
  EXPECT_THAT(CheckObjective(ObjectiveConfig(), Vocab(512), false, {}, Pairs(), "plan.objective"),
              ElementsAre(Field(&base::Violation::rule, "objective_data")));
}

TEST(ObjectiveCheckTest, RejectsHyperparametersOutOfRange) {
  ObjectiveConfig config = Dpo("ref");
  config.mutable_dpo()->set_beta(0.0);
  config.mutable_dpo()->set_label_smoothing(0.5);
  EXPECT_THAT(Lines(CheckObjective(config, Vocab(512), false, {{"ref", Vocab(512)}}, Pairs(),
                                   "plan.objective")),
              ElementsAre(HasSubstr("plan.objective.dpo.beta: 0; must be > 0"),
                          HasSubstr("plan.objective.dpo.label_smoothing: 0.5; must be in")));
}

ObjectiveConfig DpoAgainstThePolicyWithoutAdapters() {
  ObjectiveConfig config;
  config.mutable_dpo()->set_policy_without_adapters(true);
  return config;
}

// The policy without its adapters is the reference: no frozen model is needed or read, and
// the policy runs forward once more for it, unless precomputed.
TEST(ObjectiveCheckTest, AcceptsThePolicyWithoutAdaptersWhenAStepAddsThem) {
  const ObjectiveConfig config = DpoAgainstThePolicyWithoutAdapters();
  EXPECT_THAT(CheckObjective(config, Vocab(512), true, {}, Pairs(), "plan.objective"), IsEmpty());
  const WorkPerSequence work = WorkOf(config);
  EXPECT_EQ(work.trained_rows, 2.0);
  EXPECT_EQ(work.trained_forward_rows, 2.0);
  EXPECT_THAT(work.frozen_forward_rows, IsEmpty());
  EXPECT_THAT(DescribeFrozenRoles(config), IsEmpty());
  EXPECT_THAT(DescribeTrainedModelRole(config),
              HasSubstr("the DPO reference is the policy with its adapters off, no frozen copy"));

  ObjectiveConfig precomputed = config;
  precomputed.mutable_dpo()->set_precompute_reference(true);
  EXPECT_EQ(WorkOf(precomputed).trained_forward_rows, 0.0);
  EXPECT_THAT(DescribeTrainedModelRole(precomputed), HasSubstr("before the first step"));
  EXPECT_EQ(DescribeTrainedModelRole(Dpo("ref")), "");
  EXPECT_EQ(WorkOf(Dpo("ref")).trained_forward_rows, 0.0);
}

TEST(ObjectiveCheckTest, RejectsThePolicyWithoutAdaptersWhenNoStepAddsThem) {
  EXPECT_THAT(Lines(CheckObjective(DpoAgainstThePolicyWithoutAdapters(), Vocab(512), false,
                                   {{"ref", Vocab(512)}}, Pairs(), "plan.objective")),
              ElementsAre("plan.objective.dpo.policy_without_adapters: the reference is the "
                          "policy with its adapters off, but no step of the policy's preparation "
                          "adds adapters (a step whose rule's effect is ADAPTS): the policy would "
                          "be its own reference; add such a step, or name a frozen reference "
                          "model in dpo.reference (rule dpo_policy_adapters)"));
}

// DPO's reference precomputed on whole models, or the policy as its own reference, are
// features the preparation rules may refuse (a model cut into pipeline stages), each at its
// field; a live frozen reference is none.
TEST(ObjectiveCheckTest, DpoNamesTheFeaturesTheRulesMayRefuse) {
  EXPECT_THAT(FeaturesOf(Dpo("ref"), "plan.objective"), IsEmpty());
  EXPECT_THAT(FeaturesOf(ObjectiveConfig(), "plan.objective"), IsEmpty());
  ObjectiveConfig precomputed = Dpo("ref");
  precomputed.mutable_dpo()->set_precompute_reference(true);
  const std::vector<base::PlanFeature> features = FeaturesOf(precomputed, "plan.objective");
  ASSERT_EQ(features.size(), 1u);
  EXPECT_EQ(features[0].name, "precomputed_reference");
  EXPECT_EQ(features[0].field, "plan.objective.dpo.precompute_reference");
  const std::vector<base::PlanFeature> policy =
      FeaturesOf(DpoAgainstThePolicyWithoutAdapters(), "plan.objective");
  ASSERT_EQ(policy.size(), 1u);
  EXPECT_EQ(policy[0].name, "policy_as_reference");
  EXPECT_EQ(policy[0].field, "plan.objective.dpo.policy_without_adapters");
}

}  // namespace
}  // namespace plait::objectives
