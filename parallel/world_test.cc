#include "parallel/world.h"

#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace plait::parallel {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::base::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

using Variables = std::map<std::string, std::string>;

Environment FakeEnvironment(Variables variables) {
  return [variables = std::move(variables)](const std::string& name) -> std::optional<std::string> {
    auto it = variables.find(name);
    if (it == variables.end()) return std::nullopt;
    return it->second;
  };
}

Variables Torchrun() {
  return {{"RANK", "3"},
          {"WORLD_SIZE", "8"},
          {"LOCAL_RANK", "1"},
          {"LOCAL_WORLD_SIZE", "2"},
          {"MASTER_ADDR", "node0"},
          {"MASTER_PORT", "29500"}};
}

TEST(WorldFromEnvironmentTest, Torchrun) {
  absl::StatusOr<World> world = WorldFromEnvironment(FakeEnvironment(Torchrun()));
  ASSERT_THAT(world, IsOk());
  EXPECT_EQ(world->rank, 3);
  EXPECT_EQ(world->world_size, 8);
  EXPECT_EQ(world->local_rank, 1);
  EXPECT_EQ(world->local_world_size, 2);
  EXPECT_EQ(world->master_addr, "node0");
  EXPECT_EQ(world->master_port, 29500);
  EXPECT_EQ(world->source, "torchrun");
}

TEST(WorldFromEnvironmentTest, Slurm) {
  absl::StatusOr<World> world =
      WorldFromEnvironment(FakeEnvironment({{"SLURM_PROCID", "5"},
                                            {"SLURM_NTASKS", "8"},
                                            {"SLURM_LOCALID", "1"},
                                            {"SLURM_TASKS_PER_NODE", "4(x2)"},
                                            {"MASTER_ADDR", "node0"},
                                            {"MASTER_PORT", "1234"}}));
  ASSERT_THAT(world, IsOk());
  EXPECT_EQ(world->rank, 5);
  EXPECT_EQ(world->world_size, 8);
  EXPECT_EQ(world->local_rank, 1);
  EXPECT_EQ(world->local_world_size, 4);
  EXPECT_EQ(world->source, "SLURM");
}

