// A pipeline-parallel schedule as data: for p pipeline ranks holding v stages each and m
// micro-batches, the ordered list of actions (forward, backward, and the sends and receives
// between ranks) that each rank executes in one training step. A pipeline executor runs each
// rank's list literally, and plan_check prints the grid of a schedule with its bubble:
//
//   PLAIT_ASSIGN_OR_RETURN(PipelineSchedule schedule,
//                          BuildSchedule(ScheduleKind::k1F1B, /*num_ranks=*/4,
//                                        /*stages_per_rank=*/1, /*num_microbatches=*/8));
//   for (const Action& action : schedule.ranks[my_rank]) Run(action);
//   std::cout << FormatScheduleTable(schedule);
//
// Written here rather than taken from PyTorch's torch.distributed.pipelining because plait's
// executor is C++; the orders are those of its schedules.py (which torchtitan uses) and of
// Megatron-LM: GPipe, 1F1B (PipeDream-flush), Megatron's interleaved 1F1B, and ZB-H1 from
// Qi et al. 2023, "Zero Bubble Pipeline Parallelism" (arXiv:2401.10241). Check and Simulate
// verify and time any schedule, built here or written by hand.
//
// Placement and data flow. Stages are global indices 0..p*v-1 and stage s lives on rank s % p
// (looped placement, as Megatron's and torchtitan's interleaved schedules): rank r holds stages
// r, r+p, r+2p, .... Stage 0 embeds the micro-batch; the last stage computes the loss, so its
// forward sends nothing and its backward starts from the loss without a receive.
//
// Communication contract. A send is asynchronous: it never blocks, and the executor keeps its
// tensor alive until the transfer completes. A receive blocks until the matching send has been
// issued. Sends and receives between two ranks match in order, activations and gradients in
// one channel per (sender, receiver) as Communicator::Send and Receive match them, so the k-th
// receive of rank 1 from rank 0 takes the k-th tensor rank 0 sent to rank 1, and must expect
// its kind (with two ranks and several stages per rank, rank 0 sends rank 1 both activations
// and gradients). Each schedule puts a
// receive right before the compute that needs it and a send right after the compute that
// produces it. Adjacent stages on the same rank (only when p == 1) hand their tensors over
// locally, with no communication action.
#ifndef PLAIT_WRAP_PP_SCHEDULE_H_
#define PLAIT_WRAP_PP_SCHEDULE_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace plait::wrap::pp {

enum class ActionType {
  kForward,
  kBackward,           // input and weight gradients in one pass
  kBackwardInput,      // zero-bubble "B": the gradient of the stage's input, sent upstream
  kBackwardWeight,     // zero-bubble "W": the weight gradients, after kBackwardInput
  kSendActivation,     // to stage + 1, after this stage's forward
  kReceiveActivation,  // from stage - 1, before this stage's forward
  kSendGradient,       // to stage - 1, after this stage's backward (input part)
  kReceiveGradient,    // from stage + 1, before this stage's backward (input part)
};

// One step of a rank's list. `stage` is the stage that computes, or whose tensor is sent or
// received on this rank; `peer_stage` is the stage on the other rank for communication, -1
// for compute.
struct Action {
  ActionType type = ActionType::kForward;
  int stage = 0;
  int microbatch = 0;
  int peer_stage = -1;

  bool is_compute() const;
  friend bool operator==(const Action& a, const Action& b) {
    return a.type == b.type && a.stage == b.stage && a.microbatch == b.microbatch &&
           a.peer_stage == b.peer_stage;
  }
  friend bool operator!=(const Action& a, const Action& b) { return !(a == b); }
};

// Short names, as PyTorch's pipelining prints them: "F0.3" (forward of stage 0, micro-batch
// 3), "B", "I" (backward input), "W" (backward weight), "SEND_F0.3->1", "RECV_F1.3<-0",
// "SEND_B1.3->0", "RECV_B0.3<-1".
std::string ActionName(const Action& action);
std::ostream& operator<<(std::ostream& os, const Action& action);

// Bubbles below are Simulate's with equal stages, F = B = W (a full backward 2 F).
enum class ScheduleKind {
  // "GPIPE": all forwards, then all backwards (in micro-batch order); bubble
  // (p - 1) / (m + p - 1), every rank holds all m micro-batches' activations.
  kGPipe,
  // "1F1B": PipeDream-flush; rank r warms up with p - 1 - r forwards, then alternates; the
  // same bubble as GPipe, rank r holds at most min(m, p - r) micro-batches.
  k1F1B,
  // "INTERLEAVED_1F1B": Megatron's, v >= 2 stages per rank visited in groups of p
  // micro-batches; bubble (p - 1) / (v m + p - 1); rank r holds at most
  // min(2 (p - 1 - r) + (v - 1) p + 1, v m) stage activations, each 1/v of its layers. The
  // warm-up is PyTorch's ScheduleInterleaved1F1B's: Megatron's all-forward warm-up when
  // m == p is not reproduced (this order passes Check without it).
  kInterleaved1F1B,
  // "ZB_H1": 1F1B's forwards and input gradients (so its activations), with rank r's first r
  // weight gradients deferred into the cool-down; the bubble drops to (p - 1)(F + B - W) per
  // rank, and no rank holds more than p micro-batches short of their W, 1F1B's peak.
  kZeroBubbleH1,
};

