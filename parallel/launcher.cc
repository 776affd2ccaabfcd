#include "parallel/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "base/status.h"
#include "parallel/free_port.h"
#include "parallel/internal/fd.h"
#include "parallel/world.h"

extern char** environ;

namespace plait::parallel {
namespace {

using internal::Fd;

// A line longer than this is passed on in pieces, so a rank that never writes '\n' (a
// progress bar redrawn with '\r') cannot grow the launcher's memory without bound.
constexpr size_t kMaxLineBytes = 64 * 1024;

// The signals Launch handles: SIGINT and SIGTERM are forwarded, SIGCHLD wakes the loop.
constexpr int kHandledSignals[] = {SIGINT, SIGTERM, SIGCHLD};
constexpr int kNumHandledSignals = sizeof(kHandledSignals) / sizeof(kHandledSignals[0]);

// The longest the loop sleeps without checking for exited ranks. SIGCHLD normally wakes it
// at once, but a program hosting Launch may block SIGCHLD in every thread.
constexpr std::chrono::milliseconds kReapInterval(200);

std::string ErrnoText(int error) { return std::strerror(error); }

absl::Status SystemError(absl::string_view call, int error) {
  return absl::InternalError(absl::StrCat(call, " failed: ", ErrnoText(error)));
}

struct Pipe {
  Fd read;
  Fd write;
};

// Both ends close on exec, so no rank inherits another rank's pipes.
absl::StatusOr<Pipe> MakePipe(absl::string_view purpose, int read_flags) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    return SystemError(absl::StrCat("pipe2 (", purpose, ")"), errno);
  }
  Pipe pipe{Fd(fds[0]), Fd(fds[1])};
  if (read_flags != 0 &&
      fcntl(pipe.read.get(), F_SETFL, fcntl(pipe.read.get(), F_GETFL) | read_flags) != 0) {
    return SystemError(absl::StrCat("fcntl (", purpose, ")"), errno);
  }
  return pipe;
}

absl::Status ValidateOptions(const LaunchOptions& options) {
  if (options.num_ranks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_ranks=", options.num_ranks, " must be >= 1"));
  }
  if (options.command.empty()) {
    return absl::InvalidArgumentError("command is empty: it needs at least the program to run");
  }
  if (options.command[0].empty()) {
    return absl::InvalidArgumentError("command[0] (the program to run) is empty");
  }
  if (options.master_addr.empty()) {
    return absl::InvalidArgumentError("master_addr is empty");
  }
  if (options.master_port < 0 || options.master_port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("master_port=", options.master_port,
                                                   " must be in [0, 65535] (0 picks a free port)"));
  }
  if (options.grace_period < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("grace_period=", absl::FormatDuration(options.grace_period), " must be >= 0"));
  }
  if (options.num_nodes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_nodes=", options.num_nodes, " must be >= 1"));
  }
  if (options.node_rank < 0 || options.node_rank >= options.num_nodes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "node_rank=", options.node_rank, " must be in [0, num_nodes=", options.num_nodes, ")"));
  }
  if (options.num_nodes > 1 && options.master_port == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "master_port=0 with num_nodes=", options.num_nodes,
        ": the nodes cannot agree on a port picked on one of them; give every node the same "
        "port, where rank 0 hosts the store"));
  }
  if (options.max_restarts < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_restarts=", options.max_restarts, " must be >= 0"));
  }
  if (options.max_restarts > 0 && options.num_nodes > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_restarts=", options.max_restarts, " with num_nodes=", options.num_nodes,
        ": this launcher restarts the ranks of its own machine, and the other nodes' launchers "
        "would not start theirs with them; restart a multi-node job as a whole (SLURM's "
        "--requeue, or your scheduler's retry) with the plan's checkpoint.resume"));
  }
  return absl::OkStatus();
}

