#!/usr/bin/env bash
# Builds the Python venv that the reference tests (//tests/reference:reference_test) and
# benchmarks/compare_pytorch.py run in, from tests/reference/requirements.txt:
#
#   tests/reference/make_venv.sh [VENV_DIR]
#
# VENV_DIR defaults to $PLAIT_PYTHON_VENV, else ~/.cache/plait/python-venv. Idempotent: when
# the venv was last built from the same requirements.txt (its hash is kept in the venv), it
# returns at once. It installs into an existing venv and never deletes one.
set -euo pipefail

requirements="$(cd "$(dirname "$0")" && pwd)/requirements.txt"
venv="${1:-${PLAIT_PYTHON_VENV:-${HOME}/.cache/plait/python-venv}}"
stamp="${venv}/plait-requirements.sha256"
wanted="$(sha256sum "${requirements}" | cut -d' ' -f1)"

if [ -x "${venv}/bin/python" ] && [ "$(cat "${stamp}" 2>/dev/null)" = "${wanted}" ]; then
  exit 0
fi
echo "make_venv: installing ${requirements} into ${venv}"
[ -x "${venv}/bin/python" ] || python3 -m venv "${venv}"
# One install command for everything, torch pinned in it (requirements.txt): a torch pulled
# in unpinned by another package would be a CUDA build of several GB.
"${venv}/bin/python" -m pip install --quiet --disable-pip-version-check -r "${requirements}"
# Written last, so an interrupted install is redone next time.
echo "${wanted}" > "${stamp}"
