#include "wrap/pp/schedule.h"

#include <algorithm>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace plait::wrap::pp {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::base::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr ScheduleKind kOneStagePerRank[] = {ScheduleKind::kGPipe, ScheduleKind::k1F1B,
                                             ScheduleKind::kZeroBubbleH1};

PipelineSchedule Build(ScheduleKind kind, int p, int v, int m) {
  absl::StatusOr<PipelineSchedule> schedule = BuildSchedule(kind, p, v, m);
  EXPECT_THAT(schedule, IsOk());
  return schedule.ok() ? *schedule : PipelineSchedule{};
}

// With F = B = W = 1 (a full backward 2).
SimulationResult Simulated(ScheduleKind kind, int p, int v, int m) {
  absl::StatusOr<SimulationResult> result = Simulate(Build(kind, p, v, m));
  EXPECT_THAT(result, IsOk());
  return result.ok() ? *result : SimulationResult{};
}

std::string Names(const std::vector<Action>& actions) {
  return absl::StrJoin(actions, " ", [](std::string* out, const Action& action) {
    absl::StrAppend(out, ActionName(action));
  });
}

std::vector<int> Peaks(const SimulationResult& result) {
  std::vector<int> peaks;
  for (const RankTimeline& rank : result.ranks) peaks.push_back(rank.peak_activations);
  return peaks;
}

TEST(ScheduleKindTest, NamesRoundTrip) {
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B,
                            ScheduleKind::kInterleaved1F1B, ScheduleKind::kZeroBubbleH1}) {
    absl::StatusOr<ScheduleKind> parsed = ScheduleKindFromName(ScheduleKindName(kind));
    ASSERT_THAT(parsed, IsOk());
    EXPECT_EQ(*parsed, kind);
  }
  EXPECT_EQ(ScheduleKindName(ScheduleKind::kZeroBubbleH1), "ZB_H1");
  EXPECT_THAT(ScheduleKindFromName("1f1b"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("\"1f1b\""), HasSubstr("GPIPE, 1F1B, INTERLEAVED_1F1B"))));
}

TEST(ActionTest, NamesAsPyTorchPrintsThem) {
  EXPECT_EQ(ActionName({ActionType::kForward, 0, 3}), "F0.3");
  EXPECT_EQ(ActionName({ActionType::kBackward, 2, 1}), "B2.1");
  EXPECT_EQ(ActionName({ActionType::kBackwardInput, 2, 1}), "I2.1");
  EXPECT_EQ(ActionName({ActionType::kBackwardWeight, 2, 1}), "W2.1");
  EXPECT_EQ(ActionName({ActionType::kSendActivation, 0, 3, 1}), "SEND_F0.3->1");
  EXPECT_EQ(ActionName({ActionType::kReceiveActivation, 1, 3, 0}), "RECV_F1.3<-0");
  EXPECT_EQ(ActionName({ActionType::kSendGradient, 1, 3, 0}), "SEND_B1.3->0");
  EXPECT_EQ(ActionName({ActionType::kReceiveGradient, 0, 3, 1}), "RECV_B0.3<-1");
}

TEST(BuildScheduleTest, EveryOneStageScheduleChecks) {
  for (ScheduleKind kind : kOneStagePerRank) {
    for (int p : {1, 2, 3, 4, 8}) {
      for (int m : {1, 2, 3, 4, 5, 8, 9, 16}) {
        SCOPED_TRACE(absl::StrCat(ScheduleKindName(kind), " p=", p, " m=", m));
        const PipelineSchedule schedule = Build(kind, p, 1, m);
        EXPECT_THAT(Check(schedule), IsOk());
        // Each rank computes m forwards and m backwards (ZB-H1: m input and m weight
        // gradients), and talks to each neighbour once per micro-batch and direction.
        for (int rank = 0; rank < p; ++rank) {
          const int neighbours = (rank > 0) + (rank < p - 1);
          const int compute = kind == ScheduleKind::kZeroBubbleH1 ? 3 * m : 2 * m;
          EXPECT_EQ(schedule.ranks[rank].size(), compute + 2 * neighbours * m) << rank;
        }
      }
    }
  }
}