// The path execve should run for `program`, found as execvp would. Resolved before fork
// because execvp is not async-signal-safe.
absl::StatusOr<std::string> ResolveProgram(const std::string& program) {
  if (program.find('/') != std::string::npos) return program;
  const char* path_variable = std::getenv("PATH");
  // glibc's execvp searches this when PATH is unset (confstr(_CS_PATH)).
  const std::string search_path = path_variable != nullptr ? path_variable : "/bin:/usr/bin";
  for (absl::string_view dir : absl::StrSplit(search_path, ':')) {
    // An empty PATH entry is the current directory.
    const std::string candidate = dir.empty() ? program : absl::StrCat(dir, "/", program);
    struct stat info;
    if (stat(candidate.c_str(), &info) == 0 && S_ISREG(info.st_mode) &&
        access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "command[0]=\"", program, "\" is not an executable file on PATH=\"", search_path, "\""));
}

// Which start of the job a Job is, and why the one before it ended.
struct Attempt {
  int restart = 0;    // 0 for the first start
  std::string cause;  // RankStatus::Describe() of the failure before; "" for the first
};

// The environment of local rank `local_rank`: this process's, with the world variables
// replaced (those without a value removed, so a launcher started by another passes on none of
// its own launcher's).
std::vector<std::string> RankEnvironment(int local_rank, const LaunchOptions& options, int port,
                                         const std::string& store_file, const Attempt& attempt) {
  const int rank = options.node_rank * options.num_ranks + local_rank;
  const int world_size = options.num_nodes * options.num_ranks;
  auto unless_empty = [](const std::string& value) {
    return value.empty() ? std::nullopt : std::optional<std::string>(value);
  };
  // torchrun's variables (ROLE_* as for its one role, "default"), and plait's own.
  const std::vector<std::pair<std::string, std::optional<std::string>>> world = {
      {kStoreFileVariable, unless_empty(store_file)},
      {"RANK", absl::StrCat(rank)},
      {"WORLD_SIZE", absl::StrCat(world_size)},
      {"LOCAL_RANK", absl::StrCat(local_rank)},
      {"LOCAL_WORLD_SIZE", absl::StrCat(options.num_ranks)},
      {"GROUP_RANK", absl::StrCat(options.node_rank)},
      {"GROUP_WORLD_SIZE", absl::StrCat(options.num_nodes)},
      {"ROLE_RANK", absl::StrCat(rank)},
      {"ROLE_WORLD_SIZE", absl::StrCat(world_size)},
      {"MASTER_ADDR", options.master_addr},
      {"MASTER_PORT", absl::StrCat(port)},
      {kRestartCountVariable, absl::StrCat(attempt.restart)},
      {kMaxRestartsVariable, absl::StrCat(options.max_restarts)},
      {kRestartCauseVariable, unless_empty(attempt.cause)},
      {kStdoutIsTerminalVariable, options.stdout_is_terminal ? "1" : "0"},
      {kOutputPrefixedVariable, "1"},  // by LineSplitter
  };
  std::vector<std::string> environment;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const absl::string_view name = absl::string_view(*entry).substr(0, std::strcspn(*entry, "="));
    const bool replaced = std::any_of(world.begin(), world.end(),
                                      [&](const auto& variable) { return variable.first == name; });
    if (!replaced) environment.emplace_back(*entry);
  }
  for (const auto& [name, value] : world) {
    if (value.has_value()) environment.push_back(absl::StrCat(name, "=", *value));
  }
  return environment;
}

std::vector<char*> NullTerminated(std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  pointers.reserve(strings.size() + 1);
  for (std::string& s : strings) pointers.push_back(s.data());
  pointers.push_back(nullptr);
  return pointers;
}

// --- Signals ---------------------------------------------------------------------------
//
// The handlers only write the signal number to a pipe (the self-pipe trick); the loop in
// Job::Run reads it and does the work outside signal context.

std::atomic<int> signal_pipe_write_fd{-1};
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler reads this");

extern "C" void WriteSignalToPipe(int signal_number) {
  const int saved_errno = errno;
  const unsigned char byte = static_cast<unsigned char>(signal_number);
  // A full pipe already holds a wake-up; losing this byte loses nothing the loop needs
  // except a repeated forward of the same signal.
  [[maybe_unused]] ssize_t written =
      write(signal_pipe_write_fd.load(std::memory_order_relaxed), &byte, 1);
  errno = saved_errno;
}

