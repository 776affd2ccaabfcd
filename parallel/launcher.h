// A launcher in the spirit of torchrun: Launch starts N copies of a command on this machine,
// each with the environment torchrun gives and parallel/world.h reads (RANK, WORLD_SIZE,
// LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT, ...), forwards their
// output line by line prefixed with `[rank N] `, and fails fast: when one rank fails, the
// others are stopped and the first failure is reported. With max_restarts it then starts all
// of them again, up to that many times (a training plan with checkpoint.resume continues from
// its last checkpoint). A job of several machines runs one launcher per machine, each with
// the same num_nodes, master_addr and master_port and its own node_rank; their ranks meet
// through rank 0's TCP store (rendezvous.h), as under torchrun.
//
//   LaunchOptions options;
//   options.num_ranks = 4;
//   options.command = {"train_llama", "--plan=plan.textproto"};
//   PLAIT_ASSIGN_OR_RETURN(LaunchResult result, Launch(options));
//   if (!result.ok()) std::cerr << result.summary << "\n";  // "rank 1 exited with status 3; ..."
//   return result.ExitCode();
//
// A binary that should run as N ranks even when started alone launches itself:
//
//   int main(int argc, char** argv) {
//     if (std::optional<int> code = LaunchSelfIfNoWorld(argc, argv, 2)) return *code;
//     ...  // one rank of the world in the environment
//   }
//
// `bazel run //tools:launch -- --nproc_per_node=4 -- program args...` is the command line form.
#ifndef PLAIT_PARALLEL_LAUNCHER_H_
#define PLAIT_PARALLEL_LAUNCHER_H_

