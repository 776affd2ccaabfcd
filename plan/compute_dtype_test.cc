#include "plan/compute_dtype.h"

#include "ATen/core/Tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "parallel/device.h"

namespace plait::plan {
namespace {

using ::testing::HasSubstr;

const at::Device kCpu(at::kCPU);

TEST(ComputeDtypeTest, AutoIsBf16ExactlyWhereItIsNative) {
  EXPECT_EQ(ResolveAutoDtype(base::DTYPE_AUTO, "AVX512_BF16"), base::DTYPE_BFLOAT16);
  EXPECT_EQ(ResolveAutoDtype(base::DTYPE_AUTO, std::nullopt), base::DTYPE_FLOAT32);
  for (base::Dtype chosen : {base::DTYPE_UNSPECIFIED, base::DTYPE_FLOAT32, base::DTYPE_BFLOAT16}) {
    EXPECT_EQ(ResolveAutoDtype(chosen, "AMX"), chosen);
    EXPECT_EQ(ResolveAutoDtype(chosen, std::nullopt), chosen);
  }
}

TEST(ComputeDtypeTest, ThePlansModelsAreResolvedForTheDevice) {
  Plan plan;
  plan.mutable_model()->set_dtype(base::DTYPE_AUTO);
  FrozenModel* auto_reference = plan.add_frozen();
  auto_reference->mutable_model()->set_dtype(base::DTYPE_AUTO);
  FrozenModel* fp32_reference = plan.add_frozen();
  fp32_reference->mutable_model()->set_dtype(base::DTYPE_FLOAT32);

  const base::Dtype expected =
      parallel::NativeBf16(kCpu).has_value() ? base::DTYPE_BFLOAT16 : base::DTYPE_FLOAT32;
  const Plan resolved = ResolveAutoDtypes(plan, kCpu);
  EXPECT_EQ(resolved.model().dtype(), expected);
  EXPECT_EQ(resolved.frozen(0).model().dtype(), expected);
  EXPECT_EQ(resolved.frozen(1).model().dtype(), base::DTYPE_FLOAT32);
  EXPECT_EQ(plan.model().dtype(), base::DTYPE_AUTO);  // the plan itself is left as it was
}

TEST(ComputeDtypeTest, TheFirstLineSaysWhatTheModelComputesInAndWhy) {
  EXPECT_EQ(DescribeComputeDtype(base::DTYPE_AUTO, kCpu, "AVX512_BF16"),
            "bf16 with fp32 master weights (auto: the CPU has AVX512_BF16)");
  EXPECT_EQ(DescribeComputeDtype(base::DTYPE_AUTO, kCpu, std::nullopt),
            "fp32 (auto: the CPU has no native bf16)");
  EXPECT_EQ(
      DescribeComputeDtype(base::DTYPE_AUTO, at::Device(at::kCUDA, 0), "compute capability 9.0"),
      "bf16 with fp32 master weights (auto: the GPU has compute capability 9.0)");
  EXPECT_EQ(DescribeComputeDtype(base::DTYPE_UNSPECIFIED, kCpu, "AMX"), "fp32");
  EXPECT_EQ(DescribeComputeDtype(base::DTYPE_BFLOAT16, kCpu, "AMX"),
            "bf16 with fp32 master weights");
  // bf16 asked for where it is emulated runs, and says that it is slow.
  EXPECT_THAT(DescribeComputeDtype(base::DTYPE_BFLOAT16, kCpu, std::nullopt),
              HasSubstr("the CPU has no native bf16, so its bf16 matmuls are emulated: correct, "
                        "but slower than fp32"));
}

}  // namespace
}  // namespace plait::plan
