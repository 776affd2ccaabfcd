#include "base/exec_again.h"

#include <unistd.h>

#include <cstdlib>
#include <optional>

namespace plait::base {

void ExecAgainWith(char** argv, const char* name, const std::string& value) {
  const char* current = std::getenv(name);
  const std::optional<std::string> previous =
      current == nullptr ? std::nullopt : std::optional<std::string>(current);
  setenv(name, value.c_str(), /*overwrite=*/1);
  execv("/proc/self/exe", argv);
  if (previous.has_value()) {
    setenv(name, previous->c_str(), /*overwrite=*/1);
  } else {
    unsetenv(name);
  }
}

}  // namespace plait::base
