#include "parallel/tensor_slice.h"

#include "ATen/core/Tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "torch/csrc/autograd/generated/variable_factories.h"

namespace plait::parallel {
namespace {

using ::testing::ElementsAre;

TEST(TensorSliceTest, NarrowingComposesInGlobalCoordinates) {
  // Tensor parallelism's second half of the columns, then FSDP's second row of three.
  const TensorSlice slice = TensorSlice::Whole({4, 6}).Narrow(1, 3, 3).Narrow(0, 2, 2);
  EXPECT_THAT(slice.global_shape, ElementsAre(4, 6));
  EXPECT_THAT(slice.box.offsets, ElementsAre(2, 3));
  EXPECT_THAT(slice.box.lengths, ElementsAre(2, 3));
  EXPECT_EQ(slice.box.numel(), 6);
  EXPECT_EQ(slice.DebugString(), "[2:4, 3:6] of [4, 6]");
}

TEST(TensorSliceTest, DataOfLeavesThePaddingOut) {
  // A shard of 3 rows holding 2 rows of data and a padding row.
  const TensorSlice slice = TensorSlice::Whole({5, 2}).Narrow(0, 3, 2);
  const at::Tensor local = torch::arange(6, at::kFloat).reshape({3, 2});
  EXPECT_TRUE(slice.DataOf(local).equal(torch::arange(4, at::kFloat).reshape({2, 2})));
  // A scalar's box has no dimensions and one element.
  EXPECT_EQ(TensorSlice::Whole({}).box.numel(), 1);
}

TEST(TensorSliceTest, NarrowingPastTheBoxLeavesThePaddingOut) {
  // A vocabulary of 5 rows padded to 6 for 2 tensor-parallel ranks: the second holds rows 3
  // and 4 and a padding row. FSDP over 2 ranks shards its 3 rows as 2 and 1: the second
  // shard is padding alone.
  const TensorSlice second = TensorSlice::Whole({5, 2}).Narrow(0, 3, 3);
  EXPECT_EQ(second.DebugString(), "[3:5, 0:2] of [5, 2]");
  EXPECT_EQ(second.Narrow(0, 0, 2).DebugString(), "[3:5, 0:2] of [5, 2]");
  EXPECT_EQ(second.Narrow(0, 2, 1).box.numel(), 0);
}

TEST(TensorSliceTest, IntersectionsAndNarrowingToThem) {
  const Box stored{{0, 0}, {2, 4}};
  const Box wanted{{1, 2}, {3, 2}};
  const std::optional<Box> common = Intersect(stored, wanted);
  ASSERT_TRUE(common.has_value());
  EXPECT_EQ(*common, (Box{{1, 2}, {1, 2}}));
  const at::Tensor data = torch::arange(8).reshape({2, 4});
  EXPECT_TRUE(NarrowTo(data, stored, *common).equal(torch::tensor({{6, 7}})));
  EXPECT_FALSE(Intersect(stored, Box{{2, 0}, {1, 4}}).has_value());
}

}  // namespace
}  // namespace plait::parallel
