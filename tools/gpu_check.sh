#!/usr/bin/env bash
# The GPU check of a machine with NVIDIA GPUs: runs the gpu-tagged tests, trains
# //trainer:train's llama_fsdp plan on the GPUs for 100 steps (2 ranks on 2 or more GPUs, 1 rank
# with the same global batch on one), runs model_bench's CUDA step (bf16, a Llama-3.1-8B-shaped
# block stack), and prints one summary line:
#
#   tools/gpu_check.sh                                # builds with Bazel (tools/torch_cuda)
#   tools/gpu_check.sh --bundle=plait-gpu.tar.xz      # runs tools/gpu_bundle.sh's binaries
#   gpu_check: 9 passed, 0 failed | llama_fsdp on 1 GPU(s): done: 100 steps in 9.8 s, ... |
#   model_bench (cuda:0 (NVIDIA H200, 140 GiB)): 45678 tokens/s, 410 TFLOP/s, MFU 41.5% of the
#   bf16 peak, peak memory 60.1 GiB | 412 s
#
# With Bazel it builds only what it runs (the gpu-tagged tests, the trainer and model_bench;
# CI's `tools/torch_cuda build` checks that everything else compiles), so that a machine
# with a cold Bazel cache finishes within about 10 minutes. With --bundle it builds nothing:
# the machine needs only PyTorch's CUDA wheel of the LibTorch version the bundle was built
# against (in python3, or $PLAIT_GPU_PYTHON), whose torch/lib and nvidia/*/lib folders serve
# LibTorch, CUDA's runtime and NCCL. --logs=DIR keeps every log in DIR. Exits non-zero, after
# the summary, when a build, a test, the training run or the benchmark fails or prints no
# result.
set -uo pipefail

# Paths as the caller gives them, made absolute before the script moves to the repository
# (and `bazel run` to the runfiles).
bundle_archive=""
log_dir=""
for arg in "$@"; do
  case "${arg}" in
    --bundle=*) bundle_archive="$(realpath -m "${arg#--bundle=}")" ;;
    --logs=*) log_dir="$(realpath -m "${arg#--logs=}")" ;;
    *)
      echo "usage: tools/gpu_check.sh [--bundle=ARCHIVE] [--logs=DIR]" >&2
      exit 2
      ;;
  esac
done
cd "$(dirname "$0")/.."
scratch="$(mktemp -d)"
trap 'rm -rf "${scratch}"' EXIT
mkdir -p "${log_dir:=${scratch}/logs}"
start=$(date +%s)
status=0
fail() {
  echo "gpu_check: $*" >&2
  status=1
}
python="${PLAIT_GPU_PYTHON:-python3}"

if [ -n "${bundle_archive}" ]; then
  # The bundle's executables, with its libraries and the wheel's on the loader's path. Python
  # unpacks it, being there in any case.
  "${python}" -c 'import sys, tarfile
