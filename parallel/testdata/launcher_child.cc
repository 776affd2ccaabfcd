// The program the tests of //parallel:launcher and //tools:launch launch. Its first argument
// chooses what each rank (RANK in the environment) does:
//
//   print_env                   prints "RANK=.. WORLD_SIZE=.. LOCAL_RANK=.. LOCAL_WORLD_SIZE=..
//                               MASTER_ADDR=.. MASTER_PORT=..", then "to stderr" on stderr,
//                               then "no newline" without a '\n'
//   print_store_file            prints PLAIT_STORE_FILE and whether its folder is private
//                               (mode 0700)
//   report_error                writes "failed" to stderr after RankMessagePrefix, as a
//                               rank reports its error
//   print_node_env              prints "RANK=.. GROUP_RANK=.. GROUP_WORLD_SIZE=.. ROLE_RANK=..
//                               ROLE_WORLD_SIZE=.. PLAIT_STORE_FILE=.."
//   fail_first_start R S        on the job's first start (TORCHELASTIC_RESTART_COUNT=0) as
//                               exit_on_rank R S; on a restart, prints "restart N of M after:
//                               CAUSE" and exits 0
//   exit_on_rank R S            rank R exits with status S after 100 ms; the others sleep 60 s
//   kill_self_on_rank R SIG     rank R kills itself with signal SIG after 100 ms; the others
//                               sleep 60 s
//   ignore_sigterm_except_rank R S DIR
//                               the other ranks ignore SIGTERM, create DIR/ready.<rank> and
//                               sleep 60 s; rank R waits for their files, then exits with S
//   wait_for_sigterm DIR        creates DIR/ready.<rank>, waits up to 60 s for SIGTERM, then
//                               creates DIR/sigterm.<rank> and exits 0
//   launch_self N               LaunchSelfIfNoWorld(argc, argv, N), then prints the world line
//                               of print_env
//
// Exit status 64 means the arguments were wrong, 65 that a wait timed out.
#include <signal.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "parallel/launcher.h"
#include "parallel/testdata/subprocess.h"
#include "parallel/world.h"

