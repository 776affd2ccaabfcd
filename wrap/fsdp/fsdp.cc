#include "wrap/fsdp/fsdp.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/dtype.h"
#include "base/human.h"
#include "base/math.h"
#include "base/status.h"
#include "torch/csrc/autograd/generated/variable_factories.h"
#include "torch/nn/module.h"

namespace plait::wrap::fsdp {
namespace {

// What FSDP's collectives are for, as their errors say: "reduce_scatter of FSDP unit".
constexpr const char* kUnitPurpose = "FSDP unit";
constexpr const char* kReplicasPurpose = "FSDP unit across replicas";

// The rows of a parameter with `full_rows` rows that `rank` holds, `rows_per_rank` to a rank:
// fewer (or none) for the last ranks, whose shards are padded.
struct RankRows {
  int64_t first;
  int64_t count;
};
RankRows RowsOfRank(int64_t full_rows, int64_t rows_per_rank, int rank) {
  const int64_t first = std::min(full_rows, rank * rows_per_rank);
  return {first, std::min(full_rows, first + rows_per_rank) - first};
}

// Dim 0 of a parameter (a scalar counts as one row).
int64_t FullRows(const at::Tensor& parameter) {
  return parameter.dim() == 0 ? 1 : parameter.size(0);
}

// Copies `rank`'s rows of `full` into `shard` ([rows_per_rank, ...]); padding rows are left
// as they are.
void CopyRowsOfRank(const at::Tensor& full, const at::Tensor& shard, int64_t rows_per_rank,
                    int rank) {
  const int64_t full_rows = FullRows(full);
  const RankRows mine = RowsOfRank(full_rows, rows_per_rank, rank);
  shard.view({rows_per_rank, -1})
      .narrow(0, 0, mine.count)
      .copy_(full.reshape({full_rows, -1}).narrow(0, mine.first, mine.count));
}

// Copies between a parameter's full rows (`full`, contiguous) and its rows in every rank's
// chunk of `by_rank` ([n, chunk], the parameter's rows of rank r at `offset` of chunk r,
// `rows_per_rank` to a rank): into `full` (a gather) or out of it (a reduce-scatter's input).
// Two copies whatever the number of ranks (on a GPU, two kernels): one strided copy for the
// ranks that hold rows_per_rank rows of the parameter, one for the rank holding its last,
// fewer rows (the ranks after it hold only padding).
enum class Direction { kIntoFull, kOutOfFull };
void CopyBetweenFullAndRanks(const at::Tensor& full, const at::Tensor& by_rank, int64_t offset,
                             int64_t rows_per_rank, Direction direction) {
  const int64_t full_rows = FullRows(full);
  const at::Tensor rows_view = full.view({full_rows, -1});
  const int64_t row_numel = rows_view.size(1);
  const auto copy = [direction](const at::Tensor& full_part, const at::Tensor& rank_part) {
    if (direction == Direction::kIntoFull) {
      full_part.copy_(rank_part);
    } else {
      rank_part.copy_(full_part);
    }
  };
  const int64_t whole_ranks = std::min(full_rows / rows_per_rank, by_rank.size(0));
  if (whole_ranks > 0) {
    const std::vector<int64_t> ranks_rows = {whole_ranks, rows_per_rank, row_numel};
    copy(rows_view.narrow(0, 0, whole_ranks * rows_per_rank).view(ranks_rows),
         by_rank.narrow(0, 0, whole_ranks)
             .narrow(1, offset, rows_per_rank * row_numel)
             .view(ranks_rows));
  }
  const int64_t rest = full_rows - whole_ranks * rows_per_rank;
  if (rest > 0) {
    copy(rows_view.narrow(0, whole_ranks * rows_per_rank, rest),
         by_rank[whole_ranks].narrow(0, offset, rest * row_numel).view({rest, row_numel}));
  }
}

// A contiguous tensor's memory as bytes, flat.
at::Tensor BytesOf(const at::Tensor& tensor) { return tensor.reshape({-1}).view(at::kByte); }

// `shards` one after the other, shard i at offsets[i] of one flat tensor of `numel` elements
// in `options`: a rank's chunk of a gather.
at::Tensor Pack(const std::vector<at::Tensor>& shards, const std::vector<int64_t>& offsets,
                int64_t numel, const at::TensorOptions& options) {
  at::Tensor flat = torch::empty({numel}, options.requires_grad(false));
  for (size_t i = 0; i < shards.size(); ++i) {
    flat.narrow(0, offsets[i], shards[i].numel()).copy_(shards[i].reshape({-1}));
  }
  return flat;
}

// Whether the parameter `name` is one that `lender` (null: none) keeps whole over its
// dimension: with shard_dense_over_mesh_dim, FSDP shards those over both dimensions.
bool KeptWholeBy(const ParameterLayout* lender, const std::string& name) {
  return lender == nullptr || !lender->SplitsParameter(name);
}

}  // namespace

// The parameters of a unit sharded over one group: all of them, or with
// shard_dense_over_mesh_dim those the lender keeps whole over the sub-grid and those it splits
// over mesh_dim alone. Each rank's share is one flat buffer of shard_numel elements: the shards of
// its parameters one after the other. Gathering concatenates the ranks' buffers; parameter i's
// full rows are then, rank after rank, rows_i rows at offsets[i] of each rank's chunk. Its
// gradients are laid out the same way over its trainable parameters only (grad_offsets,
// grad_numel): a frozen parameter's never travel.
struct Fsdp::Part {
  parallel::Communicator* group;
  std::vector<std::string> names;
  std::vector<at::Tensor> parameters;     // the model's, full shape, memory freed when sharded
  std::vector<at::Tensor> shards;         // fp32 [rows_i, rest...], what the optimizer trains
  std::vector<int64_t> rows;              // rows of parameter i per rank
  std::vector<int64_t> offsets;           // of parameter i's shard in a rank's buffer
  int64_t shard_numel = 0;
  // Of trainable parameter i's gradient shard in a rank's chunk of a reduce-scatter (-1 for
  // a frozen one), and the trainable parameters' elements in it.
  std::vector<int64_t> grad_offsets;
  int64_t grad_numel = 0;
  int trainable = 0;  // parameters that require a gradient