// Installs the handlers for its lifetime and restores the previous ones after.
class SignalHandlers {
 public:
  static absl::StatusOr<SignalHandlers> Install() {
    PLAIT_ASSIGN_OR_RETURN(Pipe pipe, MakePipe("signal self-pipe", O_NONBLOCK));
    if (fcntl(pipe.write.get(), F_SETFL, fcntl(pipe.write.get(), F_GETFL) | O_NONBLOCK) != 0) {
      return SystemError("fcntl (signal self-pipe)", errno);
    }
    SignalHandlers handlers(std::move(pipe));
    signal_pipe_write_fd.store(handlers.pipe_.write.get());
    struct sigaction action {};
    action.sa_handler = WriteSignalToPipe;
    sigemptyset(&action.sa_mask);
    for (int i = 0; i < kNumHandledSignals; ++i) {
      action.sa_flags = SA_RESTART | (kHandledSignals[i] == SIGCHLD ? SA_NOCLDSTOP : 0);
      if (sigaction(kHandledSignals[i], &action, &handlers.previous_[i]) != 0) {
        return SystemError(absl::StrCat("sigaction(", kHandledSignals[i], ")"), errno);
      }
      handlers.installed_ = i + 1;
    }
    return handlers;
  }

  SignalHandlers(SignalHandlers&& other) noexcept
      : pipe_(std::move(other.pipe_)), installed_(std::exchange(other.installed_, 0)) {
    std::copy(std::begin(other.previous_), std::end(other.previous_), std::begin(previous_));
  }
  SignalHandlers& operator=(SignalHandlers&&) = delete;

  ~SignalHandlers() {
    for (int i = 0; i < installed_; ++i) sigaction(kHandledSignals[i], &previous_[i], nullptr);
    if (pipe_.write.valid()) signal_pipe_write_fd.store(-1);
  }

  int read_fd() const { return pipe_.read.get(); }
  // The dispositions to give a rank back before exec: a handler becomes the default at exec,
  // an ignored signal stays ignored, as if this launcher had not been in between.
  const struct sigaction* previous() const { return previous_; }

 private:
  explicit SignalHandlers(Pipe pipe) : pipe_(std::move(pipe)) {}

  Pipe pipe_;
  struct sigaction previous_[kNumHandledSignals] = {};
  int installed_ = 0;
};

// Blocks the handled signals in the calling thread for its lifetime, so a fork never
// runs a handler in the child before the child has restored the previous dispositions.
class BlockedSignals {
 public:
  BlockedSignals() {
    sigset_t set;
    sigemptyset(&set);
    for (int signal_number : kHandledSignals) sigaddset(&set, signal_number);
    pthread_sigmask(SIG_BLOCK, &set, &previous_);
  }
  ~BlockedSignals() { pthread_sigmask(SIG_SETMASK, &previous_, nullptr); }

  const sigset_t& previous() const { return previous_; }

 private:
  sigset_t previous_;
};

// --- Output ----------------------------------------------------------------------------

// Cuts one stream into lines and passes each on with the rank's prefix.
class LineSplitter {
 public:
  LineSplitter(int rank, const LineSink* sink)
      : prefix_(absl::StrCat("[rank ", rank, "] ")), sink_(sink) {}

  void Append(absl::string_view data) {
    buffer_.append(data.data(), data.size());
    size_t start = 0;
    while (start < buffer_.size()) {
      const absl::string_view rest = absl::string_view(buffer_).substr(start);
      const size_t end = rest.find_first_of("\r\n");
      if (end != absl::string_view::npos && end <= kMaxLineBytes) {
        // "\r\n" ends a line as '\n' does; a lone '\r' (a redrawn progress line) is kept.
        const bool crlf = rest[end] == '\r' && end + 1 < rest.size() && rest[end + 1] == '\n';
        const bool carriage_return = rest[end] == '\r' && !crlf;
        Emit(rest.substr(0, end), carriage_return ? '\r' : '\n');
        start += end + (crlf ? 2 : 1);
      } else if (rest.size() >= kMaxLineBytes) {
        Emit(rest.substr(0, kMaxLineBytes), '\n');
        start += kMaxLineBytes;
      } else {
        break;
      }
    }
    buffer_.erase(0, start);
  }

