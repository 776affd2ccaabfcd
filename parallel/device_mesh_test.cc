#include "parallel/device_mesh.h"

#include <memory>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "parallel/test_ranks.h"
#include "torch/csrc/autograd/generated/variable_factories.h"

namespace plait::parallel {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::base::testing::IsOkAndHolds;
using ::plait::base::testing::StatusIs;
using ::plait::parallel::testing::RunOnRingMesh;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

MeshConfig ParseMesh(const std::string& text) {
  MeshConfig config;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &config)) << text;
  return config;
}

constexpr char kDpTp[] = R"pb(dims { name: "dp" size: 2 }
                              dims { name: "tp" size: 2 })pb";

TEST(MeshLayoutTest, CoordinatesAndGroupsAreRowMajor) {
  absl::StatusOr<MeshLayout> layout = MeshLayout::Create(ParseMesh(kDpTp), 4);
  ASSERT_THAT(layout, IsOk());
  EXPECT_EQ(layout->Coordinate(3, 0), 1);
  EXPECT_EQ(layout->Coordinate(3, 1), 1);
  EXPECT_EQ(layout->Coordinate(2, 1), 0);
  EXPECT_THAT(layout->GroupRanks(3, 1), ElementsAre(2, 3));  // tp
  EXPECT_THAT(layout->GroupRanks(3, 0), ElementsAre(1, 3));  // dp
  EXPECT_THAT(layout->GroupRanks(0, 0), ElementsAre(0, 2));
  EXPECT_EQ(layout->GroupName(3, 1), "tp[dp=1]");
  EXPECT_EQ(layout->GroupName(1, 0), "dp[tp=1]");
  EXPECT_THAT(layout->DimIndex("tp"), ::plait::base::testing::IsOkAndHolds(1));
}

TEST(MeshLayoutTest, ThreeDimensions) {
  absl::StatusOr<MeshLayout> layout =
      MeshLayout::Create(ParseMesh(R"pb(dims { name: "pp" size: 2 }
                                        dims { name: "dp" size: 3 }
                                        dims { name: "tp" size: 2 })pb"),
                         12);
  ASSERT_THAT(layout, IsOk());
  // rank 9 = pp 1, dp 1, tp 1
  EXPECT_THAT(layout->GroupRanks(9, 0), ElementsAre(3, 9));
  EXPECT_THAT(layout->GroupRanks(9, 1), ElementsAre(7, 9, 11));
  EXPECT_THAT(layout->GroupRanks(9, 2), ElementsAre(8, 9));
  EXPECT_EQ(layout->GroupName(9, 1), "dp[pp=1,tp=1]");
  // Spanning pp and tp: the ranks at dp 1, row-major over (pp, tp).
  EXPECT_THAT(layout->SubgridRanks(9, {0, 2}), ElementsAre(2, 3, 8, 9));
  EXPECT_EQ(layout->SubgridIndex(9, {0, 2}), 3);
  EXPECT_EQ(layout->SubgridIndex(8, {0, 2}), 2);
  EXPECT_EQ(layout->SubgridName(9, {0, 2}), "pp,tp[dp=1]");
  EXPECT_THAT(layout->SubgridRanks(4, {0, 1, 2}),
              ElementsAre(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11));
  EXPECT_EQ(layout->SubgridName(4, {0, 1, 2}), "pp,dp,tp");
}

TEST(MeshLayoutTest, NoDimensionsIsOneRank) {
  absl::StatusOr<MeshLayout> layout = MeshLayout::Create(ParseMesh(""), 1);
  ASSERT_THAT(layout, IsOk());
  EXPECT_EQ(layout->dim_names(), std::vector<std::string>{"world"});
  EXPECT_EQ(MeshRanks(ParseMesh("")), 1);
  EXPECT_EQ(MeshRanks(ParseMesh(kDpTp)), 4);
}

