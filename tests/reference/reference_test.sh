#!/usr/bin/env bash
# //tests/reference:reference_test: runs the Python reference tests (test_*.py beside this
# script) with pytest in the venv tests/reference/make_venv.sh builds, offline, against
# plait_reference from the runfiles. Fails, saying how to make it, when the venv is
# missing or was built from another requirements.txt.
set -euo pipefail

here="tests/reference"  # the test starts in the runfiles root of the workspace
home="$(getent passwd "$(id -u)" | cut -d: -f6)"  # Bazel runs tests without HOME
venv="${PLAIT_PYTHON_VENV:-${home}/.cache/plait/python-venv}"
wanted="$(sha256sum "${here}/requirements.txt" | cut -d' ' -f1)"
if [ ! -x "${venv}/bin/python" ] || \
   [ "$(cat "${venv}/plait-requirements.sha256" 2>/dev/null)" != "${wanted}" ]; then
  echo "reference_test: no Python venv built from tests/reference/requirements.txt at" \
       "${venv}; run tools/setup.sh (or tests/reference/make_venv.sh ${venv})." >&2
  exit 1
fi

# Nothing from the network; caches and temporary files inside the test's own folder.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
export HF_HOME="${TEST_TMPDIR}/huggingface"
export PYTHONDONTWRITEBYTECODE=1
export PLAIT_REFERENCE="${PWD}/${here}/plait_reference"
exec "${venv}/bin/python" -m pytest -q -p no:cacheprovider \
  --basetemp="${TEST_TMPDIR}/pytest" ${XML_OUTPUT_FILE:+--junitxml="${XML_OUTPUT_FILE}"} \
  "${here}"
