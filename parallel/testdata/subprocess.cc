#include "parallel/testdata/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"

extern char** environ;

namespace plait::parallel::testdata {
namespace {

// How often the waits below look again.
constexpr absl::Duration kPollInterval = absl::Milliseconds(10);

std::vector<std::string> ChangedEnvironment(
    const std::map<std::string, std::optional<std::string>>& changes) {
  std::vector<std::string> environment;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string name(*entry, std::strcspn(*entry, "="));
    if (changes.count(name) == 0) environment.emplace_back(*entry);
  }
  for (const auto& [name, value] : changes) {
    if (value.has_value()) environment.push_back(absl::StrCat(name, "=", *value));
  }
  return environment;
}

std::vector<char*> NullTerminated(std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  for (std::string& s : strings) pointers.push_back(s.data());
  pointers.push_back(nullptr);
  return pointers;
}

}  // namespace

absl::StatusOr<pid_t> StartSubprocess(const SubprocessOptions& options) {
  if (options.argv.empty()) return absl::InvalidArgumentError("argv is empty");
  std::vector<std::string> argv_strings = options.argv;
  std::vector<std::string> env_strings = ChangedEnvironment(options.environment_changes);
  const std::vector<char*> argv = NullTerminated(argv_strings);
  const std::vector<char*> envp = NullTerminated(env_strings);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  constexpr int kFlags = O_WRONLY | O_CREAT | O_TRUNC;
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, options.stdout_path.c_str(), kFlags,
                                   0644);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, options.stderr_path.c_str(), kFlags,
                                   0644);
  pid_t pid = 0;
  const int error = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (error != 0) {
    return absl::InternalError(
        absl::StrCat("posix_spawn(", options.argv[0], ") failed: ", std::strerror(error)));
  }
  return pid;
}

absl::StatusOr<int> WaitForSubprocess(pid_t pid, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    int wait_status = 0;
    const pid_t reaped = waitpid(pid, &wait_status, WNOHANG);
    if (reaped == pid) return wait_status;
    if (reaped < 0 && errno != EINTR) {
      return absl::InternalError(absl::StrCat("waitpid(", pid, ") failed: ", std::strerror(errno)));
    }
    if (absl::Now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
      return absl::DeadlineExceededError(absl::StrCat("process ", pid, " was still running after ",
                                                      absl::FormatDuration(timeout),
                                                      " and was killed"));
    }
    absl::SleepFor(kPollInterval);
  }
}

absl::Status WaitForFiles(const std::vector<std::string>& paths, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    std::vector<std::string> missing;
    for (const std::string& path : paths) {
      if (access(path.c_str(), F_OK) != 0) missing.push_back(path);
    }
    if (missing.empty()) return absl::OkStatus();
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("after ", absl::FormatDuration(timeout),
                       " these files do not exist: ", absl::StrJoin(missing, ", ")));
    }
    absl::SleepFor(kPollInterval);
  }
}

pid_t ChildWithRank(pid_t parent, int rank) {
  const std::string wanted = absl::StrCat("RANK=", rank);
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string pid = entry.path().filename().string();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string fields;
    std::getline(stat, fields);
    // "pid (comm) state ppid ...": comm may hold spaces, so read after the last ')'. A process
    // that ended since the listing leaves nothing to read.
    const size_t comm_end = fields.rfind(')');
    if (comm_end == std::string::npos) continue;
    std::istringstream after_comm(fields.substr(comm_end + 1));
    std::string state;
    pid_t parent_pid = 0;
    after_comm >> state >> parent_pid;
    if (parent_pid != parent) continue;
    std::ifstream environ(entry.path() / "environ");
    for (std::string variable; std::getline(environ, variable, '\0');) {
      if (variable == wanted) return static_cast<pid_t>(std::stol(pid));
    }
  }
  return -1;
}

}  // namespace plait::parallel::testdata