// A validator divides by the data-parallel ranks before it knows the mesh is valid: a size
// of 0 made the plan check divide by zero, and huge sizes overflowed the product.
TEST(MeshLayoutTest, SubmeshRanksIsAtLeastOneAndNeverOverflows) {
  EXPECT_EQ(SubmeshRanks(ParseMesh(kDpTp), {"dp"}), 2);
  EXPECT_EQ(SubmeshRanks(ParseMesh(kDpTp), {"dp", "tp"}), 4);
  EXPECT_EQ(SubmeshRanks(ParseMesh(kDpTp), {}), 1);
  EXPECT_EQ(SubmeshRanks(ParseMesh(R"pb(dims { name: "dp" size: 0 }
                                        dims { name: "tp" size: -3 })pb"),
                         {"dp", "tp"}),
            1);
  EXPECT_EQ(SubmeshRanks(ParseMesh(R"pb(dims { name: "a" size: 2147483647 }
                                        dims { name: "b" size: 2147483647 }
                                        dims { name: "c" size: 2147483647 })pb"),
                         {"a", "b", "c"}),
            kMaxMeshRanks + 1);
}

TEST(MeshLayoutTest, InvalidConfigsNameTheField) {
  const auto invalid = [](const std::string& message) {
    return StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(message));
  };
  EXPECT_THAT(MeshLayout::Create(ParseMesh(kDpTp), 8),
              invalid("mesh: dp=2 x tp=2 makes 4 ranks, but the world has 8; the mesh's sizes "
                      "must multiply to the world size"));
  EXPECT_THAT(MeshLayout::Create(ParseMesh(""), 4),
              invalid("mesh: no dimensions (one rank) makes 1 ranks, but the world has 4"));
  EXPECT_THAT(MeshLayout::Create(ParseMesh(R"pb(dims { name: "a" size: 2147483647 }
                                                dims { name: "b" size: 2147483647 }
                                                dims { name: "c" size: 2147483647 })pb"),
                                 8),
              invalid("mesh: a=2147483647 x b=2147483647 x c=2147483647 makes more than 16777216 "
                      "ranks"));
  EXPECT_THAT(MeshLayout::Create(ParseMesh(R"pb(dims { name: "dp" size: 0 })pb"), 1),
              invalid("mesh.dims[0].size: 0; must be >= 1"));
  EXPECT_THAT(MeshLayout::Create(ParseMesh(R"pb(dims { size: 1 })pb"), 1),
              invalid("mesh.dims[0].name: is empty; name every mesh dimension"));
  EXPECT_THAT(MeshLayout::Create(ParseMesh(R"pb(dims { name: "dp" size: 1 }
                                                dims { name: "dp" size: 2 })pb"),
                                 2),
              invalid("mesh.dims[1].name: \"dp\" appears twice"));
  EXPECT_THAT(MeshLayout::Create(ParseMesh(R"pb(rendezvous_timeout_seconds: -1)pb"), 1),
              invalid("mesh.rendezvous_timeout_seconds: -1; must be between 0 (the default, "
                      "5m) and 86400 (a day)"));
  EXPECT_THAT(MeshLayout::Create(ParseMesh(R"pb(collective_timeout_seconds: 86401)pb"), 1),
              invalid("mesh.collective_timeout_seconds: 86401; must be between 0"));
}

TEST(MeshLayoutTest, TimeoutsDefaultToFiveMinutes) {
  EXPECT_EQ(RendezvousTimeout(ParseMesh("")), absl::Minutes(5));
  EXPECT_EQ(RendezvousTimeout(ParseMesh("rendezvous_timeout_seconds: 3")), absl::Seconds(3));
  EXPECT_EQ(CollectiveTimeout(ParseMesh("")), absl::Minutes(5));
}

TEST(DeviceMeshTest, EachDimensionCommunicatesWithinItsGroup) {
  absl::StatusOr<MeshLayout> layout = MeshLayout::Create(ParseMesh(kDpTp), 4);
  ASSERT_THAT(layout, IsOk());
  RunOnRingMesh(*layout, [&](int rank, DeviceMesh& mesh) {
    for (const char* dim : {"dp", "tp"}) {
      absl::StatusOr<Communicator*> comm = mesh.communicator(dim);
      ASSERT_THAT(comm, IsOk());
      const int dim_index = *layout->DimIndex(dim);
      EXPECT_EQ((*comm)->name(), layout->GroupName(rank, dim_index));
      EXPECT_EQ((*comm)->rank(), *mesh.coordinate(dim));
      // The sum of the global ranks in the group, e.g. rank 3: tp {2, 3} = 5, dp {1, 3} = 4.
      at::Tensor value = torch::full({1}, rank, at::kLong);
      ASSERT_THAT((*comm)->AllReduce(value, ReduceOp::kSum)->Wait(), IsOk());
      int64_t expected = 0;
      for (int member : layout->GroupRanks(rank, dim_index)) expected += member;
      EXPECT_EQ(value.item<int64_t>(), expected) << dim;
    }
    EXPECT_THAT(mesh.communicator("pp"),
                StatusIs(absl::StatusCode::kNotFound,
                         "the mesh has no dimension \"pp\"; its dimensions are dp, tp"));
  });
}

