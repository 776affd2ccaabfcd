#include "wrap/pp/schedule.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/status.h"

namespace plait::wrap::pp {
namespace {

constexpr ScheduleKind kAllKinds[] = {ScheduleKind::kGPipe, ScheduleKind::k1F1B,
                                      ScheduleKind::kInterleaved1F1B, ScheduleKind::kZeroBubbleH1};

// How one rank orders its compute in the 1F1B family, which GPipe, 1F1B, interleaved 1F1B and
// ZB-H1 all are (PyTorch's _get_1f1b_rank_ops): `warmup` forwards, then one forward and one
// backward per step while forwards remain, then the remaining backwards. Forward k goes to the
// rank's local stage (k / p) % v and backward k to local stage v - 1 - (k / p) % v, each stage
// taking its micro-batches in order (Megatron's groups of p). With `split_backward` each
// backward is kBackwardInput, and the weight gradients follow, oldest first, one per step
// once `weight_delay` backwards have run, the rest at the end (ZB-H1).
struct RankOrder {
  int warmup = 0;
  bool split_backward = false;
  int weight_delay = 0;
};

std::vector<Action> ComputeOrder(const PipelineSchedule& schedule, int rank,
                                 const RankOrder& order) {
  const int p = schedule.num_ranks;
  const int v = schedule.stages_per_rank;
  const int total = v * schedule.num_microbatches;
  std::vector<int> next_forward(v, 0);
  std::vector<int> next_backward(v, 0);
  std::deque<Action> pending_weights;
  std::vector<Action> actions;
  for (int step = 0; step < total + order.warmup; ++step) {
    if (step < total) {
      const int local = (step / p) % v;
      actions.push_back({ActionType::kForward, local * p + rank, next_forward[local]++});
    }
    if (step < order.warmup) continue;
    const int backward = step - order.warmup;
    const int local = v - 1 - (backward / p) % v;
    const Action input{order.split_backward ? ActionType::kBackwardInput : ActionType::kBackward,
                       local * p + rank, next_backward[local]++};
    actions.push_back(input);
    if (!order.split_backward) continue;
    pending_weights.push_back({ActionType::kBackwardWeight, input.stage, input.microbatch});
    if (backward >= order.weight_delay) {
      actions.push_back(pending_weights.front());
      pending_weights.pop_front();
    }
  }
  actions.insert(actions.end(), pending_weights.begin(), pending_weights.end());
  return actions;
}

RankOrder OrderOf(const PipelineSchedule& schedule, int rank) {
  const int p = schedule.num_ranks;
  const int v = schedule.stages_per_rank;
  const int m = schedule.num_microbatches;
  switch (schedule.kind) {
    case ScheduleKind::kGPipe:
      return {m};  // every forward is warm-up
    case ScheduleKind::k1F1B:
      return {std::min(p - 1 - rank, m)};
    case ScheduleKind::kInterleaved1F1B:
      // Megatron: the last rank warms up through its first v - 1 stages (p micro-batches each);
      // each hop from it adds two forwards, as the first gradient comes a hop down and back.
      return {std::min(2 * (p - 1 - rank) + (v - 1) * p, v * m)};
    case ScheduleKind::kZeroBubbleH1:
      // Qi et al.: 1F1B's forwards and input gradients, so 1F1B's activations; rank r defers
      // its first r weight gradients into the cool-down, where 1F1B idles. No rank then holds
      // more than p micro-batches short of their W, 1F1B's peak (on rank 0).
      return {std::min(p - 1 - rank, m), /*split_backward=*/true, /*weight_delay=*/rank};
  }
  return {};
}

// `compute` with a receive before each compute whose input comes from another rank and a send
// after each compute whose output goes to another rank.
std::vector<Action> WithCommunication(const PipelineSchedule& schedule, int rank,
                                      const std::vector<Action>& compute) {
  const int last = schedule.num_stages() - 1;
  auto remote = [&](int stage) { return schedule.RankOf(stage) != rank; };
  std::vector<Action> actions;
  for (const Action& action : compute) {
    const int s = action.stage;
    const int mb = action.microbatch;
    switch (action.type) {
      case ActionType::kForward:
        if (s > 0 && remote(s - 1)) {
          actions.push_back({ActionType::kReceiveActivation, s, mb, s - 1});
        }
        actions.push_back(action);
        if (s < last && remote(s + 1)) {
          actions.push_back({ActionType::kSendActivation, s, mb, s + 1});
        }
        break;
      case ActionType::kBackward:
      case ActionType::kBackwardInput:
        if (s < last && remote(s + 1)) {
          actions.push_back({ActionType::kReceiveGradient, s, mb, s + 1});
        }
        actions.push_back(action);
        if (s > 0 && remote(s - 1)) {
          actions.push_back({ActionType::kSendGradient, s, mb, s - 1});
        }
        break;
      default:
        actions.push_back(action);
    }
  }
  return actions;
}

absl::Status ValidateShape(ScheduleKind kind, int num_ranks, int stages_per_rank,
                           int num_microbatches) {
  const absl::string_view name = ScheduleKindName(kind);
  if (num_ranks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_ranks ", num_ranks, ": a pipeline needs at least 1 rank"));
  }
  if (stages_per_rank < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("stages_per_rank ", stages_per_rank, ": each rank needs at least 1 stage"));
  }
  if (num_microbatches < 1) {
    return absl::InvalidArgumentError(absl::StrCat("num_microbatches ", num_microbatches,
                                                   ": a step needs at least 1 micro-batch"));
  }
  if (kind == ScheduleKind::kInterleaved1F1B) {
    if (stages_per_rank < 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("stages_per_rank ", stages_per_rank, ": ", name,
                       " needs at least 2 stages per rank; with 1 it is 1F1B, ask for that"));
    }
    if (num_microbatches % num_ranks != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "num_microbatches ", num_microbatches, " is not a multiple of the ", num_ranks,
          " pipeline ranks; ", name,
          " runs micro-batches through each stage in groups of num_ranks (Megatron's order), "
          "so it needs a multiple"));
    }
  } else if (stages_per_rank != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("stages_per_rank ", stages_per_rank, ": ", name,
                     " places 1 stage per rank; more than 1 needs INTERLEAVED_1F1B"));
  }
  return absl::OkStatus();
}

