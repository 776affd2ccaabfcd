#include "base/own_output.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/file.h"
#include "base/status.h"

namespace plait::base {
namespace {

// The most symbolic links one lookup of a path follows, as Linux's own (MAXSYMLINKS).
constexpr int kMaxLinks = 40;

std::string Parent(const std::string& path) {
  const std::string parent = std::filesystem::path(path).parent_path().string();
  return parent.empty() ? "." : parent;
}

// Whether the resolved `path` lies inside the resolved folder `folder`.
bool Inside(const std::string& path, const std::string& folder) {
  return path.size() > folder.size() && absl::StartsWith(path, folder) &&
         (folder == "/" || path[folder.size()] == '/');
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

std::string ResolvedPath(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code error;
  const fs::path absolute = fs::absolute(path, error);
  if (error) return fs::path(path).lexically_normal().string();
  // The components still to walk, the next one last.
  std::vector<std::string> pending;
  const auto push = [&pending](const fs::path& relative) {
    std::vector<std::string> parts;
    for (const fs::path& part : relative.relative_path()) parts.push_back(part.string());
    pending.insert(pending.end(), parts.rbegin(), parts.rend());
  };
  push(absolute);
  fs::path resolved = "/";
  int links = 0;
  while (!pending.empty()) {
    const std::string part = std::move(pending.back());
    pending.pop_back();
    if (part.empty() || part == ".") continue;
    if (part == "..") {
      resolved = resolved.parent_path();
      continue;
    }
    fs::path next = resolved / part;
    if (links < kMaxLinks && fs::is_symlink(fs::symlink_status(next, error))) {
      const fs::path target = fs::read_symlink(next, error);
      if (!error) {
        ++links;
        if (target.is_absolute()) resolved = "/";
        push(target);
        continue;
      }
    }
    resolved = std::move(next);
  }
  return resolved.string();
}

std::vector<Violation> CheckOutputsApart(const std::vector<NamedPath>& outputs,
                                         const std::vector<NamedPath>& inputs) {
  std::vector<std::string> places;
  for (const NamedPath& output : outputs) places.push_back(ResolvedPath(output.path));
  std::vector<std::string> input_places;
  for (const NamedPath& input : inputs) input_places.push_back(ResolvedPath(input.path));
  std::vector<Violation> violations;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const NamedPath& output = outputs[i];
    if (output.path.empty()) continue;
    const std::string& place = places[i];
    // "\"<output>\" <relation> <other's field> (\"<other's path>\")<what>: <why>".
    const auto add = [&](const NamedPath& other, absl::string_view relation, absl::string_view what,
                         absl::string_view why) {
      violations.push_back(
          {output.field,
           absl::StrCat("\"", output.path, "\"",
                        output.path == place ? "" : absl::StrCat(" (resolved: \"", place, "\")"),
                        " ", relation, " ", other.field, " (\"", other.path, "\")", what, ": ",
                        why),
           ""});
    };
    for (size_t j = 0; j < inputs.size(); ++j) {
      if (inputs[j].path.empty() || input_places[j] != place) continue;
      add(inputs[j], "is also", ", an input",
          "writing there would overwrite it; choose another path");
    }
    for (size_t j = 0; j < outputs.size(); ++j) {
      if (j == i || outputs[j].path.empty()) continue;
      if (j < i && places[j] == place) {
        add(outputs[j], "is also", ", an output too",
            "one would overwrite the other; give each its own path");
      } else if (outputs[j].whole_folder && Inside(place, places[j])) {
        add(outputs[j], "lies inside", ", a folder that holds only its own writer's files",
            "choose a path outside it");
      }
    }
  }
  return violations;
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
