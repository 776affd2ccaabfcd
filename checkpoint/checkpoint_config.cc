#include "checkpoint/checkpoint_config.h"

#include <sys/stat.h>
#include <unistd.h>

#include <utility>

#include "absl/strings/str_cat.h"

namespace plait::checkpoint {

std::vector<base::Violation> CheckConfig(const CheckpointConfig& config, const std::string& field) {
  std::vector<base::Violation> violations;
  auto add = [&](const std::string& name, std::string message) {
    violations.push_back({absl::StrCat(field, ".", name), std::move(message)});
  };
  if (config.every() < 0) add("every", absl::StrCat(config.every(), "; must be >= 0"));
  if (config.keep_last() < 0) add("keep_last", absl::StrCat(config.keep_last(), "; must be >= 0"));
  if (config.dir().empty()) {
    if (config.every() != 0 || config.keep_last() != 0 || config.resume()) {
      add("dir", "is empty, but other checkpoint fields are set; name a folder");
    }
    return violations;
  }
  // The folder, or the nearest ancestor that exists, must be a writable folder.
  std::string existing = config.dir();
  struct stat info;
  while (stat(existing.c_str(), &info) != 0) {
    if (existing == "/" || existing == ".") {
      add("dir", absl::StrCat("\"", config.dir(), "\" cannot be created"));
      return violations;
    }
    const size_t slash = existing.find_last_of('/', existing.size() - 1);
    existing = slash == std::string::npos ? "." : slash == 0 ? "/" : existing.substr(0, slash);
  }
  if (!S_ISDIR(info.st_mode)) {
    add("dir", absl::StrCat("\"", config.dir(), "\" cannot be created: \"", existing,
                            "\" is not a folder"));
  } else if (access(existing.c_str(), W_OK | X_OK) != 0) {
    add("dir", absl::StrCat("\"", config.dir(), "\" cannot be written: \"", existing,
                            "\" is not writable"));
  }
  return violations;
}

}  // namespace plait::checkpoint
