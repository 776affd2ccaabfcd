#include "optim/grad_norm.h"

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "ATen/Context.h"
#include "ATen/core/Tensor.h"
#include "ATen/ops/allclose.h"
#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "parallel/device_mesh.h"
#include "parallel/ring_communicator.h"
#include "parallel/test_ranks.h"
#include "torch/csrc/autograd/generated/variable_factories.h"
#include "torch/csrc/distributed/c10d/HashStore.hpp"
#include "torch/nn/utils/clip_grad.h"

namespace plait::optim {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::base::testing::IsOkAndHolds;
using ::plait::parallel::Communicator;
using ::plait::parallel::RingCommunicator;
using ::plait::parallel::testing::RunRanks;

// The full gradients of a three-parameter model, the same in every process.
struct FullGradients {
  FullGradients() {
    at::manual_seed(7);
    a = torch::randn({8, 6});  // sharded on both mesh dimensions
    b = torch::randn({6});     // sharded on one, replicated on the other
    c = torch::randn({5});     // replicated everywhere
  }
  at::Tensor a, b, c;
  double Norm() const {
    return std::sqrt(a.pow(2).sum().item<double>() + b.pow(2).sum().item<double>() +
                     c.pow(2).sum().item<double>());
  }
};

// A parameter holding `part` with `part` as its gradient too.
parallel::TrainableParameter WithGradient(const std::string& name, const at::Tensor& part,
                                          std::vector<Communicator*> sharded_over) {
  at::Tensor tensor = torch::zeros_like(part);
  tensor.mutable_grad() = part.clone();
  return {name, tensor, std::move(sharded_over)};
}

TEST(GlobalGradNormTest, OneProcessIsTheFrobeniusNorm) {
  const FullGradients full;
  EXPECT_THAT(GlobalGradNorm({WithGradient("a", full.a, {}), WithGradient("b", full.b, {}),
                              WithGradient("c", full.c, {})}),
              IsOkAndHolds(::testing::DoubleNear(full.Norm(), 1e-6 * full.Norm())));
}

// Two ranks: `a` sharded by rows (FSDP), `b` and `c` replicated. Clipping with the global
// norm leaves each rank exactly its part of the clipped full gradients.
TEST(GlobalGradNormTest, TwoRanksShardedAndReplicatedEqualTheFullModel) {
  const FullGradients full;
  // The single-process reference: torch clips the full gradients.
  const std::vector<at::Tensor> reference = {WithGradient("a", full.a, {}).tensor,
                                             WithGradient("b", full.b, {}).tensor,
                                             WithGradient("c", full.c, {}).tensor};
  const double max_norm = full.Norm() / 3;
  torch::nn::utils::clip_grad_norm_(reference, max_norm);
  auto store = c10::make_intrusive<c10d::HashStore>();
  RunRanks(2, [&](int rank) {
    auto world = RingCommunicator::Create(*store, "world", rank, 2, RingCommunicator::kLoopback);
    ASSERT_THAT(world, IsOk());
    const std::vector<parallel::TrainableParameter> parameters = {
        WithGradient("a", full.a.chunk(2, 0)[rank], {world->get()}),
        WithGradient("b", full.b, {}),
        WithGradient("c", full.c, {}),
    };
    absl::StatusOr<double> norm = GlobalGradNorm(parameters);
    ASSERT_THAT(norm, IsOk());
    EXPECT_NEAR(*norm, full.Norm(), 1e-6 * full.Norm());
    ScaleGradients(parameters, max_norm / (*norm + 1e-6));
    EXPECT_TRUE(at::allclose(parameters[0].tensor.grad(), reference[0].grad().chunk(2, 0)[rank]));
    EXPECT_TRUE(at::allclose(parameters[1].tensor.grad(), reference[1].grad()));
    EXPECT_TRUE(at::allclose(parameters[2].tensor.grad(), reference[2].grad()));
  });
}

// A part that every rank of its group holds (tensor parallelism's key/value head shared by
// more ranks than there are heads) counts once, by its `replicas`.
TEST(GlobalGradNormTest, APartSharedByTheRanksOfItsGroupCountsOnce) {
  const FullGradients full;
  const double expected =
      std::sqrt(full.a.pow(2).sum().item<double>() + full.c.pow(2).sum().item<double>());
  auto store = c10::make_intrusive<c10d::HashStore>();
  RunRanks(2, [&](int rank) {
    auto world = RingCommunicator::Create(*store, "world", rank, 2, RingCommunicator::kLoopback);
    ASSERT_THAT(world, IsOk());
    parallel::TrainableParameter shared = WithGradient("c", full.c, {world->get()});
    shared.replicas = 2;
    EXPECT_THAT(GlobalGradNorm({WithGradient("a", full.a.chunk(2, 0)[rank], {world->get()}),
                                std::move(shared)}),
                IsOkAndHolds(::testing::DoubleNear(expected, 1e-6 * expected)));
  });
}

// Four ranks on a dp x tp mesh: `a` sharded on both (FSDP over dp of a TP shard), `b` on tp
// only (replicated across dp), `c` whole on every rank.
TEST(GlobalGradNormTest, FourRanksOnAMeshEqualTheFullModel) {
  const FullGradients full;
  absl::StatusOr<parallel::MeshLayout> layout = parallel::MeshLayout::Create(
      [] {
        parallel::MeshConfig config;
        auto* dp = config.add_dims();
        dp->set_name("dp");
        dp->set_size(2);
        auto* tp = config.add_dims();
        tp->set_name("tp");
        tp->set_size(2);
        return config;
      }(),
      4);
  ASSERT_THAT(layout, IsOk());
  parallel::testing::RunOnRingMesh(*layout, [&](int, parallel::DeviceMesh& mesh) {
    Communicator* dp = *mesh.communicator("dp");
    Communicator* tp = *mesh.communicator("tp");
    const at::Tensor a_part = full.a.chunk(2, 1)[tp->rank()].chunk(2, 0)[dp->rank()];
    const std::vector<parallel::TrainableParameter> parameters = {
        WithGradient("a", a_part.contiguous(), {dp, tp}),
        WithGradient("b", full.b.chunk(2, 0)[tp->rank()], {tp}),
        WithGradient("c", full.c, {}),
    };
    EXPECT_THAT(GlobalGradNorm(parameters),
                IsOkAndHolds(::testing::DoubleNear(full.Norm(), 1e-6 * full.Norm())));
  });
}

}  // namespace
}  // namespace plait::optim
