#include "wrap/pp/pipeline.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <optional>
#include <set>
#include <utility>

#include "ATen/core/Tensor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/human.h"
#include "base/status.h"
#include "base/violation.h"
#include "parallel/communicator.h"
#include "torch/autograd.h"
#include "torch/csrc/autograd/generated/variable_factories.h"

namespace plait::wrap::pp {
namespace {

// The header before a hidden state sent to the next stage: its dtype, its number of
// dimensions and its sizes, as int64.
constexpr int64_t kMaxDims = 6;
constexpr int64_t kHeaderLength = 2 + kMaxDims;

// The stages each rank holds: config.stages_per_rank, 1 when unset.
int StagesPerRank(const PipelineConfig& config) { return std::max(1, config.stages_per_rank()); }

// "micro-batch 3 of stage 1: <error>".
absl::Status InMicroBatch(absl::Status status, const Action& action) {
  return base::Annotate(std::move(status), absl::StrCat("micro-batch ", action.microbatch,
                                                        " of stage ", action.stage));
}

// The activations the rank whose list is `actions` keeps at its peak, and their bytes in
// `bytes`: for each (stage, micro-batch) forwarded and not yet through the backward that frees
// its graph (a full backward, or a zero-bubble weight backward), the stage's blocks, and the
// output layers' on the last stage; whether a backward ran before that peak (gradients then
// exist beside the activations, 1F1B's steady state, not GPIPE's); and the blocks of the
// rank's stages.
StepEstimate::KeptActivations PeakActivations(
    const std::vector<Action>& actions, const std::vector<std::pair<int64_t, int64_t>>& blocks,
    const ModelShape& shape, double& bytes) {
  const int last_stage = static_cast<int>(blocks.size()) - 1;
  StepEstimate::KeptActivations held, peak;
  bool backward = false;
  bytes = 0.0;
  std::set<int> stages;  // the rank's
  for (const Action& action : actions) {
    stages.insert(action.stage);
    int change = 0;
    if (action.type == ActionType::kForward) change = 1;
    if (action.type == ActionType::kBackward || action.type == ActionType::kBackwardWeight) {
      change = -1;
    }
    if (action.type == ActionType::kBackwardInput) backward = true;
    if (change == 0) continue;
    if (change < 0) backward = true;
    held.blocks += change * (blocks[action.stage].second - blocks[action.stage].first);
    if (action.stage == last_stage) held.outputs += change;
    const double held_bytes = static_cast<double>(held.blocks) * shape.block_activation_bytes +
                              static_cast<double>(held.outputs) * shape.output_activation_bytes;
    // The same peak again after a backward counts for more: gradients exist beside it.
    const bool higher =
        held_bytes > bytes || (held_bytes == bytes && backward && !peak.after_a_backward);
    if (change > 0 && higher) {
      bytes = held_bytes;
      peak = held;
      peak.after_a_backward = backward;
    }
  }
  for (const int stage : stages) peak.held_blocks += blocks[stage].second - blocks[stage].first;
  return peak;
}

// The stages of StageBlocks, or the problem with `config`'s cut (under `field`).
struct Cut {
  std::vector<std::pair<int64_t, int64_t>> stages;
  std::optional<base::Violation> problem;
};

Cut CutBlocks(const PipelineConfig& config, int64_t num_blocks, int num_stages,
              const std::string& field) {
  const std::string starts_field = absl::StrCat(field, ".stage_starts");
  if (num_stages > num_blocks) {
    return {{},
            base::Violation{field, absl::StrCat(num_stages,
                                                " stages need at least as many blocks; the model "
                                                "has ",
                                                num_blocks)}};
  }
  std::vector<int64_t> starts(config.stage_starts().begin(), config.stage_starts().end());
  if (starts.empty()) {
    if (num_blocks % num_stages != 0) {
      return {{},
              base::Violation{starts_field,
                              absl::StrCat("is empty, and the ", num_blocks,
                                           " blocks do not divide into ", num_stages,
                                           " equal stages; give the first block of each stage "
                                           "after the first")}};
    }
    for (int s = 1; s < num_stages; ++s) starts.push_back(s * num_blocks / num_stages);
  }
  if (static_cast<int>(starts.size()) != num_stages - 1) {
    return {
        {},
        base::Violation{starts_field, absl::StrCat("has ", starts.size(), " entries; ", num_stages,
                                                   " stages need ", num_stages - 1)}};
  }
  starts.insert(starts.begin(), 0);
  starts.push_back(num_blocks);
  Cut cut;
  for (int s = 0; s < num_stages; ++s) {
    if (starts[s + 1] <= starts[s]) {
      return {
          {},
          base::Violation{
              starts_field,
              absl::StrCat("[", absl::StrJoin(config.stage_starts(), ", "), "] leaves stage ", s,
                           " empty: the starts must increase from above 0 to below the "
                           "model's ",
                           num_blocks, " blocks")}};
    }
    cut.stages.emplace_back(starts[s], starts[s + 1]);
  }
  return cut;
}

}  // namespace

absl::StatusOr<std::vector<std::pair<int64_t, int64_t>>> StageBlocks(const PipelineConfig& config,
                                                                     int64_t num_blocks,
                                                                     int num_stages,
                                                                     const std::string& field) {
  Cut cut = CutBlocks(config, num_blocks, num_stages, field);
  if (cut.problem.has_value()) return absl::InvalidArgumentError(cut.problem->ToString());
  return std::move(cut.stages);
}

// Runs the rank's list of a schedule for each step, keeping per micro-batch the stage's input
// (received), output (sent, or the loss) and the gradient received for it.
class PipelineStrategy::Executor final : public MicroBatchExecutor {
 public:
  Executor(Wrappable& model, parallel::Communicator& group, at::Device device, ScheduleKind kind,
           int stages_per_rank)
      : model_(model),
        group_(group),
        device_(device),
        kind_(kind),
        stages_per_rank_(stages_per_rank) {}

