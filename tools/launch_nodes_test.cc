// A job of several machines, played on this one: the tiny 4-rank FSDP plan
// (trainer/testdata/runs/llama_fsdp_4ranks.textproto) trained by two //tools:launch processes
// acting as two nodes of two ranks, by four tasks with SLURM's variables as srun starts
// them, and by torchrun --no-python, each matching the same plan's one-node run; and a node
// that never arrives, named in the rendezvous timeout. The nodes meet at rank 0's TCP store on an
// address of this machine other than loopback: a job of several nodes refuses loopback, which other
// machines cannot reach (parallel/rendezvous.h).
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "base/file.h"
#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "parallel/free_port.h"
#include "parallel/testdata/subprocess.h"

namespace plait::tools {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::base::testing::IsOkAndHolds;
using ::plait::parallel::testdata::StartSubprocess;
using ::plait::parallel::testdata::SubprocessOptions;
using ::plait::parallel::testdata::WaitForSubprocess;
using ::testing::HasSubstr;

// Each job here trains 10 steps in seconds; start-up on a loaded 2-core machine takes longer.
constexpr absl::Duration kTimeout = absl::Minutes(4);
constexpr int kSteps = 10;
constexpr char kToken[] = "0123456789abcdef-launch-nodes-test";

std::string Runfile(const std::string& path) {
  return absl::StrCat(std::getenv("TEST_SRCDIR"), "/plait/", path);
}

std::string TestFile(const std::string& name) {
  return absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
}

// An IPv4 address of this machine other than loopback; nullopt when it has none.
std::optional<std::string> NonLoopbackAddress() {
  ifaddrs* addresses = nullptr;
  if (getifaddrs(&addresses) != 0) return std::nullopt;
  std::optional<std::string> found;
  for (ifaddrs* a = addresses; a != nullptr && !found; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    if ((a->ifa_flags & IFF_UP) == 0 || (a->ifa_flags & IFF_LOOPBACK) != 0) continue;
    char text[INET_ADDRSTRLEN];
    const in_addr address = reinterpret_cast<const sockaddr_in*>(a->ifa_addr)->sin_addr;
    if (inet_ntop(AF_INET, &address, text, sizeof(text)) != nullptr) found = text;
  }
  freeifaddrs(addresses);
  return found;
}

// The job's binary, with the 4-rank plan for kSteps steps, writing `metrics` (rank 0).
std::vector<std::string> JobCommand(const std::string& metrics) {
  return {Runfile("trainer/llama_fsdp"),
          absl::StrCat("--plan=", Runfile("trainer/testdata/runs/llama_fsdp_4ranks.textproto")),
          absl::StrCat("--set=training.steps=", kSteps),
          absl::StrCat("--set=training.metrics_file=", metrics)};
}

// A started process, its output going to files named after it.
struct Process {
  pid_t pid = -1;
  std::string name;
};

Process Start(const std::string& name, std::vector<std::string> argv,
              std::map<std::string, std::optional<std::string>> environment = {}) {
  SubprocessOptions options;
  options.argv = std::move(argv);
  options.environment_changes = std::move(environment);
  options.stdout_path = TestFile(name + ".out");
  options.stderr_path = TestFile(name + ".err");
  absl::StatusOr<pid_t> pid = StartSubprocess(options);
  EXPECT_THAT(pid, IsOk());
  return {pid.value_or(-1), name};
}

// Waits for `process`; its exit code (-1 when it did not exit) and its output.
std::pair<int, std::string> Wait(const Process& process) {
  absl::StatusOr<int> status = WaitForSubprocess(process.pid, kTimeout);
  EXPECT_THAT(status, IsOk()) << process.name;
  const std::string output = base::ReadFile(TestFile(process.name + ".out")).value_or("") +
                             base::ReadFile(TestFile(process.name + ".err")).value_or("");
  const int code = status.ok() && WIFEXITED(*status) ? WEXITSTATUS(*status) : -1;
  return {code, output};
}

std::vector<double> Losses(const std::string& metrics) {
  std::ifstream file(metrics);
  std::vector<double> losses;
  for (std::string line; std::getline(file, line);) {
    losses.push_back(nlohmann::json::parse(line)["loss"].get<double>());
  }
  return losses;
}

// The losses of the plan's run on one node: the job launches its 4 ranks itself.
const std::vector<double>& OneNodeLosses() {
  static const std::vector<double>* losses = [] {
    const std::string metrics = TestFile("one_node.jsonl");
    const auto [code, output] = Wait(Start("one_node", JobCommand(metrics)));
    EXPECT_EQ(code, 0) << output;
    return new std::vector<double>(Losses(metrics));
  }();
  return *losses;
}

class LaunchNodesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::optional<std::string> address = NonLoopbackAddress();
    if (!address) GTEST_SKIP() << "this machine has no address but loopback to meet on";
    address_ = *address;
    absl::StatusOr<int> port = parallel::PickFreeLoopbackPort();
    ASSERT_THAT(port, IsOk());
    port_ = *port;
    ASSERT_EQ(OneNodeLosses().size(), static_cast<size_t>(kSteps));
  }

  // //tools:launch as node `node_rank` of 2 of the job `name`, with 2 of its ranks; the job's
  // metrics go to TestFile(name + ".jsonl").
  Process StartNode(const std::string& name, int node_rank,
                    const std::vector<std::string>& job_flags = {}) {
    std::vector<std::string> argv = {Runfile("tools/launch"),
                                     "--nnodes=2",
                                     absl::StrCat("--node_rank=", node_rank),
                                     "--nproc_per_node=2",
                                     absl::StrCat("--master_addr=", address_),
                                     absl::StrCat("--master_port=", port_),
                                     "--"};
    for (std::string& arg : JobCommand(TestFile(name + ".jsonl"))) argv.push_back(std::move(arg));
    argv.insert(argv.end(), job_flags.begin(), job_flags.end());
    return Start(absl::StrCat(name, ".node", node_rank), argv, {{"PLAIT_STORE_TOKEN", kToken}});
  }

  std::string address_;
  int port_ = 0;
};

