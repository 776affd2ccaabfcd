#!/usr/bin/env bash
# Packs what tools/gpu_check.sh runs into one archive for a GPU machine that has PyTorch's CUDA
# wheel but neither Bazel nor Debian's packages (a container with PyTorch, a cluster's compute
# node): the gpu-tagged tests, //trainer:train and //benchmarks:model_bench, built here with
# --config=gpu --config=opt against the CUDA LibTorch of tools/torch_cuda.
#
#   tools/gpu_bundle.sh                                        # on the build machine
#   tools/gpu_check.sh --bundle=.gpu_bundle/plait-gpu.tar.xz   # on the GPU machine
#
# The archive holds the executables (plait's code linked in, stripped), the tests' data files
# laid out as Bazel's runfiles, and the shared libraries of Debian's they link (Abseil,
# protobuf, PCRE2, utf8proc, Google Benchmark, zlib): every library this machine resolves from
# its system folders except the C library's and the compiler's runtime, which the GPU machine's
# own serve. LibTorch, CUDA's runtime and NCCL come from the GPU machine's PyTorch wheel, which
# must be the version built against (BUNDLE, in the archive, records it; gpu_check.sh checks).
set -euo pipefail
cd "$(dirname "$0")/.."

output="${1:-.gpu_bundle/plait-gpu.tar.xz}"
libtorch="${LIBTORCH_HOME:-/opt/plait/libtorch-cuda}"
build_flags=(--config=opt --dynamic_mode=off --strip=always)

# The LibTorch's version from its version.h (include/torch/headeronly/ from 2.9 on).
version_h="$(grep -rl --include=version.h 'define TORCH_VERSION_MAJOR' "${libtorch}/include/torch" ||
  true)"
version_h="${version_h%%$'\n'*}"  # the first
torch_version="$(awk '/define TORCH_VERSION_(MAJOR|MINOR|PATCH) / { v = v (v == "" ? "" : ".") $3 }
  END { print v }' "${version_h:-/dev/null}")"
if [ -z "${torch_version}" ]; then
  echo "gpu_bundle: no TORCH_VERSION_MAJOR in ${libtorch}/include/torch; run tools/setup.sh" >&2
  exit 1
fi

# The gpu-tagged tests, as `bazel test --config=gpu //...` selects them (.bazelrc).
mapfile -t tests < <(bazel query --noshow_progress 'attr(tags, "\bgpu\b", tests(//...))' | sort)
[ "${#tests[@]}" -gt 0 ] || { echo "gpu_bundle: bazel query found no gpu-tagged test" >&2; exit 1; }
targets=("${tests[@]}" //trainer:train //benchmarks:model_bench)

tools/torch_cuda build "${build_flags[@]}" "${targets[@]}"
bin="$(tools/torch_cuda info "${build_flags[@]}" bazel-bin 2>/dev/null)"

staging="$(mktemp -d)"
trap 'rm -rf "${staging}"' EXIT
bundle="${staging}/plait-gpu"
mkdir -p "${bundle}/bin" "${bundle}/lib" "${bundle}/runfiles"
executables=()
for target in "${targets[@]}"; do
  path="${target#//}"
  path="${path/://}"  # //trainer:train -> trainer/train
  install -D -m 0755 "${bin}/${path}" "${bundle}/bin/${path}"
  executables+=("${bin}/${path}")
  # The data files, as the runfiles manifest maps them ("plait/plan/examples/x.textproto /abs").
  manifest="${bin}/${path}.runfiles_manifest"
  if [ ! -f "${manifest}" ]; then continue; fi
  while read -r runfile source; do
    if [ "${runfile}" != "plait/${path}" ] && [ -n "${source}" ]; then  # not the executable
      install -D -m 0644 "${source}" "${bundle}/runfiles/${runfile}"
    fi
  done <"${manifest}"
done

# The system libraries the executables resolve (`ldd` lists them transitively), but glibc's and
# the compiler runtime's. LibTorch's own (and its CUDA libraries, absent on a build machine)
# resolve elsewhere, or not at all, and stay out.
runtime='^(ld-linux.*|libc|libm|libdl|libpthread|librt|libutil|libresolv|libstdc\+\+|libgcc_s)\.so'
ldd "${executables[@]}" | awk '$2 == "=>" && $3 ~ /^(\/usr)?\/lib\// { print $1, $3 }' | sort -u |
  while read -r soname path; do
    if ! [[ "${soname}" =~ ${runtime} ]]; then cp -L "${path}" "${bundle}/lib/${soname}"; fi
  done

{
  echo "torch_version=${torch_version}"
  echo "commit=$(git rev-parse HEAD)$(git diff --quiet HEAD || echo '+changes')"
  echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "tests=${tests[*]}"
} >"${bundle}/BUNDLE"

mkdir -p "$(dirname "${output}")"
tar -C "${staging}" -cf - plait-gpu | xz -T0 -6 >"${output}.tmp"
mv "${output}.tmp" "${output}"
echo "gpu_bundle: ${output} ($(du -h "${output}" | cut -f1); LibTorch ${torch_version};" \
  "${#tests[@]} tests, train, model_bench; $(ls "${bundle}/lib" | wc -l) libraries)"
