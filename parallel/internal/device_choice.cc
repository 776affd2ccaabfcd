#include "parallel/internal/device_choice.h"

#include "ATen/core/Tensor.h"
#include "absl/strings/str_cat.h"

namespace plait::parallel::internal {

namespace {

// Whether CUDA_VISIBLE_DEVICES gives this process one GPU of its own, as a launcher does that
// binds a GPU to each task (SLURM's srun --gpus-per-task=1): it names one device.
bool OneGpuPerProcess(const std::optional<std::string>& visible_devices) {
  return visible_devices.has_value() && !visible_devices->empty() &&
         visible_devices->find(',') == std::string::npos;
}

}  // namespace

absl::StatusOr<at::Device> ChooseDevice(Device requested, int local_rank, int local_ranks,
                                        const std::string& field, bool built_for_cuda,
                                        int cuda_devices,
                                        const std::optional<std::string>& visible_devices) {
  if (requested == DEVICE_CPU || (requested == DEVICE_DEFAULT && cuda_devices == 0)) {
    return at::Device(at::kCPU);
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
  if (cuda_devices == 1 && OneGpuPerProcess(visible_devices)) {
    // Each local rank sees its own GPU as cuda:0; NCCL refuses two ranks on one GPU.
    return at::Device(at::kCUDA, 0);
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
        " ranks per machine, give each process its own GPU in CUDA_VISIBLE_DEVICES, as srun "
        "--gpus-per-task=1 does, or set device: DEVICE_CPU)",
        local_rank >= first_without ? absl::StrCat("; this is local rank ", local_rank) : ""));
  }
  return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(local_rank));
}

}  // namespace plait::parallel::internal