TEST(BuildScheduleTest, EveryInterleavedScheduleChecks) {
  for (int p : {1, 2, 3, 4}) {
    for (int v : {2, 3, 4}) {
      for (int groups : {1, 2, 3, 4}) {
        const int m = groups * p;
        SCOPED_TRACE(absl::StrCat("p=", p, " v=", v, " m=", m));
        const PipelineSchedule schedule = Build(ScheduleKind::kInterleaved1F1B, p, v, m);
        EXPECT_THAT(Check(schedule), IsOk());
        for (int rank = 0; rank < p; ++rank) {
          // Every stage but the first receives activations and sends gradients, every stage
          // but the last the reverse, when its neighbour is on another rank (p > 1).
          int communication = 0;
          for (int s = rank; s < p * v; s += p) communication += 2 * ((s > 0) + (s < p * v - 1));
          if (p == 1) communication = 0;
          EXPECT_EQ(schedule.ranks[rank].size(), (2 * v + communication) * m) << rank;
        }
      }
    }
  }
}

TEST(BuildScheduleTest, OneRankHasNoCommunication) {
  for (const auto& [kind, v] :
       {std::pair{ScheduleKind::k1F1B, 1}, std::pair{ScheduleKind::kInterleaved1F1B, 3}}) {
    const PipelineSchedule schedule = Build(kind, 1, v, 2);
    for (const Action& action : schedule.ranks[0]) EXPECT_TRUE(action.is_compute()) << action;
  }
  // Groups of p = 1 micro-batch: warm-up (v - 1) p = 1 forward, then the last stage's
  // backward right after its forward.
  EXPECT_EQ(Names(Build(ScheduleKind::kInterleaved1F1B, 1, 2, 2).ranks[0]),
            "F0.0 F1.0 B1.0 F0.1 B0.0 F1.1 B1.1 B0.1");
}

// PipeDream-flush with p = 2, m = 3: rank 0 warms up with one forward, rank 1 (the loss stage)
// with none; each forward's activation goes down and each backward's gradient comes back.
TEST(BuildScheduleTest, OneFOneBTwoRanksThreeMicrobatches) {
  const PipelineSchedule schedule = Build(ScheduleKind::k1F1B, 2, 1, 3);
  EXPECT_EQ(Names(schedule.ranks[0]),
            "F0.0 SEND_F0.0->1 "
            "F0.1 SEND_F0.1->1 RECV_B0.0<-1 B0.0 "
            "F0.2 SEND_F0.2->1 RECV_B0.1<-1 B0.1 "
            "RECV_B0.2<-1 B0.2");
  EXPECT_EQ(Names(schedule.ranks[1]),
            "RECV_F1.0<-0 F1.0 B1.0 SEND_B1.0->0 "
            "RECV_F1.1<-0 F1.1 B1.1 SEND_B1.1->0 "
            "RECV_F1.2<-0 F1.2 B1.2 SEND_B1.2->0");
}

// Megatron's interleaving with p = 2, v = 2 (stages 0 and 2 on rank 0, 1 and 3 on rank 1),
// m = 2: rank 0 warms up with 2 (p - 1 - 0) + (v - 1) p = 4 forwards, all it has; rank 1 with
// (v - 1) p = 2, then one forward and one backward (of its last stage first) per step.
TEST(BuildScheduleTest, InterleavedTwoRanksTwoStagesEach) {
  const PipelineSchedule schedule = Build(ScheduleKind::kInterleaved1F1B, 2, 2, 2);
  EXPECT_EQ(Names(schedule.ranks[0]),
            "F0.0 SEND_F0.0->1 F0.1 SEND_F0.1->1 "
            "RECV_F2.0<-1 F2.0 SEND_F2.0->3 RECV_F2.1<-1 F2.1 SEND_F2.1->3 "
            "RECV_B2.0<-3 B2.0 SEND_B2.0->1 RECV_B2.1<-3 B2.1 SEND_B2.1->1 "
            "RECV_B0.0<-1 B0.0 RECV_B0.1<-1 B0.1");
  EXPECT_EQ(Names(schedule.ranks[1]),
            "RECV_F1.0<-0 F1.0 SEND_F1.0->2 RECV_F1.1<-0 F1.1 SEND_F1.1->2 "
            "RECV_F3.0<-2 F3.0 B3.0 SEND_B3.0->2 RECV_F3.1<-2 F3.1 B3.1 SEND_B3.1->2 "
            "RECV_B1.0<-2 B1.0 SEND_B1.0->0 RECV_B1.1<-2 B1.1 SEND_B1.1->0");
}