TEST(WorldFromEnvironmentTest, OpenMpi) {
  absl::StatusOr<World> world =
      WorldFromEnvironment(FakeEnvironment({{"OMPI_COMM_WORLD_RANK", "0"},
                                            {"OMPI_COMM_WORLD_SIZE", "2"},
                                            {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                                            {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                                            {"MASTER_ADDR", "127.0.0.1"},
                                            {"MASTER_PORT", "29501"}}));
  ASSERT_THAT(world, IsOk());
  EXPECT_EQ(world->world_size, 2);
  EXPECT_EQ(world->source, "Open MPI");
}

TEST(WorldFromEnvironmentTest, TorchrunTakesPrecedence) {
  Variables variables = Torchrun();
  variables["SLURM_PROCID"] = "0";
  absl::StatusOr<World> world = WorldFromEnvironment(FakeEnvironment(variables));
  ASSERT_THAT(world, IsOk());
  EXPECT_EQ(world->source, "torchrun");
}

TEST(WorldFromEnvironmentTest, StoreFileAndTokenWhateverTheConvention) {
  absl::StatusOr<World> world = WorldFromEnvironment(
      FakeEnvironment({{"OMPI_COMM_WORLD_RANK", "0"},
                       {"OMPI_COMM_WORLD_SIZE", "2"},
                       {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                       {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                       {"MASTER_ADDR", "127.0.0.1"},
                       {"MASTER_PORT", "29501"},
                       {"PLAIT_STORE_FILE", "/tmp/job/store"},
                       {"PLAIT_STORE_TOKEN", "0123456789abcdef0123456789abcdef"}}));
  ASSERT_THAT(world, IsOk());
  EXPECT_EQ(world->store_file, "/tmp/job/store");
  EXPECT_EQ(world->store_token, "0123456789abcdef0123456789abcdef");
}

TEST(WorldFromEnvironmentTest, WhichStartOfTheJob) {
  absl::StatusOr<World> world = WorldFromEnvironment(FakeEnvironment(Torchrun()));
  ASSERT_THAT(world, IsOk());
  EXPECT_EQ(world->restart_count, 0);
  EXPECT_EQ(world->max_restarts, 0);
  EXPECT_EQ(world->restart_cause, "");

  Variables restarted = Torchrun();
  restarted[kRestartCountVariable] = "2";
  restarted[kMaxRestartsVariable] = "3";
  restarted[kRestartCauseVariable] = "rank 1 was killed by signal 9 (Killed)";
  world = WorldFromEnvironment(FakeEnvironment(restarted));
  ASSERT_THAT(world, IsOk());
  EXPECT_EQ(world->restart_count, 2);
  EXPECT_EQ(world->max_restarts, 3);
  EXPECT_EQ(world->restart_cause, "rank 1 was killed by signal 9 (Killed)");

  // A requeued SLURM job counts its restarts in SLURM_RESTART_COUNT.
  Variables requeued = Torchrun();
  requeued[kSlurmRestartCountVariable] = "1";
  world = WorldFromEnvironment(FakeEnvironment(requeued));
  ASSERT_THAT(world, IsOk());
  EXPECT_EQ(world->restart_count, 1);

  restarted[kRestartCountVariable] = "-1";
  EXPECT_THAT(WorldFromEnvironment(FakeEnvironment(restarted)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "TORCHELASTIC_RESTART_COUNT=\"-1\" is not a count (an integer >= 0)"));
}

// torchrun's agent keeps its own store on MASTER_PORT, so rank 0's goes beside it, unless
// PLAIT_STORE_PORT names the port, under any launcher.
TEST(WorldFromEnvironmentTest, StorePort) {
  Variables torchrun = Torchrun();
  torchrun["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  absl::StatusOr<World> world = WorldFromEnvironment(FakeEnvironment(torchrun));
  ASSERT_THAT(world, IsOk());
  EXPECT_EQ(world->master_port, 29501);
  torchrun[kStorePortVariable] = "30000";
  world = WorldFromEnvironment(FakeEnvironment(torchrun));
  ASSERT_THAT(world, IsOk());
  EXPECT_EQ(world->master_port, 30000);
  torchrun[kStorePortVariable] = "70000";
  EXPECT_THAT(
      WorldFromEnvironment(FakeEnvironment(torchrun)),
      StatusIs(absl::StatusCode::kInvalidArgument, "PLAIT_STORE_PORT=70000 must be in [1, 65535]"));
  torchrun = Torchrun();
  torchrun["MASTER_PORT"] = "65535";
  torchrun["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  EXPECT_THAT(WorldFromEnvironment(FakeEnvironment(torchrun)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("MASTER_PORT (+ 1, beside torchrun's own store)=65536")));
}

TEST(WorldFromEnvironmentTest, NoTokenIsEmpty) {
  absl::StatusOr<World> world = WorldFromEnvironment(FakeEnvironment(Torchrun()));
  ASSERT_THAT(world, IsOk());
  EXPECT_EQ(world->store_token, "");
}

TEST(WorldFromEnvironmentTest, ShortOrLongTokenIsNamedButNotShown) {
  for (const std::string& token : {std::string("hunter2"), std::string(257, 'x')}) {
    Variables variables = Torchrun();
    variables["PLAIT_STORE_TOKEN"] = token;
    absl::StatusOr<World> world = WorldFromEnvironment(FakeEnvironment(variables));
    EXPECT_THAT(world, StatusIs(absl::StatusCode::kInvalidArgument,
                                AllOf(HasSubstr(absl::StrCat("PLAIT_STORE_TOKEN has ", token.size(),
                                                             " characters; it "
                                                             "needs 16 to 256")),
                                      HasSubstr("openssl rand -hex 16"))));
    EXPECT_THAT(world.status().message(), Not(HasSubstr(token)));
  }
}

TEST(WorldFromEnvironmentTest, NoWorldIsNotFound) {
  EXPECT_THAT(WorldFromEnvironment(FakeEnvironment({{"HOME", "/root"}})),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("RANK")));
}

struct BadEnvironment {
  std::string name;
  std::string variable;
  std::optional<std::string> value;  // nullopt: unset
  std::string message;
};

class BadEnvironmentTest : public ::testing::TestWithParam<BadEnvironment> {};

TEST_P(BadEnvironmentTest, NamesTheVariable) {
  Variables variables = Torchrun();
  if (GetParam().value.has_value()) {
    variables[GetParam().variable] = *GetParam().value;
  } else {
    variables.erase(GetParam().variable);
  }
  EXPECT_THAT(WorldFromEnvironment(FakeEnvironment(variables)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(GetParam().message)));
}

INSTANTIATE_TEST_SUITE_P(
    Torchrun, BadEnvironmentTest,
    ::testing::Values(
        BadEnvironment{"missing_world_size", "WORLD_SIZE", std::nullopt,
                       "WORLD_SIZE is not set (torchrun launch: RANK is set)"},
        BadEnvironment{"missing_master_addr", "MASTER_ADDR", std::nullopt,
                       "MASTER_ADDR is not set"},
        BadEnvironment{"empty_master_port", "MASTER_PORT", "", "MASTER_PORT is not set"},
        BadEnvironment{"non_numeric_rank", "RANK", "three", "RANK=\"three\" is not an integer"},
        BadEnvironment{"trailing_garbage", "WORLD_SIZE", "8x",
                       "WORLD_SIZE=\"8x\" is not an integer"},
        BadEnvironment{"rank_too_large", "RANK", "8", "RANK=8 must be in [0, WORLD_SIZE=8)"},
        BadEnvironment{"negative_rank", "RANK", "-1", "RANK=-1 must be in [0, WORLD_SIZE=8)"},
        BadEnvironment{"zero_world", "WORLD_SIZE", "0", "WORLD_SIZE=0 must be >= 1"},
        BadEnvironment{"local_rank_too_large", "LOCAL_RANK", "2",
                       "LOCAL_RANK=2 must be in [0, LOCAL_WORLD_SIZE=2)"},
        BadEnvironment{"local_world_too_large", "LOCAL_WORLD_SIZE", "9",
                       "LOCAL_WORLD_SIZE=9 must be in [1, WORLD_SIZE=8]"},
        BadEnvironment{"port_too_large", "MASTER_PORT", "70000",
                       "MASTER_PORT=70000 must be in [1, 65535]"},
        BadEnvironment{"port_zero", "MASTER_PORT", "0", "MASTER_PORT=0 must be in [1, 65535]"}),
    [](const ::testing::TestParamInfo<BadEnvironment>& info) { return info.param.name; });

TEST(WorldFromEnvironmentTest, SlurmErrorsNameSlurmVariables) {
  EXPECT_THAT(WorldFromEnvironment(FakeEnvironment(
                  {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "0"}})),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("SLURM_NTASKS_PER_NODE and SLURM_TASKS_PER_NODE are not set")));
  EXPECT_THAT(WorldFromEnvironment(FakeEnvironment({{"SLURM_PROCID", "4"},
                                                    {"SLURM_NTASKS", "2"},
                                                    {"SLURM_LOCALID", "0"},
                                                    {"SLURM_NTASKS_PER_NODE", "2"},
                                                    {"MASTER_ADDR", "a"},
                                                    {"MASTER_PORT", "1"}})),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("SLURM_PROCID=4 must be in [0, SLURM_NTASKS=2)")));
  EXPECT_THAT(WorldFromEnvironment(FakeEnvironment({{"SLURM_PROCID", "0"},
                                                    {"SLURM_NTASKS", "2"},
                                                    {"SLURM_LOCALID", "0"},
                                                    {"SLURM_TASKS_PER_NODE", "(x2)"}})),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("SLURM_TASKS_PER_NODE=\"(x2)\" does not start with a task "
                                 "count")));
}

TEST(ValidateWorldTest, ExplicitValues) {
  World world{.rank = 1,
              .world_size = 2,
              .local_rank = 1,
              .local_world_size = 2,
              .master_addr = "127.0.0.1",
              .master_port = 29500};
  EXPECT_THAT(ValidateWorld(world), IsOk());
  world.rank = 2;
  EXPECT_THAT(ValidateWorld(world), StatusIs(absl::StatusCode::kInvalidArgument,
                                             "world.rank=2 must be in [0, world.world_size=2)"));
  world.rank = 0;
  world.master_addr = "";
  EXPECT_THAT(ValidateWorld(world),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("world.master_addr")));
  world.master_addr = "127.0.0.1";
  world.store_token = "short";
  EXPECT_THAT(ValidateWorld(world),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("world.store_token has 5 characters; it needs 16 to 256")));
}

}  // namespace
}  // namespace plait::parallel
