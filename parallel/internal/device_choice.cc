#include "parallel/internal/device_choice.h"

#include "absl/strings/str_cat.h"

namespace plait::parallel::internal {

absl::StatusOr<torch::Device> ChooseDevice(Device requested, int local_rank, int local_ranks,
                                           const std::string& field, bool built_for_cuda,
                                           int cuda_devices) {
  if (requested == DEVICE_CPU || (requested == DEVICE_DEFAULT && cuda_devices == 0)) {
    return torch::Device(torch::kCPU);
  }
  const std::string chosen = requested == DEVICE_CUDA ? "DEVICE_CUDA" : "the default, CUDA,";
  if (!built_for_cuda) {
    return absl::FailedPreconditionError(
        absl::StrCat(field, ": ", chosen,
                     " needs a binary built with --config=gpu; this one has no CUDA code paths "
                     "(rebuild with --config=gpu, or set device: DEVICE_CPU)"));
  }
  if (cuda_devices == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(field, ": ", chosen,
                     " but LibTorch sees no GPU here (check CUDA_VISIBLE_DEVICES and the driver, "
                     "or set device: DEVICE_CPU)"));
  }
  if (local_ranks > cuda_devices) {
    // Local rank r computes on cuda:r, so the ranks from cuda_devices on have none.
    const int first_without = cuda_devices;
    return absl::FailedPreconditionError(absl::StrCat(
        field, ": ", chosen, " with ", local_ranks, " ranks on this machine, but it has ",
        cuda_devices, " GPU", cuda_devices == 1 ? "" : "s", ": local rank",
        local_ranks - first_without == 1
            ? absl::StrCat(" ", first_without, " has")
            : absl::StrCat("s ", first_without, " to ", local_ranks - 1, " have"),
        " none, and each rank needs its own (use at most ", cuda_devices,
        " ranks per machine, or set device: DEVICE_CPU)",
        local_rank >= first_without ? absl::StrCat("; this is local rank ", local_rank) : ""));
  }
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(local_rank));
}

}  // namespace plait::parallel::internal