// ZB-H1 with p = 2, m = 2: rank 1 defers its first weight gradient by one step (its rank).
TEST(BuildScheduleTest, ZeroBubbleDefersWeightGradients) {
  const PipelineSchedule schedule = Build(ScheduleKind::kZeroBubbleH1, 2, 1, 2);
  EXPECT_EQ(Names(schedule.ranks[0]),
            "F0.0 SEND_F0.0->1 F0.1 SEND_F0.1->1 RECV_B0.0<-1 I0.0 W0.0 RECV_B0.1<-1 I0.1 W0.1");
  EXPECT_EQ(Names(schedule.ranks[1]),
            "RECV_F1.0<-0 F1.0 I1.0 SEND_B1.0->0 RECV_F1.1<-0 F1.1 I1.1 SEND_B1.1->0 W1.0 W1.1");
}

// GPipe and 1F1B both idle (p - 1) (F + B) on every rank: the forward of micro-batch 0 needs
// p - 1 hops to reach the last rank and its backward as many to come back.
TEST(SimulateTest, GPipeAndOneFOneBBubble) {
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B}) {
    for (int p : {1, 2, 4, 8}) {
      for (int m : {1, 3, 4, 8, 9}) {
        SCOPED_TRACE(absl::StrCat(ScheduleKindName(kind), " p=", p, " m=", m));
        const SimulationResult result = Simulated(kind, p, 1, m);
        EXPECT_DOUBLE_EQ(result.makespan, 3.0 * (m + p - 1));
        EXPECT_DOUBLE_EQ(result.bubble_fraction, (p - 1.0) / (m + p - 1));
        for (const RankTimeline& rank : result.ranks) EXPECT_DOUBLE_EQ(rank.busy, 3.0 * m);
      }
    }
  }
}

// Megatron's interleaved bubble: the same p - 1 hops, each stage 1/v of the work, so with unit
// costs per stage (p - 1) (F + B) idle against v m (F + B) of work on each rank.
TEST(SimulateTest, InterleavedBubble) {
  for (int p : {2, 4}) {
    for (int v : {2, 3}) {
      for (int groups : {1, 2, 4}) {
        const int m = groups * p;
        SCOPED_TRACE(absl::StrCat("p=", p, " v=", v, " m=", m));
        const SimulationResult result = Simulated(ScheduleKind::kInterleaved1F1B, p, v, m);
        EXPECT_DOUBLE_EQ(result.makespan, 3.0 * (v * m + p - 1));
        EXPECT_DOUBLE_EQ(result.bubble_fraction, (p - 1.0) / (v * m + p - 1));
      }
    }
  }
}