  at::Tensor gather_input, gather_output;
  std::shared_ptr<parallel::Work> gather;
  // A rank's reduced gradient rows, then one flag per trainable parameter: above zero when
  // some rank produced its gradient.
  at::Tensor reduce_output;
  std::shared_ptr<parallel::Work> reduce;
  // Whether this rank had a gradient for every trainable parameter in its reduce-scatter:
  // then every flag is above zero and need not be read back from the device.
  bool every_gradient_here = true;

  // The tensors the model's seams hold the part's projections' weights in
  // (Seams::HeldTensors: QLoRA's NF4 codes and scales), kept as they are: their bytes are sharded
  // by rows as the parameters are, gathered beside them in a collective of their own, freed with
  // them, and never trained.
  struct HeldWeight {
    std::string name;  // the weight's parameter name, "model.layers.0.self_attn.q_proj.weight"
    const torch::nn::Module* projection;
    std::vector<size_t> tensors;  // its tensors' indices in `held`
  };
  std::vector<HeldWeight> held_weights;
  std::vector<at::Tensor> held;         // the seams' tensors, memory freed when sharded
  std::vector<at::Tensor> held_shards;  // uint8 [held_rows[i]]: this rank's bytes of held[i]
  std::vector<int64_t> held_rows;
  std::vector<int64_t> held_offsets;  // of held_shards[i] in a rank's chunk of bytes
  int64_t held_numel = 0;
  at::Tensor held_gather_input, held_gather_output;
  std::shared_ptr<parallel::Work> held_gather;

  // This rank's shards one after the other, in `dtype`: its chunk of a gather.
  at::Tensor PackShards(at::ScalarType dtype) const {
    return Pack(shards, offsets, shard_numel, shards[0].options().dtype(dtype));
  }

  // The bytes of its full parameters and held tensors.
  int64_t ParameterBytes() const {
    int64_t bytes = 0;
    for (const at::Tensor& parameter : parameters) bytes += parameter.nbytes();
    for (const at::Tensor& tensor : held) bytes += tensor.nbytes();
    return bytes;
  }
};

// A block's parameters, or the root's: gathered, freed and reduced together, in one collective
// each way per part.
struct Fsdp::Unit {
  std::string name;
  std::vector<Part> parts;

  enum class State { kSharded, kGathering, kUnsharded };
  State state = State::kSharded;

  int stage = 0;              // Wrappable::Unit::stage; the root's is unused
  int gradients_pending = 0;  // of its trainable parameters, those whose gradient has not arrived
  // Whether the backward under way runs through it: its reductions are this backward's (a
  // pipeline rank's backward runs one of its stages).
  bool in_backward = false;
  // Whether the gradient of the unit's input is complete in this backward (the hook on the
  // block before it has fired): then no more of its backward reads its parameters.
  bool input_gradient_done = false;

  // Whether the gradients of its trainable parameters arriving tells that its backward has
  // read its parameters for the last time. A parameter's gradient comes from the node that
  // also computes the gradient of what the parameter multiplied, so when every parameter
  // trains, the last gradient ends the unit's use of them; a frozen parameter's node (a base
  // weight under adapters) may run after the unit's trainable gradients are all in.
  bool gradients_end_backward() const { return trainable() == parameters(); }

  // Its parameters, in every part, and those of them that require a gradient.
  int parameters() const {
    int count = 0;
    for (const Part& part : parts) count += static_cast<int>(part.parameters.size());
    return count;
  }
  int trainable() const {
    int count = 0;
    for (const Part& part : parts) count += part.trainable;
    return count;
  }

  // Whether its reduce-scatters have started in this backward and not yet been taken in.
  bool reducing() const {
    return std::any_of(parts.begin(), parts.end(),
                       [](const Part& part) { return part.reduce != nullptr; });
  }

