// Whole files in and out: ReadFile reads one into a string, WriteFileAtomically replaces one
// so that a reader (or a crash) sees the old contents or the new, never a mix, and SyncToDisk
// flushes a file or folder before a rename publishes it. Errors name the path:
//
//   PLAIT_ASSIGN_OR_RETURN(std::string text, ReadFile("plan.textproto"));
//   PLAIT_RETURN_IF_ERROR(WriteFileAtomically("metrics.jsonl", kept_rows));
#ifndef PLAIT_BASE_FILE_H_
#define PLAIT_BASE_FILE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace plait::base {

// The bytes of `path`; NotFound when it cannot be opened, FailedPrecondition when it is not a
// regular file (OpenForReading), DataLoss when reading fails.
absl::StatusOr<std::string> ReadFile(const std::string& path);

// Opens `path` for reading and returns the descriptor (the caller closes it), refusing what
// is not a regular file before reading anything from it: a directory, FIFO, device or socket
// given where a file belongs fails at once, naming what it is, rather than blocking on a
// FIFO or reading a device forever. NotFound when it cannot be opened.
absl::StatusOr<int> OpenForReading(const std::string& path);

// A path the user gave on a command line: under `bazel run` the working directory is the
// runfiles tree, so a relative path is taken from BUILD_WORKING_DIRECTORY, where they ran it.
std::string UserPath(const std::string& path);

// What a file of mode `mode` (stat's st_mode) is, for errors: "a directory", "a FIFO", ...
std::string FileKind(unsigned int mode);

// Writes `contents` to `path` + ".tmp", flushes it to the disk and renames it over `path`.
absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents);

// Flushes `path` (a file, or a folder after entries were renamed into it) to the disk, so a
// rename that publishes it cannot survive a machine crash while its contents do not.
absl::Status SyncToDisk(const std::string& path);

// OK when the folder `dir` can be written into: it, or the nearest of its ancestors that
// exists, is a folder this process may write. FailedPrecondition otherwise, naming `dir` and
// what stands in the way ("\"out/model\" cannot be created: \"out\" is not a folder"), a
// symbolic link on the way to nothing included, which no folder can be created through.
absl::Status CheckFolderIsWritable(const std::string& dir);

}  // namespace plait::base

#endif  // PLAIT_BASE_FILE_H_