// p = 4, m = 8, F = B = W = 1, each rank 24 units of work. Rank 0 forwards micro-batches 0..3
// in slots 0-3; micro-batch 0's forward reaches rank 3 in slot 3 and its input gradient comes
// back through ranks 3, 2, 1 in slots 4, 5, 6, so rank 0 idles slots 4-6 and runs I0.0 in slot
// 7; from there every rank is busy until the deferred weight gradients end at 24 + 3 = 27
// (the paper's (p - 1)(F + B - W) bubble). Bubble 4 * 3 / (4 * 27) = 1/9, against 1F1B's
// 3/11.
TEST(SimulateTest, ZeroBubbleH1BubbleByHand) {
  const SimulationResult result = Simulated(ScheduleKind::kZeroBubbleH1, 4, 1, 8);
  EXPECT_DOUBLE_EQ(result.makespan, 27);
  EXPECT_DOUBLE_EQ(result.bubble_fraction, 1.0 / 9);
  const RankTimeline& rank0 = result.ranks[0];
  ASSERT_GE(rank0.compute.size(), 5u);
  EXPECT_EQ(rank0.compute[4].action, (Action{ActionType::kBackwardInput, 0, 0}));
  EXPECT_DOUBLE_EQ(rank0.compute[4].start, 7);
}

TEST(SimulateTest, ZeroBubbleH1BeatsOneFOneB) {
  for (int p : {2, 3, 4, 8}) {
    for (int m : {p, 2 * p, 3 * p + 1}) {
      SCOPED_TRACE(absl::StrCat("p=", p, " m=", m));
      EXPECT_LT(Simulated(ScheduleKind::kZeroBubbleH1, p, 1, m).bubble_fraction,
                Simulated(ScheduleKind::k1F1B, p, 1, m).bubble_fraction);
    }
  }
}

TEST(SimulateTest, PeakActivations) {
  for (int p : {1, 2, 4, 8}) {
    for (int m : {1, 3, 4, 8, 9}) {
      SCOPED_TRACE(absl::StrCat("p=", p, " m=", m));
      std::vector<int> gpipe(p, m), one_f_one_b;
      for (int rank = 0; rank < p; ++rank) one_f_one_b.push_back(std::min(m, p - rank));
      EXPECT_EQ(Peaks(Simulated(ScheduleKind::kGPipe, p, 1, m)), gpipe);
      EXPECT_EQ(Peaks(Simulated(ScheduleKind::k1F1B, p, 1, m)), one_f_one_b);
      EXPECT_EQ(Peaks(Simulated(ScheduleKind::kZeroBubbleH1, p, 1, m)), one_f_one_b);
    }
  }
}

// Megatron: rank r holds its 2 (p - 1 - r) + (v - 1) p warm-up forwards and one more, each a
// stage's, 1/v of the rank's layers; on rank 0 that is p + (p - 1) / v micro-batches of the
// whole rank's activations, the (1 + (p - 1) / (p v)) p of Korthikanti et al. 2022.
TEST(SimulateTest, InterleavedPeakActivations) {
  for (int p : {2, 4}) {
    for (int v : {2, 3}) {
      for (int groups : {1, 2, 4}) {
        const int m = groups * p;
        SCOPED_TRACE(absl::StrCat("p=", p, " v=", v, " m=", m));
        const std::vector<int> peaks = Peaks(Simulated(ScheduleKind::kInterleaved1F1B, p, v, m));
        for (int rank = 0; rank < p; ++rank) {
          EXPECT_EQ(peaks[rank], std::min(2 * (p - 1 - rank) + (v - 1) * p + 1, v * m)) << rank;
        }
      }
    }
  }
  const SimulationResult result = Simulated(ScheduleKind::kInterleaved1F1B, 4, 2, 8);
  EXPECT_DOUBLE_EQ(result.ranks[0].peak_activations / 2.0, 4 + 3.0 / 2);
}

TEST(SimulateTest, ZeroBubbleDefersAtMostRankPlusOneWeightGradients) {
  const SimulationResult result = Simulated(ScheduleKind::kZeroBubbleH1, 4, 1, 8);
  std::vector<int> pending;
  for (const RankTimeline& rank : result.ranks) {
    pending.push_back(rank.peak_pending_weight_gradients);
  }
  EXPECT_THAT(pending, ElementsAre(1, 2, 3, 4));
}

