// launch: runs a program as N ranks on this machine, with torchrun's flags and the
// environment torchrun gives its ranks (see parallel/launcher.h):
//
//   bazel run //tools:launch -- --nproc_per_node=4 [--max_restarts=1] -- program args...
//   # one machine of several, run on each with its own --node_rank (one command line):
//   launch --nnodes=2 --node_rank=0 --nproc_per_node=8 --master_addr=node0
//       --master_port=29500 -- program args...
//
// Each rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR,
// MASTER_PORT, ...; its output lines are prefixed `[rank N] `. When a rank fails the others
// are stopped and the failure is printed; with --max_restarts=N every rank is then started
// again, up to N times, each restart printed with the rank that failed and how. When no
// restart is left, launch exits with the failing rank's status (128 + signal when it was
// killed); with 2 when the ranks could not be started (bad flag values, a program that
// cannot be executed), and with 1, from Abseil, for a flag it cannot parse.
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/time/time.h"
#include "base/guarded_main.h"
#include "parallel/launcher.h"

ABSL_FLAG(int, nproc_per_node, 1, "How many ranks to start on this machine.");
ABSL_FLAG(int, nnodes, 1,
          "How many machines run the job, each with its own launch; the world is nnodes x "
          "nproc_per_node ranks.");
ABSL_FLAG(int, node_rank, 0,
          "Which of the nnodes machines this is, from 0: its ranks are node_rank x "
          "nproc_per_node onwards.");
ABSL_FLAG(int, max_restarts, 0,
          "How many times to start every rank again after one fails (a plan with "
          "checkpoint.resume continues from its last checkpoint). One node only.");
ABSL_FLAG(std::string, master_addr, "127.0.0.1",
          "MASTER_ADDR given to the ranks: with nnodes > 1, the address of node 0 that every "
          "node reaches, where rank 0 hosts the store. A one-node job meets through a file "
          "store, so nothing listens on it for the rendezvous; the ring communicators use loopback "
          "when it is "
          "127.0.0.1 or localhost, this host's name otherwise.");
ABSL_FLAG(int, master_port, 0,
          "MASTER_PORT given to the ranks, the same on every node; 0 picks a free TCP port on "
          "loopback (one node only).");
ABSL_FLAG(absl::Duration, grace_period, absl::Seconds(5),
          "After the first rank fails, how long the others have to exit after SIGTERM "
          "before they get SIGKILL.");

int LaunchRanks(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "runs a program as N ranks on this machine.\n"
      "usage: launch --nproc_per_node=N [--max_restarts=R] [--nnodes=M --node_rank=I "
      "--master_addr=HOST --master_port=P] [--grace_period=5s] -- program args...");
  // The arguments after "--" are positional, so the program's own flags pass through.
  const std::vector<char*> positional = absl::ParseCommandLine(argc, argv);

  plait::parallel::LaunchOptions options;
  options.num_ranks = absl::GetFlag(FLAGS_nproc_per_node);
  if (options.num_ranks < 1) {
    std::cerr << "launch: --nproc_per_node=" << options.num_ranks << " must be >= 1\n";
    return plait::parallel::kLaunchErrorExitCode;
  }
  // positional[0] is launch itself.
  options.command.assign(positional.begin() + 1, positional.end());
  if (options.command.empty()) {
    std::cerr << "launch: no program to run; usage: launch --nproc_per_node=N -- program "
                 "args...\n";
    return plait::parallel::kLaunchErrorExitCode;
  }
  // `bazel run` starts launch in its runfiles tree; relative paths in the command are meant
  // from where the user typed it.
  if (const char* dir = std::getenv("BUILD_WORKING_DIRECTORY"); dir != nullptr && chdir(dir) != 0) {
    std::cerr << "launch: cannot change to BUILD_WORKING_DIRECTORY=" << dir << ": "
              << std::strerror(errno) << "\n";
    return plait::parallel::kLaunchErrorExitCode;
  }
  options.master_addr = absl::GetFlag(FLAGS_master_addr);
  options.master_port = absl::GetFlag(FLAGS_master_port);
  options.grace_period = absl::GetFlag(FLAGS_grace_period);
  options.num_nodes = absl::GetFlag(FLAGS_nnodes);
  options.node_rank = absl::GetFlag(FLAGS_node_rank);
  options.max_restarts = absl::GetFlag(FLAGS_max_restarts);
  return plait::parallel::LaunchAndReport(options);
}

int main(int argc, char** argv) {
  return plait::base::RunCatchingExceptions("launch", [&] { return LaunchRanks(argc, argv); });
}