// The schedule's name as plans and plan_check spell it ("GPIPE", "1F1B", "INTERLEAVED_1F1B",
// "ZB_H1"), and back; an unknown name is InvalidArgument listing the known ones.
absl::string_view ScheduleKindName(ScheduleKind kind);
absl::StatusOr<ScheduleKind> ScheduleKindFromName(absl::string_view name);

struct PipelineSchedule {
  ScheduleKind kind = ScheduleKind::k1F1B;
  int num_ranks = 1;
  int stages_per_rank = 1;
  int num_microbatches = 1;
  // ranks[r]: what pipeline rank r executes, in order.
  std::vector<std::vector<Action>> ranks;

  int num_stages() const { return num_ranks * stages_per_rank; }
  int RankOf(int stage) const { return stage % num_ranks; }
};

// The schedule of `kind` for `num_ranks` (p) ranks of `stages_per_rank` (v) stages and
// `num_microbatches` (m) micro-batches, or InvalidArgument naming the value and what is needed:
// - p, v and m are at least 1; v > 1 only for INTERLEAVED_1F1B, which needs v >= 2 (at v == 1
//   it is 1F1B: ask for that).
// - GPIPE, 1F1B and ZB_H1 accept any m >= 1: with m < p the warm-up is cut to m forwards and
//   the lists stay complete and deadlock-free (Check passes); the pipeline is never full and
//   the bubble is large, which Simulate reports rather than this refusing it.
// - INTERLEAVED_1F1B needs m to be a multiple of p: Megatron's ordering runs micro-batches in
//   groups of p through each of a rank's stages in turn, so a partial group has no place.
absl::StatusOr<PipelineSchedule> BuildSchedule(ScheduleKind kind, int num_ranks,
                                               int stages_per_rank, int num_microbatches);

// OK when executing `schedule` trains every micro-batch exactly once and finishes: every
// (stage, micro-batch) runs its forward once and its backward once (kBackward, or
// kBackwardInput then kBackwardWeight) on the stage's rank, after its forward; a forward runs
// after the activation arrived from the stage before (received, or computed on the same rank),
// a backward after the gradient arrived from the stage after; every send follows the compute
// that produces it and is taken by exactly one receive of the peer, in channel order; and
// running the lists with asynchronous sends and blocking receives ends without deadlock.
// Otherwise InvalidArgument naming the rank, the action's place in its list and its name, and
// the micro-batch (for a deadlock, every blocked rank and what it waits for).
absl::Status Check(const PipelineSchedule& schedule);

// Time of each compute action in units the caller chooses; a full backward costs
// backward_input + backward_weight, communication is free.
struct ActionCosts {
  double forward = 1;
  double backward_input = 1;
  double backward_weight = 1;
};

struct TimedAction {
  Action action;
  double start = 0;
  double end = 0;
};

struct RankTimeline {
  std::vector<TimedAction> compute;  // in execution order
  double busy = 0;                   // the sum of its compute times
  // The most (stage, micro-batch) activations the rank holds at once: forwarded, input
  // gradient not yet computed. Each is one stage's, 1/v of the rank's layers.
  int peak_activations = 0;
  // Zero-bubble only: the most micro-batches whose input gradient is done and weight gradient
  // is not; their weight gradients still need the inputs of the stage's linear layers.
  int peak_pending_weight_gradients = 0;
};

struct SimulationResult {
  std::vector<RankTimeline> ranks;
  double makespan = 0;         // the step: from 0 to the last rank's last compute
  double bubble_fraction = 0;  // idle time over p * makespan
};

// Runs `schedule` (after Check, whose error it returns) with `costs`, every rank starting at
// 0, a receive waiting for its send, and reports when each compute runs.
absl::StatusOr<SimulationResult> Simulate(const PipelineSchedule& schedule,
                                          const ActionCosts& costs = {});

// How many tensors `actions` (one rank's list) sends: its kSendActivation and kSendGradient.
int64_t CountSends(const std::vector<Action>& actions);

// One row per rank, one column per time slot of the simulation with unit costs (a full
// backward spans two slots, "B" in both): "F0.3", "B0.3", "I0.3", "W0.3", "." when idle;
// then a summary line with the bubble fraction and each rank's peak activations. A schedule
// that fails Check prints its error instead.
std::string FormatScheduleTable(const PipelineSchedule& schedule);

}  // namespace plait::wrap::pp

#endif  // PLAIT_WRAP_PP_SCHEDULE_H_