  // Passes on a final line that has no '\n'.
  void Flush() {
    if (buffer_.empty()) return;
    Emit(buffer_, '\n');
    buffer_.clear();
  }

 private:
  // `text` is one line without its end, which is `end`.
  void Emit(absl::string_view text, char end) {
    (*sink_)(absl::StrCat(prefix_, text, absl::string_view(&end, 1)));
  }

  std::string prefix_;
  const LineSink* sink_;
  std::string buffer_;
};

// One output stream of one rank: the read end of its pipe and its line splitter.
struct OutputStream {
  Fd fd;
  LineSplitter lines;
};

enum class ReadOutcome { kMore, kWouldBlock, kEnd };

ReadOutcome ReadOnce(OutputStream& stream) {
  char buffer[64 * 1024];
  const ssize_t n = read(stream.fd.get(), buffer, sizeof(buffer));
  if (n > 0) {
    stream.lines.Append(absl::string_view(buffer, static_cast<size_t>(n)));
    return ReadOutcome::kMore;
  }
  if (n < 0 && errno == EINTR) return ReadOutcome::kMore;
  if (n < 0 && errno == EAGAIN) return ReadOutcome::kWouldBlock;
  // EOF, or an error that leaves nothing more to read from this pipe.
  stream.lines.Flush();
  stream.fd.Reset();
  return ReadOutcome::kEnd;
}

// --- Ranks -----------------------------------------------------------------------------

// What a child writes to its error pipe when it cannot become the rank's program.
struct ChildError {
  enum Step : int { kDeathSignal, kRedirect, kExec };
  Step step;
  int error;
};

// Everything a child needs between fork and exec, prepared before fork: the child of a
// multithreaded process may only make async-signal-safe calls, so it must not allocate.
struct ChildSetup {
  const char* path;
  char* const* argv;
  char* const* envp;
  int stdout_fd;
  int stderr_fd;
  int error_fd;
  pid_t parent;
  const struct sigaction* previous_actions;
  const sigset_t* previous_mask;
};

// `from` becomes `to` without close-on-exec (dup2 clears the flag, except onto itself).
bool MoveFd(int from, int to) {
  if (from == to) return fcntl(to, F_SETFD, 0) == 0;
  return dup2(from, to) == to;
}

[[noreturn]] void RunChild(const ChildSetup& setup) {
  for (int i = 0; i < kNumHandledSignals; ++i) {
    sigaction(kHandledSignals[i], &setup.previous_actions[i], nullptr);
  }
  sigprocmask(SIG_SETMASK, setup.previous_mask, nullptr);
  ChildError failure{ChildError::kExec, 0};
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) {
    failure = {ChildError::kDeathSignal, errno};
  } else if (getppid() != setup.parent) {
    _exit(127);  // the launcher is already gone: nobody to run for or report to
  } else if (!MoveFd(setup.stdout_fd, STDOUT_FILENO) || !MoveFd(setup.stderr_fd, STDERR_FILENO)) {
    failure = {ChildError::kRedirect, errno};
  } else {
    execve(setup.path, setup.argv, setup.envp);
    failure = {ChildError::kExec, errno};
  }
  [[maybe_unused]] ssize_t written = write(setup.error_fd, &failure, sizeof(failure));
  _exit(127);
}

std::string DescribeChildError(const ChildError& failure, int rank, const std::string& program) {
  switch (failure.step) {
    case ChildError::kDeathSignal:
      return absl::StrCat("rank ", rank,
                          " could not set PR_SET_PDEATHSIG: ", ErrnoText(failure.error));
    case ChildError::kRedirect:
      return absl::StrCat("rank ", rank,
                          " could not redirect stdout and stderr: ", ErrnoText(failure.error));
    case ChildError::kExec:
      break;
  }
  return absl::StrCat("command[0]=\"", program,
                      "\" cannot be executed: ", ErrnoText(failure.error));
}

struct Rank {
  // `rank` is the global rank, by which messages and output lines name it.
  Rank(int rank, pid_t pid, Fd out, Fd err, const LaunchOptions& options)
      : rank(rank),
        pid(pid),
        out{std::move(out), LineSplitter(rank, &options.stdout_sink)},
        err{std::move(err), LineSplitter(rank, &options.stderr_sink)} {}

