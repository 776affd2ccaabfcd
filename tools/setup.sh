#!/usr/bin/env bash
# Installs every Debian 12 package that building and testing plait needs.
# Idempotent: when everything is installed it only checks, and returns in seconds.
set -euo pipefail

# One package per line, with why it is needed.
packages=(
  bazel-bootstrap          # Bazel 4.2.3, the only Bazel in Debian 12
  g++                      # the C++ toolchain Bazel autodetects
  libtorch-dev             # LibTorch 1.13 (CPU), headers and libraries
  libopenblas0-pthread     # fast BLAS for LibTorch: without it matmuls run ~25x slower
  libabsl-dev              # Abseil: status, flags, strings, time
  libprotobuf-dev          # protobuf runtime and headers
  protobuf-compiler        # the system protoc used by proto_library
  libgtest-dev             # GoogleTest
  libgmock-dev             # GoogleMock
  libbenchmark-dev         # Google Benchmark
  libgloo-dev              # Gloo collectives used by parallel/ on CPU
  nlohmann-json3-dev       # JSON for safetensors headers and HF config.json
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

missing=()
for pkg in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done

if [ "${#missing[@]}" -eq 0 ]; then
  link_pinned_bazel
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
echo "setup: done"