safe = {"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}
tarfile.open(sys.argv[1]).extractall(sys.argv[2], **safe)' "${bundle_archive}" "${scratch}" ||
    { echo "gpu_check: cannot unpack ${bundle_archive} with ${python}" >&2; exit 1; }
  bundle="${scratch}/plait-gpu"
  wanted="$(sed -n 's/^torch_version=//p' "${bundle}/BUNDLE")"
  torch_info="$("${python}" -c 'import os, torch
print(torch.__version__)
print(os.path.dirname(torch.__file__))')" ||
    { echo "gpu_check: ${python} cannot import torch; the bundle needs PyTorch ${wanted}'s CUDA wheel" >&2; exit 1; }
  torch_version="${torch_info%%$'\n'*}"
  torch_dir="${torch_info#*$'\n'}"
  case "${torch_version}" in
    "${wanted}" | "${wanted}"+*) ;;
    *)
      echo "gpu_check: ${bundle_archive} was built against LibTorch ${wanted}, but ${python}'s" \
        "torch is ${torch_version} (${torch_dir}); LibTorch's C++ ABI differs between versions" >&2
      exit 1
      ;;
  esac
  library_path="${bundle}/lib:${torch_dir}/lib"
  for wheel_libraries in "${torch_dir}"/../nvidia/*/lib; do
    [ -d "${wheel_libraries}" ] && library_path+=":$(cd "${wheel_libraries}" && pwd)"
  done
  export LD_LIBRARY_PATH="${library_path}${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}"
  echo "--- bundle $(sed -n 's/^commit=//p' "${bundle}/BUNDLE"), LibTorch ${torch_version} from ${torch_dir}"
  read -r -a tests <<<"$(sed -n 's/^tests=//p' "${bundle}/BUNDLE")"
  train=("${bundle}/bin/trainer/train")
  model_bench=("${bundle}/bin/benchmarks/model_bench")
else
  train=(tools/torch_cuda run --config=opt //trainer:train --)
  model_bench=(tools/torch_cuda run --config=opt //benchmarks:model_bench --)
fi

# Runs the bundle's test `label` (//pkg:name) as `bazel test` would: in its runfiles, with a
# fresh TEST_TMPDIR and .bazelrc's test environment, within a medium test's 300 s. Prints
# Bazel's result line, and the log when the test did not pass.
run_bundled_test() {
  local label="$1" path log tmp started result
  path="${label#//}"
  path="${path/://}"
  log="${log_dir}/${path//\//_}.log"
  tmp="$(mktemp -d -p "${scratch}")"
  started=$(date +%s)
  (cd "${bundle}/runfiles/plait" && TEST_TMPDIR="${tmp}" TEST_SRCDIR="${bundle}/runfiles" \
    TEST_WORKSPACE=plait OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 \
    timeout 300 "${bundle}/bin/${path}") >"${log}" 2>&1
  case $? in
    0) result=PASSED ;;
    124) result=TIMEOUT ;;
    *) result=FAILED ;;
  esac
  [ "${result}" = PASSED ] || cat "${log}"
  echo "${label}  ${result} in $(($(date +%s) - started))s"
}

echo "--- gpu-tagged tests"
if [ -n "${bundle_archive}" ]; then
  for label in "${tests[@]}"; do run_bundled_test "${label}"; done 2>&1 | tee "${log_dir}/tests.log"
else
  # --config=gpu, building the gpu-tagged tests and nothing else.
  tools/torch_cuda test --config=opt --build_tests_only --test_output=errors //... 2>&1 |
    tee "${log_dir}/tests.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || fail "bazel test --config=gpu failed"
fi
target_line='^//[^ ]+ +(\(cached\) +)?'
passed=$(grep -cE "${target_line}PASSED" "${log_dir}/tests.log")
failed=$(grep -cE "${target_line}(FAILED|TIMEOUT|FLAKY|NO STATUS|INCOMPLETE)" "${log_dir}/tests.log")
[ "${passed}" -gt 0 ] || fail "no gpu-tagged test passed"

echo "--- llama_fsdp on the GPUs, 100 steps"
gpus=$(nvidia-smi --list-gpus 2>/dev/null | wc -l)
plan="${log_dir}/llama_fsdp.textproto"
if [ "${gpus}" -ge 2 ]; then
  cp plan/examples/llama_fsdp.textproto "${plan}"
else
  # One rank with the two ranks' batch: the same global batch of 16 sequences.
  sed -e 's/dims { name: "dp" size: 2 }/dims { name: "dp" size: 1 }/' \
    -e 's/micro_batch: 8$/micro_batch: 16/' plan/examples/llama_fsdp.textproto >"${plan}"
  grep -q 'size: 1 }' "${plan}" && grep -q 'micro_batch: 16$' "${plan}" ||
    fail "plan/examples/llama_fsdp.textproto no longer has the mesh and micro_batch this script rewrites for one GPU"
fi
# The plan's peaks are a CPU core's: no MFU for the tiny model (model_bench gives the GPU's).
"${train[@]}" --plan="${plan}" \
  --set=device=DEVICE_CUDA --set=training.steps=100 --set=training.metrics_file= \
  --set=training.peak_flops_per_rank=0 --set=training.peak_bf16_flops_per_rank=0 2>&1 |
  tee "${log_dir}/train.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || fail "llama_fsdp failed"
train_summary=$(grep -o 'done: .*' "${log_dir}/train.log" | tail -1)
[ -n "${train_summary}" ] || fail "llama_fsdp printed no summary"
grep -q 'peak device memory' <<<"${train_summary}" ||
  fail "llama_fsdp's summary has no peak device memory: it did not train on a GPU"

echo "--- model_bench on CUDA"
"${model_bench[@]}" --benchmark_filter=Cuda --benchmark_out="${log_dir}/bench.json" \
  --benchmark_out_format=json 2>&1 | tee "${log_dir}/bench.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || fail "model_bench failed"
# Exits non-zero for a benchmark that reported an error or no run.
bench_summary=$(
  "${python}" - "${log_dir}/bench.json" <<'PY'
import json, sys
try:
    runs = json.load(open(sys.argv[1]))["benchmarks"]
except (OSError, ValueError, KeyError) as error:
    print("model_bench: no result (%s)" % error)
    sys.exit(1)
ok = bool(runs)
for run in runs:
    if run.get("error_occurred"):
        print("model_bench: %s" % run.get("error_message", "failed"))
        ok = False
        continue
    mfu = "MFU %.1f%% of the bf16 peak" % (100 * run["MFU"]) if "MFU" in run else "no bf16 peak known"
    print("model_bench (%s): %.0f tokens/s, %.0f TFLOP/s, %s, peak memory %.1f GiB"
          % (run.get("label", "?"), run["tokens/s"], run["TFLOP/s"], mfu, run["peak_memory_GiB"]))
sys.exit(0 if ok else 1)
PY
) || fail "model_bench gave no result"

echo "gpu_check: ${passed} passed, ${failed} failed | llama_fsdp on ${gpus} GPU(s):" \
  "${train_summary:-no summary} | ${bench_summary:-model_bench: no result}" \
  "| $(($(date +%s) - start)) s"
[ "${failed}" -eq 0 ] && exit "${status}"
exit 1