  int rank;
  pid_t pid;
  bool running = true;
  OutputStream out;
  OutputStream err;
  RankStatus status;
};

RankStatus StatusFromWait(int rank, int wait_status) {
  RankStatus status;
  status.rank = rank;
  if (WIFSIGNALED(wait_status)) {
    status.term_signal = WTERMSIG(wait_status);
  } else {
    status.exit_status = WEXITSTATUS(wait_status);
  }
  return status;
}

// The running ranks of one launch. Its destructor kills and reaps any rank still running,
// so an error part-way through leaves no process behind.
class Job {
 public:
  Job(const LaunchOptions& options, const SignalHandlers& handlers, int port,
      std::string store_file, Attempt attempt)
      : options_(options),
        handlers_(handlers),
        port_(port),
        store_file_(std::move(store_file)),
        attempt_(std::move(attempt)) {
    ranks_.reserve(options.num_ranks);
  }
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  ~Job() {
    for (Rank& rank : ranks_) {
      if (!rank.running) continue;
      kill(rank.pid, SIGKILL);
      while (waitpid(rank.pid, nullptr, 0) < 0 && errno == EINTR) {
      }
    }
  }

  absl::Status Start(const std::string& path) {
    for (int r = 0; r < options_.num_ranks; ++r) PLAIT_RETURN_IF_ERROR(StartRank(r, path));
    return absl::OkStatus();
  }

  absl::StatusOr<LaunchResult> Run();

  // Whether this launcher was told to stop (SIGINT or SIGTERM, forwarded to the ranks): a
  // job stopped so is not restarted.
  bool interrupted() const { return interrupted_; }

 private:
  using Clock = std::chrono::steady_clock;

  absl::Status StartRank(int r, const std::string& path);
  absl::Status ReapExited();
  void OnFailure(const RankStatus& failure);
  void Signal(int signal_number);
  absl::Status HandleSignals();
  void DrainOutput();
  std::string Summary() const;

  const LaunchOptions& options_;
  const SignalHandlers& handlers_;
  const int port_;
  const std::string store_file_;
  const Attempt attempt_;
  std::vector<Rank> ranks_;
  std::optional<RankStatus> first_failure_;
  std::optional<Clock::time_point> kill_deadline_;  // set while waiting out the grace period
  // Ranks sent SIGTERM after the first failure, and of those, ranks sent SIGKILL after the
  // grace period.
  int num_stopped_ = 0;
  int num_killed_ = 0;
  bool interrupted_ = false;
};

absl::Status Job::StartRank(int r, const std::string& path) {
  std::vector<std::string> argv_strings = options_.command;
  std::vector<std::string> env_strings = RankEnvironment(r, options_, port_, store_file_, attempt_);
  const std::vector<char*> argv = NullTerminated(argv_strings);
  const std::vector<char*> envp = NullTerminated(env_strings);
  PLAIT_ASSIGN_OR_RETURN(Pipe out, MakePipe(absl::StrCat("rank ", r, " stdout"), O_NONBLOCK));
  PLAIT_ASSIGN_OR_RETURN(Pipe err, MakePipe(absl::StrCat("rank ", r, " stderr"), O_NONBLOCK));
  PLAIT_ASSIGN_OR_RETURN(Pipe exec_error, MakePipe(absl::StrCat("rank ", r, " exec errors"), 0));

  pid_t pid;
  {
    BlockedSignals blocked;
    const ChildSetup setup{path.c_str(),    argv.data(),          envp.data(),
                           out.write.get(), err.write.get(),      exec_error.write.get(),
                           getpid(),        handlers_.previous(), &blocked.previous()};
    pid = fork();
    if (pid == 0) RunChild(setup);
  }
  if (pid < 0) return SystemError(absl::StrCat("fork (rank ", r, ")"), errno);

  const int rank = options_.node_rank * options_.num_ranks + r;
  ranks_.emplace_back(rank, pid, std::move(out.read), std::move(err.read), options_);
  out.write.Reset();
  err.write.Reset();
  exec_error.write.Reset();

  // The error pipe closes on a successful exec, or carries why the child could not run.
  ChildError failure;
  ssize_t n;
  while ((n = read(exec_error.read.get(), &failure, sizeof(failure))) < 0 && errno == EINTR) {
  }
  if (n == 0) return absl::OkStatus();
  if (n < 0) return SystemError(absl::StrCat("read (rank ", r, " exec errors)"), errno);
  while (waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
  }
  ranks_.back().running = false;
  if (n != static_cast<ssize_t>(sizeof(failure))) {
    return absl::InternalError(
        absl::StrCat("rank ", rank, " failed before exec and its error report was cut short"));
  }
  return absl::InvalidArgumentError(DescribeChildError(failure, rank, options_.command[0]));
}

