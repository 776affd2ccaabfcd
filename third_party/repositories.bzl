"""Repositories for plait's system-installed dependencies: nothing here downloads.

Each dependency is a directory tree on this machine (Debian's packages under /usr, CUDA under
/usr/local/cuda, or a LibTorch unpacked anywhere) exposed as a repository whose BUILD file,
kept beside this file as `<name>.BUILD`, declares real cc_library targets.
"""

# Library directories probed under a root, most specific first: Debian's multiarch layout,
# then the lib64/lib layouts of CUDA and of LibTorch's release archives.
_LIBRARY_DIRS = ["lib/x86_64-linux-gnu", "lib64", "lib"]

def _system_repository_impl(rctx):
    root = rctx.attr.root
    if rctx.attr.root_env and rctx.attr.root_env in rctx.os.environ:
        root = rctx.os.environ[rctx.attr.root_env]
    elif rctx.attr.library_probe:
        # The first of the roots next to an environment variable's, root and the fallbacks
        # that holds the probed library.
        beside = [
            "%s/%s" % (rctx.os.environ[variable], relative)
            for variable, relative in rctx.attr.beside_env_roots.items()
            if variable in rctx.os.environ
        ]
        for candidate_root in beside + [root] + rctx.attr.fallback_roots:
            if any([
                rctx.path("%s/%s/%s" % (candidate_root, d, rctx.attr.library_probe)).exists
                for d in _LIBRARY_DIRS
            ]):
                root = candidate_root
                break
    if not rctx.path(root).exists:
        hint = " (set %s to its root)" % rctx.attr.root_env if rctx.attr.root_env else ""
        fail("%s: %s does not exist%s; run tools/setup.sh to install the Debian packages" %
             (rctx.name, root, hint))

    for entry in rctx.attr.entries:
        if rctx.path(root + "/" + entry).exists:
            rctx.symlink(root + "/" + entry, entry)

    library_dir = ""
    extra_linkopts = []
    if rctx.attr.library_probe:
        for candidate in _LIBRARY_DIRS:
            if rctx.path("%s/%s/%s" % (root, candidate, rctx.attr.library_probe)).exists:
                library_dir = "%s/%s" % (root, candidate)
                break
        if not library_dir:
            fail("%s: %s not found under %s/{%s}" %
                 (rctx.name, rctx.attr.library_probe, root, ",".join(_LIBRARY_DIRS)))
        for library, flag in rctx.attr.optional_libraries.items():
            if rctx.path("%s/%s" % (library_dir, library)).exists:
                extra_linkopts.append(flag)

    rctx.template("BUILD.bazel", rctx.attr.build_file, substitutions = {
        "%{library_dir}": library_dir,
        "%{extra_linkopts}": repr(extra_linkopts),
        "%{optional_libraries_found}": repr(
            bool(rctx.attr.optional_libraries) and
            len(extra_linkopts) == len(rctx.attr.optional_libraries),
        ),
    })

system_repository = repository_rule(
    implementation = _system_repository_impl,
    doc = "A directory tree installed on this machine, with a BUILD file from third_party/.",
    attrs = {
        "root": attr.string(default = "/usr", doc = "Root of the installed tree."),
        "root_env": attr.string(doc = "Environment variable that overrides `root`, if any."),
        "fallback_roots": attr.string_list(
            doc = "Roots tried after `root` (when root_env is unset) for the library_probe.",
        ),
        "beside_env_roots": attr.string_dict(
            doc = "Environment variable -> path relative to its value, tried before `root` " +
                  "(when root_env is unset) for the library_probe.",
        ),
        "entries": attr.string_list(
            default = ["include"],
            doc = "Entries of the root linked into the repository (those that exist).",
        ),
        "library_probe": attr.string(
            doc = "A shared library whose directory becomes %{library_dir} in the BUILD file.",
        ),
        "optional_libraries": attr.string_dict(
            doc = "Library file -> link flag, added to %{extra_linkopts} when the file exists.",
        ),
        "build_file": attr.label(mandatory = True, allow_single_file = True),
    },
    environ = ["LIBTORCH_HOME", "CUDA_HOME", "NCCL_HOME"],
    local = True,
)

def _directory_repository_impl(rctx):
    directory = rctx.path(rctx.attr.build_file).dirname
    for child in directory.readdir():
        rctx.symlink(child, child.basename)
    rctx.file("WORKSPACE", "workspace(name = \"%s\")\n" % rctx.name)

