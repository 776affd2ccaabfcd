#include "parallel/world.h"

#include <cstdlib>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace plait::parallel {
namespace {

// The variable names of one launcher convention.
struct Convention {
  const char* source;
  const char* rank;
  const char* world_size;
  const char* local_rank;
  const char* local_world_size;
};

constexpr Convention kTorchrun = {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                                  "LOCAL_WORLD_SIZE"};
constexpr Convention kSlurm = {"SLURM", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
                               "SLURM_NTASKS_PER_NODE"};
constexpr Convention kOpenMpi = {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                 "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"};

// The names a World's fields are reported under: environment variables, or world.<field>.
struct FieldNames {
  const char* rank;
  const char* world_size;
  const char* local_rank;
  const char* local_world_size;
  const char* master_addr;
  const char* master_port;
  const char* store_token;
};

absl::Status Check(const World& world, const FieldNames& names) {
  auto error = [](const char* name, const auto& value, const std::string& problem) {
    return absl::InvalidArgumentError(absl::StrCat(name, "=", value, " ", problem));
  };
  if (world.world_size < 1) return error(names.world_size, world.world_size, "must be >= 1");
  if (world.rank < 0 || world.rank >= world.world_size) {
    return error(names.rank, world.rank,
                 absl::StrCat("must be in [0, ", names.world_size, "=", world.world_size, ")"));
  }
  if (world.local_world_size < 1 || world.local_world_size > world.world_size) {
    return error(names.local_world_size, world.local_world_size,
                 absl::StrCat("must be in [1, ", names.world_size, "=", world.world_size, "]"));
  }
  if (world.local_rank < 0 || world.local_rank >= world.local_world_size) {
    return error(
        names.local_rank, world.local_rank,
        absl::StrCat("must be in [0, ", names.local_world_size, "=", world.local_world_size, ")"));
  }
  if (world.master_addr.empty()) return error(names.master_addr, "\"\"", "must not be empty");
  if (world.master_port < 1 || world.master_port > 65535) {
    return error(names.master_port, world.master_port, "must be in [1, 65535]");
  }
  const size_t token_bytes = world.store_token.size();
  if (token_bytes != 0 &&
      (token_bytes < kMinStoreTokenBytes || token_bytes > kMaxStoreTokenBytes)) {
    // The token is a secret: its length is named, never its value.
    return absl::InvalidArgumentError(absl::StrCat(
        names.store_token, " has ", token_bytes, " characters; it needs ", kMinStoreTokenBytes,
        " to ", kMaxStoreTokenBytes, " (", kStoreTokenHowTo, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> Required(const Environment& env, const Convention& convention,
                                     const std::string& name) {
  std::optional<std::string> value = env(name);
  if (!value.has_value() || value->empty()) {
    return absl::InvalidArgumentError(absl::StrCat(name, " is not set (", convention.source,
                                                   " launch: ", convention.rank, " is set)"));
  }
  return *value;
}

absl::StatusOr<int> RequiredInt(const Environment& env, const Convention& convention,
                                const std::string& name) {
  PLAIT_ASSIGN_OR_RETURN(std::string text, Required(env, convention, name));
  int value = 0;
  if (!absl::SimpleAtoi(text, &value)) {
    return absl::InvalidArgumentError(absl::StrCat(name, "=\"", text, "\" is not an integer"));
  }
  return value;
}

// SLURM writes tasks per node as "4", "4(x2)" or "4(x2),3": the first count is this
// layout's, which is what a homogeneous job has on every node.
absl::StatusOr<int> SlurmTasksPerNode(const Environment& env) {
  for (const char* name : {"SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}) {
    std::optional<std::string> value = env(name);
    if (!value.has_value() || value->empty()) continue;
    const std::string first = value->substr(0, value->find_first_of("(,"));
    int count = 0;
    if (!absl::SimpleAtoi(first, &count)) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, "=\"", *value, "\" does not start with a task count"));
    }
    return count;
  }
  return absl::InvalidArgumentError(
      "SLURM_NTASKS_PER_NODE and SLURM_TASKS_PER_NODE are not set (SLURM launch: "
      "SLURM_PROCID is set)");
}

// A count a launcher may set, >= 0; 0 when unset.
absl::StatusOr<int> OptionalCount(const Environment& env, const char* name) {
  const std::optional<std::string> text = env(name);
  if (!text.has_value() || text->empty()) return 0;
  int value = 0;
  if (!absl::SimpleAtoi(*text, &value) || value < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, "=\"", *text, "\" is not a count (an integer >= 0)"));
  }
  return value;
}

absl::StatusOr<World> ReadWorld(const Environment& env, const Convention& convention) {
  World world;
  world.source = convention.source;
  PLAIT_ASSIGN_OR_RETURN(world.rank, RequiredInt(env, convention, convention.rank));
  PLAIT_ASSIGN_OR_RETURN(world.world_size, RequiredInt(env, convention, convention.world_size));
  PLAIT_ASSIGN_OR_RETURN(world.local_rank, RequiredInt(env, convention, convention.local_rank));
  if (&convention == &kSlurm) {
    PLAIT_ASSIGN_OR_RETURN(world.local_world_size, SlurmTasksPerNode(env));
  } else {
    PLAIT_ASSIGN_OR_RETURN(world.local_world_size,
                           RequiredInt(env, convention, convention.local_world_size));
  }
  PLAIT_ASSIGN_OR_RETURN(world.master_addr, Required(env, convention, "MASTER_ADDR"));
  PLAIT_ASSIGN_OR_RETURN(world.master_port, RequiredInt(env, convention, "MASTER_PORT"));
  const char* port_name = "MASTER_PORT";
  if (env(kStorePortVariable).value_or("") != "") {
    port_name = kStorePortVariable;
    PLAIT_ASSIGN_OR_RETURN(world.master_port, RequiredInt(env, convention, kStorePortVariable));
  } else if (env("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True") {
    // torchrun's agent hosts its own store on MASTER_PORT for the job's lifetime.
    port_name = "MASTER_PORT (+ 1, beside torchrun's own store)";
    ++world.master_port;
  }
  world.store_file = env(kStoreFileVariable).value_or("");
  world.store_token = env(kStoreTokenVariable).value_or("");
  PLAIT_ASSIGN_OR_RETURN(world.restart_count, OptionalCount(env, kRestartCountVariable));
  if (world.restart_count == 0) {
    PLAIT_ASSIGN_OR_RETURN(world.restart_count, OptionalCount(env, kSlurmRestartCountVariable));
  }
  PLAIT_ASSIGN_OR_RETURN(world.max_restarts, OptionalCount(env, kMaxRestartsVariable));
  world.restart_cause = env(kRestartCauseVariable).value_or("");

  PLAIT_RETURN_IF_ERROR(
      Check(world, {convention.rank, convention.world_size, convention.local_rank,
                    convention.local_world_size, "MASTER_ADDR", port_name, kStoreTokenVariable}));
  return world;
}

}  // namespace

Environment ProcessEnvironment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

absl::StatusOr<World> WorldFromEnvironment(const Environment& env) {
  for (const Convention* convention : {&kTorchrun, &kSlurm, &kOpenMpi}) {
    if (env(convention->rank).has_value()) return ReadWorld(env, *convention);
  }
  return absl::NotFoundError(
      "no distributed world in the environment (none of RANK, SLURM_PROCID, "
      "OMPI_COMM_WORLD_RANK is set)");
}

absl::Status ValidateWorld(const World& world) {
  return Check(world,
               {"world.rank", "world.world_size", "world.local_rank", "world.local_world_size",
                "world.master_addr", "world.master_port", "world.store_token"});
}

}  // namespace plait::parallel
