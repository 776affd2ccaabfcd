#include "trainer/run.h"

#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "base/cpus.h"
#include "base/guarded_main.h"
#include "base/heap.h"
#include "base/status.h"
#include "base/threads.h"
#include "parallel/device.h"
#include "parallel/device_mesh.h"
#include "parallel/launcher.h"
#include "parallel/process_group.h"
#include "parallel/world.h"
#include "plan/compute_dtype.h"
#include "plan/plan.h"
#include "plan/validate.h"
#include "trainer/run_folder.h"
#include "trainer/trainer.h"

namespace plait::trainer {
namespace {

constexpr char kUsage[] =
    "usage: [--plan=PLAN.textproto] [--set=path=value]... [--max_local_ranks=N] "
    "[--max_restarts=N] [--skip_memory_check]";

// OK unless a launcher restarts this job (`launcher` says which: "--max_restarts=1" or
// "TORCHELASTIC_MAX_RESTARTS=1") and the plan would not resume from its checkpoint: a
// restart would then train from step 1 again, over the metrics and checkpoints of the start
// before it.
absl::Status CheckRestartable(const plan::Plan& plan, const std::string& launcher) {
  if (plan.training().checkpoint().resume()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "plan.training.checkpoint.resume is not set, but ", launcher,
      " restarts this job after a failure; a restart continues from the last checkpoint: set "
      "training { checkpoint { dir: \"...\" every: N resume: true } }"));
}

// Sets this rank's compute threads: the plan's training.compute_threads_per_rank, or the CPUs
// this process may use shared among the ranks on this machine. Local rank 0 says how many and
// why, the run's first line from its ranks. False, having said why, when the CPUs cannot be
// read.
bool UseComputeThreads(const plan::Plan& plan, const parallel::World& world) {
  int threads = plan.training().compute_threads_per_rank();
  std::string why = absl::StrCat("training.compute_threads_per_rank: ", threads);
  if (threads == 0) {
    const absl::StatusOr<base::UsableCpus> cpus = base::ReadUsableCpus();
    if (!cpus.ok()) {
      std::cerr << parallel::RankMessagePrefix(world.rank) << cpus.status().message()
                << "; set training.compute_threads_per_rank to choose the thread count\n";
      return false;
    }
    threads = cpus->PerRank(world.local_world_size);
    why = absl::StrCat(cpus->Describe(), "; ", world.local_world_size,
                       world.local_world_size == 1 ? " local rank" : " local ranks");
  }
  base::SetComputeThreads(threads);
  if (world.local_rank == 0) {
    std::cout << "compute threads: " << threads << " per rank (" << why << ")" << std::endl;
  }
  return true;
}

absl::Status TrainAsRank(const plan::ResolvedPlan& resolved, const parallel::World& world) {
  const plan::Plan& plan = resolved.plan;
  PLAIT_ASSIGN_OR_RETURN(const at::Device device,
                         parallel::ResolveDevice(plan.device(), world.local_rank,
                                                 world.local_world_size, "plan.device"));
  PLAIT_RETURN_IF_ERROR(parallel::BindDevice(device));
  if (world.rank == 0) {
    std::cout << "device: " << parallel::DescribeDevice(device)
              << (device.is_cuda() && world.local_world_size > 1 ? ", cuda:<local rank> per rank"
                                                                 : "")
              << "; compute: " << plan::DescribeComputeDtype(plan, device) << std::endl;
  }
  PLAIT_ASSIGN_OR_RETURN(std::unique_ptr<parallel::ProcessGroup> group,
                         parallel::ProcessGroup::Start(world, plan.mesh(), device,
                                                       parallel::RendezvousTimeout(plan.mesh())));
  TrainOptions options;
  options.log = &std::cout;
  options.log_is_terminal = parallel::StdoutIsTerminal();
  options.restart_count = world.restart_count;
  options.restart_cause = world.restart_cause;
  return group->ExplainFailure(Train(resolved, group->mesh(), options).status());
}

// Creates the run's folder once the plan is accepted and says where its outputs go; false,
// having said why, when it cannot be created.
bool OpenRunFolder(const RunFolder& folder) {
  if (absl::Status created = folder.Create(); !created.ok()) {
    std::cerr << created.message() << "\n";
    return false;
  }
  if (folder.is_new) std::cout << "outputs: " << folder.path << std::endl;
  return true;
}

// Why ResolveForMachine refused the plan: its violations, or that it does not fit.
void PrintRefusal(const absl::Status& status) {
  std::cerr << (absl::IsInvalidArgument(status) ? "invalid plan:\n" : "plan refused: ")
            << status.message() << "\n";
}

// RunMain without its guards against exceptions.
int RunGuarded(int argc, char** argv, const EmbeddedPlan& embedded) {
  absl::StatusOr<plan::PlanArguments> arguments =
      plan::ParsePlanArguments(argc, argv, plan::PlanCommand::kTrain);
  if (!arguments.ok()) {
    std::cerr << arguments.status().message() << "\n" << kUsage << "\n";
    return 2;
  }
  if (arguments->help) {
    std::cout << kUsage << "\n" << plan::PlanFlagsHelp(plan::PlanCommand::kTrain);
    return 0;
  }
  if (arguments->plan_path.empty() && *embedded.text == '\0') {
    std::cerr << "no plan: give --plan=FILE\n" << kUsage << "\n";
    return 2;
  }
  absl::StatusOr<plan::Plan> plan =
      plan::LoadPlanFromArguments(*arguments, embedded.text, embedded.name);
  if (!plan.ok()) {
    std::cerr << plan.status().message() << "\n";
    return 1;
  }

  absl::StatusOr<parallel::World> world =
      parallel::WorldFromEnvironment(parallel::ProcessEnvironment());
  std::optional<plan::ResolvedPlan> resolved;  // for `world`, once it is known
  if (absl::IsNotFound(world.status())) {
    const RunFolder folder = TakeRunFolder(*plan, /*starts_run=*/true, /*restart_count=*/0);
    const int ranks = static_cast<int>(parallel::MeshRanks(plan->mesh()));
    absl::StatusOr<plan::ResolvedPlan> on_this_machine =
        plan::ResolveForMachine(*plan, ranks, ranks, arguments->skip_memory_check);
    if (!on_this_machine.ok()) {
      PrintRefusal(on_this_machine.status());
      return 1;
    }
    if (absl::Status status = parallel::CheckLocalRanks(ranks, arguments->max_local_ranks);
        !status.ok()) {
      std::cerr << "plan.mesh: " << status.message() << "\n";
      return 1;
    }
    if (arguments->max_restarts > 0) {
      if (absl::Status status =
              CheckRestartable(*plan, absl::StrCat("--max_restarts=", arguments->max_restarts));
          !status.ok()) {
        std::cerr << "plan refused: " << status.message() << "\n";
        return 1;
      }
    }
    // A job that restarts runs under a launcher even with one rank, which starts it again.
    const bool launches = ranks > 1 || arguments->max_restarts > 0;
    if (!launches && !UseComputeThreads(*plan, parallel::World())) return 1;
    if (!OpenRunFolder(folder)) return 1;
    if (launches) {
      if (std::optional<int> code =
              parallel::LaunchSelfIfNoWorld(argc, argv, ranks, arguments->max_restarts)) {
        return *code;
      }
      world = parallel::WorldFromEnvironment(parallel::ProcessEnvironment());
    } else {
      world = parallel::World();
      resolved = *std::move(on_this_machine);
    }
  }
  if (!world.ok()) {
    std::cerr << world.status().message() << "\n";
    return 2;
  }
  if (!resolved.has_value()) {
    const RunFolder folder = TakeRunFolder(*plan, world->rank == 0, world->restart_count);
    absl::StatusOr<plan::ResolvedPlan> for_world = plan::ResolveForMachine(
        *plan, world->world_size, world->local_world_size, arguments->skip_memory_check);
    if (!for_world.ok()) {
      if (world->local_rank == 0) PrintRefusal(for_world.status());
      return 1;
    }
    if (!UseComputeThreads(*plan, *world)) return 1;
    if (!OpenRunFolder(folder)) return 1;
    resolved = *std::move(for_world);
  }
  if (world->max_restarts > 0 || world->restart_count > 0) {
    if (absl::Status status = CheckRestartable(
            *plan, world->max_restarts > 0
                       ? absl::StrCat(parallel::kMaxRestartsVariable, "=", world->max_restarts)
                       : absl::StrCat("the launcher (restart ", world->restart_count, ")"));
        !status.ok()) {
      if (world->local_rank == 0) std::cerr << "plan refused: " << status.message() << "\n";
      return 1;
    }
  }
  if (absl::Status status = TrainAsRank(*resolved, *world); !status.ok()) {
    std::cerr << parallel::RankMessagePrefix(world->rank) << status.message() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace

int RunMain(int argc, char** argv, const EmbeddedPlan& embedded) {
  base::SetIdleThreadWaits(argv);
  base::UseHugePagesForHeap(argv);
  base::RetainFreedHeapMemory();
  return base::RunCatchingExceptions(argv[0], [&] {
    // A LibTorch error's what() carries a backtrace; its message alone names the problem.
    try {
      return RunGuarded(argc, argv, embedded);
    } catch (const c10::Error& error) {
      std::cerr << "stopped by an error in LibTorch: " << error.what_without_backtrace() << "\n";
      return 1;
    }
  });
}

}  // namespace plait::trainer