// ---- Checking and executing a schedule.

bool IsBackwardInput(ActionType type) {
  return type == ActionType::kBackward || type == ActionType::kBackwardInput;
}

bool IsGradientChannel(ActionType type) {
  return type == ActionType::kSendGradient || type == ActionType::kReceiveGradient;
}

std::string Where(int rank, int index, const Action& action) {
  return absl::StrCat("rank ", rank, ", action ", index, " (", ActionName(action), ")");
}

absl::Status Error(int rank, int index, const Action& action, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(Where(rank, index, action), ": ", what));
}

// OK when `action`'s stage and micro-batch exist, its stage lives on `rank`, and a
// communication's peer is the neighbour its kind names, on another rank.
absl::Status CheckAction(const PipelineSchedule& schedule, int rank, int index,
                         const Action& action) {
  const int stages = schedule.num_stages();
  if (action.stage < 0 || action.stage >= stages) {
    return Error(rank, index, action,
                 absl::StrCat("stage ", action.stage, " is outside 0..", stages - 1));
  }
  if (action.microbatch < 0 || action.microbatch >= schedule.num_microbatches) {
    return Error(rank, index, action,
                 absl::StrCat("micro-batch ", action.microbatch, " is outside 0..",
                              schedule.num_microbatches - 1));
  }
  if (schedule.RankOf(action.stage) != rank) {
    return Error(rank, index, action,
                 absl::StrCat("stage ", action.stage, " lives on rank ",
                              schedule.RankOf(action.stage), ", not on rank ", rank));
  }
  if (action.is_compute()) return absl::OkStatus();
  const bool downstream =
      action.type == ActionType::kSendActivation || action.type == ActionType::kReceiveGradient;
  const int peer = action.stage + (downstream ? 1 : -1);
  if (action.peer_stage != peer || peer < 0 || peer >= stages) {
    return Error(rank, index, action,
                 absl::StrCat("stage ", action.stage, " exchanges this only with stage ", peer,
                              peer < 0 || peer >= stages ? ", which does not exist" : ""));
  }
  if (schedule.RankOf(peer) == rank) {
    return Error(rank, index, action,
                 absl::StrCat("stages ", action.stage, " and ", peer, " share rank ", rank,
                              " and hand over without communication"));
  }
  return absl::OkStatus();
}