  double last_wait_seconds() const override { return wait_seconds_; }

  absl::Status Train(int num_micro, const MicroBatchForward& forward,
                     const std::function<void(bool)>& sync_gradients) override {
    wait_seconds_ = 0.0;
    PLAIT_ASSIGN_OR_RETURN(const std::vector<Action>* actions, Actions(num_micro));
    // The rank's last backward of its weights synchronises the step's gradients.
    int last_weight_backward = -1;
    for (int i = 0; i < static_cast<int>(actions->size()); ++i) {
      const ActionType type = (*actions)[i].type;
      if (type == ActionType::kBackward || type == ActionType::kBackwardWeight) {
        last_weight_backward = i;
      }
    }
    MicroBatches state(num_micro, stages_per_rank_);
    absl::Status status;
    for (int i = 0; i < static_cast<int>(actions->size()) && status.ok(); ++i) {
      const Action& action = (*actions)[i];
      if (action.type == ActionType::kBackward || action.type == ActionType::kBackwardWeight) {
        sync_gradients(i == last_weight_backward);
      }
      status = InMicroBatch(Run(action, forward, state), action);
    }
    return FinishSends(state, std::move(status));
  }

  absl::Status Evaluate(int num_micro, const MicroBatchForward& forward) override {
    wait_seconds_ = 0.0;
    MicroBatches state(num_micro, stages_per_rank_);
    absl::Status status;
    // Each micro-batch through the rank's stages in turn: the stage before a stage has run
    // its forward of the micro-batch, or is about to, on its rank.
    const int last_stage = group_.size() * stages_per_rank_ - 1;
    for (int micro = 0; micro < num_micro && status.ok(); ++micro) {
      for (int local = 0; local < stages_per_rank_ && status.ok(); ++local) {
        const int stage = local * group_.size() + group_.rank();
        for (const ActionType type :
             {ActionType::kReceiveActivation, ActionType::kForward, ActionType::kSendActivation}) {
          const Action action{type, stage, micro, -1};
          if (type == ActionType::kReceiveActivation && stage == 0) continue;
          if (type == ActionType::kSendActivation && stage == last_stage) continue;
          status = InMicroBatch(Run(action, forward, state), action);
          if (!status.ok()) break;
        }
      }
    }
    return FinishSends(state, std::move(status));
  }

 private:
  // Per (stage of the rank, micro-batch), at Slot().
  struct MicroBatches {
    MicroBatches(int num_micro, int stages_per_rank)
        : num_micro(num_micro),
          inputs(num_micro * stages_per_rank),
          outputs(inputs.size()),
          output_gradients(inputs.size()),
          input_gradients(inputs.size()) {}
    int num_micro;
    std::vector<at::Tensor> inputs;            // received, a leaf requiring its gradient
    std::vector<at::Tensor> outputs;           // the stage's output, or the loss
    std::vector<at::Tensor> output_gradients;  // received for the outputs
    std::vector<at::Tensor> input_gradients;   // zero-bubble: computed before the weights'
    std::vector<std::pair<std::shared_ptr<parallel::Work>, at::Tensor>> sends;
  };