TEST(DeviceMeshTest, SubgridsCommunicateWithinTheirGroup) {
  absl::StatusOr<MeshLayout> layout =
      MeshLayout::Create(ParseMesh(R"pb(dims { name: "dp" size: 2 }
                                        dims { name: "ep" size: 2 }
                                        dims { name: "tp" size: 2 })pb"),
                         8);
  ASSERT_THAT(layout, IsOk());
  RunOnRingMesh(*layout, [&](int rank, DeviceMesh& mesh) {
    absl::StatusOr<Communicator*> span = mesh.SubgridCommunicator({"ep", "dp"});
    ASSERT_THAT(span, IsOk());
    EXPECT_EQ(mesh.SubgridCommunicator({"dp", "ep"}).value(), *span);  // created once
    EXPECT_EQ((*span)->name(), layout->SubgridName(rank, {0, 1}));
    EXPECT_EQ((*span)->rank(), mesh.SubgridRankAndSize({"dp", "ep"})->first);
    EXPECT_EQ((*span)->size(), 4);
    // The sum of the global ranks at this rank's tp coordinate: 0+2+4+6 or 1+3+5+7.
    at::Tensor value = torch::full({1}, rank, at::kLong);
    ASSERT_THAT((*span)->AllReduce(value, ReduceOp::kSum)->Wait(), IsOk());
    EXPECT_EQ(value.item<int64_t>(), rank % 2 == 0 ? 12 : 16);
    EXPECT_EQ(mesh.SubgridCommunicator({"tp"}).value(), mesh.communicator("tp").value());
    EXPECT_EQ(mesh.communicators().size(), 4u);  // three dimensions and the sub-grid
    EXPECT_THAT(mesh.SubgridCommunicator({"dp", "pp"}),
                StatusIs(absl::StatusCode::kNotFound, HasSubstr("no dimension \"pp\"")));
  });
}

TEST(DeviceMeshTest, ReductionsSpanTheWholeMesh) {
  absl::StatusOr<MeshLayout> layout = MeshLayout::Create(ParseMesh(kDpTp), 4);
  ASSERT_THAT(layout, IsOk());
  RunOnRingMesh(*layout, [&](int rank, DeviceMesh& mesh) {
    at::Tensor value = torch::full({1}, static_cast<float>(rank), at::kFloat);
    ASSERT_THAT(mesh.AllReduce(value, ReduceOp::kAverage), IsOk());
    EXPECT_EQ(value.item<float>(), 1.5f);  // (0 + 1 + 2 + 3) / 4

    // Rank 3 (dp 1, tp 1): dp-major index 3 of 4; along "tp" alone, 1 of 2.
    EXPECT_EQ(*mesh.SubgridRankAndSize({"tp", "dp"}), std::make_pair(rank, 4));
    EXPECT_EQ(*mesh.SubgridRankAndSize({"tp"}), std::make_pair(*mesh.coordinate("tp"), 2));
    EXPECT_EQ(*mesh.SubgridRankAndSize({}), std::make_pair(0, 1));
    EXPECT_THAT(mesh.SubgridRankAndSize({"pp"}),
                StatusIs(absl::StatusCode::kNotFound, HasSubstr("no dimension \"pp\"")));

    EXPECT_THAT(mesh.PerRank(10 * rank + 1), IsOkAndHolds(ElementsAre(1, 11, 21, 31)));

    EXPECT_THAT(mesh.Agree(absl::OkStatus(), "saving"), IsOk());
    const absl::Status own = rank == 2 ? absl::InternalError("disk full") : absl::OkStatus();
    const absl::Status agreed = mesh.Agree(own, "saving");
    if (rank == 2) {
      EXPECT_THAT(agreed, StatusIs(absl::StatusCode::kInternal, "disk full"));
    } else {
      EXPECT_THAT(agreed,
                  StatusIs(absl::StatusCode::kAborted,
                           "saving: rank 2 failed (see their errors); this rank stops too"));
    }
  });
}

}  // namespace
}  // namespace plait::parallel