  // The bytes of its full parameters and held tensors.
  int64_t ParameterBytes() const {
    int64_t bytes = 0;
    for (const Part& part : parts) bytes += part.ParameterBytes();
    return bytes;
  }
};

absl::StatusOr<std::unique_ptr<Fsdp>> Fsdp::Create(
    Wrappable& model, parallel::Communicator& communicator, parallel::Communicator* replicate,
    const FsdpConfig& config, parallel::Communicator* dense, const ParameterLayout* lender) {
  auto fsdp = std::unique_ptr<Fsdp>(new Fsdp(model, replicate, config));
  // The group each parameter (or held weight) of `name` is sharded over.
  const auto group_of = [&](const std::string& name) {
    return dense != nullptr && KeptWholeBy(lender, name) ? dense : &communicator;
  };
  // Its part of `unit`, added the first time.
  const auto part_of = [&](Unit& unit, const std::string& name) -> Part& {
    parallel::Communicator* group = group_of(name);
    for (Part& part : unit.parts) {
      if (part.group == group) return part;
    }
    Part& part = unit.parts.emplace_back();
    part.group = group;
    return part;
  };

  auto add_unit = [&](std::string name, const std::vector<Wrappable::NamedParameter>& named) {
    Unit unit;
    unit.name = std::move(name);
    for (const Wrappable::NamedParameter& parameter : named) {
      Part& part = part_of(unit, parameter.name);
      const int n = part.group->size();
      const at::Tensor& full = parameter.parameter;
      const int64_t full_rows = FullRows(full);
      const int64_t rows = base::CeilDiv(full_rows, n);
      std::vector<int64_t> shard_shape = full.sizes().vec();
      if (shard_shape.empty()) shard_shape.push_back(1);
      shard_shape[0] = rows;
      at::Tensor shard = torch::zeros(shard_shape, full.options().dtype(at::kFloat));
      {
        at::NoGradGuard no_grad;
        CopyRowsOfRank(full, shard, rows, part.group->rank());
      }
      // A frozen parameter (a reference model's) stays frozen: no gradient, no optimizer.
      shard.requires_grad_(full.requires_grad());
      part.names.push_back(parameter.name);
      part.parameters.push_back(full);
      part.shards.push_back(shard);
      part.rows.push_back(rows);
      part.offsets.push_back(part.shard_numel);
      part.shard_numel += shard.numel();
      part.grad_offsets.push_back(full.requires_grad() ? part.grad_numel : -1);
      if (full.requires_grad()) {
        ++part.trainable;
        part.grad_numel += shard.numel();
      }
    }
    fsdp->units_.push_back(std::move(unit));
  };
  // The tensors a block's projections' weights are held in, each in memory of its own.
  const Seams& seams = model.seams();
  auto add_held = [&](Unit& unit, const Wrappable::Unit& block) {
    for (const auto& item :
         block.module->named_modules(/*name_prefix=*/"", /*include_self=*/false)) {
      const std::vector<at::Tensor> tensors = seams.HeldTensors(*item.value());
      if (tensors.empty()) continue;
      const std::string name = absl::StrCat(block.name, ".", item.key(), ".weight");
      Part& part = part_of(unit, name);
      Part::HeldWeight& weight = part.held_weights.emplace_back();
      weight.name = name;
      weight.projection = item.value().get();
      for (const at::Tensor& tensor : tensors) {
        at::NoGradGuard no_grad;
        tensor.set_data(tensor.clone(at::MemoryFormat::Contiguous));
        const at::Tensor bytes = BytesOf(tensor);
        const int64_t rows = base::CeilDiv(bytes.numel(), part.group->size());
        at::Tensor shard = torch::zeros({rows}, bytes.options());
        CopyRowsOfRank(bytes, shard, rows, part.group->rank());
        weight.tensors.push_back(part.held.size());
        part.held.push_back(tensor);
        part.held_shards.push_back(shard);
        part.held_rows.push_back(rows);
        part.held_offsets.push_back(part.held_numel);
        part.held_numel += rows;
      }
    }
  };
  for (const Wrappable::Unit& block : model.Blocks()) {
    std::vector<Wrappable::NamedParameter> named;
    for (const auto& item : block.module->named_parameters()) {
      named.push_back({absl::StrCat(block.name, ".", item.key()), item.value()});
    }
    add_unit(block.name, named);
    fsdp->units_.back().stage = block.stage;
    add_held(fsdp->units_.back(), block);
  }
  add_unit("root", model.RootParameters());
  // Hook unit i is units_[i] and the root is units_.back(), so that every unit has a
  // collective of its own. A root without parameters (a pipeline's middle stage, which holds
  // neither the embedding nor the output layers) has none to gather: every rank of its group
  // holds the same stage, so none of them issues one.
  for (const Unit& unit : fsdp->units_) {
    if (unit.parameters() == 0 && &unit != &fsdp->units_.back()) {
      return absl::InvalidArgumentError(
          absl::StrCat("fsdp: unit ", unit.name,
                       " has no parameters; every block needs one to be an FSDP unit"));
    }
  }

  // The full parameters give up their memory (and take the compute dtype); the hooks bring
  // it back, contiguous, when a unit computes. A parameter that is a view without memory of
  // its own (a model built for deferred initialisation) gets a contiguous layout first.
  for (Unit& unit : fsdp->units_) {
    const int index = static_cast<int>(&unit - fsdp->units_.data());
    for (Part& part : unit.parts) {
      for (at::Tensor& parameter : part.parameters) {
        if (parameter.scalar_type() != fsdp->param_dtype_ || !parameter.is_contiguous()) {
          parameter.set_data(
              torch::empty(parameter.sizes(), parameter.options().dtype(fsdp->param_dtype_)));
        }
        internal::FreeStorage(parameter);
      }
      for (const at::Tensor& tensor : part.held) internal::FreeStorage(tensor);
      for (const at::Tensor& parameter : part.parameters) {
        if (!parameter.requires_grad()) continue;
        fsdp->hooks_.push_back(internal::AddPostAccumulateHook(
            parameter, [fsdp = fsdp.get(), index] { fsdp->OnGradientAccumulated(index); }));
      }
    }
  }
  Fsdp* self = fsdp.get();
  model.SetUnitHooks({[self](int unit) { self->BeforeForward(unit); },
                      [self](int unit, at::Tensor output) {
                        return self->AfterForward(unit, std::move(output));
                      }});
  return fsdp;
}

Fsdp::Fsdp(Wrappable& model, parallel::Communicator* replicate, const FsdpConfig& config)
    : model_(model),
      replicate_(replicate),
      reshard_after_forward_(!config.has_reshard_after_forward() ||
                             config.reshard_after_forward()) {
  const auto named = model.NamedParameters();
  const at::ScalarType model_dtype =
      named.empty() ? at::kFloat : named.front().parameter.scalar_type();
  param_dtype_ = base::ToScalarType(config.param_dtype(), model_dtype);
  reduce_dtype_ = base::ToScalarType(config.reduce_dtype(), at::kFloat);
}

Fsdp::~Fsdp() { model_.SetUnitHooks({}); }

std::vector<parallel::TrainableParameter> Fsdp::TrainableParameters() {
  std::vector<parallel::TrainableParameter> parameters = Shards();
  parameters.erase(std::remove_if(parameters.begin(), parameters.end(),
                                  [](const parallel::TrainableParameter& parameter) {
                                    return !parameter.tensor.requires_grad();  // frozen
                                  }),
                   parameters.end());
  return parameters;
}

std::vector<parallel::TrainableParameter> Fsdp::Shards() {
  std::vector<parallel::TrainableParameter> parameters;
  for (const Unit& unit : units_) {
    for (const Part& part : unit.parts) {
      const int rank = part.group->rank();
      for (size_t i = 0; i < part.shards.size(); ++i) {
        const at::Tensor& full = part.parameters[i];
        parallel::TensorSlice slice = parallel::TensorSlice::Whole(full.sizes());
        if (full.dim() == 0) {
          // A scalar is rank 0's one row; the other ranks' row is padding: marked as replicas,
          // they never save it.
          slice.replica = rank;
        } else {
          const RankRows mine = RowsOfRank(FullRows(full), part.rows[i], rank);
          slice = slice.Narrow(0, mine.first, mine.count);
        }
        if (replicate_ != nullptr) {
          slice.replica = slice.replica * replicate_->size() + replicate_->rank();
        }
        parameters.push_back({part.names[i], part.shards[i], {part.group}, 1, slice});
      }
    }
  }
  return parameters;
}

int64_t Fsdp::replica_count(const parallel::TrainableParameter& shard) const {
  return int64_t{shard.sharded_over.front()->size()} *
         (replicate_ != nullptr ? replicate_->size() : 1);
}

int Fsdp::num_blocks() const { return static_cast<int>(units_.size()) - 1; }

Fsdp::Unit& Fsdp::root() { return units_.back(); }

bool Fsdp::FirstOfStage(int unit) const {
  return unit == 0 || units_[unit - 1].stage != units_[unit].stage;
}

bool Fsdp::LastOfStage(int unit) const {
  return unit + 1 == num_blocks() || units_[unit + 1].stage != units_[unit].stage;
}

void Fsdp::Fail(const absl::Status& status) {
  if (status_.ok()) status_ = status;
}

parallel::StepPlace Fsdp::PlaceOf(const Unit& unit, const char* purpose) const {
  const int index = static_cast<int>(&unit - units_.data());
  return {index == num_blocks() ? parallel::StepPlace::kRoot : index,
          backward_started_ ? parallel::Pass::kBackward : parallel::Pass::kForward, purpose};
}

void Fsdp::StartGather(Unit& unit) {
  if (unit.state != Unit::State::kSharded) return;
  at::NoGradGuard no_grad;
  for (Part& part : unit.parts) {
    const parallel::ScopedPlace place(*part.group, PlaceOf(unit, kUnitPurpose));
    if (!part.parameters.empty()) {
      part.gather_input = part.PackShards(param_dtype_);
      part.gather_output =
          torch::empty({part.shard_numel * part.group->size()}, part.gather_input.options());
      part.gather = part.group->AllGather(part.gather_input, part.gather_output);
    }
    StartHeldGather(part);
  }
  unit.state = Unit::State::kGathering;
  // Counted from here: a prefetched unit's full parameters are alive from now on.
  unsharded_bytes_ += unit.ParameterBytes();
  peak_unsharded_bytes_ = std::max(peak_unsharded_bytes_, unsharded_bytes_);
}

void Fsdp::Unshard(Unit& unit) {
  if (unit.state == Unit::State::kUnsharded) return;
  StartGather(unit);
  for (Part& part : unit.parts) {
    if (part.gather != nullptr) {
      // On failure the parameters are refilled with whatever the buffer holds, so that the
      // forward still has memory to read; the error is reported by last_status().
      if (absl::Status status = part.gather->Wait(); !status.ok()) Fail(status);
      const at::Tensor by_rank = part.gather_output.view({part.group->size(), part.shard_numel});
      for (size_t i = 0; i < part.parameters.size(); ++i) {
        CopyBetweenFullAndRanks(internal::RestoreStorage(part.parameters[i]), by_rank,
                                part.offsets[i], part.rows[i], Direction::kIntoFull);
      }
      part.gather_input = at::Tensor();
      part.gather_output = at::Tensor();
      part.gather.reset();
    }
    FinishHeldGather(part);
  }
  unit.state = Unit::State::kUnsharded;
}

void Fsdp::StartHeldGather(Part& part) {
  if (part.held_numel == 0) return;
  part.held_gather_input =
      Pack(part.held_shards, part.held_offsets, part.held_numel, part.held_shards[0].options());
  part.held_gather_output =
      torch::empty({part.held_numel * part.group->size()}, part.held_gather_input.options());
  part.held_gather = part.group->AllGather(part.held_gather_input, part.held_gather_output);
}

void Fsdp::FinishHeldGather(Part& part) {
  if (part.held_gather == nullptr) return;
  // As Unshard's parameters: on failure the tensors get whatever the buffer holds.
  if (absl::Status status = part.held_gather->Wait(); !status.ok()) Fail(status);
  const at::Tensor bytes_by_rank =
      part.held_gather_output.view({part.group->size(), part.held_numel});
  for (size_t i = 0; i < part.held.size(); ++i) {
    CopyBetweenFullAndRanks(BytesOf(internal::RestoreStorage(part.held[i])), bytes_by_rank,
                            part.held_offsets[i], part.held_rows[i], Direction::kIntoFull);
  }
  part.held_gather_input = at::Tensor();
  part.held_gather_output = at::Tensor();
  part.held_gather.reset();
}

void Fsdp::Reshard(Unit& unit) {
  if (unit.state == Unit::State::kGathering) Unshard(unit);  // settle the collective first
  if (unit.state != Unit::State::kUnsharded) return;
  for (const Part& part : unit.parts) {
    for (const at::Tensor& parameter : part.parameters) internal::FreeStorage(parameter);
    for (const at::Tensor& tensor : part.held) internal::FreeStorage(tensor);
  }
  unit.state = Unit::State::kSharded;
  unsharded_bytes_ -= unit.ParameterBytes();
}

// The root unit computes twice in a forward pass: before the first block (the embedding
// lookup) and after the last (final norm, output projection). In between it is freed, as a
// block is, when reshard_after_forward is set: an embedding lookup's backward reads only the
// indices and the weight's size (Wrappable's contract), so nothing reads the root's
// parameters again until the output projection's backward. It is gathered again while the
// last block computes, kept through the backward of the norm and output projection, and
// freed when the last block's backward starts; its gradient is reduced once the embedding's
// arrives, at the end. A pipeline stage's forward runs its own blocks only, and gathers the
// root only for the layers of it the stage holds: before its first block when it embeds,
// after its last when it computes the output.
void Fsdp::KeepGathered(bool keep) {
  keep_gathered_ = keep;
  if (keep) return;
  for (Unit& unit : units_) Reshard(unit);
}

void Fsdp::BeforeForward(int hook_unit) {
  if (hook_unit == Wrappable::kRootUnit) {
    if (backward_started_) {
      // The last backward never reached its end (it threw): its gradients are incomplete.
      // Settle its collectives, so every rank is in step again, and report it.
      for (Unit& unit : units_) {
        for (Part& part : unit.parts) {
          if (part.reduce != nullptr) part.reduce->Wait().IgnoreError();
          part.reduce.reset();
          part.reduce_output = at::Tensor();
        }
        Reshard(unit);
      }
      reducing_.clear();
      backward_started_ = false;
      Fail(absl::AbortedError(
          "fsdp: the previous backward pass did not finish; its gradients were dropped"));
    }
    forward_root_use_ = {model_.HoldsInputLayers(), model_.HoldsOutputLayers()};
    forward_last_unit_ = -1;
    if (forward_root_use_.embeds) {
      Unshard(root());
      // The stage that embeds starts at block 0.
      if (num_blocks() > 0) StartGather(units_[0]);  // overlaps the embedding lookup
    }
    return;
  }
  forward_last_unit_ = hook_unit;
  if (hook_unit == 0 && reshard_after_forward_ && !keep_gathered_) Reshard(root());
  Unshard(units_[hook_unit]);
  // Prefetch: the next unit's gather runs while this block computes.
  if (!LastOfStage(hook_unit)) {
    StartGather(units_[hook_unit + 1]);
  } else if (forward_root_use_.outputs) {
    StartGather(root());
  }
}

at::Tensor Fsdp::AfterForward(int hook_unit, at::Tensor output) {
  const bool backward_follows = output.requires_grad();
  if (backward_follows) {
    output.register_hook([this, hook_unit, root_use = forward_root_use_,
                          last_unit = forward_last_unit_](at::Tensor grad) {
      BeforeBackward(hook_unit, root_use, last_unit);
      return grad;
    });
  }
  if (hook_unit == Wrappable::kRootUnit) {
    if (!backward_follows && !keep_gathered_) Reshard(root());
    return output;
  }
  if ((!backward_follows || reshard_after_forward_) && !keep_gathered_) {
    Reshard(units_[hook_unit]);
  }
  if (LastOfStage(hook_unit) && forward_root_use_.outputs) {
    Unshard(root());  // the final norm and output follow
  }
  return output;
}

void Fsdp::BeforeBackward(int hook_unit, RootUse root_use, int last_unit) {
  if (!backward_started_) {
    backward_started_ = true;
    for (Unit& unit : units_) {
      unit.gradients_pending = unit.trainable();
      unit.input_gradient_done = false;
      unit.in_backward = false;
    }
    internal::QueueEndOfBackwardCallback([this] { FinishBackward(); });
  }
  if (hook_unit == Wrappable::kRootUnit) {
    root().in_backward = root_use.embeds || root_use.outputs;
    // The output projection's backward reads the root's parameters; the embedding's does not.
    if (root_use.outputs) Unshard(root());
    if (last_unit >= 0) StartGather(units_[last_unit]);  // prefetch the forward's last block
    return;
  }
  units_[hook_unit].in_backward = true;
  // The stage's last block's output gradient is complete: the norm and output projection have
  // run their backward, and nothing left reads the root's parameters.
  if (LastOfStage(hook_unit)) Reshard(root());
  // This block's output is the next block's input: the next block's backward is over, and
  // once its gradients are in too, it is freed (a block with frozen parameters waits for
  // this; a stage's first block, whose input comes from the root or another rank, for the
  // end of the backward).
  if (!LastOfStage(hook_unit)) {
    Unit& next = units_[hook_unit + 1];
    next.input_gradient_done = true;
    if (next.gradients_pending == 0) Reshard(next);
  }
  Unshard(units_[hook_unit]);
  // Prefetch: the block that runs backward next is the one before this one, in its stage.
  if (!FirstOfStage(hook_unit)) StartGather(units_[hook_unit - 1]);
}

void Fsdp::OnGradientAccumulated(int index) {
  Unit& unit = units_[index];
  if (!backward_started_ || --unit.gradients_pending > 0) return;
  StartReduceScatter(unit);
  if (unit.gradients_end_backward() || unit.input_gradient_done) Reshard(unit);
}

// Every rank's chunk of a part's input holds, for each trainable parameter, that rank's rows
// of the full gradient (zero for padding rows and for parameters without a gradient), then a
// flag per trainable parameter, 1 where this rank has its gradient: reduced, the flags tell
// every rank which parameters some rank used, and the others get no gradient, as in one
// process. Frozen parameters have no place in it.
void Fsdp::StartReduceScatter(Unit& unit) {
  at::NoGradGuard no_grad;
  for (Part& part : unit.parts) {
    if (part.trainable == 0) continue;
    const int n = part.group->size();
    const int64_t flags = part.trainable;
    at::Tensor input =
        torch::zeros({n, part.grad_numel + flags}, part.shards[0].options().dtype(reduce_dtype_));
    part.every_gradient_here = true;
    int64_t flag = 0;
    for (size_t i = 0; i < part.parameters.size(); ++i) {
      if (part.grad_offsets[i] < 0) continue;  // frozen
      at::Tensor& parameter = part.parameters[i];
      const at::Tensor grad = parameter.grad();
      const int64_t own_flag = flag++;
      if (!grad.defined()) {
        part.every_gradient_here = false;
        continue;
      }
      input.select(1, part.grad_numel + own_flag).fill_(1);
      CopyBetweenFullAndRanks(grad.contiguous(), input, part.grad_offsets[i], part.rows[i],
                              Direction::kOutOfFull);
      parameter.mutable_grad().reset();  // the full gradient is not needed any more
    }
    part.reduce_output = torch::empty({part.grad_numel + flags}, input.options());
    const parallel::ScopedPlace place(*part.group, PlaceOf(unit, kUnitPurpose));
    part.reduce = part.group->ReduceScatter(input.view({-1}), part.reduce_output,
                                            parallel::ReduceOp::kAverage);
  }
  // The units whose reduce-scatters started before this one's have had a block's backward to
  // finish them in.
  SettleEarlierReduces();
  reducing_.push_back(&unit);
}

// Waits for each reducing unit's reduce-scatters, so that their inputs, the unit's whole
// gradient in reduce_dtype, are freed now: a Work holds its tensors until it is waited for (an
// NcclWork, so that the caching allocator cannot hand out memory NCCL still reads), and
// waiting for all of them only at the end of the backward would keep every unit's whole
// gradient alive at once. With a replicate group, each result (the averaged gradient shards
// and usage flags) is then averaged across the replicas in place, overlapping what is left of
// the backward; its `reduce` becomes that all-reduce. Every rank waits and starts them in the
// same order, that of the reduce-scatters.
void Fsdp::SettleEarlierReduces() {
  for (Unit* unit : reducing_) {
    for (Part& part : unit->parts) {
      if (part.reduce == nullptr) continue;
      if (absl::Status status = part.reduce->Wait(); !status.ok()) {
        Fail(status);  // its `reduce` keeps the failure, which FinishBackward finds
        continue;
      }
      if (replicate_ != nullptr) {
        const parallel::ScopedPlace place(*replicate_, PlaceOf(*unit, kReplicasPurpose));
        part.reduce = replicate_->AllReduce(part.reduce_output, parallel::ReduceOp::kAverage);
      }
    }
  }
  reducing_.clear();
}

void Fsdp::FinishBackward() {
  at::NoGradGuard no_grad;
  for (Unit& unit : units_) {
    // A unit of this backward with a trainable parameter that got no gradient has not reduced
    // yet; every rank has the same model and runs the same stage, so every rank starts the
    // same reductions here, in unit order.
    if (unit.in_backward && unit.trainable() > 0 && !unit.reducing()) StartReduceScatter(unit);
  }
  SettleEarlierReduces();  // with a replicate group, the last units' all-reduces start
  for (Unit& unit : units_) {
    for (Part& part : unit.parts) {
      if (part.reduce == nullptr) continue;
      absl::Status status = part.reduce->Wait();
      part.reduce.reset();
      if (status.ok()) {
        AccumulateShardGradients(part);
      } else {
        Fail(status);
      }
      part.reduce_output = at::Tensor();
    }
    Reshard(unit);
  }
  backward_started_ = false;
}

void Fsdp::AccumulateShardGradients(Part& part) {
  // Reading the flags waits for the device, so they are read only when this rank lacks a
  // gradient (a parameter unused here), which another rank may have; in a usual step every
  // rank has every gradient.
  const at::Tensor used_by_any =
      part.every_gradient_here
          ? at::Tensor()
          : part.reduce_output.narrow(0, part.grad_numel, part.trainable).to(at::kCPU, at::kFloat);
  int64_t flag = 0;
  for (size_t i = 0; i < part.shards.size(); ++i) {
    at::Tensor& shard = part.shards[i];
    if (part.grad_offsets[i] < 0) continue;  // frozen
    const int64_t own_flag = flag++;
    if (used_by_any.defined() && used_by_any[own_flag].item<float>() == 0.0f) continue;
    const at::Tensor grad =
        part.reduce_output.narrow(0, part.grad_offsets[i], shard.numel()).view(shard.sizes());
    if (shard.grad().defined()) {
      shard.mutable_grad().add_(grad);  // gradient accumulation over micro-steps
    } else {
      // A copy of its own: reduce_output is freed, and may be of another dtype.
      shard.mutable_grad() = grad.to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);
    }
  }
}