void Job::Signal(int signal_number) {
  for (Rank& rank : ranks_) {
    if (rank.running) kill(rank.pid, signal_number);
  }
}

void Job::OnFailure(const RankStatus& failure) {
  first_failure_ = failure;
  for (const Rank& rank : ranks_) num_stopped_ += rank.running ? 1 : 0;
  Signal(SIGTERM);
  kill_deadline_ = Clock::now() + absl::ToChronoNanoseconds(options_.grace_period);
}

absl::Status Job::ReapExited() {
  // Of several ranks found ended in one pass, one killed by a signal is the likelier cause:
  // the others typically failed because it vanished from their collectives.
  std::optional<RankStatus> failure;
  for (Rank& rank : ranks_) {
    if (!rank.running) continue;
    int wait_status = 0;
    pid_t reaped;
    while ((reaped = waitpid(rank.pid, &wait_status, WNOHANG)) < 0 && errno == EINTR) {
    }
    if (reaped == 0) continue;
    if (reaped < 0) {
      return SystemError(absl::StrCat("waitpid(", rank.pid, ") for rank ", rank.rank,
                                      " (did other code in this process reap it?)"),
                         errno);
    }
    rank.running = false;
    rank.status = StatusFromWait(rank.rank, wait_status);
    if (!rank.status.ok() &&
        (!failure.has_value() || (failure->term_signal == 0 && rank.status.term_signal != 0))) {
      failure = rank.status;
    }
  }
  if (failure.has_value() && !first_failure_.has_value()) OnFailure(*failure);
  return absl::OkStatus();
}

absl::Status Job::HandleSignals() {
  unsigned char signals[64];
  for (;;) {
    const ssize_t n = read(handlers_.read_fd(), signals, sizeof(signals));
    if (n < 0 && errno == EINTR) continue;
    if (n == 0 || (n < 0 && errno == EAGAIN)) return absl::OkStatus();
    if (n < 0) return SystemError("read (signal self-pipe)", errno);
    for (ssize_t i = 0; i < n; ++i) {
      if (signals[i] == SIGINT || signals[i] == SIGTERM) {
        interrupted_ = true;
        Signal(signals[i]);
      }
    }
  }
}

// Reads what the ranks left in their pipes once they have all ended. A pipe still held
// open by a process a rank started is read up to what is there now, not waited on.
void Job::DrainOutput() {
  for (Rank& rank : ranks_) {
    for (OutputStream* stream : {&rank.out, &rank.err}) {
      while (stream->fd.valid() && ReadOnce(*stream) == ReadOutcome::kMore) {
      }
      stream->lines.Flush();
    }
  }
}

