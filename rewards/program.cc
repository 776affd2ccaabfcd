#include "rewards/program.h"

#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

extern char** environ;

namespace plait::rewards {
namespace {

constexpr double kDefaultTimeoutSeconds = 30;

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The example as the errors name it: its prompt, cut to 80 bytes.
std::string DescribeExample(const nlohmann::json& example) {
  const auto prompt = example.find("prompt");
  std::string text =
      prompt != example.end() && prompt->is_string() ? prompt->get<std::string>() : example.dump();
  if (text.size() > 80) text = text.substr(0, 77) + "...";
  return nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

absl::StatusOr<std::unique_ptr<ProgramReward>> ProgramReward::Start(const RewardProgram& config,
                                                                    const std::string& field) {
  if (config.command_size() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".command: is empty; name the program"));
  }
  const double timeout =
      config.timeout_seconds() == 0 ? kDefaultTimeoutSeconds : config.timeout_seconds();
  if (!(timeout > 0) || std::isinf(timeout)) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".timeout_seconds: ", config.timeout_seconds(), " is not a positive time"));
  }
  std::unique_ptr<ProgramReward> program(
      new ProgramReward(absl::StrJoin(config.command(), " "), timeout));
  int ends[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ends) != 0) {
    return absl::InternalError(
        absl::StrCat("reward program ", program->name_, ": socketpair: ", std::strerror(errno)));
  }
  program->socket_ = ends[0];
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, ends[1], STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, ends[1], STDOUT_FILENO);
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  // A group of its own, which End kills whole: what the program starts goes with it.
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attributes, 0);
  std::vector<std::string> arguments(config.command().begin(), config.command().end());
  std::vector<char*> argv;
  for (std::string& argument : arguments) argv.push_back(argument.data());
  argv.push_back(nullptr);
  const int spawned =
      posix_spawnp(&program->pid_, argv[0], &actions, &attributes, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  close(ends[1]);
  if (spawned != 0) {
    program->pid_ = -1;
    return absl::FailedPreconditionError(absl::StrCat(
        field, ".command: cannot start \"", program->name_, "\": ", std::strerror(spawned)));
  }
  return program;
}

ProgramReward::~ProgramReward() { End(); }

std::string ProgramReward::End() {
  if (socket_ >= 0) close(socket_);
  socket_ = -1;
  if (pid_ < 0) return "";
  // Its input closed, a program that reads it to its end exits by itself; then the group
  // is terminated, and killed after a second.
  int status = 0;
  pid_t done = waitpid(pid_, &status, WNOHANG);
  if (done == 0) {
    kill(-pid_, SIGTERM);
    for (int i = 0; i < 100 && done == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      done = waitpid(pid_, &status, WNOHANG);
    }
    if (done == 0) {
      kill(-pid_, SIGKILL);
      done = waitpid(pid_, &status, 0);
    }
  }
  kill(-pid_, SIGKILL);  // whatever it started and left behind
  pid_ = -1;
  if (WIFEXITED(status)) return absl::StrCat("it exited with status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return absl::StrCat("it was killed by signal ", WTERMSIG(status));
  return "it ended";
}

absl::Status ProgramReward::Fail(absl::Status status) {
  End();
  failed_ = status;
  return status;
}

absl::StatusOr<std::string> ProgramReward::ReadLine(int64_t deadline_ms) {
  while (true) {
    if (const size_t end = pending_.find('\n'); end != std::string::npos) {
      std::string line = pending_.substr(0, end);
      pending_.erase(0, end + 1);
      return line;
    }
    const int64_t left = deadline_ms - NowMs();
    if (left <= 0) return absl::DeadlineExceededError("");
    pollfd readable = {.fd = socket_, .events = POLLIN, .revents = 0};
    const int ready = poll(&readable, 1, static_cast<int>(left));
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) return absl::DeadlineExceededError("");
    char buffer[4096];
    const ssize_t got = read(socket_, buffer, sizeof(buffer));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return absl::UnavailableError("");
    pending_.append(buffer, static_cast<size_t>(got));
  }
}

absl::StatusOr<double> ProgramReward::Score(const Completion& completion) {
  if (!failed_.ok()) return failed_;
  const std::string example = DescribeExample(completion.example);
  nlohmann::json line = completion.example;
  line["completion"] = std::string(completion.completion);
  line["completion_ids"] = completion.tokens;
  const std::string text =
      line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  const std::string where = absl::StrCat("reward program \"", name_, "\", example ", example);
  for (size_t sent = 0; sent < text.size();) {
    const ssize_t wrote = send(socket_, text.data() + sent, text.size() - sent, MSG_NOSIGNAL);
    if (wrote < 0 && errno == EINTR) continue;
    if (wrote <= 0) {
      return Fail(absl::UnavailableError(
          absl::StrCat(where, ": it stopped reading its input (", End(), ")")));
    }
    sent += static_cast<size_t>(wrote);
  }
  absl::StatusOr<std::string> answer =
      ReadLine(NowMs() + static_cast<int64_t>(timeout_seconds_ * 1000));
  if (absl::IsDeadlineExceeded(answer.status())) {
    End();
    return Fail(absl::DeadlineExceededError(absl::StrCat(
        where, ": no answer within ", timeout_seconds_, " s (RewardProgram.timeout_seconds)")));
  }
  if (!answer.ok()) {
    return Fail(
        absl::UnavailableError(absl::StrCat(where, ": it exited before answering (", End(), ")")));
  }
  double reward = 0;
  const absl::string_view stripped = absl::StripAsciiWhitespace(*answer);
  if (!absl::SimpleAtod(stripped, &reward) || !std::isfinite(reward)) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat(where, ": answered ",
                     nlohmann::json(std::string(stripped))
                         .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                     ", not a finite number")));
  }
  return reward;
}

}  // namespace plait::rewards
