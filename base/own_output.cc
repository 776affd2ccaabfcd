#include "base/own_output.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "base/file.h"
#include "base/status.h"

namespace plait::base {
namespace {

std::string Parent(const std::string& path) {
  const std::string parent = std::filesystem::path(path).parent_path().string();
  return parent.empty() ? "." : parent;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> CheckOutputFolder(const std::string& dir,
                                                           const IsOwnOutput& is_own,
                                                           absl::string_view writer) {
  std::vector<std::string> earlier;
  struct stat info;
  if (stat(dir.c_str(), &info) == 0) {
    if (!S_ISDIR(info.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat("\"", dir, "\" exists and is ", FileKind(info.st_mode), ", not a folder"));
    }
    std::error_code error;
    for (std::filesystem::directory_iterator it(dir, error), end; !error && it != end;
         it.increment(error)) {
      const std::string path = it->path().string();
      if (!it->is_regular_file() || !is_own(path)) {
        return absl::FailedPreconditionError(
            absl::StrCat("\"", dir, "\" holds \"", it->path().filename().string(), "\", which ",
                         writer, " did not write: choose a new or empty folder"));
      }
      earlier.push_back(path);
    }
    if (error) {
      return absl::FailedPreconditionError(
          absl::StrCat("\"", dir, "\" cannot be listed: ", error.message()));
    }
    std::sort(earlier.begin(), earlier.end());
  }
  PLAIT_RETURN_IF_ERROR(CheckFolderIsWritable(dir));
  return earlier;
}

absl::StatusOr<bool> CheckOutputFile(const std::string& path, const IsOwnOutput& is_own,
                                     absl::string_view writer) {
  struct stat info;
  if (stat(path.c_str(), &info) != 0) {
    PLAIT_RETURN_IF_ERROR(CheckFolderIsWritable(Parent(path)));
    return false;
  }
  if (!S_ISREG(info.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("\"", path, "\" exists and is ", FileKind(info.st_mode), ", not a file"));
  }
  if (!is_own(path)) {
    return absl::FailedPreconditionError(absl::StrCat("\"", path, "\" exists and ", writer,
                                                      " did not write it: choose another path"));
  }
  PLAIT_RETURN_IF_ERROR(CheckFolderIsWritable(Parent(path)));
  return true;
}

}  // namespace plait::base