TEST_F(LaunchNodesTest, TwoNodesOfTwoRanksMatchOneNodeOfFour) {
  const Process node1 = StartNode("two_nodes", 1);
  const Process node0 = StartNode("two_nodes", 0);
  const auto [code0, output0] = Wait(node0);
  const auto [code1, output1] = Wait(node1);
  ASSERT_EQ(code0, 0) << output0 << output1;
  ASSERT_EQ(code1, 0) << output0 << output1;
  EXPECT_THAT(output0, HasSubstr("[rank 0] training 123712 parameters on 4 ranks"));
  EXPECT_EQ(Losses(TestFile("two_nodes.jsonl")), OneNodeLosses());
}

// srun starts every task itself, with SLURM's variables and no launcher in between.
TEST_F(LaunchNodesTest, SlurmTasksOnTwoNodesMatchOneNodeOfFour) {
  const std::string metrics = TestFile("slurm.jsonl");
  std::vector<Process> tasks;
  for (int task = 0; task < 4; ++task) {
    tasks.push_back(Start(absl::StrCat("slurm.task", task), JobCommand(metrics),
                          {{"SLURM_PROCID", absl::StrCat(task)},
                           {"SLURM_NTASKS", "4"},
                           {"SLURM_LOCALID", absl::StrCat(task % 2)},
                           {"SLURM_NODEID", absl::StrCat(task / 2)},
                           {"SLURM_NNODES", "2"},
                           {"SLURM_TASKS_PER_NODE", "2(x2)"},
                           {"MASTER_ADDR", address_},
                           {"MASTER_PORT", absl::StrCat(port_)},
                           {"PLAIT_STORE_TOKEN", kToken}}));
  }
  std::string outputs;
  bool all_ok = true;
  for (const Process& task : tasks) {
    const auto [code, output] = Wait(task);
    all_ok = all_ok && code == 0;
    absl::StrAppend(&outputs, task.name, " exited with ", code, ":\n", output);
  }
  ASSERT_TRUE(all_ok) << outputs;
  EXPECT_EQ(Losses(metrics), OneNodeLosses());
}

// torchrun starts the ranks of the job's binary itself (--no-python) and keeps its own store
// on MASTER_PORT; rank 0's goes beside it (parallel/world.h). Needs the PyTorch of the
// LibTorch 2.x build's venv (tools/setup.sh).
TEST_F(LaunchNodesTest, TorchrunNoPythonMatchesOneNodeOfFour) {
  const std::string torchrun = "/opt/plait/venv/bin/torchrun";
  if (access(torchrun.c_str(), X_OK) != 0) GTEST_SKIP() << "no " << torchrun;
  std::vector<std::string> argv = {torchrun,
                                   "--no-python",
                                   "--nnodes=1",
                                   "--nproc_per_node=4",
                                   "--master_addr=127.0.0.1",
                                   absl::StrCat("--master_port=", port_)};
  for (std::string& arg : JobCommand(TestFile("torchrun.jsonl"))) argv.push_back(std::move(arg));
  const auto [code, output] = Wait(Start("torchrun", argv, {{"PLAIT_STORE_TOKEN", kToken}}));
  ASSERT_EQ(code, 0) << output;
  EXPECT_EQ(Losses(TestFile("torchrun.jsonl")), OneNodeLosses());
}

TEST_F(LaunchNodesTest, ANodeThatNeverArrivesIsNamedInTheTimeout) {
  const auto [code, output] =
      Wait(StartNode("alone", 0, {"--set=mesh.rendezvous_timeout_seconds=3"}));
  EXPECT_EQ(code, 1) << output;
  EXPECT_THAT(output, HasSubstr("ranks 2, 3 of 4 never arrived: all of node 1 (of 2 nodes; a "
                                "node that never arrives was not started, or cannot reach"));
}

}  // namespace
}  // namespace plait::tools
