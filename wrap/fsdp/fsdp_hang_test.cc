// A hang test: in a 2-rank FSDP step (ranks as threads meeting through a file store), rank 1
// skips the reduce-scatter of block 1's gradients, as a rank whose code took another path
// would (parallel/testing_skip.h). Rank 0's error, once ProcessGroup::ExplainFailure has
// heard from rank 1, names the collective's place in the step (step, block, pass, kind,
// group, index) and rank 1 with the place where it was instead; and it is an absl::Status
// from the backward pass, not an abort.
#include <memory>
#include <string>
#include <vector>

#include "ATen/Context.h"
#include "ATen/core/Tensor.h"
#include "base/status_matchers.h"
#include "base/test_paths.h"
#include "base/threads.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/causal_lm.h"
#include "models/model_config.h"
#include "parallel/process_group.h"
#include "parallel/test_ranks.h"
#include "parallel/testing_skip.h"
#include "torch/csrc/autograd/generated/variable_factories.h"
#include "wrap/preparation.h"

namespace plait::wrap {
namespace {

using ::plait::base::testing::IsOk;
using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::HasSubstr;

constexpr int kRanks = 2;

// Rank `rank` of a local job meeting through `store_file`, on a mesh whose one dimension,
// "dp", gives up on a collective after a second.
absl::StatusOr<std::unique_ptr<parallel::ProcessGroup>> StartRank(int rank,
                                                                  const std::string& store_file) {
  parallel::MeshConfig config;
  parallel::MeshConfig::Dimension* dim = config.add_dims();
  dim->set_name("dp");
  dim->set_size(kRanks);
  config.set_collective_timeout_seconds(1);
  return parallel::ProcessGroup::Start(parallel::testing::LocalWorld(rank, kRanks, store_file),
                                       config, at::kCPU, absl::Seconds(30));
}

TEST(FsdpHangTest, ACollectiveOneRankSkippedIsNamedByItsPlaceInTheStepAndTheRank) {
  base::SetComputeThreads(1);  // one core per rank: the ranks share the machine
  const std::string store_file = base::testing::FreshTestDir("skipped_collective_store");
  models::InitConfig init;
  init.set_seed(3);
  at::manual_seed(7);  // the batch, drawn once before the rank threads start
  const at::Tensor sequence = torch::randint(models::PresetConfig("tiny")->vocab_size(),
                                             {kRanks, 17}, at::dtype(at::kLong));
  std::vector<absl::Status> backward(kRanks);
  parallel::testing::RunRanks(kRanks, [&](int rank) {
    absl::StatusOr<std::unique_ptr<parallel::ProcessGroup>> group = StartRank(rank, store_file);
    ASSERT_THAT(group, IsOk());
    const parallel::DeviceMesh& mesh = (*group)->mesh();
    std::shared_ptr<models::CausalLM> model =
        models::CausalLM::Create(*models::PresetConfig("tiny"), init).value();
    absl::StatusOr<std::unique_ptr<Preparation>> preparation = Preparation::Begin(*model, mesh);
    ASSERT_THAT(preparation, IsOk());
    PrepareStep fsdp;
    fsdp.mutable_fsdp()->set_mesh_dim("dp");
    ASSERT_THAT((*preparation)->Apply(fsdp), IsOk());
    if (rank == 1) {
      parallel::SkipCollectiveForTesting(
          **mesh.communicator("dp"), [](const parallel::CollectiveCall& call) {
            return call.collective == parallel::Collective::kReduceScatter && call.place.block == 1;
          });
    }
    mesh.BeginStep(1);
    const at::Tensor tokens = sequence.narrow(0, rank, 1).narrow(1, 0, 16);
    const at::Tensor targets = sequence.narrow(0, rank, 1).narrow(1, 1, 16);
    model->Loss(tokens, targets).backward();
    backward[rank] = (*group)->ExplainFailure((*preparation)->BackwardStatus());
  });
  // Rank 0 reaches block 1's reduce-scatter first and sends its part; rank 1, at block 0's,
  // receives it, sees another collective's transfer and stops. So rank 0 usually times out
  // waiting for rank 1, and fails at once if rank 1's part reached it first.
  const absl::Status& waited = backward[0];
  EXPECT_TRUE(absl::IsDeadlineExceeded(waited) || absl::IsUnavailable(waited)) << waited;
  EXPECT_THAT(std::string(waited.message()),
              AllOf(HasSubstr("step 1, block 1 backward, reduce_scatter of FSDP unit on group "
                              "'dp' (rank 0 of 2; collective #12 of the step): "),
                    AnyOf(HasSubstr("timed out after 1s waiting for rank 1"),
                          HasSubstr("transfer with rank 1 failed")),
                    HasSubstr("; rank 1 of 2 did not reach it: it failed at step 1, block 0 "
                              "backward, reduce_scatter of FSDP unit on group 'dp' (collective "
                              "#12 of the step)")));
  // Rank 1, which skipped block 1's, fails at the next one, block 0's, and names rank 0 there.
  EXPECT_THAT(std::string(backward[1].message()),
              AllOf(HasSubstr("step 1, block 0 backward, reduce_scatter of FSDP unit on group "
                              "'dp' (rank 1 of 2; collective #12 of the step): "),
                    HasSubstr("rank 0 of 2 did not reach it: it failed at step 1, block 1 "
                              "backward, reduce_scatter of FSDP unit")));
}

}  // namespace
}  // namespace plait::wrap
