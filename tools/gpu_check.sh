#!/usr/bin/env bash
# The GPU check of a machine with NVIDIA GPUs and Bazel: builds and runs the gpu-tagged tests
# with --config=gpu against a CUDA LibTorch (tools/torch_cuda: LIBTORCH_HOME, else
# tools/setup.sh's), trains //trainer:train's llama_fsdp plan on the GPUs for 100 steps (2 ranks
# on 2 or more GPUs, 1 rank with the same global batch on one), runs model_bench's CUDA step
# (bf16, a Llama-3.1-8B-shaped block stack), and prints one summary line:
#
#   tools/gpu_check.sh
#   gpu_check: 9 passed, 0 failed | llama_fsdp on 1 GPU(s): done: 100 steps in 9.8 s, ... |
#   model_bench (cuda:0 (NVIDIA H200, 140 GiB)): 45678 tokens/s, 410 TFLOP/s, MFU 41.5% of the
#   bf16 peak, peak memory 60.1 GiB | 412 s
#
# It builds only what it runs (the gpu-tagged tests, the trainer and model_bench; CI's
# `tools/torch_cuda build //...` checks that everything else compiles), so that a machine
# with a cold Bazel cache finishes within about 10 minutes. Exits non-zero, after the summary,
# when a build, a test, the training run or the benchmark fails or prints no result.
set -uo pipefail
cd "$(dirname "$0")/.."

log_dir="$(mktemp -d)"
trap 'rm -rf "${log_dir}"' EXIT
start=$(date +%s)
status=0
fail() {
  echo "gpu_check: $*" >&2
  status=1
}

echo "--- gpu-tagged tests (--config=gpu; builds them and nothing else)"
tools/torch_cuda test --config=opt --build_tests_only --test_output=errors //... 2>&1 | tee "${log_dir}/tests.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || fail "bazel test --config=gpu failed"
target_line='^//[^ ]+ +(\(cached\) +)?'
passed=$(grep -cE "${target_line}PASSED" "${log_dir}/tests.log")
failed=$(grep -cE "${target_line}(FAILED|TIMEOUT|FLAKY|NO STATUS|INCOMPLETE)" "${log_dir}/tests.log")
[ "${passed}" -gt 0 ] || fail "no gpu-tagged test passed"

echo "--- llama_fsdp on the GPUs, 100 steps"
gpus=$(nvidia-smi --list-gpus 2>/dev/null | wc -l)
plan="${log_dir}/llama_fsdp.textproto"
if [ "${gpus}" -ge 2 ]; then
  cp trainer/plans/llama_fsdp.textproto "${plan}"
else
  # One rank with the two ranks' batch: the same global batch of 16 sequences.
  sed -e 's/dims { name: "dp" size: 2 }/dims { name: "dp" size: 1 }/' \
    -e 's/micro_batch: 8$/micro_batch: 16/' trainer/plans/llama_fsdp.textproto >"${plan}"
  grep -q 'size: 1 }' "${plan}" && grep -q 'micro_batch: 16$' "${plan}" ||
    fail "trainer/plans/llama_fsdp.textproto no longer has the mesh and micro_batch this script rewrites for one GPU"
fi
# The plan's peaks are a CPU core's: no MFU for the tiny model (model_bench gives the GPU's).
tools/torch_cuda run --config=opt //trainer:train -- --plan="${plan}" \
  --set=device=DEVICE_CUDA --set=training.steps=100 --set=training.metrics_file= \
  --set=training.peak_flops_per_rank=0 --set=training.peak_bf16_flops_per_rank=0 2>&1 |
  tee "${log_dir}/train.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || fail "llama_fsdp failed"
train_summary=$(grep -o 'done: .*' "${log_dir}/train.log" | tail -1)
[ -n "${train_summary}" ] || fail "llama_fsdp printed no summary"
grep -q 'peak device memory' <<<"${train_summary}" ||
  fail "llama_fsdp's summary has no peak device memory: it did not train on a GPU"

echo "--- model_bench on CUDA"
tools/torch_cuda run --config=opt //benchmarks:model_bench -- --benchmark_filter=Cuda \
  --benchmark_out="${log_dir}/bench.json" --benchmark_out_format=json ||
  fail "model_bench failed"
# Exits non-zero for a benchmark that reported an error or no run.
bench_summary=$(
  python3 - "${log_dir}/bench.json" <<'PY'
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