  absl::StatusOr<const std::vector<Action>*> Actions(int num_micro) {
    auto it = schedules_.find(num_micro);
    if (it == schedules_.end()) {
      PLAIT_ASSIGN_OR_RETURN(PipelineSchedule schedule,
                             BuildSchedule(kind_, group_.size(), stages_per_rank_, num_micro));
      it = schedules_.emplace(num_micro, std::move(schedule)).first;
    }
    return &it->second.ranks[group_.rank()];
  }

  // Waits for the sends still under way, which hold their tensors until they are done; the
  // first error of `status` (the passes') and theirs.
  static absl::Status FinishSends(const MicroBatches& state, absl::Status status) {
    for (const auto& [work, tensor] : state.sends) {
      const absl::Status sent = work->Wait();
      if (status.ok()) status = sent;
    }
    return status;
  }

  // Waits for a receive, counting the time in last_wait_seconds().
  absl::Status Wait(const std::shared_ptr<parallel::Work>& receive) {
    const auto start = std::chrono::steady_clock::now();
    absl::Status status = receive->Wait();
    wait_seconds_ +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return status;
  }

  void Send(at::Tensor tensor, int peer, MicroBatches& state) {
    tensor = tensor.detach().contiguous();
    state.sends.emplace_back(group_.Send(tensor, peer), tensor);
  }

  absl::StatusOr<at::Tensor> ReceiveActivation(int peer) {
    at::Tensor header = torch::empty({kHeaderLength}, at::TensorOptions(at::kLong).device(device_));
    PLAIT_RETURN_IF_ERROR(Wait(group_.Receive(header, peer)));
    header = header.cpu();
    const auto values = header.accessor<int64_t, 1>();
    std::vector<int64_t> sizes(values.data() + 2, values.data() + 2 + values[1]);
    at::Tensor tensor = torch::empty(
        sizes, at::TensorOptions(static_cast<at::ScalarType>(values[0])).device(device_));
    PLAIT_RETURN_IF_ERROR(Wait(group_.Receive(tensor, peer)));
    return tensor;
  }

  absl::Status SendActivation(const at::Tensor& tensor, int peer, MicroBatches& state) {
    if (tensor.dim() > kMaxDims) {
      return absl::InvalidArgumentError(absl::StrCat("the stage's output has ", tensor.dim(),
                                                     " dimensions; a pipeline sends at most ",
                                                     kMaxDims));
    }
    at::Tensor header = torch::zeros({kHeaderLength}, at::kLong);
    header[0] = static_cast<int64_t>(tensor.scalar_type());
    header[1] = tensor.dim();
    for (int64_t d = 0; d < tensor.dim(); ++d) header[2 + d] = tensor.size(d);
    Send(header.to(device_), peer, state);
    Send(tensor, peer, state);
    return absl::OkStatus();
  }

  // The trainable tensors of the stage, the leaves a zero-bubble weight backward computes.
  std::vector<at::Tensor> Weights() {
    std::vector<at::Tensor> weights;
    for (const Wrappable::NamedParameter& named : model_.NamedParameters()) {
      if (named.parameter.requires_grad()) weights.push_back(named.parameter);
    }
    return weights;
  }

