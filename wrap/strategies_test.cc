#include "wrap/strategies.h"

#include <memory>
#include <string>

#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "wrap/wrap.pb.h"

namespace plait::wrap {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::base::testing::StatusIs;
using ::testing::HasSubstr;

PrepareStep Step(const std::string& text) {
  PrepareStep step;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &step)) << text;
  return step;
}

TEST(MakeStrategyTest, MakesTheStrategyAStepNames) {
  absl::StatusOr<std::unique_ptr<Strategy>> fsdp = MakeStrategy(Step("fsdp { mesh_dim: 'dp' }"));
  ASSERT_THAT(fsdp, IsOk());
  EXPECT_EQ((*fsdp)->name(), "fsdp");
  EXPECT_EQ((*fsdp)->mesh_dim(), "dp");
  EXPECT_THAT(MakeStrategy(Step("ddp { mesh_dim: 'dp' bucket_cap_mb: 25 }")), IsOk());
  EXPECT_THAT(MakeStrategy(Step("")),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("names no strategy")));
}

// A bucket cap DDP refuses when it wraps the model is refused when the plan is checked: a
// negative or infinite one passed the plan check and failed only at preparation.
TEST(MakeStrategyTest, BucketCapsArePositiveAndFinite) {
  EXPECT_THAT(
      MakeStrategy(Step("ddp { mesh_dim: 'dp' bucket_cap_mb: -1 }")),
      StatusIs(absl::StatusCode::kInvalidArgument, "ddp.bucket_cap_mb: -1 must be > 0 and finite"));
  EXPECT_THAT(MakeStrategy(Step("ddp { mesh_dim: 'dp' first_bucket_cap_mb: inf }")),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "ddp.first_bucket_cap_mb: inf must be > 0 and finite"));
  EXPECT_THAT(MakeStrategy(Step("ddp { mesh_dim: 'dp' bucket_cap_mb: 0 }")),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bucket_cap_mb: 0")));
}

}  // namespace
}  // namespace plait::wrap