absl::StatusOr<std::map<std::string, at::Tensor>> Fsdp::FullStateDict() {
  std::map<std::string, at::Tensor> state;
  at::NoGradGuard no_grad;
  for (Unit& unit : units_) {
    for (Part& part : unit.parts) {
      if (!part.parameters.empty()) {
        const int n = part.group->size();
        const at::Tensor input = part.PackShards(at::kFloat);
        at::Tensor output = torch::empty({part.shard_numel * n}, input.options());
        PLAIT_RETURN_IF_ERROR(part.group->AllGather(input, output)->Wait());
        const at::Tensor by_rank = output.view({n, part.shard_numel});
        for (size_t i = 0; i < part.parameters.size(); ++i) {
          at::Tensor full = torch::empty(part.parameters[i].sizes(), input.options());
          CopyBetweenFullAndRanks(full, by_rank, part.offsets[i], part.rows[i],
                                  Direction::kIntoFull);
          state[part.names[i]] = std::move(full);
        }
      }
      if (part.held_weights.empty()) continue;
      // The held weights as the seams compute with them, from their bytes gathered for a
      // moment.
      const Seams& seams = model_.seams();
      if (seams.HeldTensors(*part.held_weights.front().projection).empty()) {
        return absl::InternalError(absl::StrCat(
            "fsdp: unit ", unit.name, " holds weights for a layer of the seams, which is gone"));
      }
      Reshard(unit);  // the held tensors are freed again below: the unit must be sharded
      StartHeldGather(part);
      FinishHeldGather(part);
      PLAIT_RETURN_IF_ERROR(status_);
      for (const Part::HeldWeight& weight : part.held_weights) {
        state[weight.name] = seams.Weight(*weight.projection, at::Tensor()).clone();
      }
      for (const at::Tensor& tensor : part.held) internal::FreeStorage(tensor);
    }
  }
  return state;
}