namespace plait::parallel::testdata {
namespace {

constexpr int kUsageError = 64;
constexpr int kTimedOut = 65;
constexpr unsigned kLongSleepSeconds = 60;
constexpr absl::Duration kFailureDelay = absl::Milliseconds(100);

std::string Variable(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "<unset>" : value;
}

int IntVariable(const char* name) {
  int value = -1;
  if (!absl::SimpleAtoi(Variable(name), &value)) {
    std::cerr << name << "=" << Variable(name) << " is not an integer\n";
    std::exit(kUsageError);
  }
  return value;
}

int IntArgument(const std::vector<std::string>& args, size_t i) {
  int value = 0;
  if (i >= args.size() || !absl::SimpleAtoi(args[i], &value)) {
    std::cerr << "argument " << i << " must be an integer\n";
    std::exit(kUsageError);
  }
  return value;
}

std::string StringArgument(const std::vector<std::string>& args, size_t i) {
  if (i >= args.size()) {
    std::cerr << "argument " << i << " is missing\n";
    std::exit(kUsageError);
  }
  return args[i];
}

void PrintWorld() {
  std::cout << "RANK=" << Variable("RANK") << " WORLD_SIZE=" << Variable("WORLD_SIZE")
            << " LOCAL_RANK=" << Variable("LOCAL_RANK")
            << " LOCAL_WORLD_SIZE=" << Variable("LOCAL_WORLD_SIZE")
            << " MASTER_ADDR=" << Variable("MASTER_ADDR")
            << " MASTER_PORT=" << Variable("MASTER_PORT") << std::endl;
}

void CreateFile(const std::string& path) {
  std::ofstream file(path);
  if (!file) {
    std::cerr << "cannot create " << path << "\n";
    std::exit(kUsageError);
  }
}

std::string RankFile(const std::string& dir, const char* name, int rank) {
  return absl::StrCat(dir, "/", name, ".", rank);
}

int Run(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  const std::string mode = StringArgument(args, 0);
  if (mode == "launch_self") {
    if (std::optional<int> code =
            LaunchSelfIfNoWorld(argc, argv, IntArgument(args, 1), /*max_restarts=*/0)) {
      return *code;
    }
    PrintWorld();
    return 0;
  }

  const int rank = IntVariable("RANK");
  if (mode == "print_store_file") {
    const std::string store_file = Variable(plait::parallel::kStoreFileVariable);
    const std::string folder = store_file.substr(0, store_file.rfind('/'));
    struct stat info;
    const bool private_folder =
        stat(folder.c_str(), &info) == 0 && S_ISDIR(info.st_mode) && (info.st_mode & 0777) == 0700;
    std::cout << store_file << (private_folder ? " in a private folder" : " elsewhere")
              << std::endl;
    return 0;
  }
  if (mode == "print_env") {
    PrintWorld();
    std::cerr << "to stderr" << std::endl;
    std::cout << "no newline" << std::flush;
    return 0;
  }
  if (mode == "report_error") {
    std::cerr << plait::parallel::RankMessagePrefix(rank) << "failed" << std::endl;
    return 0;
  }
  if (mode == "print_node_env") {
    std::cout << "RANK=" << rank;
    for (const char* name : {"GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE",
                             plait::parallel::kStoreFileVariable}) {
      std::cout << " " << name << "=" << Variable(name);
    }
    std::cout << std::endl;
    return 0;
  }
  if (mode == "fail_first_start" && IntVariable(plait::parallel::kRestartCountVariable) > 0) {
    std::cout << "restart " << Variable(plait::parallel::kRestartCountVariable) << " of "
              << Variable(plait::parallel::kMaxRestartsVariable)
              << " after: " << Variable(plait::parallel::kRestartCauseVariable) << std::endl;
    return 0;
  }
  if (mode == "exit_on_rank" || mode == "kill_self_on_rank" || mode == "fail_first_start") {
    if (rank != IntArgument(args, 1)) {
      sleep(kLongSleepSeconds);
      return 0;
    }
    absl::SleepFor(kFailureDelay);
    if (mode == "kill_self_on_rank") raise(IntArgument(args, 2));
    return IntArgument(args, 2);
  }
  if (mode == "ignore_sigterm_except_rank") {
    const std::string dir = StringArgument(args, 3);
    if (rank != IntArgument(args, 1)) {
      signal(SIGTERM, SIG_IGN);
      CreateFile(RankFile(dir, "ready", rank));
      sleep(kLongSleepSeconds);
      return 0;
    }
    std::vector<std::string> others;
    for (int other = 0; other < IntVariable("WORLD_SIZE"); ++other) {
      if (other != rank) others.push_back(RankFile(dir, "ready", other));
    }
    if (!WaitForFiles(others, absl::Seconds(30)).ok()) return kTimedOut;
    return IntArgument(args, 2);
  }
  if (mode == "wait_for_sigterm") {
    const std::string dir = StringArgument(args, 1);
    // Blocked before the ready file exists, so a SIGTERM sent after it is seen waits here.
    sigset_t sigterm;
    sigemptyset(&sigterm);
    sigaddset(&sigterm, SIGTERM);
    sigprocmask(SIG_BLOCK, &sigterm, nullptr);
    CreateFile(RankFile(dir, "ready", rank));
    const timespec timeout{kLongSleepSeconds, 0};
    if (sigtimedwait(&sigterm, nullptr, &timeout) != SIGTERM) return kTimedOut;
    CreateFile(RankFile(dir, "sigterm", rank));
    return 0;
  }
  std::cerr << "unknown mode \"" << mode << "\"\n";
  return kUsageError;
}

}  // namespace
}  // namespace plait::parallel::testdata

int main(int argc, char** argv) { return plait::parallel::testdata::Run(argc, argv); }