using StageMicrobatch = std::pair<int, int>;

// What one rank has done so far, for the order checks.
struct RankState {
  std::set<StageMicrobatch> forwarded, input_gradient_done, received_activation, received_gradient;
};

// What each (stage, micro-batch) has run, over all ranks.
struct Counts {
  int forward = 0;
  int backward = 0;
  int backward_input = 0;
  int backward_weight = 0;
};

absl::Status CheckOrder(const PipelineSchedule& schedule, int rank, int index, const Action& action,
                        RankState& state, std::map<StageMicrobatch, Counts>& counts) {
  const int s = action.stage;
  const int mb = action.microbatch;
  const StageMicrobatch key{s, mb};
  const int last = schedule.num_stages() - 1;
  auto fail = [&](absl::string_view what) { return Error(rank, index, action, what); };
  Counts& count = counts[key];
  switch (action.type) {
    case ActionType::kForward:
      if (++count.forward > 1) return fail(absl::StrCat("micro-batch ", mb, " forwarded twice"));
      if (s > 0) {
        const bool local = schedule.RankOf(s - 1) == rank;
        if (local ? !state.forwarded.count({s - 1, mb}) : !state.received_activation.count(key)) {
          return fail(absl::StrCat("forward of micro-batch ", mb, " before its activation ",
                                   local ? "was computed by" : "was received from", " stage ",
                                   s - 1));
        }
      }
      state.forwarded.insert(key);
      return absl::OkStatus();
    case ActionType::kBackward:
    case ActionType::kBackwardInput: {
      ++(action.type == ActionType::kBackward ? count.backward : count.backward_input);
      if (count.backward + count.backward_input > 1) {
        return fail(absl::StrCat("micro-batch ", mb, " runs its backward twice"));
      }
      if (!state.forwarded.count(key)) {
        return fail(absl::StrCat("backward of micro-batch ", mb, " before its forward"));
      }
      if (s < last) {
        const bool local = schedule.RankOf(s + 1) == rank;
        if (local ? !state.input_gradient_done.count({s + 1, mb})
                  : !state.received_gradient.count(key)) {
          return fail(absl::StrCat("backward of micro-batch ", mb, " before its gradient ",
                                   local ? "was computed by" : "was received from", " stage ",
                                   s + 1));
        }
      }
      state.input_gradient_done.insert(key);
      return absl::OkStatus();
    }
    case ActionType::kBackwardWeight:
      if (++count.backward_weight > 1) {
        return fail(absl::StrCat("weight gradient of micro-batch ", mb, " computed twice"));
      }
      if (count.backward_input == 0) {
        return fail(absl::StrCat("weight gradient of micro-batch ", mb,
                                 " before its input gradient (I", s, ".", mb, ")"));
      }
      return absl::OkStatus();
    case ActionType::kSendActivation:
      if (!state.forwarded.count(key)) {
        return fail(absl::StrCat("sends micro-batch ", mb, "'s activation before its forward"));
      }
      return absl::OkStatus();
    case ActionType::kSendGradient:
      if (!state.input_gradient_done.count(key)) {
        return fail(absl::StrCat("sends micro-batch ", mb, "'s gradient before its backward"));
      }
      return absl::OkStatus();
    case ActionType::kReceiveActivation:
      state.received_activation.insert(key);
      return absl::OkStatus();
    case ActionType::kReceiveGradient:
      state.received_gradient.insert(key);
      return absl::OkStatus();
  }
  return absl::OkStatus();
}

absl::Status CheckComplete(const PipelineSchedule& schedule,
                           const std::map<StageMicrobatch, Counts>& counts) {
  for (int s = 0; s < schedule.num_stages(); ++s) {
    for (int mb = 0; mb < schedule.num_microbatches; ++mb) {
      const auto found = counts.find({s, mb});
      const Counts count = found == counts.end() ? Counts{} : found->second;
      const std::string where = absl::StrCat("rank ", schedule.RankOf(s), " never runs the ");
      if (count.forward == 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, "forward of stage ", s, ", micro-batch ", mb, " (F", s, ".", mb, ")"));
      }
      if (count.backward + count.backward_input == 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, "backward of stage ", s, ", micro-batch ", mb, " (B", s, ".", mb,
                         ", or I", s, ".", mb, " and W", s, ".", mb, ")"));
      }
      if (count.backward_input == 1 && count.backward_weight == 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, "weight gradient of stage ", s, ", micro-batch ", mb, " (W", s, ".", mb, ")"));
      }
    }
  }
  return absl::OkStatus();
}

