#include "plan/compute_dtype.h"

#include "ATen/core/Tensor.h"
#include "absl/strings/str_cat.h"
#include "parallel/device.h"

namespace plait::plan {

base::Dtype ResolveAutoDtype(base::Dtype requested, const std::optional<std::string>& native_bf16) {
  if (requested != base::DTYPE_AUTO) return requested;
  return native_bf16.has_value() ? base::DTYPE_BFLOAT16 : base::DTYPE_FLOAT32;
}

Plan ResolveAutoDtypes(const Plan& plan, const at::Device& device) {
  return ResolveAutoDtypes(plan, parallel::NativeBf16(device));
}

Plan ResolveAutoDtypes(const Plan& plan, const std::optional<std::string>& native_bf16) {
  Plan resolved = plan;
  models::ModelSpec* model = resolved.mutable_model();
  model->set_dtype(ResolveAutoDtype(model->dtype(), native_bf16));
  for (FrozenModel& frozen : *resolved.mutable_frozen()) {
    frozen.mutable_model()->set_dtype(ResolveAutoDtype(frozen.model().dtype(), native_bf16));
  }
  return resolved;
}

std::string DescribeComputeDtype(base::Dtype requested, const at::Device& device,
                                 const std::optional<std::string>& native_bf16) {
  const std::string processor = device.is_cuda() ? "the GPU" : "the CPU";
  switch (ResolveAutoDtype(requested, native_bf16)) {
    case base::DTYPE_BFLOAT16:
      if (requested == base::DTYPE_AUTO) {
        return absl::StrCat("bf16 with fp32 master weights (auto: ", processor, " has ",
                            *native_bf16, ")");
      }
      if (!native_bf16.has_value()) {
        return absl::StrCat("bf16 with fp32 master weights; ", processor,
                            " has no native bf16, so its bf16 matmuls are emulated: correct, "
                            "but slower than fp32");
      }
      return "bf16 with fp32 master weights";
    case base::DTYPE_FLOAT16:
      return "fp16 with fp32 master weights";
    default:
      if (requested == base::DTYPE_AUTO) {
        return absl::StrCat("fp32 (auto: ", processor, " has no native bf16)");
      }
      return "fp32";
  }
}

std::string DescribeComputeDtype(const Plan& plan, const at::Device& device) {
  return DescribeComputeDtype(plan.model().dtype(), device, parallel::NativeBf16(device));
}

}  // namespace plait::plan
