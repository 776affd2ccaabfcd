#include "plan/plan.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace plait::plan {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::base::testing::StatusIs;
using ::testing::HasSubstr;

constexpr char kPlan[] = R"pb(
  model { preset: "tiny" }
  training { steps: 10 micro_batch: 4 seq_len: 16 }
  schedule {
    lr: 1e-3
    cosine {}
  }
)pb";

TEST(ParsePlanTest, ReadsTheComposedMessages) {
  absl::StatusOr<Plan> plan = ParsePlan(kPlan, "plan.textproto");
  ASSERT_THAT(plan, IsOk());
  EXPECT_EQ(plan->model().preset(), "tiny");
  EXPECT_EQ(plan->training().steps(), 10);
  EXPECT_TRUE(plan->schedule().has_cosine());
}

TEST(ParsePlanTest, UnknownFieldGivesFileLineAndColumn) {
  EXPECT_THAT(ParsePlan("model { preset: \"tiny\" }\ntraining {\n  stepz: 3\n}\n", "p.textproto"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("p.textproto:3:8: Message type \"plait.plan.TrainingConfig\" "
                                 "has no field named \"stepz\"")));
}

TEST(ParsePlanTest, BadEnumValueIsAnError) {
  EXPECT_THAT(ParsePlan("data { token_files { format: TOKEN_FORMAT_CSV } }", "p.textproto"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("p.textproto:1:47: Unknown enumeration value of "
                                 "\"TOKEN_FORMAT_CSV\"")));
}

// The last value does not silently win: `adamw {} sgd {}` would train with SGD.
TEST(ParsePlanTest, TwoOptimizersOrAFieldTwiceAreErrors) {
  EXPECT_THAT(ParsePlan("optimizer { adamw {} sgd {} }", "p.textproto"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("p.textproto:1:26: Field \"sgd\" is specified along with field "
                                 "\"adamw\", another member of oneof \"algorithm\"")));
  EXPECT_THAT(ParsePlan("training { steps: 10 steps: 20 }", "p.textproto"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("Non-repeated field \"steps\" is specified multiple times")));
}

TEST(LoadPlanTest, MissingFileIsNotFound) {
  EXPECT_THAT(LoadPlan("/nonexistent/plan.textproto"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("/nonexistent/plan.textproto")));
}

TEST(ApplyOverrideTest, SetsScalarsIncludingZeroAndStrings) {
  Plan plan = *ParsePlan(kPlan, "plan.textproto");
  ASSERT_THAT(ApplyOverride("training.steps=50", plan), IsOk());
  EXPECT_EQ(plan.training().steps(), 50);
  ASSERT_THAT(ApplyOverride("training.steps=0", plan), IsOk());
  EXPECT_EQ(plan.training().steps(), 0);
  ASSERT_THAT(ApplyOverride("training.metrics_file=/tmp/m \"1\".jsonl", plan), IsOk());
  EXPECT_EQ(plan.training().metrics_file(), "/tmp/m \"1\".jsonl");
  ASSERT_THAT(ApplyOverride("schedule.lr=3e-4", plan), IsOk());
  EXPECT_DOUBLE_EQ(plan.schedule().lr(), 3e-4);
  // The rest of the plan stays.
  EXPECT_EQ(plan.model().preset(), "tiny");
  EXPECT_TRUE(plan.schedule().has_cosine());
}

TEST(ApplyOverrideTest, ErrorsNameTheOverrideAndTheField) {
  Plan plan = *ParsePlan(kPlan, "plan.textproto");
  EXPECT_THAT(ApplyOverride("training.stepz=5", plan),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--set=training.stepz=5: plan.training has no field \"stepz\"")));
  EXPECT_THAT(
      ApplyOverride("training.steps=many", plan),
      StatusIs(absl::StatusCode::kInvalidArgument,
               "--set=training.steps=many: plan.training.steps: \"many\" is not an integer"));
  EXPECT_THAT(ApplyOverride("prepare.fsdp.mesh_dim=dp", plan),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("plan.prepare is repeated")));
  EXPECT_THAT(ApplyOverride("training=5", plan), StatusIs(absl::StatusCode::kInvalidArgument,
                                                          HasSubstr("plan.training is a message")));
  EXPECT_THAT(ApplyOverride("steps", plan),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("expected path=value")));
}