std::function<void(const at::Tensor&)> Fsdp::StoreIntoShards(
    const std::string& name, std::function<void(const at::Tensor&)> store) {
  for (Unit& unit : units_) {
    for (Part& part : unit.parts) {
      for (const Part::HeldWeight& weight : part.held_weights) {
        if (weight.name != name) continue;
        return
            [this, &unit, &part, &weight, store = std::move(store)](const at::Tensor& values) {
              Reshard(unit);  // a gathered unit would keep computing with the old values
              for (size_t i : weight.tensors) internal::RestoreStorage(part.held[i]);
              store(values);
              at::NoGradGuard no_grad;
              for (size_t i : weight.tensors) {
                CopyRowsOfRank(BytesOf(part.held[i]), part.held_shards[i], part.held_rows[i],
                               part.group->rank());
                internal::FreeStorage(part.held[i]);
              }
            };
      }
    }
  }
  return store;
}

absl::Status Fsdp::LoadFullStateDict(const std::map<std::string, at::Tensor>& state) {
  // Every entry is checked before anything changes, so an error leaves the model as it was.
  for (const Unit& unit : units_) {
    for (const Part& part : unit.parts) {
      for (size_t i = 0; i < part.parameters.size(); ++i) {
        auto it = state.find(part.names[i]);
        if (it == state.end()) {
          return absl::InvalidArgumentError(
              absl::StrCat("full state dict: no tensor for parameter ", part.names[i]));
        }
        if (it->second.sizes() != part.parameters[i].sizes()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "full state dict: ", part.names[i], " has shape ", c10::str(it->second.sizes()),
              ", the parameter's is ", c10::str(part.parameters[i].sizes())));
        }
      }
    }
  }
  at::NoGradGuard no_grad;
  for (Unit& unit : units_) {
    Reshard(unit);  // a gathered unit would keep computing with the old values
    for (Part& part : unit.parts) {
      for (size_t i = 0; i < part.parameters.size(); ++i) {
        part.shards[i].zero_();
        CopyRowsOfRank(state.at(part.names[i]), part.shards[i], part.rows[i], part.group->rank());
      }
    }
  }
  return absl::OkStatus();
}

