"""GPU_ONLY: the target_compatible_with of targets that exist only under --config=gpu.

    cc_test(name = "nccl_test", tags = ["gpu"], target_compatible_with = GPU_ONLY, ...)

Without --config=gpu such targets are skipped by `bazel build //...` and `bazel test //...`,
so the CPU build never needs the CUDA headers.
"""

GPU_ONLY = select({
    "//third_party:gpu_build": [],
    "//conditions:default": ["//third_party:never"],
})
