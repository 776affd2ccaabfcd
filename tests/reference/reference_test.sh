#!/usr/bin/env bash
# //tests/reference:reference_test: runs the Python reference tests (test_*.py beside this
# script; the arguments, when given, are pytest's: which of them) with pytest in the venv
# tools/setup.sh builds, offline, against plait_reference and the trainer from the runfiles. Fails, saying how to make it, when the venv is
# missing or was built from another requirements.txt.
set -euo pipefail

here="tests/reference"  # the test starts in the runfiles root of the workspace
venv="${PLAIT_PYTHON_VENV:-/opt/plait/venv}"
if [ ! -x "${venv}/bin/python" ] || \
   ! cmp -s "${here}/requirements.txt" "${venv}/installed-requirements.txt"; then
  echo "reference_test: no Python venv with tests/reference/requirements.txt installed at" \
       "${venv}; run tools/setup.sh." >&2
  exit 1
fi

# Nothing from the network; caches and temporary files inside the test's own folder.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
export HF_HOME="${TEST_TMPDIR}/huggingface"
export PYTHONDONTWRITEBYTECODE=1
export PLAIT_REFERENCE="${PWD}/${here}/plait_reference"
export PLAIT_TRAIN="${PWD}/trainer/llama_single" PLAIT_PLOT="${PWD}/tools/plot"
export PLAIT_TOKENIZE="${PWD}/tools/tokenize"
export PLAIT_TRAIN_PLAN="${PWD}/trainer/train" PLAIT_EXAMPLES="${PWD}/plan/examples"
[ "$#" -gt 0 ] || set -- "${here}"
exec "${venv}/bin/python" -m pytest -q -p no:cacheprovider \
  --basetemp="${TEST_TMPDIR}/pytest" ${XML_OUTPUT_FILE:+--junitxml="${XML_OUTPUT_FILE}"} \
  "$@"