std::vector<base::Violation> FsdpStrategy::Check(const std::optional<ModelShape>& shape,
                                                 const parallel::MeshConfig& mesh,
                                                 const std::string& field) const {
  std::vector<base::Violation> violations;
  if (config_.param_dtype() == base::DTYPE_FLOAT16) {
    violations.push_back({field + ".fsdp.param_dtype", base::kNoCpuFp16, ""});
  }
  if (config_.param_dtype() == base::DTYPE_AUTO) {
    violations.push_back({field + ".fsdp.param_dtype", base::kAutoIsForModels, ""});
  }
  if (config_.reduce_dtype() == base::DTYPE_AUTO) {
    violations.push_back({field + ".fsdp.reduce_dtype", base::kAutoIsForModels, ""});
  }
  return violations;
}

StepEstimate FsdpStrategy::Estimate(const ModelShape& shape,
                                    const parallel::MeshConfig& mesh) const {
  const bool reshard = !config_.has_reshard_after_forward() || config_.reshard_after_forward();
  const int dim_size = static_cast<int>(parallel::SubmeshRanks(mesh, {config_.mesh_dim()}));
  const bool hybrid = !config_.replicate_mesh_dim().empty();
  const int replicas =
      hybrid ? static_cast<int>(parallel::SubmeshRanks(mesh, {config_.replicate_mesh_dim()})) : 1;
  // With shard_dense_over_mesh_dim, the share of the parameters (of those a rank holds) that
  // the lender keeps whole, sharded over both dimensions; those it splits over mesh_dim alone.
  const bool borrows = !borrowed_dim().empty();
  const int dense_size = static_cast<int>(
      parallel::SubmeshRanks(mesh, {config_.mesh_dim(), borrows ? borrowed_dim() : ""}));
  double dense_share = 0.0;
  if (borrows) {
    double dense = 0.0;
    double all = 0.0;
    for (const ModelShape::Parameter& parameter : shape.parameter_list) {
      all += parameter.numel();
      if (KeptWholeBy(lender_, parameter.name)) dense += parameter.numel();
    }
    dense_share = all > 0 ? dense / all : 0.0;
  }
  std::string dense_dims;  // the dimensions the dense parts are sharded over, in mesh order
  for (const parallel::MeshConfig::Dimension& dim : mesh.dims()) {
    if (borrows && (dim.name() == config_.mesh_dim() || dim.name() == borrowed_dim())) {
      absl::StrAppend(&dense_dims, dense_dims.empty() ? "" : ",", dim.name());
    }
  }
  const int64_t units = shape.num_blocks + 1;  // the blocks and the root
  StepEstimate estimate;
  estimate.description = absl::StrFormat(
      "fsdp over %s (%d ranks): %d units (%d block%s and the root), each rank keeps 1/%d of %s "
      "parameters%s and gathers one unit at a time (prefetching the next)%s%s",
      config_.mesh_dim(), dim_size, units, units - 1, units == 2 ? "" : "s", dim_size,
      base::HumanCount(shape.parameters * (1.0 - dense_share)),
      borrows ? absl::StrFormat(" (those split over %s) and 1/%d of the other %s (sharded over %s)",
                                borrowed_dim(), dense_size,
                                base::HumanCount(shape.parameters * dense_share), dense_dims)
              : "",
      reshard ? "" : ", keeping it until its backward",
      hybrid ? absl::StrFormat("; hybrid sharding: the shards replicated over %s (%d ranks), "
                               "each unit's gradient shards all-reduced across it after their "
                               "reduce-scatter",
                               config_.replicate_mesh_dim(), replicas)
             : "");
  estimate.parameter_fraction = (1.0 - dense_share) / dim_size + dense_share / dense_size;
  const double gathered_bytes_per_element =
      config_.param_dtype() == base::DTYPE_UNSPECIFIED
          ? shape.parameter_bytes
          : c10::elementSize(base::ToScalarType(config_.param_dtype(), at::kFloat));
  // The two largest units (the one computing and the one prefetched); without resharding
  // after forward, every unit by the end of the forward.
  estimate.memory.push_back(
      {.name = "gathered units",
       .part = MemoryTerm::Part::kGathered,
       .bytes = (reshard ? shape.block_parameters +
                               std::max(shape.root_parameters, shape.block_parameters)
                         : shape.parameters) *
                gathered_bytes_per_element});
  // A generation phase that keeps what it gathers holds every unit.
  estimate.memory.push_back({.name = "every unit gathered",
                             .part = MemoryTerm::Part::kKeptGathered,
                             .bytes = shape.parameters * gathered_bytes_per_element});
  // Every micro-batch gathers each unit for its forward (and again for its backward when
  // resharded after forward) and reduce-scatters its trainable parameters' gradients, over
  // each group its parts are sharded over, then all-reduces those gradient shards across the
  // replicas.
  const double reduce_bytes_per_element =
      c10::elementSize(base::ToScalarType(config_.reduce_dtype(), at::kFloat));
  estimate.kept_parameter_bytes = sizeof(float);  // the shards, whatever the model's dtype
  estimate.kept_gradient_bytes = reduce_bytes_per_element;
  const auto unit_collectives = [&](const std::string& dims, int ranks, double share) {
    const double ring = static_cast<double>(ranks - 1) / ranks;
    estimate.transfers.push_back(
        {.mesh_dim = dims,
         .bytes_per_micro_batch =
             ring * share *
             (shape.parameters * (reshard ? 2 : 1) * gathered_bytes_per_element +
              shape.TrainableParameters() * reduce_bytes_per_element)});
  };
  unit_collectives(config_.mesh_dim(), dim_size, 1.0 - dense_share);
  if (borrows) unit_collectives(dense_dims, dense_size, dense_share);
  if (hybrid) {
    const double replica_ring = static_cast<double>(replicas - 1) / replicas;
    estimate.transfers.push_back(
        {.mesh_dim = config_.replicate_mesh_dim(),
         .bytes_per_micro_batch = 2.0 * replica_ring * shape.TrainableParameters() *
                                  estimate.parameter_fraction * reduce_bytes_per_element});
  }
  return estimate;
}