// The paper's memory claim: counting a micro-batch from its forward to its weight gradient,
// no ZB-H1 rank holds more than 1F1B's peak, p (on its rank 0).
TEST(SimulateTest, ZeroBubbleH1HoldsNoMoreThanOneFOneB) {
  for (int p : {2, 3, 4, 8}) {
    for (int m : {1, p, 2 * p + 1}) {
      SCOPED_TRACE(absl::StrCat("p=", p, " m=", m));
      int peak = 0;
      for (const RankTimeline& rank : Simulated(ScheduleKind::kZeroBubbleH1, p, 1, m).ranks) {
        int held = 0;
        for (const TimedAction& timed : rank.compute) {
          if (timed.action.type == ActionType::kForward) ++held;
          if (timed.action.type == ActionType::kBackwardWeight) --held;
          peak = std::max(peak, held);
        }
      }
      EXPECT_EQ(peak, std::min(m, p));
    }
  }
}

TEST(FormatScheduleTableTest, OneFOneBTwoRanks) {
  // Rank 1's B1.0 ends at 4, so rank 0 runs B0.0 in 4-5; B1.1 (5-6) lets B0.1 run in 7-8.
  EXPECT_EQ(FormatScheduleTable(Build(ScheduleKind::k1F1B, 2, 1, 2)),
            "rank 0 | F0.0 F0.1 .    .    B0.0 B0.0 .    B0.1 B0.1\n"
            "rank 1 | .    F1.0 B1.0 B1.0 F1.1 B1.1 B1.1 .    .\n"
            "1F1B p=2 v=1 m=2: 9 slots, bubble 33.3%, peak stage activations held per rank "
            "2 1\n");
}

TEST(FormatScheduleTableTest, PrintsTheErrorOfABrokenSchedule) {
  PipelineSchedule schedule = Build(ScheduleKind::k1F1B, 2, 1, 1);
  schedule.ranks[1].pop_back();  // SEND_B1.0->0
  EXPECT_THAT(FormatScheduleTable(schedule),
              AllOf(HasSubstr("1F1B p=2 v=1 m=1: invalid: deadlock"), HasSubstr("RECV_B0.0<-1")));
}

TEST(CheckTest, ReceiveWithoutSendDeadlocks) {
  PipelineSchedule schedule{ScheduleKind::k1F1B, 2, 1, 1, {}};
  schedule.ranks = {
      {{ActionType::kForward, 0, 0},
       {ActionType::kSendActivation, 0, 0, 1},
       {ActionType::kReceiveGradient, 0, 0, 1},
       {ActionType::kBackward, 0, 0}},
      {{ActionType::kReceiveActivation, 1, 0, 0},
       {ActionType::kForward, 1, 0},
       {ActionType::kBackward, 1, 0}},
  };
  EXPECT_THAT(Check(schedule),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("deadlock: rank 0, action 2 (RECV_B0.0<-1) waits for "
                                       "micro-batch 0's gradient from rank 1, which has "
                                       "finished without sending it"))));
}

TEST(CheckTest, ReceivesWaitingForEachOtherDeadlock) {
  PipelineSchedule schedule = Build(ScheduleKind::k1F1B, 2, 1, 2);
  // Rank 0 waits for micro-batch 0's gradient before sending micro-batch 0's activation.
  std::vector<Action>& rank0 = schedule.ranks[0];
  rank0 = {{ActionType::kForward, 0, 0},
           {ActionType::kReceiveGradient, 0, 0, 1},
           {ActionType::kSendActivation, 0, 0, 1},
           {ActionType::kBackward, 0, 0},
           {ActionType::kForward, 0, 1},
           {ActionType::kSendActivation, 0, 1, 1},
           {ActionType::kReceiveGradient, 0, 1, 1},
           {ActionType::kBackward, 0, 1}};
  EXPECT_THAT(Check(schedule),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("rank 0, action 1 (RECV_B0.0<-1)"),
                             HasSubstr("rank 1, action 0 (RECV_F1.0<-0) waits for micro-batch "
                                       "0's activation from rank 0, which is blocked itself"))));
}

