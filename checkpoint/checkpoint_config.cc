#include "checkpoint/checkpoint_config.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/file.h"

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
  if (absl::Status writable = base::CheckFolderIsWritable(config.dir()); !writable.ok()) {
    add("dir", std::string(writable.message()));
  }
  return violations;
}

}  // namespace plait::checkpoint
