// The plan space, for the test that every plan plan_check accepts trains (plan_space_test.cc):
// a seeded generator of training plans over the strategies and options of wrap.proto, in any
// order, on meshes of up to 8 ranks, with each objective, data form, tiny model preset and
// start, drawn freely (invalid combinations included, so that the rules are exercised), and
// the check of one drawn plan: either the plan's validation (plan/validate.h) refuses it, each
// violation naming a rule or a plan field, or it trains its steps on its ranks as threads and
// every step's loss, gradient norm and metrics are the one-process run's: within 1e-5
// relative from the same weights, and after an update of an optimizer that moves each
// parameter by about the learning rate whatever its gradient (AdamW, Adam, Lion) within 1e-4.
//
//   const DrawnPlan drawn = DrawPlan(seed, dir);
//   const PlanOutcome outcome = CheckDrawnPlan(drawn);
//   if (outcome.kind == PlanOutcome::kFailed) ... outcome.failure, PlanText(drawn.plan) ...
//
// Everything is fp32 and without dropout: the one-process comparison holds within rounding
// noise only there (mixed precision and dropout masks differ by layout by design).
#ifndef PLAIT_TRAINER_TESTING_PLAN_SPACE_H_
#define PLAIT_TRAINER_TESTING_PLAN_SPACE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "base/violation.h"
#include "plan/plan.pb.h"
#include "plan/resolved_plan.h"
#include "trainer/trainer.h"

namespace plait::trainer::testing {

// Where a drawn plan's model starts.
enum class Start {
  kSeed,                   // its seeded initialisation
  kHfFolder,               // plan.hf_weights_dir, a folder of another seed's model
  kOtherLayoutCheckpoint,  // a checkpoint of step 1 written by the one-process run
  kPeftAdapter,            // lora.initial_adapter_dir: adapters whose B is not zero
  kResumeAfterKill,        // the plan's own checkpoint of step 1, resumed by a restart
};
const char* StartName(Start start);

struct DrawnPlan {
  uint64_t seed = 0;
  plan::Plan plan;  // the files it reads (data, Hugging Face and adapter folders) exist
  int world_size = 1;
  Start start = Start::kSeed;
  // The folder of this draw's own files (Hugging Face and adapter folders, checkpoints), for
  // the caller to remove when done with it.
  std::string folder;
};

// Plan `seed` of the space, its files written under `dir`: its own in a folder of its own
// (DrawnPlan::folder), and the data files all draws share, the first time one needs them.
DrawnPlan DrawPlan(uint64_t seed, const std::string& dir);

// What checking a drawn plan found.
struct PlanOutcome {
  enum Kind {
    kRefused,
    kTrained,
    // Trained, and a mixture of experts' router sent a token to another expert than in one
    // process, its two experts' scores within rounding noise: the runs differ from that step on
    // by less than 1e-2, the experts' loads by a routed slot or two, which 1e-5 cannot hold.
    kRoutingFlip,
    kFailed,
  };
  Kind kind = kFailed;
  std::vector<base::Violation> violations;  // kRefused: the validation's
  // kFailed: what went wrong, with the step or the error; kRoutingFlip: the differences.
  std::string failure;
};

// Resolves `drawn`; when refused, checks that every violation names a rule or a plan field;
// when accepted, trains it (with its start) on its ranks and compares every step with the
// one-process run (OneProcessPlan), writing checkpoints into drawn.folder.
PlanOutcome CheckDrawnPlan(const DrawnPlan& drawn);

// `plan` as one process: no mesh, no preparation step but those that add adapters (LoRA),
// frozen models unprepared, and `global_batch` sequences a step in the plan's micro-steps
// (each of global_batch / grad_accumulation sequences), so that it reads the batches the
// plan's ranks read, in the same micro-steps.
plan::Plan OneProcessPlan(const plan::Plan& plan, int64_t global_batch);

// Trains `resolved` on its world's ranks as threads of this process, over loopback rings whose
// collectives fail after `timeout` rather than hang; rank 0's report, or the first rank's
// error (an exception a rank threw included) naming the rank.
absl::StatusOr<TrainReport> TrainOnThreads(const plan::ResolvedPlan& resolved,
                                           const TrainOptions& options = {});

// The key a refusal is counted under: "rule <name>", or the violation's field with its
// indices dropped ("field plan.prepare[].pipeline.schedule").
std::string RefusalKey(const base::Violation& violation);

// The plan as text, to print with a failure.
std::string PlanText(const plan::Plan& plan);

}  // namespace plait::trainer::testing

#endif  // PLAIT_TRAINER_TESTING_PLAN_SPACE_H_