// An override reads its value as the plan file would, and cannot swap the file's optimizer.
TEST(ApplyOverrideTest, ReadsValuesAsTheFileAndKeepsItsChoiceOfOptimizer) {
  Plan plan = *ParsePlan(absl::StrCat(kPlan, "optimizer { adamw { beta1: 0.8 } }"), "p.textproto");
  ASSERT_THAT(ApplyOverride("training.steps=010", plan), IsOk());
  EXPECT_EQ(plan.training().steps(), 8);  // as `steps: 010` in the file: octal
  EXPECT_THAT(ApplyOverride("optimizer.sgd.momentum=0.9", plan),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--set=optimizer.sgd.momentum=0.9: plan.optimizer.sgd: "
                                 "plan.optimizer.adamw is set, and both are members of the oneof "
                                 "plan.optimizer.algorithm")));
  EXPECT_EQ(plan.optimizer().adamw().beta1(), 0.8);
  ASSERT_THAT(ApplyOverride("optimizer.adamw.beta2=0.95", plan), IsOk());
  EXPECT_EQ(plan.optimizer().adamw().beta2(), 0.95);
  // A scalar member is a whole choice: a Hugging Face config in place of the file's preset,
  // as README.md and the shipped plans tell.
  plan.mutable_model()->set_preset("tiny");
  ASSERT_THAT(ApplyOverride("model.hf_config_path=/models/tiny/config.json", plan), IsOk());
  EXPECT_EQ(plan.model().hf_config_path(), "/models/tiny/config.json");
}