// A sent tensor waiting in its channel.
struct Message {
  Action send;
  int index = 0;  // in the sender's list
  double time = 0;
};

// The channel a communication action uses: (sender rank, receiver rank), activations and
// gradients in one order, as Communicator::Send and Receive match them.
using Channel = std::pair<int, int>;

Channel ChannelOf(const PipelineSchedule& schedule, int rank, const Action& action) {
  const int peer = schedule.RankOf(action.peer_stage);
  const bool sends =
      action.type == ActionType::kSendActivation || action.type == ActionType::kSendGradient;
  return sends ? Channel{rank, peer} : Channel{peer, rank};
}

double CostOf(const ActionCosts& costs, ActionType type) {
  switch (type) {
    case ActionType::kForward:
      return costs.forward;
    case ActionType::kBackward:
      return costs.backward_input + costs.backward_weight;
    case ActionType::kBackwardInput:
      return costs.backward_input;
    case ActionType::kBackwardWeight:
      return costs.backward_weight;
    default:
      return 0;
  }
}

// Runs every rank's list as far as its receives allow, over and over, until all finish; a
// round in which no rank moves is a deadlock. A rank's clock moves by each compute's cost and
// to a message's send time when it waits for it; its timeline does not depend on the order in
// which ranks are advanced.
absl::StatusOr<SimulationResult> Execute(const PipelineSchedule& schedule,
                                         const ActionCosts& costs) {
  const int p = schedule.num_ranks;
  std::vector<size_t> next(p, 0);
  std::vector<double> clock(p, 0);
  std::map<Channel, std::deque<Message>> channels;
  SimulationResult result;
  result.ranks.resize(p);
  std::vector<int> activations(p, 0), pending_weights(p, 0);
  for (bool moved = true; moved;) {
    moved = false;
    for (int rank = 0; rank < p; ++rank) {
      const std::vector<Action>& actions = schedule.ranks[rank];
      RankTimeline& timeline = result.ranks[rank];
      for (; next[rank] < actions.size(); ++next[rank], moved = true) {
        const int index = static_cast<int>(next[rank]);
        const Action& action = actions[index];
        switch (action.type) {
          case ActionType::kSendActivation:
          case ActionType::kSendGradient:
            channels[ChannelOf(schedule, rank, action)].push_back({action, index, clock[rank]});
            continue;
          case ActionType::kReceiveActivation:
          case ActionType::kReceiveGradient: {
            std::deque<Message>& channel = channels[ChannelOf(schedule, rank, action)];
            if (channel.empty()) break;
            const Message& message = channel.front();
            if (IsGradientChannel(message.send.type) != IsGradientChannel(action.type) ||
                message.send.peer_stage != action.stage ||
                message.send.stage != action.peer_stage ||
                message.send.microbatch != action.microbatch) {
              return Error(
                  rank, index, action,
                  absl::StrCat(
                      "the next tensor rank ", schedule.RankOf(action.peer_stage), " sent here is ",
                      Where(schedule.RankOf(action.peer_stage), message.index, message.send),
                      "; receives must come in the order of the sends, activations and "
                      "gradients alike"));
            }
            clock[rank] = std::max(clock[rank], message.time);
            channel.pop_front();
            continue;
          }
          default: {
            const double start = clock[rank];
            clock[rank] += CostOf(costs, action.type);
            timeline.compute.push_back({action, start, clock[rank]});
            timeline.busy += clock[rank] - start;
            if (action.type == ActionType::kForward) ++activations[rank];
            if (IsBackwardInput(action.type)) --activations[rank];
            if (action.type == ActionType::kBackwardInput) ++pending_weights[rank];
            if (action.type == ActionType::kBackwardWeight) --pending_weights[rank];
            timeline.peak_activations = std::max(timeline.peak_activations, activations[rank]);
            timeline.peak_pending_weight_gradients =
                std::max(timeline.peak_pending_weight_gradients, pending_weights[rank]);
            continue;
          }
        }
        break;  // blocked on an empty channel
      }
    }
  }
  std::vector<std::string> blocked;
  for (int rank = 0; rank < p; ++rank) {
    if (next[rank] == schedule.ranks[rank].size()) continue;
    const Action& action = schedule.ranks[rank][next[rank]];
    const int peer = schedule.RankOf(action.peer_stage);
    blocked.push_back(absl::StrCat(
        Where(rank, static_cast<int>(next[rank]), action), " waits for micro-batch ",
        action.microbatch, "'s ", IsGradientChannel(action.type) ? "gradient" : "activation",
        " from rank ", peer,
        next[peer] == schedule.ranks[peer].size() ? ", which has finished without sending it"
                                                  : ", which is blocked itself"));
  }
  if (!blocked.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("deadlock: ", absl::StrJoin(blocked, "; ")));
  }
  for (const auto& [channel, messages] : channels) {
    if (messages.empty()) continue;
    const Message& message = messages.front();
    return Error(channel.first, message.index, message.send,
                 absl::StrCat("rank ", channel.second, " never receives micro-batch ",
                              message.send.microbatch, "'s ",
                              IsGradientChannel(message.send.type) ? "gradient" : "activation"));
  }
  for (const RankTimeline& timeline : result.ranks) {
    if (!timeline.compute.empty()) {
      result.makespan = std::max(result.makespan, timeline.compute.back().end);
    }
  }
  double busy = 0;
  for (const RankTimeline& timeline : result.ranks) busy += timeline.busy;
  // Idle over total rather than 1 - busy / total: exact when the times are whole numbers.
  const double total = p * result.makespan;
  if (total > 0) result.bubble_fraction = (total - busy) / total;
  return result;
}

