#!/usr/bin/env bash
# The GPU check of a machine with NVIDIA GPUs and Bazel: builds everything with --config=gpu
# against a CUDA LibTorch (tools/torch_cuda: LIBTORCH_HOME, else tools/setup.sh's), runs the
# gpu-tagged tests, trains //trainer:llama_fsdp on the GPUs for 100 steps (2 ranks on 2 or
# more GPUs, 1 rank on one), runs model_bench's CUDA step (bf16, a Llama-3.1-8B-shaped block
# stack), and prints one summary line:
#
#   tools/gpu_check.sh
#   gpu_check: 7 passed, 0 failed | llama_fsdp 100 steps: 123456 tokens/s, peak memory ... |
#   model_bench (NVIDIA H200): 45678 tokens/s, MFU 41.2% of the bf16 peak, peak memory ...
#
# Exits non-zero when a step fails or a test fails. Meant to finish within 10 minutes on one
# GPU once the build is cached.
set -uo pipefail
cd "$(dirname "$0")/.."

log_dir="$(mktemp -d)"
trap 'rm -rf "${log_dir}"' EXIT
start=$(date +%s)
status=0

echo "--- build (--config=gpu)"
tools/torch_cuda build --config=opt //... || exit 1

echo "--- gpu-tagged tests"
tools/torch_cuda test --config=opt //... 2>&1 | tee "${log_dir}/tests.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
target_line='^//[^ ]+ +(\(cached\) +)?'
passed=$(grep -cE "${target_line}PASSED" "${log_dir}/tests.log")
failed=$(grep -cE "${target_line}(FAILED|TIMEOUT|FLAKY|NO STATUS|INCOMPLETE)" "${log_dir}/tests.log")

echo "--- llama_fsdp on the GPUs, 100 steps"
gpus=$(nvidia-smi --list-gpus 2>/dev/null | wc -l)
plan="${log_dir}/llama_fsdp.textproto"
if [ "${gpus}" -ge 2 ]; then
  cp trainer/plans/llama_fsdp.textproto "${plan}"
else
  # One rank with the two ranks' batch: the same global batch of 16 sequences.
  sed -e 's/dims { name: "dp" size: 2 }/dims { name: "dp" size: 1 }/' \
    -e 's/micro_batch: 8/micro_batch: 16/' trainer/plans/llama_fsdp.textproto >"${plan}"
fi
tools/torch_cuda run --config=opt //trainer:train -- --plan="${plan}" \
  --set=device=DEVICE_CUDA --set=training.steps=100 --set=training.metrics_file= \
  --set=training.peak_flops_per_rank=0 2>&1 | tee "${log_dir}/train.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
train_summary=$(grep -o 'done: .*' "${log_dir}/train.log" | tail -1)

echo "--- model_bench on CUDA"
tools/torch_cuda run --config=opt //benchmarks:model_bench -- --benchmark_filter=Cuda \
  --benchmark_out="${log_dir}/bench.json" --benchmark_out_format=json || status=1
bench_summary=$(python3 - "${log_dir}/bench.json" <<'PY' 2>/dev/null
import json, sys
for run in json.load(open(sys.argv[1]))["benchmarks"]:
    if "error_message" in run:
        print("model_bench:", run["error_message"]); continue
    mfu = "MFU %.1f%% of the bf16 peak" % (100 * run["MFU"]) if "MFU" in run else "no bf16 peak known"
    print("model_bench (%s): %.0f tokens/s, %.0f TFLOP/s, %s, peak memory %.1f GiB"
          % (run.get("label", "?"), run["tokens/s"], run["TFLOP/s"], mfu, run["peak_memory_GiB"]))
PY
)

echo "gpu_check: ${passed} passed, ${failed} failed | llama_fsdp on ${gpus} GPU(s): " \
  "${train_summary:-no summary} | ${bench_summary:-model_bench: no result}" \
  "| $(($(date +%s) - start)) s"
[ "${failed}" -eq 0 ] && [ "${passed}" -gt 0 ] && exit "${status}"
exit 1