TEST(PlanArgumentsTest, TakesThePlanItsOverridesInOrderAndTheWorldSize) {
  const char* argv[] = {"plan_check", "plan.textproto", "--set=training.steps=5", "--world_size=4",
                        "--set=training.steps=6"};
  absl::StatusOr<PlanArguments> arguments =
      ParsePlanArguments(5, const_cast<char**>(argv), PlanCommand::kCheck);
  ASSERT_THAT(arguments, IsOk());
  EXPECT_EQ(arguments->plan_path, "plan.textproto");
  EXPECT_THAT(arguments->overrides, ::testing::ElementsAre("training.steps=5", "training.steps=6"));
  EXPECT_EQ(arguments->world_size, 4);
  EXPECT_FALSE(arguments->skip_memory_check);
  EXPECT_THAT(ParsePlanArguments(4, const_cast<char**>(argv), PlanCommand::kTrain),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "Unknown command line flag 'world_size' (--help lists the flags)"));
  // A count that is not a positive integer is named, not taken for the plan's path (which
  // "--world_size=nan" was, found by the plan mutation test).
  for (const char* bad : {"--world_size=nan", "--world_size=0", "--world_size=2147483648"}) {
    const char* bad_argv[] = {"plan_check", bad};
    EXPECT_THAT(ParsePlanArguments(2, const_cast<char**>(bad_argv), PlanCommand::kCheck),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr(absl::StrCat(bad, ": \"", absl::string_view(bad).substr(13),
                                                "\" is not a positive integer"))));
  }
  const char* bad_ranks[] = {"train", "--max_local_ranks=-2"};
  EXPECT_THAT(ParsePlanArguments(2, const_cast<char**>(bad_ranks), PlanCommand::kTrain),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "--max_local_ranks=-2: \"-2\" is not a positive integer"));

  // A GPU cluster to check it for: its nodes and a catalogue of one's own go with --target,
  // and the world is the target's, not --world_size's.
  const char* target_argv[] = {"plan_check", "plan.textproto", "--target=h200", "--nodes=2",
                               "--targets_file=mine.textproto"};
  absl::StatusOr<PlanArguments> for_target =
      ParsePlanArguments(5, const_cast<char**>(target_argv), PlanCommand::kCheck);
  ASSERT_THAT(for_target, IsOk());
  EXPECT_EQ(for_target->target, "h200");
  EXPECT_EQ(for_target->nodes, 2);
  EXPECT_EQ(for_target->targets_file, "mine.textproto");
  EXPECT_THAT(ParsePlanArguments(3, const_cast<char**>(target_argv), PlanCommand::kTrain),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'target'")));
  const char* nodes_alone[] = {"plan_check", "--nodes=2"};
  EXPECT_THAT(ParsePlanArguments(2, const_cast<char**>(nodes_alone), PlanCommand::kCheck),
              StatusIs(absl::StatusCode::kInvalidArgument, "--nodes needs --target=NAME"));
  const char* two_worlds[] = {"plan_check", "--target=h200", "--world_size=8"};
  EXPECT_THAT(
      ParsePlanArguments(3, const_cast<char**>(two_worlds), PlanCommand::kCheck),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--world_size with --target")));

  // The later override wins, and the embedded plan serves when no file is named.
  arguments->plan_path.clear();
  absl::StatusOr<Plan> plan = LoadPlanFromArguments(*arguments, kPlan, "embedded");
  ASSERT_THAT(plan, IsOk());
  EXPECT_EQ(plan->training().steps(), 6);
  EXPECT_THAT(LoadPlanFromArguments(PlanArguments(), "", "embedded"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no plan")));
}

TEST(PlanArgumentsTest, TakesMaxRestartsForTraining) {
  const char* argv[] = {"llama_fsdp", "--max_restarts=2"};
  absl::StatusOr<PlanArguments> arguments =
      ParsePlanArguments(2, const_cast<char**>(argv), PlanCommand::kTrain);
  ASSERT_THAT(arguments, IsOk());
  EXPECT_EQ(arguments->max_restarts, 2);
  EXPECT_THAT(ParsePlanArguments(2, const_cast<char**>(argv), PlanCommand::kCheck),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "Unknown command line flag 'max_restarts' (--help lists the flags)"));
  const char* bad[] = {"llama_fsdp", "--max_restarts=-1"};
  EXPECT_THAT(ParsePlanArguments(2, const_cast<char**>(bad), PlanCommand::kTrain),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "--max_restarts=-1: \"-1\" is not an integer >= 0"));
}

TEST(PlanArgumentsTest, TakesTheMemoryCheckOverrideForBothCommands) {
  const char* argv[] = {"llama_fsdp", "--skip_memory_check"};
  for (PlanCommand command : {PlanCommand::kTrain, PlanCommand::kCheck}) {
    absl::StatusOr<PlanArguments> arguments =
        ParsePlanArguments(2, const_cast<char**>(argv), command);
    ASSERT_THAT(arguments, IsOk());
    EXPECT_TRUE(arguments->skip_memory_check);
  }
}

// --help asks for the flags, which are the command's own, one line each.
TEST(PlanArgumentsTest, HelpListsTheCommandsFlags) {
  const char* argv[] = {"train", "--help"};
  absl::StatusOr<PlanArguments> arguments =
      ParsePlanArguments(2, const_cast<char**>(argv), PlanCommand::kTrain);
  ASSERT_THAT(arguments, IsOk());
  EXPECT_TRUE(arguments->help);
  const std::string train = PlanFlagsHelp(PlanCommand::kTrain);
  EXPECT_THAT(train, HasSubstr("\n  --set=path=value      sets one field of the plan"));
  EXPECT_THAT(train, HasSubstr("\n  --max_restarts=N"));
  EXPECT_THAT(train, ::testing::Not(HasSubstr("--world_size")));
  const std::string check = PlanFlagsHelp(PlanCommand::kCheck);
  EXPECT_THAT(check, HasSubstr("\n  --world_size=N        checks the plan for N ranks"));
  EXPECT_THAT(check, ::testing::Not(HasSubstr("--max_restarts")));
}

}  // namespace
}  // namespace plait::plan