char ComputeLetter(ActionType type) {
  switch (type) {
    case ActionType::kForward:
      return 'F';
    case ActionType::kBackward:
      return 'B';
    case ActionType::kBackwardInput:
      return 'I';
    case ActionType::kBackwardWeight:
      return 'W';
    default:
      return '?';
  }
}

}  // namespace

bool Action::is_compute() const {
  return type == ActionType::kForward || type == ActionType::kBackward ||
         type == ActionType::kBackwardInput || type == ActionType::kBackwardWeight;
}

std::string ActionName(const Action& action) {
  const std::string id = absl::StrCat(action.stage, ".", action.microbatch);
  switch (action.type) {
    case ActionType::kSendActivation:
      return absl::StrCat("SEND_F", id, "->", action.peer_stage);
    case ActionType::kReceiveActivation:
      return absl::StrCat("RECV_F", id, "<-", action.peer_stage);
    case ActionType::kSendGradient:
      return absl::StrCat("SEND_B", id, "->", action.peer_stage);
    case ActionType::kReceiveGradient:
      return absl::StrCat("RECV_B", id, "<-", action.peer_stage);
    default:
      return absl::StrCat(std::string(1, ComputeLetter(action.type)), id);
  }
}

std::ostream& operator<<(std::ostream& os, const Action& action) {
  return os << ActionName(action);
}

absl::string_view ScheduleKindName(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kGPipe:
      return "GPIPE";
    case ScheduleKind::k1F1B:
      return "1F1B";
    case ScheduleKind::kInterleaved1F1B:
      return "INTERLEAVED_1F1B";
    case ScheduleKind::kZeroBubbleH1:
      return "ZB_H1";
  }
  return "UNKNOWN";
}

absl::StatusOr<ScheduleKind> ScheduleKindFromName(absl::string_view name) {
  std::vector<absl::string_view> names;
  for (ScheduleKind kind : kAllKinds) {
    if (ScheduleKindName(kind) == name) return kind;
    names.push_back(ScheduleKindName(kind));
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown pipeline schedule \"", name,
                                                 "\"; known: ", absl::StrJoin(names, ", ")));
}

absl::StatusOr<PipelineSchedule> BuildSchedule(ScheduleKind kind, int num_ranks,
                                               int stages_per_rank, int num_microbatches) {
  PLAIT_RETURN_IF_ERROR(base::Annotate(
      ValidateShape(kind, num_ranks, stages_per_rank, num_microbatches), ScheduleKindName(kind)));
  PipelineSchedule schedule{kind, num_ranks, stages_per_rank, num_microbatches, {}};
  for (int rank = 0; rank < num_ranks; ++rank) {
    schedule.ranks.push_back(
        WithCommunication(schedule, rank, ComputeOrder(schedule, rank, OrderOf(schedule, rank))));
  }
  return schedule;
}