TEST(CheckTest, MissingBackward) {
  PipelineSchedule schedule = Build(ScheduleKind::kGPipe, 1, 1, 3);
  schedule.ranks[0].pop_back();  // B0.2
  EXPECT_THAT(Check(schedule),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("rank 0 never runs the backward of stage 0, micro-batch 2")));
}

TEST(CheckTest, MissingWeightGradient) {
  PipelineSchedule schedule = Build(ScheduleKind::kZeroBubbleH1, 2, 1, 2);
  schedule.ranks[1].pop_back();  // W1.1
  EXPECT_THAT(Check(schedule), StatusIs(absl::StatusCode::kInvalidArgument,
                                        HasSubstr("rank 1 never runs the weight gradient of "
                                                  "stage 1, micro-batch 1 (W1.1)")));
}

TEST(CheckTest, BackwardBeforeForward) {
  PipelineSchedule schedule = Build(ScheduleKind::kGPipe, 1, 1, 2);
  std::swap(schedule.ranks[0][1], schedule.ranks[0][2]);  // F0.0 B0.0 F0.1 B0.1
  std::swap(schedule.ranks[0][0], schedule.ranks[0][1]);  // B0.0 F0.0 F0.1 B0.1
  EXPECT_THAT(Check(schedule),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("rank 0, action 0 (B0.0): backward of micro-batch 0 before its "
                                 "forward")));
}

TEST(CheckTest, WeightGradientBeforeInputGradient) {
  PipelineSchedule schedule = Build(ScheduleKind::kZeroBubbleH1, 1, 1, 1);  // F0.0 I0.0 W0.0
  std::swap(schedule.ranks[0][1], schedule.ranks[0][2]);
  EXPECT_THAT(Check(schedule),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("rank 0, action 1 (W0.0): weight gradient of micro-batch 0 "
                                 "before its input gradient (I0.0)")));
}

TEST(CheckTest, ForwardBeforeItsActivationArrives) {
  PipelineSchedule schedule = Build(ScheduleKind::k1F1B, 2, 1, 1);
  std::swap(schedule.ranks[1][0], schedule.ranks[1][1]);  // F1.0 before RECV_F1.0<-0
  EXPECT_THAT(Check(schedule),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("rank 1, action 0 (F1.0): forward of micro-batch 0 before its "
                                 "activation was received from stage 0")));
}

TEST(CheckTest, ReceivesOutOfSendOrder) {
  PipelineSchedule schedule = Build(ScheduleKind::kGPipe, 2, 1, 2);
  // Rank 1: RECV_F1.0 F1.0 RECV_F1.1 F1.1 ...: take micro-batch 1 first.
  std::vector<Action>& rank1 = schedule.ranks[1];
  std::rotate(rank1.begin(), rank1.begin() + 2, rank1.begin() + 4);
  EXPECT_THAT(Check(schedule),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("rank 1, action 0 (RECV_F1.1<-0): the next tensor rank 0 "
                                 "sent here is rank 0, action 1 (SEND_F0.0->1)")));
}

TEST(CheckTest, ActivationsAndGradientsShareTheirChannel) {
  // On 2 ranks of 2 stages each, rank 0 sends rank 1 both activations (stage 0 to 1, 2 to 3)
  // and gradients (stage 2 to 1): taking a gradient while an activation is first in the
  // channel is refused, as Communicator::Receive would take the activation.
  PipelineSchedule schedule = Build(ScheduleKind::kInterleaved1F1B, 2, 2, 2);
  std::vector<Action>& rank1 = schedule.ranks[1];
  const auto gradient = std::find_if(rank1.begin(), rank1.end(), [](const Action& action) {
    return action.type == ActionType::kReceiveGradient;
  });
  ASSERT_NE(gradient, rank1.end());
  const auto activation = std::find_if(
      std::make_reverse_iterator(gradient), rank1.rend(),
      [](const Action& action) { return action.type == ActionType::kReceiveActivation; });
  ASSERT_NE(activation, rank1.rend());
  // The gradient received just before that activation: each receive still precedes its use.
  const Action moved = *gradient;
  const auto at = activation.base() - 1;
  rank1.erase(gradient);
  rank1.insert(at, moved);
  EXPECT_THAT(Check(schedule),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("receives must come in the order of the sends, activations and "
                                 "gradients alike")));
}

