// Where this process sits in a distributed job: its rank, the world size, its place on its
// node, and how its ranks meet: a file they share, or rank 0's TCP store, which admits only
// clients that show the job's token (PLAIT_STORE_TOKEN).
//
// WorldFromEnvironment reads the conventions launchers already use, so a plait binary runs
// unchanged under torchrun, `tools/launch`, SLURM's srun or Open MPI's mpirun:
//
//   absl::StatusOr<World> world = WorldFromEnvironment(ProcessEnvironment());
//   if (absl::IsNotFound(world.status())) { /* not launched: run alone, or launch self */ }
//
// Every value is checked; a missing, partial or inconsistent setting is an InvalidArgument
// error naming the variable and its value.
#ifndef PLAIT_PARALLEL_WORLD_H_
#define PLAIT_PARALLEL_WORLD_H_

#include <cstddef>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace plait::parallel {

struct World {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;                     // rank among the processes on this node
  int local_world_size = 1;               // processes on this node
  std::string master_addr = "127.0.0.1";  // where rank 0 hosts the rendezvous store
  // The port of that store: MASTER_PORT, or kStorePortVariable when set. Under torchrun,
  // whose own store already holds MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True), it is
  // MASTER_PORT + 1 unless kStorePortVariable says otherwise.
  int master_port = 0;
  // A file the ranks of a one-machine job meet through instead of rank 0's TCP store, so the
  // job listens on no network port for its rendezvous: set (kStoreFileVariable) by the local
  // launcher; empty otherwise.
  std::string store_file;
  // The secret every rank shows rank 0's TCP store before it may use it (kStoreTokenVariable),
  // the same on every node; a job that meets through store_file needs none. Empty when unset.
  std::string store_token;
  std::string source;  // the convention the values came from, for messages
  // Which start of the job this process belongs to: 0 for the first, k after its launcher
  // started the ranks again k times (TORCHELASTIC_RESTART_COUNT, which torchrun and
  // tools/launch set, or SLURM_RESTART_COUNT for a requeued SLURM job); how many restarts
  // the launcher allows (TORCHELASTIC_MAX_RESTARTS; 0 when unset); and why the previous start
  // ended, as the launcher saw it (kRestartCauseVariable; tools/launch sets it, "" otherwise).
  int restart_count = 0;
  int max_restarts = 0;
  std::string restart_cause;
};

// The environment variable that carries World::store_file.
inline constexpr char kStoreFileVariable[] = "PLAIT_STORE_FILE";

// The environment variable that carries World::store_token, and its bounds: long enough not
// to be guessed, short enough for the store's fixed-size hello.
inline constexpr char kStoreTokenVariable[] = "PLAIT_STORE_TOKEN";
inline constexpr size_t kMinStoreTokenBytes = 16;
inline constexpr size_t kMaxStoreTokenBytes = 256;

// The variable that gives the port of rank 0's store when MASTER_PORT is not it (World).
inline constexpr char kStorePortVariable[] = "PLAIT_STORE_PORT";

// The variables through which a launcher says which start of the job this is (World).
inline constexpr char kRestartCountVariable[] = "TORCHELASTIC_RESTART_COUNT";
inline constexpr char kMaxRestartsVariable[] = "TORCHELASTIC_MAX_RESTARTS";
inline constexpr char kSlurmRestartCountVariable[] = "SLURM_RESTART_COUNT";
inline constexpr char kRestartCauseVariable[] = "PLAIT_RESTART_CAUSE";

// How to set kStoreTokenVariable, for errors: the same random value on every node.
inline constexpr char kStoreTokenHowTo[] =
    "export PLAIT_STORE_TOKEN=$(openssl rand -hex 16) with the same value on every node";

// Reads one environment variable; nullopt when it is not set.
using Environment = std::function<std::optional<std::string>(const std::string& name)>;

// The environment of this process.
Environment ProcessEnvironment();

// The world described by the first convention present in `env`, in this order:
//   torchrun / tools/launch: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
//     MASTER_PORT;
//   SLURM: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE (or
//     SLURM_TASKS_PER_NODE), with MASTER_ADDR and MASTER_PORT from the environment;
//   Open MPI: OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK,
//     OMPI_COMM_WORLD_LOCAL_SIZE, with MASTER_ADDR and MASTER_PORT from the environment;
// and, whatever the convention, PLAIT_STORE_FILE, PLAIT_STORE_TOKEN, PLAIT_STORE_PORT and the
// restart variables above when they are set.
// NotFound when none is present (the process was not launched as part of a job).
absl::StatusOr<World> WorldFromEnvironment(const Environment& env);

// Checks explicit values: 0 <= rank < world_size, 0 <= local_rank < local_world_size <=
// world_size, a non-empty master_addr, 1 <= master_port <= 65535 and a store_token that is
// empty or kMinStoreTokenBytes to kMaxStoreTokenBytes long. Errors name the field.
absl::Status ValidateWorld(const World& world);

}  // namespace plait::parallel

#endif  // PLAIT_PARALLEL_WORLD_H_