  absl::Status Run(const Action& action, const MicroBatchForward& forward, MicroBatches& state) {
    const int local_stage = action.stage / group_.size();
    const int slot = local_stage * state.num_micro + action.microbatch;
    // Looped placement: the stage before is on the rank before, the stage after on the next.
    const int previous = (group_.rank() + group_.size() - 1) % group_.size();
    const int next = (group_.rank() + 1) % group_.size();
    switch (action.type) {
      case ActionType::kReceiveActivation: {
        PLAIT_ASSIGN_OR_RETURN(at::Tensor input, ReceiveActivation(previous));
        state.inputs[slot] = input.requires_grad_(at::GradMode::is_enabled());
        return absl::OkStatus();
      }
      case ActionType::kForward: {
        PLAIT_RETURN_IF_ERROR(model_.SelectStage(local_stage));
        PLAIT_ASSIGN_OR_RETURN(state.outputs[slot], forward(action.microbatch, state.inputs[slot]));
        if (!at::GradMode::is_enabled()) state.inputs[slot] = at::Tensor();
        return absl::OkStatus();
      }
      case ActionType::kSendActivation:
        PLAIT_RETURN_IF_ERROR(SendActivation(state.outputs[slot], next, state));
        if (!at::GradMode::is_enabled()) state.outputs[slot] = at::Tensor();
        return absl::OkStatus();
      case ActionType::kReceiveGradient: {
        // Contiguous, as the sender's: the output itself may be a strided view.
        at::Tensor gradient =
            torch::empty(state.outputs[slot].sizes(), state.outputs[slot].options());
        PLAIT_RETURN_IF_ERROR(Wait(group_.Receive(gradient, next)));
        state.output_gradients[slot] = gradient;
        return absl::OkStatus();
      }
      case ActionType::kBackward:
        // On the last stage the output is the loss, whose gradient is one.
        state.outputs[slot].backward(state.output_gradients[slot]);
        Release(slot, state);
        return absl::OkStatus();
      case ActionType::kBackwardInput:
        // The first stage has no input: its weight backward does all of its work.
        if (state.inputs[slot].defined()) {
          state.input_gradients[slot] =
              torch::autograd::grad({state.outputs[slot]}, {state.inputs[slot]},
                                    {state.output_gradients[slot]}, /*retain_graph=*/true)[0];
        }
        return absl::OkStatus();
      case ActionType::kBackwardWeight:
        torch::autograd::backward({state.outputs[slot]}, {state.output_gradients[slot]},
                                  /*retain_graph=*/false, /*create_graph=*/false, Weights());
        Release(slot, state);
        return absl::OkStatus();
      case ActionType::kSendGradient: {
        at::Tensor gradient = state.input_gradients[slot].defined() ? state.input_gradients[slot]
                                                                    : state.inputs[slot].grad();
        state.inputs[slot] = at::Tensor();
        state.input_gradients[slot] = at::Tensor();
        Send(gradient, previous, state);
        return absl::OkStatus();
      }
    }
    return absl::InternalError("unknown pipeline action");
  }

  // After a slot's (weight) backward: its output and the gradient received for it.
  void Release(int slot, MicroBatches& state) {
    state.outputs[slot] = at::Tensor();
    state.output_gradients[slot] = at::Tensor();
  }