TEST(CheckTest, SendNeverReceived) {
  PipelineSchedule schedule = Build(ScheduleKind::k1F1B, 2, 1, 1);
  schedule.ranks[0].insert(schedule.ranks[0].begin() + 2, {ActionType::kSendActivation, 0, 0, 1});
  EXPECT_THAT(Check(schedule),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("rank 0, action 2 (SEND_F0.0->1): rank 1 never receives "
                                 "micro-batch 0's activation")));
}

TEST(CheckTest, StageOnTheWrongRank) {
  PipelineSchedule schedule = Build(ScheduleKind::k1F1B, 2, 1, 1);
  schedule.ranks[0][0].stage = 1;
  EXPECT_THAT(Check(schedule), StatusIs(absl::StatusCode::kInvalidArgument,
                                        HasSubstr("rank 0, action 0 (F1.0): stage 1 lives on "
                                                  "rank 1, not on rank 0")));
}

// Each micro-batch crosses each stage boundary forward and back: on 2 ranks, 1F1B's first rank
// sends only hidden states and its last only gradients; with 2 stages per rank, rank 0 also
// sends stage 2's hidden states on and its input gradients back.
TEST(CountSendsTest, CountsHiddenStatesAndGradients) {
  const PipelineSchedule one_f_one_b = Build(ScheduleKind::k1F1B, 2, 1, 4);
  EXPECT_EQ(CountSends(one_f_one_b.ranks[0]), 4);
  EXPECT_EQ(CountSends(one_f_one_b.ranks[1]), 4);
  const PipelineSchedule interleaved = Build(ScheduleKind::kInterleaved1F1B, 2, 2, 4);
  EXPECT_EQ(CountSends(interleaved.ranks[0]), 12);
  EXPECT_EQ(CountSends(interleaved.ranks[1]), 12);
}

TEST(BuildScheduleTest, RefusesBadShapes) {
  EXPECT_THAT(BuildSchedule(ScheduleKind::k1F1B, 0, 1, 4),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "1F1B: num_ranks 0: a pipeline needs at least 1 rank"));
  EXPECT_THAT(BuildSchedule(ScheduleKind::kGPipe, 2, 0, 4),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "GPIPE: stages_per_rank 0: each rank needs at least 1 stage"));
  EXPECT_THAT(BuildSchedule(ScheduleKind::kZeroBubbleH1, 2, 1, 0),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "ZB_H1: num_microbatches 0: a step needs at least 1 micro-batch"));
  EXPECT_THAT(BuildSchedule(ScheduleKind::k1F1B, 4, 2, 8),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "1F1B: stages_per_rank 2: 1F1B places 1 stage per rank; more than 1 "
                       "needs INTERLEAVED_1F1B"));
  EXPECT_THAT(BuildSchedule(ScheduleKind::kZeroBubbleH1, 4, 2, 8),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("stages_per_rank 2")));
  EXPECT_THAT(BuildSchedule(ScheduleKind::kInterleaved1F1B, 4, 1, 8),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "INTERLEAVED_1F1B: stages_per_rank 1: INTERLEAVED_1F1B needs at least 2 "
                       "stages per rank; with 1 it is 1F1B, ask for that"));
  EXPECT_THAT(BuildSchedule(ScheduleKind::kInterleaved1F1B, 4, 2, 6),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "INTERLEAVED_1F1B: num_microbatches 6 is not a multiple of the 4 "
                       "pipeline ranks; INTERLEAVED_1F1B runs micro-batches through each stage "
                       "in groups of num_ranks (Megatron's order), so it needs a multiple"));
}

}  // namespace
}  // namespace plait::wrap::pp
