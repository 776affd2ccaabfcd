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
  EXPECT_THAT(
      CheckObjective(Dpo("ref"), Vocab(512), {{"ref", Vocab(512)}}, Pairs(), "plan.objective"),
      IsEmpty());
  EXPECT_THAT(
      CheckObjective(ObjectiveConfig(), Vocab(512), {}, data::DataConfig(), "plan.objective"),
      IsEmpty());
}

TEST(ObjectiveCheckTest, RejectsAReferenceThatIsNoFrozenModel) {
  EXPECT_THAT(Lines(CheckObjective(Dpo("policy"), Vocab(512), {{"ref", Vocab(512)}}, Pairs(),
                                   "plan.objective")),
              ElementsAre("plan.objective.dpo.reference: \"policy\" names no frozen model of the "
                          "plan (\"ref\"); DPO needs a frozen reference model in plan.frozen "
                          "(rule dpo_reference_frozen)"));
}

TEST(ObjectiveCheckTest, RejectsAReferenceWithAnotherVocabulary) {
  EXPECT_THAT(Lines(CheckObjective(Dpo("ref"), Vocab(512), {{"ref", Vocab(4096)}}, Pairs(),
                                   "plan.objective")),
              ElementsAre("plan.objective.dpo.reference: \"ref\" has vocab_size 4096, the policy "
                          "512; the reference must score the same token ids (rule "
                          "dpo_reference_vocab)"));
}

TEST(ObjectiveCheckTest, RejectsDataThatDoesNotFitTheObjective) {
  EXPECT_THAT(Lines(CheckObjective(Dpo("ref"), Vocab(512), {{"ref", Vocab(512)}},
                                   data::DataConfig(), "plan.objective")),
              ElementsAre("plan.objective.kind: trains on preference_files or synthetic_pairs, "
                          "but plan.data is synthetic (rule objective_data)"));
  EXPECT_THAT(CheckObjective(ObjectiveConfig(), Vocab(512), {}, Pairs(), "plan.objective"),
              ElementsAre(Field(&base::Violation::rule, "objective_data")));
}

TEST(ObjectiveCheckTest, RejectsHyperparametersOutOfRange) {
  ObjectiveConfig config = Dpo("ref");
  config.mutable_dpo()->set_beta(0.0);
  config.mutable_dpo()->set_label_smoothing(0.5);
  EXPECT_THAT(
      Lines(CheckObjective(config, Vocab(512), {{"ref", Vocab(512)}}, Pairs(), "plan.objective")),
      ElementsAre(HasSubstr("plan.objective.dpo.beta: 0; must be > 0"),
                  HasSubstr("plan.objective.dpo.label_smoothing: 0.5; must be in")));
}

}  // namespace
}  // namespace plait::objectives
