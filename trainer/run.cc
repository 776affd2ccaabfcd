#include "trainer/run.h"

#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "base/heap.h"
#include "base/status.h"
#include "base/threads.h"
#include "parallel/device_mesh.h"
#include "parallel/gloo_communicator.h"
#include "parallel/launcher.h"
#include "parallel/rendezvous.h"
#include "parallel/world.h"
#include "torch/csrc/distributed/c10d/HashStore.hpp"
#include "torch/torch.h"
#include "trainer/plan.h"
#include "trainer/trainer.h"
#include "trainer/validate.h"

namespace plait::trainer {
namespace {

constexpr char kUsage[] = "usage: [--plan=PLAN.textproto] [--set=path=value]...";

// How long rank 0 waits for the others at start.
constexpr absl::Duration kRendezvousTimeout = absl::Minutes(5);

// Under `bazel run` the working directory is the runfiles tree; the user's paths are
// relative to where they ran bazel.
std::string UserPath(const std::string& path) {
  const char* dir = std::getenv("BUILD_WORKING_DIRECTORY");
  if (path.empty() || path[0] == '/' || dir == nullptr) return path;
  return absl::StrCat(dir, "/", path);
}

// The address other ranks reach this one at.
std::string OwnAddress(const parallel::World& world) {
  if (world.master_addr == "127.0.0.1" || world.master_addr == "localhost") {
    return parallel::GlooCommunicator::kLoopback;
  }
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return host;
}

absl::Status TrainAsRank(const Plan& plan, const parallel::World& world) {
  base::SetComputeThreads(1);  // one core per rank; ranks share the machine
  c10::intrusive_ptr<c10d::Store> store;
  if (world.world_size > 1) {
    PLAIT_ASSIGN_OR_RETURN(store, parallel::Rendezvous(world, kRendezvousTimeout));
  } else {
    store = c10::make_intrusive<c10d::HashStore>();
  }
  parallel::MeshConfig mesh_config = plan.mesh();
  if (mesh_config.dims().empty()) {
    // A plan without a mesh runs on one rank; wrappers need a mesh all the same.
    auto* dim = mesh_config.add_dims();
    dim->set_name("world");
    dim->set_size(1);
  }
  PLAIT_ASSIGN_OR_RETURN(parallel::MeshLayout layout,
                         parallel::MeshLayout::Create(mesh_config, world.world_size));
  const std::string address = OwnAddress(world);
  PLAIT_ASSIGN_OR_RETURN(
      parallel::DeviceMesh mesh,
      parallel::DeviceMesh::Create(layout, world.rank,
                                   parallel::GlooCommunicatorFactory(*store, address)));
  TrainOptions options;
  options.log = &std::cout;
  options.log_is_terminal = parallel::StdoutIsTerminal();
  options.metrics_path = UserPath(plan.training().metrics_file());
  options.save_hf_dir = UserPath(plan.training().save_hf_dir());
  options.checkpoint_dir = UserPath(plan.training().checkpoint().dir());
  return Train(plan, mesh, options).status();
}

}  // namespace

int RunMain(int argc, char** argv, const EmbeddedPlan& embedded) {
  base::UseHugePagesForHeap(argv);
  base::RetainFreedHeapMemory();
  std::string plan_path;
  std::vector<std::string> overrides;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (absl::ConsumePrefix(&arg, "--plan=")) {
      plan_path = std::string(arg);
    } else if (absl::ConsumePrefix(&arg, "--set=")) {
      overrides.emplace_back(arg);
    } else {
      std::cerr << "unexpected argument \"" << argv[i] << "\"\n" << kUsage << "\n";
      return 2;
    }
  }
  absl::StatusOr<Plan> plan;
  if (!plan_path.empty()) {
    plan = LoadPlan(UserPath(plan_path));
  } else if (*embedded.text != '\0') {
    plan = ParsePlan(embedded.text, embedded.name);
  } else {
    std::cerr << "no plan: give --plan=FILE\n" << kUsage << "\n";
    return 2;
  }
  for (const std::string& assignment : overrides) {
    if (!plan.ok()) break;
    if (absl::Status status = ApplyOverride(assignment, *plan); !status.ok()) plan = status;
  }
  if (!plan.ok()) {
    std::cerr << plan.status().message() << "\n";
    return 1;
  }

  absl::StatusOr<parallel::World> world =
      parallel::WorldFromEnvironment(parallel::ProcessEnvironment());
  if (absl::IsNotFound(world.status())) {
    const int ranks = MeshRanks(*plan);
    if (absl::Status status = ValidatePlan(*plan, ranks); !status.ok()) {
      std::cerr << "invalid plan:\n" << status.message() << "\n";
      return 1;
    }
    if (ranks > 1) {
      if (std::optional<int> code = parallel::LaunchSelfIfNoWorld(argc, argv, ranks)) {
        return *code;
      }
      world = parallel::WorldFromEnvironment(parallel::ProcessEnvironment());
    } else {
      world = parallel::World();
    }
  }
  if (!world.ok()) {
    std::cerr << world.status().message() << "\n";
    return 2;
  }
  if (absl::Status status = ValidatePlan(*plan, world->world_size); !status.ok()) {
    if (world->rank == 0) std::cerr << "invalid plan:\n" << status.message() << "\n";
    return 1;
  }
  if (absl::Status status = TrainAsRank(*plan, *world); !status.ok()) {
    std::cerr << "rank " << world->rank << ": " << status.message() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace plait::trainer
