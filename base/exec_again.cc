#include "base/exec_again.h"

#include <unistd.h>

#include <cstdlib>
#include <optional>

namespace plait::base {

void ExecAgainWith(char** argv, const std::map<std::string, std::string>& settings) {
  std::map<std::string, std::optional<std::string>> previous;
  for (const auto& [name, value] : settings) {
    const char* current = std::getenv(name.c_str());
    previous[name] = current == nullptr ? std::nullopt : std::optional<std::string>(current);
    setenv(name.c_str(), value.c_str(), /*overwrite=*/1);
  }
  execv("/proc/self/exe", argv);
  for (const auto& [name, value] : previous) {
    if (value.has_value()) {
      setenv(name.c_str(), value->c_str(), /*overwrite=*/1);
    } else {
      unsetenv(name.c_str());
    }
  }
}

}  // namespace plait::base