absl::StatusOr<LaunchResult> Job::Run() {
  std::vector<pollfd> fds;
  std::vector<OutputStream*> streams;  // streams[i] is polled as fds[i + 1]
  for (;;) {
    PLAIT_RETURN_IF_ERROR(ReapExited());
    if (std::none_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.running; })) {
      break;
    }
    int timeout_ms = static_cast<int>(kReapInterval.count());
    if (kill_deadline_.has_value()) {
      const auto left = *kill_deadline_ - Clock::now();
      if (left <= Clock::duration::zero()) {
        for (const Rank& rank : ranks_) num_killed_ += rank.running ? 1 : 0;
        Signal(SIGKILL);
        kill_deadline_.reset();
      } else {
        // Rounded up, so the loop does not wake just before the deadline and spin.
        timeout_ms =
            std::min(timeout_ms,
                     static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(left).count()));
      }
    }

    fds.assign(1, pollfd{handlers_.read_fd(), POLLIN, 0});
    streams.clear();
    for (Rank& rank : ranks_) {
      for (OutputStream* stream : {&rank.out, &rank.err}) {
        if (!stream->fd.valid()) continue;
        fds.push_back(pollfd{stream->fd.get(), POLLIN, 0});
        streams.push_back(stream);
      }
    }
    if (poll(fds.data(), fds.size(), timeout_ms) < 0) {
      if (errno == EINTR) continue;
      return SystemError("poll", errno);
    }
    if (fds[0].revents != 0) PLAIT_RETURN_IF_ERROR(HandleSignals());
    for (size_t i = 0; i < streams.size(); ++i) {
      if (fds[i + 1].revents != 0) ReadOnce(*streams[i]);
    }
  }
  DrainOutput();

  LaunchResult result;
  for (const Rank& rank : ranks_) result.ranks.push_back(rank.status);
  result.first_failure = first_failure_;
  result.summary = Summary();
  result.master_port = port_;
  return result;
}

std::string Job::Summary() const {
  if (!first_failure_.has_value()) {
    return absl::StrCat("all ", ranks_.size(), " ranks exited with status 0");
  }
  std::string summary = first_failure_->Describe();
  if (num_stopped_ > 0) {
    absl::StrAppend(&summary, "; stopped the ", num_stopped_, " other running rank",
                    num_stopped_ == 1 ? "" : "s", " with SIGTERM");
  }
  if (num_killed_ > 0) {
    absl::StrAppend(&summary, ", then ", num_killed_, " with SIGKILL after the ",
                    absl::FormatDuration(options_.grace_period), " grace period");
  }
  return summary;
}

// Only one launch may own the signal handlers at a time.
std::atomic<bool> launch_running{false};

}  // namespace

LineSink FileDescriptorSink(int fd) {
  return [fd](std::string_view line) {
    while (!line.empty()) {
      const ssize_t n = write(fd, line.data(), line.size());
      if (n < 0 && errno == EINTR) continue;
      // The launcher's own output is gone (a closed pipe, a full disk): drop the line
      // rather than stop the ranks.
      if (n <= 0) return;
      line.remove_prefix(static_cast<size_t>(n));
    }
  };
}

std::string RankStatus::Describe() const {
  if (term_signal != 0) {
    return absl::StrCat("rank ", rank, " was killed by signal ", term_signal, " (",
                        strsignal(term_signal), ")");
  }
  return absl::StrCat("rank ", rank, " exited with status ", exit_status);
}

absl::Status LaunchResult::status() const {
  if (ok()) return absl::OkStatus();
  return absl::AbortedError(summary);
}

int LaunchResult::ExitCode() const {
  if (!first_failure.has_value()) return 0;
  if (first_failure->term_signal != 0) return 128 + first_failure->term_signal;
  return first_failure->exit_status;
}

