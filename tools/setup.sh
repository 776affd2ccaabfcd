#!/usr/bin/env bash
# Installs every Debian 12 package that building and testing plait needs, NCCL's headers and
# library for the GPU build when the machine's CUDA has none, the LibTorch of PyTorch's CUDA
# wheel that the GPU build links (tools/torch_cuda) on machines with CUDA, and the Python
# environment whose PyTorch wheel carries the LibTorch 2.x that plait is also built against
# (tools/torch2).
# Idempotent: when everything is installed it only checks, and returns in seconds.
set -euo pipefail

# One package per line, with why it is needed.
packages=(
  bazel-bootstrap          # Bazel 4.2.3, the only Bazel in Debian 12
  g++                      # the C++ toolchain Bazel autodetects
  python3-venv             # the venv of tools/torch2's PyTorch wheel (install_venv below)
  libtorch-dev             # LibTorch 1.13 (CPU), headers and libraries
  libopenblas0-pthread     # fast BLAS for LibTorch: without it matmuls run ~25x slower
  libabsl-dev              # Abseil: status, flags, strings, time
  libprotobuf-dev          # protobuf runtime and headers
  protobuf-compiler        # the system protoc used by proto_library
  libgtest-dev             # GoogleTest
  libgmock-dev             # GoogleMock
  libbenchmark-dev         # Google Benchmark
  nlohmann-json3-dev       # JSON for safetensors headers and HF config.json
  libpcre2-dev             # PCRE2 with JIT: tokenizer.json's pre-tokenizer split regexes
  libutf8proc-dev          # Unicode normalization (NFC) of tokenizer.json's normalizers
)

# Debian's /usr/bin/bazel wrapper runs /usr/bin/bazel-<version in .bazelversion>, but
# bazel-bootstrap installs its 4.2.3 binary as /usr/bin/bazel-4: link the pinned name to it.
link_pinned_bazel() {
  local pinned
  pinned="$(cat "$(dirname "$0")/../.bazelversion")"
  [ -x "/usr/bin/bazel-${pinned}" ] && return 0
  if ! dpkg-query -W -f='${Version}' bazel-bootstrap 2>/dev/null | grep -q "^${pinned}+"; then
    echo "setup: bazel-bootstrap is not version ${pinned} (.bazelversion)" >&2
    return 1
  fi
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: run as root to link /usr/bin/bazel-${pinned} to Debian's /usr/bin/bazel-4" >&2
    return 1
  fi
  ln -s bazel-4 "/usr/bin/bazel-${pinned}"
}

# Unpacks the include/ and lib/ folders under FOLDER of the wheel pip finds for REQUIREMENT
# (no dependencies) into TARGET/include and TARGET/lib, replacing TARGET.
unpack_wheel() {
  local requirement="$1" folder="$2" target="$3"
  local download
  download="$(mktemp -d)"
  python3 -m pip download --quiet --no-deps --only-binary=:all: -d "${download}" "${requirement}"
  python3 - "${download}" "${folder}" "${target}" <<'EOF'
import glob, os, shutil, sys, zipfile
download, folder, target = sys.argv[1], sys.argv[2], sys.argv[3]
staging = target + ".tmp"
shutil.rmtree(staging, ignore_errors=True)
with zipfile.ZipFile(glob.glob(os.path.join(download, "*.whl"))[0]) as wheel:
    for name in wheel.namelist():
        if name.startswith(folder + "/include/") or name.startswith(folder + "/lib/"):
            wheel.extract(name, staging)
shutil.rmtree(target, ignore_errors=True)
os.rename(os.path.join(staging, folder), target)
shutil.rmtree(staging)
EOF
  rm -rf "${download}"
}

# NCCL for `bazel build --config=gpu` (third_party/nccl.BUILD): compiling and linking the NCCL
# code needs nccl.h and libnccl.so. Some machines carry the CUDA toolkit without NCCL; there
# NVIDIA's PyPI wheel (headers and library, no toolkit) is unpacked into /opt/nccl.
nccl_wheel="nvidia-nccl-cu13==2.32.3"  # CUDA 13, as /usr/local/cuda on the build machines
nccl_dir=/opt/nccl
install_nccl() {
  local cuda="${CUDA_HOME:-/usr/local/cuda}"
  [ -n "${NCCL_HOME:-}" ] && return 0
  [ -f "${cuda}/include/cuda_runtime.h" ] || return 0  # no CUDA: no GPU build to serve
  [ -f "${cuda}/include/nccl.h" ] && return 0
  [ -f "${nccl_dir}/include/nccl.h" ] && [ -e "${nccl_dir}/lib/libnccl.so" ] && return 0
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: run as root to install NCCL into ${nccl_dir} (or set NCCL_HOME)" >&2
    return 1
  fi
  echo "setup: installing NCCL (${nccl_wheel}) into ${nccl_dir}"
  unpack_wheel "${nccl_wheel}" nvidia/nccl "${nccl_dir}"
  ln -s libnccl.so.2 "${nccl_dir}/lib/libnccl.so"
}