#include <unistd.h>

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace plait::parallel {

// Receives the ranks' output one whole line at a time, `[rank N] ` prefix and end included.
// A line ends with '\n' ("\r\n" is passed on as '\n'), or with a lone '\r', which is kept:
// a rank redrawing a progress line in place is passed on as it draws.
using LineSink = std::function<void(std::string_view line)>;

// A sink that writes each line to `fd`, which stays owned by the caller.
LineSink FileDescriptorSink(int fd);

struct LaunchOptions {
  // How many ranks to start on this machine (torchrun's --nproc_per_node): LOCAL_WORLD_SIZE.
  int num_ranks = 1;
  // How many machines run the job, each with a launcher of its own (torchrun's --nnodes), and
  // which one this is (--node_rank): this machine's ranks are node_rank * num_ranks onwards,
  // of a world of num_nodes * num_ranks. With one node the ranks meet through a file in a
  // private folder and open no port for it (World::store_file); with more, through rank 0's
  // store on master_addr:master_port, which must then be given.
  int num_nodes = 1;
  int node_rank = 0;
  // How many times the ranks are all started again after one fails (torchrun's
  // --max_restarts): the others are stopped as below, and once every rank has ended the job
  // starts anew with TORCHELASTIC_RESTART_COUNT one higher and kRestartCauseVariable naming
  // the failure. A launcher told to stop (SIGINT, SIGTERM) does not restart. Only with one
  // node: another node's launcher would not restart its ranks with these.
  int max_restarts = 0;
  // The program and its arguments; the program is looked up on PATH unless it holds a '/'.
  std::vector<std::string> command;
  std::string master_addr = "127.0.0.1";
  // 0 picks a free TCP port on loopback (one node only). The port is free when picked, not
  // reserved: another process may take it before rank 0 binds it (torchrun has the same window).
  int master_port = 0;
  // After the first failure the other ranks get SIGTERM, then SIGKILL when they are still
  // running this long after.
  absl::Duration grace_period = absl::Seconds(5);
  // Where the ranks' stdout and stderr lines go.
  LineSink stdout_sink = FileDescriptorSink(STDOUT_FILENO);
  // Whether the ranks' stdout lines end up on a terminal; the ranks, whose own stdout is a
  // pipe, read it with StdoutIsTerminal(). Set it when stdout_sink goes elsewhere.
  bool stdout_is_terminal = isatty(STDOUT_FILENO) == 1;
  LineSink stderr_sink = FileDescriptorSink(STDERR_FILENO);
};

// How one rank ended.
struct RankStatus {
  int rank = 0;         // the global rank
  int exit_status = 0;  // meaningful when term_signal is 0
  int term_signal = 0;  // the signal that killed the rank; 0 when it exited

  bool ok() const { return term_signal == 0 && exit_status == 0; }
  // "rank 1 exited with status 3" or "rank 2 was killed by signal 9 (Killed)".
  std::string Describe() const;
};

// How the last start of a job ended (see LaunchOptions::max_restarts for the others).
struct LaunchResult {
  std::vector<RankStatus> ranks;  // indexed by local rank
  // The first rank seen to exit non-zero or be killed (of ranks seen ended at once, one
  // killed by a signal, the likelier cause); nullopt when every rank exited 0.
  std::optional<RankStatus> first_failure;
  // The failure that ended each earlier start, in order: one per restart.
  std::vector<RankStatus> restarted_after;
  // One line: "all 4 ranks exited with status 0", or the first failure and how the other
  // ranks were stopped, then "(after 1 restart)" when there were restarts.
  std::string summary;
  int master_port = 0;  // the MASTER_PORT the ranks were given

  bool ok() const { return !first_failure.has_value(); }
  // OK, or an Aborted error whose message is the summary.
  absl::Status status() const;
  // What the launcher process should exit with: 0 on success, otherwise the first failing
  // rank's exit status, or 128 + signal when it was killed (the shell's convention).
  int ExitCode() const;
};

// The variable through which Launch tells the ranks whether their stdout reaches a terminal:
// "1" or "0".
inline constexpr char kStdoutIsTerminalVariable[] = "PLAIT_STDOUT_IS_TERMINAL";

// The variable through which Launch tells the ranks that it starts each line they write with
// "[rank N] ": "1".
inline constexpr char kOutputPrefixedVariable[] = "PLAIT_OUTPUT_PREFIXED";

// What rank `rank` starts a message of its own with, so that a job's output says which rank
// wrote it: "rank N: ", or nothing for a rank of Launch, whose every line starts with
// "[rank N] " already (kOutputPrefixedVariable):
//
//   std::cerr << RankMessagePrefix(world.rank) << status.message() << "\n";
std::string RankMessagePrefix(int rank);

// Whether what this process writes to stdout reaches a terminal: its stdout is one, or it is
// a rank whose launcher says so (kStdoutIsTerminalVariable). Either way false when TERM is
// "dumb" or unset, as a terminal that cannot redraw a line is no better than a file.
bool StdoutIsTerminal();

// Starts `options.num_ranks` processes of `options.command`, each with this process's
// environment plus torchrun's RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK,
// GROUP_WORLD_SIZE, ROLE_RANK, ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
// TORCHELASTIC_RESTART_COUNT and TORCHELASTIC_MAX_RESTARTS, and plait's kStoreFileVariable
// (one node), kRestartCauseVariable (after a restart), kStdoutIsTerminalVariable and
// kOutputPrefixedVariable, and
// returns when every one has ended and no restart is left to make. Their
// stdout and stderr lines go to the sinks (see LineSink); a final line without an end is
// passed on with '\n', and a line longer than
// 64 KiB is passed on in pieces of 64 KiB. While Launch runs, SIGINT and SIGTERM sent to
// this process are forwarded to every running rank, and SIGCHLD is handled; the previous
// handlers are restored before it returns. The ranks stay in this process's process group
// (as under torchrun), so Ctrl-C in a terminal reaches them directly as well as forwarded.
// A rank is sent SIGKILL when the thread that called Launch ends (PR_SET_PDEATHSIG), so a
// launcher killed outright leaves no ranks behind.
//
// A failing rank is a result, not an error: see LaunchResult::ok(). Errors are
// InvalidArgument for bad options or a program that cannot be executed (naming the field,
// the value and the reason), FailedPrecondition when another Launch is running in this
// process, and Internal when a system call fails.
absl::StatusOr<LaunchResult> Launch(const LaunchOptions& options);

// The exit code LaunchAndReport and LaunchSelfIfNoWorld return when the ranks could not be
// launched at all (bad options, a program that cannot be executed): 2, as for a usage error.
inline constexpr int kLaunchErrorExitCode = 2;

// Launch for a main(): prints an error or the failure summary to stderr, prefixed
// "launch: ", and returns the exit code to exit with (LaunchResult::ExitCode, or
// kLaunchErrorExitCode when Launch returned an error).
int LaunchAndReport(const LaunchOptions& options);

// Makes a binary run as `num_ranks` ranks when it was started alone. When the environment
// holds no world (WorldFromEnvironment is NotFound), runs this same binary (/proc/self/exe)
// with argv[1..] as `num_ranks` ranks through LaunchAndReport, restarting them up to
// `max_restarts` times (LaunchOptions::max_restarts), and returns the exit code the caller
// should exit with. When it holds a world, returns nullopt: the caller is one rank
// and proceeds. When it holds an invalid world, prints the error and returns
// kLaunchErrorExitCode.
std::optional<int> LaunchSelfIfNoWorld(int argc, char** argv, int num_ranks, int max_restarts);

// Local ranks a job may start per core, unless the caller says otherwise: each is a process
// with its own copy of the model and one compute thread, so more only oversubscribe the
// machine (and a mesh of thousands would fork thousands of processes).
inline constexpr int kLocalRanksPerCore = 4;

// OK when this machine can run `num_ranks` local ranks: at most `max_local_ranks`, or
// kLocalRanksPerCore per core when that is unset. FailedPrecondition naming both otherwise.
absl::Status CheckLocalRanks(int num_ranks, std::optional<int> max_local_ranks);

}  // namespace plait::parallel

#endif  // PLAIT_PARALLEL_LAUNCHER_H_