  Wrappable& model_;
  parallel::Communicator& group_;
  const at::Device device_;
  const ScheduleKind kind_;
  const int stages_per_rank_;
  std::map<int, PipelineSchedule> schedules_;  // by micro-batches per step
  double wait_seconds_ = 0.0;
};

PipelineStrategy::PipelineStrategy(PipelineConfig config) : config_(std::move(config)) {}

PipelineStrategy::~PipelineStrategy() = default;

std::vector<base::Violation> PipelineStrategy::Check(const std::optional<ModelShape>& shape,
                                                     const parallel::MeshConfig& mesh,
                                                     const std::string& field) const {
  std::vector<base::Violation> problems;
  const std::string step_field = absl::StrCat(field, ".pipeline");
  const std::string per_rank_field = absl::StrCat(step_field, ".stages_per_rank");
  const int per_rank = StagesPerRank(config_);
  const absl::StatusOr<ScheduleKind> kind = ScheduleKindFromName(config_.schedule());
  if (!kind.ok()) {
    problems.push_back(
        {absl::StrCat(step_field, ".schedule"), std::string(kind.status().message())});
  }
  const bool interleaved = kind.ok() && *kind == ScheduleKind::kInterleaved1F1B;
  if (config_.stages_per_rank() < 0) {
    problems.push_back({per_rank_field, absl::StrCat("is ", config_.stages_per_rank(),
                                                     "; a rank holds 1 stage or more")});
  } else if (interleaved && per_rank < 2) {
    problems.push_back(
        {per_rank_field, absl::StrCat("is ", config_.stages_per_rank(),
                                      "; INTERLEAVED_1F1B needs 2 or more stages "
                                      "per rank (with 1 it is 1F1B: ask for that)")});
  } else if (kind.ok() && !interleaved && per_rank > 1) {
    problems.push_back(
        {per_rank_field, absl::StrCat("is ", per_rank,
                                      "; only INTERLEAVED_1F1B places several stages on a rank, "
                                      "and the schedule is ",
                                      config_.schedule())});
  }
  if (!shape.has_value()) return problems;
  // 1 for an unknown dimension, which the rules report.
  const int ranks = static_cast<int>(parallel::SubmeshRanks(mesh, {config_.mesh_dim()}));
  if (ranks == 1 && per_rank > 1) {
    problems.push_back(
        {per_rank_field,
         absl::StrCat("is ", per_rank, ", but \"", config_.mesh_dim(),
                      "\" has 1 rank: its stages would hand their tensors over on that rank, "
                      "which the pipeline does not do; give the dimension 2 ranks or more")});
  }
  if (shape->num_experts > 0) {
    problems.push_back(
        {step_field, absl::StrCat("the model is a mixture of ", shape->num_experts,
                                  " experts, whose routing statistics (the load-balancing loss) "
                                  "span the stages; a pipeline of one is not supported yet")});
  }
  // Counted in 64 bits: a huge stages_per_rank times the ranks wraps the int CutBlocks takes.
  const int64_t stages = int64_t{ranks} * per_rank;
  if (stages > std::numeric_limits<int>::max()) {
    problems.push_back(
        {per_rank_field,
         absl::StrCat("is ", per_rank, ": ", ranks, " ranks holding ", per_rank,
                      " stages each make ", stages, " stages, more than the model's ",
                      shape->num_blocks, " blocks (a stage needs one)")});
  } else {
    Cut cut = CutBlocks(config_, shape->num_blocks, static_cast<int>(stages), step_field);
    if (cut.problem.has_value()) problems.push_back(*std::move(cut.problem));
  }
  // Fewer micro-batches than ranks never fill the pipeline: some rank idles through every step.
  const int64_t micro = shape->micro_batches_per_step;
  if (ranks > 1 && micro < ranks) {
    problems.push_back(
        {step_field,
         absl::StrCat("runs ", micro, " micro-batch(es) a step (training.grad_accumulation) over ",
                      ranks,
                      " pipeline ranks; a pipeline needs at least as many micro-batches as "
                      "ranks to fill, or some rank idles through every step")});
  } else if (interleaved && micro % ranks != 0) {
    problems.push_back(
        {step_field, absl::StrCat("runs ", micro,
                                  " micro-batches a step (training.grad_accumulation); "
                                  "INTERLEAVED_1F1B runs them in groups of the ",
                                  ranks, " pipeline ranks, so it needs a multiple of ", ranks)});
  }
  return problems;
}

StepEstimate PipelineStrategy::Estimate(const ModelShape& shape,
                                        const parallel::MeshConfig& mesh) const {
  StepEstimate estimate;
  const int ranks = static_cast<int>(parallel::SubmeshRanks(mesh, {config_.mesh_dim()}));
  const int per_rank = StagesPerRank(config_);
  const int stages = ranks * per_rank;
  const absl::StatusOr<ScheduleKind> kind = ScheduleKindFromName(config_.schedule());
  const auto blocks = StageBlocks(config_, shape.num_blocks, stages, "pipeline");
  const int micro = static_cast<int>(shape.micro_batches_per_step);
  const absl::StatusOr<PipelineSchedule> schedule =
      kind.ok() ? BuildSchedule(*kind, ranks, per_rank, micro) : kind.status();
  if (!blocks.ok() || !schedule.ok()) {
    estimate.description = "pipeline (invalid: see the plan's validation)";
    return estimate;
  }
  // The embedding on the first stage, the rest of the root (final norm, output projection)
  // on the last.
  const double embedding = static_cast<double>(shape.vocab_size) * shape.hidden_size;
  std::vector<double> rank_parameters(ranks, 0.0);
  for (int s = 0; s < stages; ++s) {
    const auto [begin, end] = (*blocks)[s];
    double parameters = static_cast<double>(end - begin) * shape.block_parameters;
    if (s == 0) parameters += embedding;
    if (s + 1 == stages) {
      // A tied embedding is the last stage's output projection too.
      parameters += shape.root_parameters - embedding;
      if (shape.tied_embeddings && ranks > 1) parameters += embedding;
    }
    rank_parameters[schedule->RankOf(s)] += parameters;
    estimate.details.push_back(absl::StrFormat(
        "stage %d (rank %d of %s): blocks %d..%d, %s parameters", s, schedule->RankOf(s),
        config_.mesh_dim(), begin, end - 1, base::HumanCount(parameters)));
  }
  for (int r = 0; r < ranks; ++r) {
    std::vector<std::string> own;
    for (int local = 0; local < per_rank; ++local) own.push_back(absl::StrCat(local * ranks + r));
    StepEstimate::RankShare& share = estimate.rank_shares.emplace_back();
    share.description = absl::StrCat(per_rank > 1 ? "stages " : "stage ",
                                     absl::StrJoin(own, per_rank > 2 ? ", " : " and "));
    share.parameter_fraction = shape.parameters > 0 ? rank_parameters[r] / shape.parameters : 1.0;
  }
  const double most = *std::max_element(rank_parameters.begin(), rank_parameters.end());
  estimate.parameter_fraction = shape.parameters > 0 ? most / shape.parameters : 1.0;
  const double hidden_bytes = shape.micro_batch_tokens * shape.hidden_size * shape.parameter_bytes;
  if (shape.TrainableParameters() == 0) {
    // A frozen model (a DPO reference): each micro-batch runs forward through the stages, with
    // no backward and nothing kept for one.
    estimate.description = absl::StrFormat(
        "pipeline over \"%s\" (%d stages), forward only: each of %d micro-batches through the "
        "stages in turn",
        config_.mesh_dim(), stages, micro);
    if (ranks > 1) {
      estimate.details.push_back(absl::StrCat("sends ", base::HumanBytes(hidden_bytes),
                                              " per micro-batch between neighbouring stages "
                                              "(hidden states forward)"));
    }
    return estimate;
  }
  std::string bubble;
  if (const absl::StatusOr<SimulationResult> run = Simulate(*schedule); run.ok()) {
    std::vector<std::string> in_flight;
    for (const RankTimeline& rank : run->ranks) {
      in_flight.push_back(absl::StrCat(rank.peak_activations));
    }
    bubble = absl::StrFormat(
        ", bubble %.1f%% (equal stages), %s in flight per rank %s", 100.0 * run->bubble_fraction,
        per_rank > 1 ? "stage micro-batches" : "micro-batches", absl::StrJoin(in_flight, "/"));
  }
  // The rank that keeps the most activations at its peak.
  double most_bytes = -1.0;
  for (int r = 0; r < ranks; ++r) {
    double bytes = 0.0;
    const StepEstimate::KeptActivations kept =
        PeakActivations(schedule->ranks[r], *blocks, shape, bytes);
    estimate.rank_shares[r].kept_activations = kept;
    if (bytes > most_bytes) {
      most_bytes = bytes;
      estimate.kept_activations = kept;
    }
  }
  for (const absl::string_view line : absl::StrSplit(FormatScheduleTable(*schedule), '\n')) {
    if (!line.empty()) estimate.details.emplace_back(line);
  }
  estimate.description = absl::StrFormat(
      "pipeline over \"%s\" (%s), schedule %s over %d micro-batches%s", config_.mesh_dim(),
      per_rank > 1 ? absl::StrFormat("%d ranks of %d stages", ranks, per_rank)
                   : absl::StrFormat("%d stages", stages),
      ScheduleKindName(*kind), micro, bubble);
  // Each micro-batch's hidden state goes forward and its gradient back once between each pair
  // of neighbouring stages; the rank that sends the most (a middle one, or with several stages
  // per rank any) counts.
  if (ranks > 1) {
    int64_t most_sends = 0;
    for (const std::vector<Action>& actions : schedule->ranks) {
      most_sends = std::max(most_sends, CountSends(actions));
    }
    Transfer transfer;
    transfer.mesh_dim = config_.mesh_dim();
    transfer.bytes_per_micro_batch = static_cast<double>(most_sends) / micro * hidden_bytes;
    transfer.overlaps_compute = false;
    estimate.transfers.push_back(transfer);
    estimate.details.push_back(
        absl::StrCat("sends ", base::HumanBytes(hidden_bytes),
                     " per micro-batch between neighbouring stages each way (hidden states "
                     "forward, their gradients back)"));
    if (shape.tied_embeddings) {
      // The first and the last stage swap their gradients of the tied embedding.
      transfer.bytes_per_micro_batch = 0;
      transfer.bytes_per_step = embedding * shape.parameter_bytes;
      estimate.transfers.push_back(transfer);
      estimate.details.push_back(absl::StrCat(
          "the first and last stage swap their gradients of the tied embedding once a step: ",
          base::HumanBytes(transfer.bytes_per_step)));
    }
  }
  return estimate;
}

absl::Status PipelineStrategy::Apply(Wrappable& model, const parallel::DeviceMesh& mesh) {
  PLAIT_ASSIGN_OR_RETURN(
      kind_, base::Annotate(ScheduleKindFromName(config_.schedule()), "pipeline.schedule"));
  PLAIT_ASSIGN_OR_RETURN(group_, mesh.communicator(config_.mesh_dim()));
  device_ = mesh.device();
  const int ranks = group_->size();
  const int rank = group_->rank();
  const int per_rank = StagesPerRank(config_);
  PLAIT_ASSIGN_OR_RETURN(const auto blocks,
                         StageBlocks(config_, static_cast<int64_t>(model.Blocks().size()),
                                     ranks * per_rank, "pipeline"));
  for (const Wrappable::NamedParameter& named : model.NamedParameters()) {
    whole_.push_back({named.name, named.parameter.sizes().vec(), {}});
  }
  // Looped: this rank's stages are its rank, then each `ranks` further.
  std::vector<std::pair<int64_t, int64_t>> kept;
  for (int local = 0; local < per_rank; ++local) kept.push_back(blocks[local * ranks + rank]);
  PLAIT_RETURN_IF_ERROR(model.KeepStages(kept));
  // Which rank holds each parameter: every rank marks its own, summed over the dimension.
  std::set<std::string> held;
  for (const Wrappable::NamedParameter& named : model.NamedParameters()) held.insert(named.name);
  const int64_t count = static_cast<int64_t>(whole_.size());
  at::Tensor holders = torch::zeros({ranks, count});
  auto own_flags = holders.accessor<float, 2>();
  for (int64_t i = 0; i < count; ++i) {
    if (held.count(whole_[i].name) > 0) own_flags[rank][i] = 1.0f;
  }
  holders = holders.to(device_);
  PLAIT_RETURN_IF_ERROR(group_->AllReduce(holders, parallel::ReduceOp::kSum)->Wait());
  holders = holders.cpu();
  const auto held_by = holders.accessor<float, 2>();
  for (WholeParameter& whole : whole_) {
    const int64_t i = &whole - whole_.data();
    for (int r = 0; r < ranks; ++r) {
      if (held_by[r][i] > 0) whole.holders.push_back(r);
    }
    if (whole.holders.empty()) {
      return absl::InternalError(
          absl::StrCat("pipeline: no stage holds the model's parameter ", whole.name));
    }
    if (whole.holders.size() > 1) shared_[whole.name] = whole.holders;
  }
  executor_ = std::make_unique<Executor>(model, *group_, device_, kind_, per_rank);
  return absl::OkStatus();
}

MicroBatchExecutor& PipelineStrategy::executor() { return *executor_; }

void PipelineStrategy::UpdateParameters(std::vector<parallel::TrainableParameter>& parameters) {
  for (parallel::TrainableParameter& parameter : parameters) {
    parameter.sharded_over.push_back(group_);
    const auto shared = shared_.find(parameter.name);
    if (shared == shared_.end()) continue;
    // Its holders keep one value: it counts once in the norm, and the first saves it.
    const std::vector<int>& holders = shared->second;
    const int64_t index =
        std::find(holders.begin(), holders.end(), group_->rank()) - holders.begin();
    const int64_t count = static_cast<int64_t>(holders.size());
    parameter.replicas *= count;
    parameter.slice.replica = parameter.slice.replica * count + index;
  }
}

absl::Status PipelineStrategy::FinishGradients(
    const std::vector<parallel::TrainableParameter>& trainable) {
  at::NoGradGuard no_grad;
  for (const parallel::TrainableParameter& parameter : trainable) {
    const auto shared = shared_.find(parameter.name);
    if (shared == shared_.end()) continue;
    at::Tensor& gradient = parameter.tensor.mutable_grad();
    if (!gradient.defined()) gradient = torch::zeros_like(parameter.tensor);
    // Each holder sends its gradient to the others, then sums all of them in rank order, so
    // that every holder has the same bits.
    const at::Tensor own = gradient.detach().contiguous();
    std::vector<std::shared_ptr<parallel::Work>> sends;
    std::vector<at::Tensor> received;
    for (const int holder : shared->second) {
      if (holder != group_->rank()) sends.push_back(group_->Send(own, holder));
    }
    for (const int holder : shared->second) {
      if (holder == group_->rank()) {
        received.push_back(own);
        continue;
      }
      at::Tensor theirs = torch::empty_like(own);
      PLAIT_RETURN_IF_ERROR(base::Annotate(
          group_->Receive(theirs, holder)->Wait(),
          absl::StrCat("the gradient of ", parameter.name, ", held by several stages")));
      received.push_back(theirs);
    }
    for (const auto& sent : sends) PLAIT_RETURN_IF_ERROR(sent->Wait());
    at::Tensor sum = received.front().clone();
    for (size_t i = 1; i < received.size(); ++i) sum += received[i];
    gradient.copy_(sum);
  }
  return absl::OkStatus();
}

absl::Status PipelineStrategy::GatherFullParameters(std::map<std::string, at::Tensor>& parameters) {
  // The holders' dtypes first (the strategies after this one may keep fp32 copies of a 16-bit
  // model), one collective for all.
  const int64_t count = static_cast<int64_t>(whole_.size());
  at::Tensor dtypes = torch::zeros({count});
  auto own_dtypes = dtypes.accessor<float, 1>();
  for (int64_t i = 0; i < count; ++i) {
    if (whole_[i].holders.front() != group_->rank()) continue;
    const auto it = parameters.find(whole_[i].name);
    if (it == parameters.end()) {
      return absl::InternalError(absl::StrCat("pipeline: no gathered ", whole_[i].name));
    }
    own_dtypes[i] = static_cast<float>(it->second.scalar_type());
  }
  std::set<std::string> listed;
  for (const WholeParameter& whole : whole_) listed.insert(whole.name);
  dtypes = dtypes.to(device_);
  PLAIT_RETURN_IF_ERROR(group_->AllReduce(dtypes, parallel::ReduceOp::kSum)->Wait());
  dtypes = dtypes.cpu();
  const auto holder_dtypes = dtypes.accessor<float, 1>();
  for (int64_t i = 0; i < count; ++i) {
    const WholeParameter& whole = whole_[i];
    at::Tensor tensor;
    const int holder = whole.holders.front();
    if (holder == group_->rank()) {
      tensor = parameters.at(whole.name).detach().contiguous();
    } else {
      const auto dtype = static_cast<at::ScalarType>(static_cast<int>(holder_dtypes[i]));
      tensor = torch::empty(whole.shape, at::TensorOptions(dtype).device(device_));
    }
    PLAIT_RETURN_IF_ERROR(group_->Broadcast(tensor, holder)->Wait());
    parameters[whole.name] = tensor;
  }
  // Then those the steps after this one added to each stage (LoRA's adapters), which the cut
  // did not list: each rank names its own ("name<TAB>dtype<TAB>shape" lines), and broadcasts
  // them in that order.
  std::string own;
  for (const auto& [name, tensor] : parameters) {
    if (listed.count(name) > 0) continue;
    absl::StrAppend(&own, name, "\t", static_cast<int>(tensor.scalar_type()), "\t",
                    absl::StrJoin(tensor.sizes(), ","), "\n");
  }
  PLAIT_ASSIGN_OR_RETURN(const std::vector<std::string> added,
                         parallel::AllGatherStrings(*group_, own));
  for (int holder = 0; holder < group_->size(); ++holder) {
    for (const absl::string_view line : absl::StrSplit(added[holder], '\n', absl::SkipEmpty())) {
      const absl::Status unreadable =
          absl::InternalError(absl::StrCat("pipeline: rank ", holder, " of ", config_.mesh_dim(),
                                           " named a parameter it added as '", line, "'"));
      const std::vector<std::string> fields = absl::StrSplit(line, '\t');
      int dtype = 0;
      if (fields.size() != 3 || !absl::SimpleAtoi(fields[1], &dtype)) return unreadable;
      std::vector<int64_t> shape;
      for (const absl::string_view size : absl::StrSplit(fields[2], ',', absl::SkipEmpty())) {
        if (!absl::SimpleAtoi(size, &shape.emplace_back())) return unreadable;
      }
      at::Tensor tensor =
          holder == group_->rank()
              ? parameters.at(fields[0]).detach().contiguous()
              : torch::empty(shape,
                             at::TensorOptions(static_cast<at::ScalarType>(dtype)).device(device_));
      PLAIT_RETURN_IF_ERROR(group_->Broadcast(tensor, holder)->Wait());
      parameters[fields[0]] = tensor;
    }
  }
  return absl::OkStatus();
}

}  // namespace plait::wrap::pp