# A CUDA LibTorch for `tools/torch_cuda` (--config=gpu), linked as /opt/plait/libtorch-cuda.
# Only where CUDA is installed: without it there is no GPU build. A machine that only compiles
# and links (CI) needs the torch/ folder of PyPI's CUDA wheel of PyTorch alone, unpacked; its
# CUDA libraries come from other wheels (third_party/repositories.bzl). A machine with an
# NVIDIA driver runs what it builds, so there the wheel is installed with those libraries
# (cuBLAS, cuDNN, NCCL, ... in NVIDIA's wheels, which LibTorch's RPATH finds beside its own
# folder) into a venv of its own. 2.11.0, a CUDA 13 build as /usr/local/cuda on the build
# machines: the LibTorch of the GPU machines plait's GPU tests run on, so what this build
# links runs there; and LibTorch 2.14 and newer require C++20, where plait is C++17.
torch_cuda_wheel="torch==2.11.0"
torch_cuda_dir=/opt/plait/libtorch-cuda-2.11.0
torch_cuda_venv=/opt/plait/venv-cuda-2.11.0
torch_cuda_link=/opt/plait/libtorch-cuda
# The torch/ folder of the CUDA venv's wheel, beside NVIDIA's wheels in its site-packages.
cuda_venv_torch() {
  "${torch_cuda_venv}/bin/python" -c 'import sysconfig
print(sysconfig.get_paths()["purelib"] + "/torch")'
}
install_libtorch_cuda() {
  [ -f "${CUDA_HOME:-/usr/local/cuda}/include/cuda_runtime.h" ] || return 0
  local runs_gpus=false target="${torch_cuda_dir}"
  if nvidia-smi -L >/dev/null 2>&1; then
    runs_gpus=true
    target="$(cuda_venv_torch 2>/dev/null)"
  fi
  [ -n "${target}" ] && [ "$(readlink "${torch_cuda_link}")" = "${target}" ] &&
    [ -e "${torch_cuda_link}/lib/libtorch_cuda.so" ] && return 0
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: run as root to install ${torch_cuda_wheel}'s LibTorch (CUDA) under /opt/plait" >&2
    return 1
  fi
  if "${runs_gpus}"; then
    echo "setup: installing ${torch_cuda_wheel} (CUDA) with its CUDA libraries into ${torch_cuda_venv}"
    [ -x "${torch_cuda_venv}/bin/python" ] || python3 -m venv "${torch_cuda_venv}"
    "${torch_cuda_venv}/bin/python" -m pip install --quiet --disable-pip-version-check \
      "${torch_cuda_wheel}"
    target="$(cuda_venv_torch)"
  else
    echo "setup: unpacking the LibTorch of ${torch_cuda_wheel} (CUDA) into ${torch_cuda_dir}"
    unpack_wheel "${torch_cuda_wheel}" torch "${torch_cuda_dir}"
  fi
  ln -sfn "${target}" "${torch_cuda_link}"
}

# The Python environment of plait's tools, and PyTorch's wheel in it: its torch/ folder
# (headers in include/, libraries in lib/) is the LibTorch 2.x of tools/torch2, linked as
# /opt/plait/libtorch2. install_venv takes a requirements file, so that each tool adds its own
# packages to this one environment; a file already installed as it is now is skipped quietly.
venv_dir=/opt/plait/venv
libtorch2_link=/opt/plait/libtorch2
install_venv() {
  local requirements="$1"
  local installed="${venv_dir}/installed-$(basename "${requirements}")"
  cmp -s "${requirements}" "${installed}" && return 0
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: run as root to install ${requirements} into ${venv_dir}" >&2
    return 1
  fi
  echo "setup: installing ${requirements} into ${venv_dir}"
  [ -x "${venv_dir}/bin/python" ] || python3 -m venv "${venv_dir}"
  "${venv_dir}/bin/python" -m pip install --quiet --disable-pip-version-check -r "${requirements}"
  cp "${requirements}" "${installed}"
}
install_python_tools() {
  install_venv "$(dirname "$0")/requirements-torch2.txt"
  # transformers, torch.optim and pytest for //tests/reference:reference_test and
  # benchmarks/compare_pytorch.py.
  install_venv "$(dirname "$0")/../tests/reference/requirements.txt"
  [ -e "${libtorch2_link}/lib/libtorch.so" ] && return 0
  # PyTorch's documented way to find its LibTorch: torch.utils.cmake_prefix_path is
  # <site-packages>/torch/share/cmake.
  ln -sfn "$("${venv_dir}/bin/python" -c 'import os, torch.utils
print(os.path.dirname(os.path.dirname(torch.utils.cmake_prefix_path)))' 2>/dev/null)" \
    "${libtorch2_link}"
}

missing=()
for pkg in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done

if [ "${#missing[@]}" -eq 0 ]; then
  link_pinned_bazel
  install_nccl
  install_libtorch_cuda
  install_python_tools
  echo "setup: all ${#packages[@]} packages are installed"
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "setup: missing packages: ${missing[*]}" >&2
  echo "setup: run as root (sudo tools/setup.sh) or install them with apt-get" >&2
  exit 1
fi

echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
link_pinned_bazel
install_nccl
install_libtorch_cuda
install_python_tools
echo "setup: done"
