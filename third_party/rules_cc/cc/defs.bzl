"""Re-exports Bazel 4.2.3's native C++ rules under the @rules_cc//cc:defs.bzl names.

Bazel's own C++ toolchain loads this file. The real rules_cc is a download, and Debian's
bazel-rules-cc (0.0.4) is too new for Bazel 4.2.3 (it needs use_cpp_toolchain), so this
shim keeps the build offline.
"""

cc_binary = native.cc_binary
cc_import = native.cc_import
cc_library = native.cc_library
cc_proto_library = native.cc_proto_library
cc_test = native.cc_test
cc_toolchain = native.cc_toolchain
cc_toolchain_suite = native.cc_toolchain_suite
objc_library = native.objc_library