absl::Status FsdpStrategy::Apply(Wrappable& model, const parallel::DeviceMesh& mesh) {
  PLAIT_ASSIGN_OR_RETURN(parallel::Communicator * communicator,
                         mesh.communicator(config_.mesh_dim()));
  parallel::Communicator* replicate = nullptr;
  if (!config_.replicate_mesh_dim().empty()) {
    PLAIT_ASSIGN_OR_RETURN(replicate, mesh.communicator(config_.replicate_mesh_dim()));
  }
  parallel::Communicator* dense = nullptr;
  if (!borrowed_dim().empty()) {
    PLAIT_ASSIGN_OR_RETURN(dense, mesh.SubgridCommunicator({config_.mesh_dim(), borrowed_dim()}));
  }
  PLAIT_ASSIGN_OR_RETURN(fsdp_,
                         Fsdp::Create(model, *communicator, replicate, config_, dense, lender_));
  return absl::OkStatus();
}

void FsdpStrategy::UpdateParameters(std::vector<parallel::TrainableParameter>& parameters) {
  // FSDP's shards of the same parameters in its unit order; each keeps the groups earlier
  // strategies split it over and how many ranks of those share it.
  std::map<std::string, parallel::TrainableParameter> earlier;
  for (parallel::TrainableParameter& parameter : parameters) {
    earlier[parameter.name] = std::move(parameter);
  }
  parameters.clear();
  for (parallel::TrainableParameter& parameter : fsdp_->Shards()) {
    const auto it = earlier.find(parameter.name);
    if (it == earlier.end()) continue;
    const parallel::TrainableParameter& before = it->second;
    const int64_t copies = fsdp_->replica_count(parameter);
    std::vector<parallel::Communicator*> groups = before.sharded_over;
    groups.insert(groups.end(), parameter.sharded_over.begin(), parameter.sharded_over.end());
    parameter.sharded_over = std::move(groups);
    parameter.replicas = before.replicas;
    // The shard's rows, counted in what the earlier strategies left this rank.
    const parallel::TensorSlice rows = parameter.slice;
    parameter.slice = rows.box.offsets.empty()
                          ? before.slice
                          : before.slice.Narrow(0, rows.box.offsets[0], rows.box.lengths[0]);
    parameter.slice.replica = before.slice.replica * copies + rows.replica;
    parameters.push_back(std::move(parameter));
  }
}

void FsdpStrategy::UpdateHeldParameters(std::vector<parallel::TrainableParameter>& held) {
  for (parallel::TrainableParameter& part : held) {
    if (part.store) part.store = fsdp_->StoreIntoShards(part.name, std::move(part.store));
  }
}

absl::Status FsdpStrategy::GatherFullParameters(std::map<std::string, at::Tensor>& parameters) {
  using FullStateDict = std::map<std::string, at::Tensor>;
  PLAIT_ASSIGN_OR_RETURN(FullStateDict full, fsdp_->FullStateDict());
  for (auto& [name, tensor] : full) parameters[name] = std::move(tensor);
  return absl::OkStatus();
}

}  // namespace plait::wrap::fsdp
