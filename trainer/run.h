// The main() of the trainer binaries: reads the plan (compiled in, or --plan=FILE), applies
// --set=path=value overrides, validates it for the world it runs in, and trains. Started
// alone it launches the plan's number of ranks itself (parallel::LaunchSelfIfNoWorld), and
// with --max_restarts=N starts them all again after one fails, up to N times; under
// //tools:launch, torchrun, SLURM or mpirun it is one rank of that world, meeting the others
// through parallel::Rendezvous and communicating over TCP rings (NCCL on GPUs). A job that a
// launcher restarts must resume from its checkpoints (plan.training.checkpoint.resume), or it is
// refused at its start:
//
//   int main(int argc, char** argv) {
//     return plait::trainer::RunMain(argc, argv, {kPlanText,
//     "plan/examples/llama_fsdp.textproto"});
//   }
#ifndef PLAIT_TRAINER_RUN_H_
#define PLAIT_TRAINER_RUN_H_

#include <string>

namespace plait::trainer {

// A plan compiled into the binary; empty text means the binary needs --plan=FILE.
struct EmbeddedPlan {
  const char* text = "";
  const char* name = "";  // for errors, e.g. "plan/examples/llama_fsdp.textproto"
};

// Keeps freed memory in the heap for the next step (base/heap.h), then runs. Returns
// the process's exit code: 0 after training, 1 for an invalid plan or a failed run
// (the error printed to stderr, prefixed with the rank; an exception, such as an allocation
// the machine cannot meet, is printed too and never aborts), 2 for a usage error.
int RunMain(int argc, char** argv, const EmbeddedPlan& embedded);

}  // namespace plait::trainer

#endif  // PLAIT_TRAINER_RUN_H_