# A directory of plait's own (found through its BUILD file, so this also works when plait is
# an external repository of another workspace) served as a repository of its own.
_directory_repository = repository_rule(
    implementation = _directory_repository_impl,
    attrs = {"build_file": attr.label(mandatory = True, allow_single_file = True)},
)

def _maybe(repository_rule, name, **kwargs):
    if name not in native.existing_rules():
        repository_rule(name = name, **kwargs)

def plait_dependencies():
    """Declares every external repository plait's build needs, except those already declared.

    Call it from the WORKSPACE of plait or of a repository that depends on plait.
    """

    # Offline stand-ins for repositories Bazel 4.2.3 would otherwise download.
    for shim in ["rules_cc", "rules_java", "remote_coverage_tools"]:
        _maybe(
            _directory_repository,
            name = shim,
            build_file = Label("//third_party/%s:BUILD.bazel" % shim),
        )

    # LibTorch: Debian's libtorch-dev by default; LIBTORCH_HOME may name another: an unpacked
    # LibTorch archive or the torch/ folder of PyTorch's wheel (1.13 or 2.x, CPU or CUDA), all
    # with include/ and lib/ under one root. Only LibTorch's own headers are exposed: the
    # wheel's include/ also carries the libraries it bundles (protobuf 3.13, fmt, oneDNN, ...),
    # which must not stand in for Debian's.
    _maybe(
        system_repository,
        name = "libtorch",
        root_env = "LIBTORCH_HOME",
        entries = ["include/ATen", "include/c10", "include/caffe2", "include/torch"],
        library_probe = "libtorch.so",
        optional_libraries = {
            # A CUDA build's kernels register themselves at load time, so the library must be
            # linked even though no symbol of it is referenced directly. It needs CUDA's math
            # libraries (cuBLAS, cuDNN, cuSPARSELt, ... from their own wheels or the toolkit),
            # which a machine that only builds need not have: its undefined symbols are left
            # to the dynamic loader of the machine that runs the binary.
            "libtorch_cuda.so": "-Wl,--no-as-needed,-ltorch_cuda,--as-needed,--allow-shlib-undefined",
            "libc10_cuda.so": "-Wl,--no-as-needed,-lc10_cuda,--as-needed",
        },
        build_file = Label("//third_party:libtorch.BUILD"),
    )
    _maybe(
        system_repository,
        name = "com_google_absl",
        build_file = Label("//third_party:absl.BUILD"),
    )
    _maybe(
        system_repository,
        name = "com_google_protobuf",
        entries = ["include", "bin"],
        build_file = Label("//third_party:protobuf.BUILD"),
    )
    _maybe(
        system_repository,
        name = "com_google_googletest",
        build_file = Label("//third_party:googletest.BUILD"),
    )
    _maybe(
        system_repository,
        name = "com_github_google_benchmark",
        build_file = Label("//third_party:benchmark.BUILD"),
    )
    _maybe(
        system_repository,
        name = "com_github_nlohmann_json",
        build_file = Label("//third_party:nlohmann_json.BUILD"),
    )

    # Tokenizers (data/tokenizer): PCRE2 for the split regexes, utf8proc for Unicode
    # normalization.
    for name in ["pcre2", "utf8proc"]:
        _maybe(
            system_repository,
            name = name,
            build_file = Label("//third_party:%s.BUILD" % name),
        )

    # The CUDA runtime, used only under --config=gpu (the repository is fetched only
    # when a GPU target is built).
    _maybe(
        system_repository,
        name = "local_cuda",
        root = "/usr/local/cuda",
        root_env = "CUDA_HOME",
        library_probe = "libcudart.so",
        build_file = Label("//third_party:cuda.BUILD"),
    )

    # NCCL: beside a CUDA wheel's LibTorch, the nvidia-nccl wheel's (site-packages/nvidia/nccl,
    # the copy that LibTorch loads itself: one NCCL per process); else the CUDA tree's where it
    # was installed there; else where tools/setup.sh puts the one from PyPI (/opt/nccl).
    _maybe(
        system_repository,
        name = "local_nccl",
        root = "/usr/local/cuda",
        root_env = "NCCL_HOME",
        beside_env_roots = {"LIBTORCH_HOME": "../nvidia/nccl"},
        fallback_roots = ["/opt/nccl"],
        library_probe = "libnccl.so.2",
        build_file = Label("//third_party:nccl.BUILD"),
    )