namespace {

// Check's verdict on everything but running the lists: shape, each action, per-rank order
// and completeness.
absl::Status CheckActions(const PipelineSchedule& schedule) {
  if (schedule.num_ranks < 1 || schedule.stages_per_rank < 1 || schedule.num_microbatches < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a schedule needs at least 1 rank, stage per rank and micro-batch; this one has ",
        schedule.num_ranks, ", ", schedule.stages_per_rank, " and ", schedule.num_microbatches));
  }
  if (static_cast<int>(schedule.ranks.size()) != schedule.num_ranks) {
    return absl::InvalidArgumentError(absl::StrCat("the schedule lists ", schedule.ranks.size(),
                                                   " ranks' actions for ", schedule.num_ranks,
                                                   " pipeline ranks"));
  }
  std::map<StageMicrobatch, Counts> counts;
  for (int rank = 0; rank < schedule.num_ranks; ++rank) {
    RankState state;
    for (int index = 0; index < static_cast<int>(schedule.ranks[rank].size()); ++index) {
      const Action& action = schedule.ranks[rank][index];
      PLAIT_RETURN_IF_ERROR(CheckAction(schedule, rank, index, action));
      PLAIT_RETURN_IF_ERROR(CheckOrder(schedule, rank, index, action, state, counts));
    }
  }
  return CheckComplete(schedule, counts);
}

}  // namespace

absl::Status Check(const PipelineSchedule& schedule) {
  PLAIT_RETURN_IF_ERROR(CheckActions(schedule));
  return Execute(schedule, ActionCosts{}).status();
}

// Execute finds a deadlock or a receive out of order whatever the costs: one run serves as
// the check's last part and as the simulation.
absl::StatusOr<SimulationResult> Simulate(const PipelineSchedule& schedule,
                                          const ActionCosts& costs) {
  PLAIT_RETURN_IF_ERROR(CheckActions(schedule));
  return Execute(schedule, costs);
}

int64_t CountSends(const std::vector<Action>& actions) {
  return std::count_if(actions.begin(), actions.end(), [](const Action& action) {
    return action.type == ActionType::kSendActivation || action.type == ActionType::kSendGradient;
  });
}

std::string FormatScheduleTable(const PipelineSchedule& schedule) {
  const std::string title =
      absl::StrCat(ScheduleKindName(schedule.kind), " p=", schedule.num_ranks,
                   " v=", schedule.stages_per_rank, " m=", schedule.num_microbatches);
  absl::StatusOr<SimulationResult> result = Simulate(schedule);
  if (!result.ok()) return absl::StrCat(title, ": invalid: ", result.status().message(), "\n");
  const int slots = static_cast<int>(std::lround(result->makespan));
  std::vector<std::vector<std::string>> grid(schedule.num_ranks,
                                             std::vector<std::string>(slots, "."));
  size_t width = 1;
  for (int rank = 0; rank < schedule.num_ranks; ++rank) {
    for (const TimedAction& timed : result->ranks[rank].compute) {
      const std::string name = ActionName(timed.action);
      width = std::max(width, name.size());
      for (long slot = std::lround(timed.start); slot < std::lround(timed.end); ++slot) {
        grid[rank][slot] = name;
      }
    }
  }
  std::string table;
  std::vector<int> peaks;
  for (int rank = 0; rank < schedule.num_ranks; ++rank) {
    std::string row = absl::StrCat("rank ", rank, " |");
    for (const std::string& cell : grid[rank]) {
      absl::StrAppend(&row, " ", cell, std::string(width - cell.size(), ' '));
    }
    absl::StrAppend(&table, absl::StripTrailingAsciiWhitespace(row), "\n");
    peaks.push_back(result->ranks[rank].peak_activations);
  }
  absl::StrAppend(&table, title, ": ", slots, " slots, bubble ",
                  absl::StrFormat("%.1f%%", 100 * result->bubble_fraction),
                  ", peak stage activations held per rank ", absl::StrJoin(peaks, " "), "\n");
  return table;
}

}  // namespace plait::wrap::pp