absl::StatusOr<LaunchResult> Launch(const LaunchOptions& options) {
  PLAIT_RETURN_IF_ERROR(ValidateOptions(options));
  PLAIT_ASSIGN_OR_RETURN(const std::string path, ResolveProgram(options.command[0]));
  int port = options.master_port;
  if (port == 0) {
    PLAIT_ASSIGN_OR_RETURN(port, PickFreeLoopbackPort());
  }

  if (launch_running.exchange(true)) {
    return absl::FailedPreconditionError(
        "another Launch is running in this process: a launch owns the SIGINT, SIGTERM and "
        "SIGCHLD handlers until it returns, so launches cannot overlap");
  }
  absl::Cleanup release = [] { launch_running.store(false); };
  PLAIT_ASSIGN_OR_RETURN(SignalHandlers handlers, SignalHandlers::Install());
  // The ranks meet through a file in a folder only this user can enter, removed after the
  // job: a local job opens no port for its rendezvous (World::store_file).
  char store_dir[] = "/tmp/plait-launch-XXXXXX";
  if (mkdtemp(store_dir) == nullptr) {
    return absl::InternalError(
        absl::StrCat("cannot create the job's store folder: ", std::strerror(errno)));
  }
  absl::Cleanup remove_store = [&store_dir] {
    std::error_code ignored;
    std::filesystem::remove_all(store_dir, ignored);
  };
  Attempt attempt;
  std::vector<RankStatus> restarted_after;
  for (;;) {
    // A store file of its own for each start (a file store keeps the keys of the last one);
    // none for a job of several nodes, whose ranks meet at rank 0's store.
    const std::string store_file =
        options.num_nodes == 1 ? absl::StrCat(store_dir, "/store-", attempt.restart) : "";
    Job job(options, handlers, port, store_file, attempt);
    PLAIT_RETURN_IF_ERROR(job.Start(path));
    PLAIT_ASSIGN_OR_RETURN(LaunchResult result, job.Run());
    if (result.ok() || attempt.restart == options.max_restarts || job.interrupted()) {
      result.restarted_after = std::move(restarted_after);
      if (!result.restarted_after.empty()) {
        absl::StrAppend(&result.summary, " (after ", result.restarted_after.size(), " restart",
                        result.restarted_after.size() == 1 ? "" : "s", ")");
      }
      return result;
    }
    restarted_after.push_back(*result.first_failure);
    attempt.cause = result.first_failure->Describe();
    ++attempt.restart;
    options.stderr_sink(absl::StrCat("launch: ", result.summary, "; starting the ",
                                     options.num_ranks, " rank", options.num_ranks == 1 ? "" : "s",
                                     " again (restart ", attempt.restart, " of ",
                                     options.max_restarts, ")\n"));
  }
}

int LaunchAndReport(const LaunchOptions& options) {
  absl::StatusOr<LaunchResult> result = Launch(options);
  if (!result.ok()) {
    std::cerr << "launch: " << result.status().message() << "\n";
    return kLaunchErrorExitCode;
  }
  if (!result->ok()) std::cerr << "launch: " << result->summary << "\n";
  return result->ExitCode();
}

std::string RankMessagePrefix(int rank) {
  const char* prefixed = std::getenv(kOutputPrefixedVariable);
  if (prefixed != nullptr && absl::string_view(prefixed) == "1") return "";
  return absl::StrCat("rank ", rank, ": ");
}

bool StdoutIsTerminal() {
  const char* term = std::getenv("TERM");
  if (term == nullptr || absl::string_view(term) == "dumb") return false;
  if (isatty(STDOUT_FILENO) == 1) return true;
  const char* launcher_says = std::getenv(kStdoutIsTerminalVariable);
  return launcher_says != nullptr && absl::string_view(launcher_says) == "1";
}

std::optional<int> LaunchSelfIfNoWorld(int argc, char** argv, int num_ranks, int max_restarts) {
  const absl::StatusOr<World> world = WorldFromEnvironment(ProcessEnvironment());
  if (world.ok()) return std::nullopt;
  if (!absl::IsNotFound(world.status())) {
    std::cerr << "launch: the environment holds an invalid world: " << world.status().message()
              << "\n";
    return kLaunchErrorExitCode;
  }
  char self[PATH_MAX];
  const ssize_t length = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (length < 0) {
    std::cerr << "launch: cannot find this binary: readlink(/proc/self/exe) failed: "
              << ErrnoText(errno) << "\n";
    return kLaunchErrorExitCode;
  }
  LaunchOptions options;
  options.num_ranks = num_ranks;
  options.max_restarts = max_restarts;
  options.command.emplace_back(self, static_cast<size_t>(length));
  for (int i = 1; i < argc; ++i) options.command.emplace_back(argv[i]);
  return LaunchAndReport(options);
}

absl::Status CheckLocalRanks(int num_ranks, std::optional<int> max_local_ranks) {
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  const int limit = max_local_ranks.value_or(kLocalRanksPerCore * cores);
  if (num_ranks <= limit) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      num_ranks, " local ranks are more than this machine runs (", limit,
      max_local_ranks ? " by --max_local_ranks"
                      : absl::StrCat(": ", kLocalRanksPerCore, " per core on ", cores, " cores"),
      "); use a smaller mesh, launch across machines, or pass --max_local_ranks=N"));
}

}  // namespace plait::parallel
