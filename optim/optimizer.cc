#include "optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "ATen/Parallel.h"
#include "ATen/core/Tensor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"
#include "base/torch_compat.h"
#include "optim/grad_norm.h"
#include "optim/internal/cpu_updates.h"
#include "optim/internal/fused_kernels.h"
#include "optim/internal/multi_tensor_updates.h"
#include "torch/csrc/autograd/generated/variable_factories.h"

namespace plait::optim {
namespace {

// Elements per task when a parameter's update is split across LibTorch's intra-op threads.
constexpr int64_t kGrainSize = 1 << 16;
// Elements per pass of a fused update: 8 KiB of fp32, so that a chunk's master, gradient and
// state are still in the core's cache when a 16-bit parameter gets its rounded copy.
constexpr int64_t kChunk = 2048;

template <typename Low>
void Widen(const Low* in, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(in[i]);
}

template <typename Low>
void Narrow(const float* in, int64_t n, Low* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<Low>(in[i]);
}

// Runs `kernel(begin, count, grad)` over a CPU parameter's fp32 master in chunks, on
// LibTorch's intra-op threads, `grad` the chunk's gradient in fp32 (the gradient itself, or a
// 16-bit one widened into the thread's buffer); after each chunk a 16-bit parameter gets the
// chunk's new master values, rounded as Tensor::copy_ rounds them. One pass over memory, with
// no separate passes to cast the gradient or the parameter.
template <typename Kernel>
void ForEachChunk(const at::Tensor& master, const at::Tensor& grad, const at::Tensor& parameter,
                  const Kernel& kernel) {
  const float* p = master.data_ptr<float>();
  at::parallel_for(0, master.numel(), kGrainSize, [&](int64_t begin, int64_t end) {
    float widened[kChunk];
    for (int64_t chunk = begin; chunk < end; chunk += kChunk) {
      const int64_t count = std::min(kChunk, end - chunk);
      const float* g = widened;
      switch (grad.scalar_type()) {
        case at::kBFloat16:
          Widen(grad.data_ptr<at::BFloat16>() + chunk, count, widened);
          break;
        case at::kHalf:
          Widen(grad.data_ptr<at::Half>() + chunk, count, widened);
          break;
        default:
          g = grad.data_ptr<float>() + chunk;
      }
      kernel(chunk, count, g);
      switch (parameter.scalar_type()) {
        case at::kBFloat16:
          Narrow(p + chunk, count, parameter.data_ptr<at::BFloat16>() + chunk);
          break;
        case at::kHalf:
          Narrow(p + chunk, count, parameter.data_ptr<at::Half>() + chunk);
          break;
        default:
          break;  // the master is the parameter
      }
    }
  });
}
// torch.nn.utils.clip_grad_norm_'s guard against dividing by a zero norm.
constexpr double kClipEpsilon = 1e-6;

// The hyperparameters of the configured algorithm, defaults applied and checked.
struct Hyperparameters {
  OptimizerConfig::AlgorithmCase algorithm;
  double beta1 = 0.0;
  double beta2 = 0.0;
  double eps = 0.0;
  double momentum = 0.0;
  double dampening = 0.0;
  bool nesterov = false;
};

absl::Status Require(bool ok, const std::string& field, double value,
                     absl::string_view requirement) {
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("optimizer.", field, ": ", value, " must be ", requirement));
}

absl::Status CheckBeta(const std::string& field, double beta) {
  return Require(beta >= 0.0 && beta < 1.0, field, beta, "in [0, 1)");
}

// AdamW and Adam have the same fields in distinct messages.
template <typename AdamConfig>
absl::StatusOr<Hyperparameters> AdamHyperparameters(const AdamConfig& config,
                                                    const std::string& name, Hyperparameters h) {
  h.beta1 = config.has_beta1() ? config.beta1() : 0.9;
  h.beta2 = config.has_beta2() ? config.beta2() : 0.999;
  h.eps = config.has_eps() ? config.eps() : 1e-8;
  PLAIT_RETURN_IF_ERROR(CheckBeta(name + ".beta1", h.beta1));
  PLAIT_RETURN_IF_ERROR(CheckBeta(name + ".beta2", h.beta2));
  PLAIT_RETURN_IF_ERROR(Require(h.eps > 0.0, name + ".eps", h.eps, "> 0"));
  // An infinite eps silently makes every update 0.
  PLAIT_RETURN_IF_ERROR(Require(std::isfinite(h.eps), name + ".eps", h.eps, "finite"));
  return h;
}

absl::StatusOr<Hyperparameters> ResolveHyperparameters(const OptimizerConfig& config) {
  Hyperparameters h;
  h.algorithm = config.algorithm_case();
  switch (config.algorithm_case()) {
    case OptimizerConfig::kAdamw:
      return AdamHyperparameters(config.adamw(), "adamw", h);
    case OptimizerConfig::kAdam:
      return AdamHyperparameters(config.adam(), "adam", h);
    case OptimizerConfig::kSgd: {
      const Sgd& sgd = config.sgd();
      h.momentum = sgd.momentum();
      h.dampening = sgd.dampening();
      h.nesterov = sgd.nesterov();
      PLAIT_RETURN_IF_ERROR(CheckBeta("sgd.momentum", h.momentum));
      PLAIT_RETURN_IF_ERROR(Require(h.dampening >= 0.0 && h.dampening <= 1.0, "sgd.dampening",
                                    h.dampening, "in [0, 1]"));
      if (h.nesterov && (h.momentum == 0.0 || h.dampening != 0.0)) {
        return absl::InvalidArgumentError(
            absl::StrCat("optimizer.sgd.nesterov: needs momentum > 0 and dampening 0 (momentum ",
                         h.momentum, ", dampening ", h.dampening, ")"));
      }
      return h;
    }
    case OptimizerConfig::kLion: {
      const Lion& lion = config.lion();
      h.beta1 = lion.has_beta1() ? lion.beta1() : 0.9;
      h.beta2 = lion.has_beta2() ? lion.beta2() : 0.99;
      PLAIT_RETURN_IF_ERROR(CheckBeta("lion.beta1", h.beta1));
      PLAIT_RETURN_IF_ERROR(CheckBeta("lion.beta2", h.beta2));
      return h;
    }
    case OptimizerConfig::ALGORITHM_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError(
      "optimizer: no algorithm is set; set one of adamw, adam, sgd, lion");
}

// The state buffers each algorithm keeps per parameter.
std::vector<std::string> BufferNames(const Hyperparameters& h) {
  switch (h.algorithm) {
    case OptimizerConfig::kAdamw:
    case OptimizerConfig::kAdam:
      return {"exp_avg", "exp_avg_sq"};
    case OptimizerConfig::kSgd:
      if (h.momentum != 0.0) return {"momentum_buffer"};
      return {};
    case OptimizerConfig::kLion:
      return {"exp_avg"};
    case OptimizerConfig::ALGORITHM_NOT_SET:
      break;
  }
  return {};
}

}  // namespace

int StateBuffersPerElement(const OptimizerConfig& config) {
  absl::StatusOr<Hyperparameters> hyperparameters = ResolveHyperparameters(config);
  return hyperparameters.ok() ? static_cast<int>(BufferNames(*hyperparameters).size()) : 0;
}

namespace {

absl::Status CheckParameters(const std::vector<parallel::TrainableParameter>& parameters) {
  if (parameters.empty()) return absl::InvalidArgumentError("optimizer: no parameters to train");
  std::set<std::string> names;
  for (const parallel::TrainableParameter& parameter : parameters) {
    const std::string where = absl::StrCat("parameter \"", parameter.name, "\"");
    if (parameter.name.empty()) return absl::InvalidArgumentError("a parameter has no name");
    if (!names.insert(parameter.name).second) {
      return absl::InvalidArgumentError(absl::StrCat(where, " is listed twice"));
    }
    const at::Tensor& tensor = parameter.tensor;
    if (!tensor.defined()) return absl::InvalidArgumentError(where + " is undefined");
    const auto dtype = tensor.scalar_type();
    if (dtype != at::kFloat && dtype != at::kBFloat16 && dtype != at::kHalf) {
      return absl::InvalidArgumentError(absl::StrCat(where, " has dtype ", c10::toString(dtype),
                                                     "; supported are Float, BFloat16, Half"));
    }
    if (!tensor.is_contiguous()) {
      return absl::InvalidArgumentError(where + " is not contiguous");
    }
    // The clipping norm is reduced on one device (grad_norm.h).
    const at::Device device = parameters.front().tensor.device();
    if (tensor.device() != device) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, " is on ", tensor.device().str(), ", parameter \"", parameters.front().name,
          "\" on ", device.str(), "; an optimizer's parameters share one device"));
    }
    const at::Tensor& master = parameter.master;
    if (master.defined() && (dtype == at::kFloat || master.scalar_type() != at::kFloat ||
                             master.sizes() != tensor.sizes() ||
                             master.device() != tensor.device() || !master.is_contiguous())) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, " (", c10::toString(dtype), " ", c10::str(tensor.sizes()), " on ",
          tensor.device().str(), ") was given a master of ", c10::toString(master.scalar_type()),
          " ", c10::str(master.sizes()), " on ", master.device().str(),
          "; a master is a 16-bit parameter's fp32 values, contiguous, of its shape and device"));
    }
    // The full parameters of an FSDP-wrapped model have no memory between uses: an
    // optimizer over them would train nothing the model computes with (the motivating bug).
    if (tensor.storage().nbytes() <
        static_cast<size_t>((tensor.storage_offset() + tensor.numel()) * tensor.element_size())) {
      return absl::InvalidArgumentError(
          absl::StrCat(where,
                       " has no memory: it is the full parameter of a sharded (FSDP) model; build "
                       "the optimizer from the prepared model's trainable parameters"));
    }
  }
  return absl::OkStatus();
}

// A copy of `tensor` in host memory, made directly from wherever it is.
at::Tensor HostCopy(const at::Tensor& tensor) {
  return tensor.to(tensor.options().device(at::kCPU), /*non_blocking=*/false, /*copy=*/true);
}

std::string StateKey(const std::string& parameter, const std::string& slot) {
  return absl::StrCat(parameter, ":", slot);
}

// What a config says for parameters with given names, checked.
struct ResolvedConfig {
  Hyperparameters hyperparameters;
  std::vector<ParamGroup> groups;
};

absl::StatusOr<ResolvedConfig> Resolve(const OptimizerConfig& config,
                                       const std::vector<std::string>& parameter_names) {
  ResolvedConfig resolved;
  PLAIT_ASSIGN_OR_RETURN(resolved.hyperparameters, ResolveHyperparameters(config));
  if (config.has_clipping()) {
    const double max_norm = config.clipping().max_norm();
    PLAIT_RETURN_IF_ERROR(Require(max_norm >= 0.0 && std::isfinite(max_norm), "clipping.max_norm",
                                  max_norm, ">= 0 and finite"));
  }
  PLAIT_ASSIGN_OR_RETURN(resolved.groups, AssignParamGroups(parameter_names, config));
  return resolved;
}

}  // namespace

struct Optimizer::Slot {
  Hyperparameters hyperparameters;
  int group = 0;
  // The fused loops over the memory of a CPU parameter; otherwise the multi-tensor updates
  // of its bucket, on any device.
  bool fused = false;
  at::Tensor master;  // fp32; the parameter itself when the parameter is fp32
  // The algorithm's state (BufferNames), empty until this parameter's first update or a
  // LoadState allocates it, as torch.optim allocates its state: a run's start-up does not
  // page in the memory that its first step fills (4 bytes an element per buffer).
  std::map<std::string, at::Tensor> buffers;
  int64_t steps = 0;  // updates this parameter received

  // Allocates the state as zeros unless it is allocated.
  void AllocateBuffers() {
    if (!buffers.empty()) return;
    for (const std::string& buffer : BufferNames(hyperparameters)) {
      buffers[buffer] = torch::zeros_like(master);
    }
  }
};

absl::Status ValidateOptimizerConfig(const OptimizerConfig& config,
                                     const std::vector<std::string>& parameter_names) {
  return Resolve(config, parameter_names).status();
}

absl::StatusOr<std::unique_ptr<Optimizer>> Optimizer::Create(
    std::vector<parallel::TrainableParameter> parameters, const OptimizerConfig& config) {
  return internal::CreateOptimizer(std::move(parameters), config, internal::UpdatePaths());
}

absl::StatusOr<std::unique_ptr<Optimizer>> internal::CreateOptimizer(
    std::vector<parallel::TrainableParameter> parameters, const OptimizerConfig& config,
    const UpdatePaths& paths) {
  PLAIT_RETURN_IF_ERROR(CheckParameters(parameters));
  std::vector<std::string> names;
  for (const parallel::TrainableParameter& parameter : parameters) names.push_back(parameter.name);
  PLAIT_ASSIGN_OR_RETURN(ResolvedConfig resolved, Resolve(config, names));
  const Hyperparameters& hyperparameters = resolved.hyperparameters;
  std::vector<ParamGroup>& groups = resolved.groups;

  std::vector<Optimizer::Slot> slots(parameters.size());
  for (int g = 0; g < static_cast<int>(groups.size()); ++g) {
    for (int member : groups[g].members) slots[member].group = g;
  }
  for (size_t i = 0; i < parameters.size(); ++i) {
    const at::Tensor& tensor = parameters[i].tensor;
    Optimizer::Slot& slot = slots[i];
    slot.hyperparameters = hyperparameters;
    slot.fused = tensor.is_cpu() && paths.cpu_updates == CpuUpdates::kFusedLoops;
    if (tensor.scalar_type() == at::kFloat) {
      slot.master = tensor.detach();
    } else if (parameters[i].master.defined()) {
      slot.master = parameters[i].master.detach();
    } else {
      slot.master = tensor.detach().to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);
    }
  }
  return std::unique_ptr<Optimizer>(new Optimizer(std::move(parameters), config, std::move(groups),
                                                  std::move(slots), paths.bucket_elements));
}

Optimizer::Optimizer(std::vector<parallel::TrainableParameter> parameters, OptimizerConfig config,
                     std::vector<ParamGroup> groups, std::vector<Slot> slots,
                     int64_t bucket_elements)
    : parameters_(std::move(parameters)),
      config_(std::move(config)),
      groups_(std::move(groups)),
      slots_(std::move(slots)),
      bucket_elements_(bucket_elements) {}

Optimizer::~Optimizer() = default;

absl::StatusOr<StepReport> Optimizer::Step(double lr) {
  if (!(lr >= 0.0 && std::isfinite(lr))) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer step ", step_, ": learning rate ", lr, " must be >= 0 and finite"));
  }
  StepReport report;
  report.step = step_;
  if (config_.has_clipping()) {
    PLAIT_ASSIGN_OR_RETURN(const double norm, GlobalGradNorm(parameters_));
    report.grad_norm = norm;
    if (!std::isfinite(norm)) return SkipNonFinite(std::move(report), "the gradient norm", norm);
    const double max_norm = config_.clipping().max_norm();
    if (max_norm > 0.0 && norm > max_norm) {
      report.clip_factor = max_norm / (norm + kClipEpsilon);
      ScaleGradients(parameters_, report.clip_factor);
    }
  }
  // The other slots, by what their update shares: the group (lr, decay), the update's count
  // (bias corrections, SGD's first step; it differs for a parameter that missed a gradient)
  // and the parameter dtype (one multi-tensor copy writes the 16-bit ones).
  std::map<std::tuple<int, int64_t, at::ScalarType>, std::vector<size_t>> by_scalars;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const at::Tensor& parameter = parameters_[i].tensor;
    if (!parameter.grad().defined()) continue;
    Slot& slot = slots_[i];
    ++slot.steps;
    slot.AllocateBuffers();
    if (slot.fused) {
      UpdateFused(i, lr);
    } else {
      by_scalars[{slot.group, slot.steps, parameter.scalar_type()}].push_back(i);
    }
  }
  for (const auto& [scalars, members] : by_scalars) {
    // Buckets of at most bucket_elements_ elements (one larger parameter is a bucket alone).
    std::vector<size_t> bucket;
    int64_t elements = 0;
    for (const size_t i : members) {
      const int64_t numel = parameters_[i].tensor.numel();
      if (!bucket.empty() && elements + numel > bucket_elements_) {
        UpdateBucket(bucket, lr);
        bucket.clear();
        elements = 0;
      }
      bucket.push_back(i);
      elements += numel;
    }
    UpdateBucket(bucket, lr);
  }
  report.step = ++step_;
  return report;
}

absl::StatusOr<StepReport> Optimizer::SkipNonFiniteLoss(double loss) const {
  if (std::isfinite(loss)) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer step ", step_, ": the loss ", loss, " is finite; not skipped"));
  }
  StepReport report;
  report.step = step_;
  return SkipNonFinite(std::move(report), "the loss", loss);
}

absl::StatusOr<StepReport> Optimizer::SkipNonFinite(StepReport report, absl::string_view quantity,
                                                    double value) const {
  if (config_.clipping().non_finite() == Clipping::FAIL) {
    return absl::FailedPreconditionError(absl::StrCat("optimizer step ", step_, ": ", quantity,
                                                      " is ", value,
                                                      " (optimizer.clipping.non_finite is FAIL)"));
  }
  report.skipped = true;
  return report;
}

namespace {

internal::AdamStep AdamStepOf(const Hyperparameters& h, const ParamGroup& group, double base_lr,
                              int64_t step) {
  return {.decoupled = h.algorithm == OptimizerConfig::kAdamw,
          .lr = base_lr * group.lr_scale,
          .weight_decay = group.weight_decay,
          .beta1 = h.beta1,
          .beta2 = h.beta2,
          .eps = h.eps,
          .step = step};
}

internal::SgdStep SgdStepOf(const Hyperparameters& h, const ParamGroup& group, double base_lr,
                            int64_t step) {
  return {.lr = base_lr * group.lr_scale,
          .weight_decay = group.weight_decay,
          .momentum = h.momentum,
          .dampening = h.dampening,
          .nesterov = h.nesterov,
          .first_step = step == 1};
}

internal::LionStep LionStepOf(const Hyperparameters& h, const ParamGroup& group, double base_lr) {
  return {.lr = base_lr * group.lr_scale,
          .weight_decay = group.weight_decay,
          .beta1 = h.beta1,
          .beta2 = h.beta2};
}

}  // namespace

void Optimizer::UpdateFused(size_t index, double base_lr) {
  Slot& slot = slots_[index];
  const Hyperparameters& h = slot.hyperparameters;
  const ParamGroup& group = groups_[slot.group];
  const at::Tensor& parameter = parameters_[index].tensor;
  const at::Tensor grad = parameter.grad().contiguous();
  float* p = slot.master.data_ptr<float>();

  switch (h.algorithm) {
    case OptimizerConfig::kAdamw:
    case OptimizerConfig::kAdam: {
      const internal::AdamScalars scalars =
          internal::ScalarsOf(AdamStepOf(h, group, base_lr, slot.steps));
      float* m = slot.buffers.at("exp_avg").data_ptr<float>();
      float* v = slot.buffers.at("exp_avg_sq").data_ptr<float>();
      ForEachChunk(slot.master, grad, parameter, [&](int64_t begin, int64_t n, const float* g) {
        internal::AdamUpdate(scalars, n, p + begin, g, m + begin, v + begin);
      });
      return;
    }
    case OptimizerConfig::kSgd: {
      const internal::SgdScalars scalars =
          internal::ScalarsOf(SgdStepOf(h, group, base_lr, slot.steps));
      float* b = h.momentum != 0.0 ? slot.buffers.at("momentum_buffer").data_ptr<float>() : nullptr;
      ForEachChunk(slot.master, grad, parameter, [&](int64_t begin, int64_t n, const float* g) {
        internal::SgdUpdate(scalars, n, p + begin, g, b != nullptr ? b + begin : nullptr);
      });
      return;
    }
    case OptimizerConfig::kLion: {
      const internal::LionScalars scalars = internal::ScalarsOf(LionStepOf(h, group, base_lr));
      float* m = slot.buffers.at("exp_avg").data_ptr<float>();
      ForEachChunk(slot.master, grad, parameter, [&](int64_t begin, int64_t n, const float* g) {
        internal::LionUpdate(scalars, n, p + begin, g, m + begin);
      });
      return;
    }
    case OptimizerConfig::ALGORITHM_NOT_SET:
      return;  // rejected by Create
  }
}

void Optimizer::UpdateBucket(const std::vector<size_t>& bucket, double base_lr) {
  const Slot& first = slots_[bucket.front()];
  const Hyperparameters& h = first.hyperparameters;
  const ParamGroup& group = groups_[first.group];
  const bool low_precision = parameters_[bucket.front()].tensor.scalar_type() != at::kFloat;
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> masters;
  std::vector<at::Tensor> grads;
  for (const size_t i : bucket) {
    masters.push_back(slots_[i].master);
    grads.push_back(parameters_[i].tensor.grad().contiguous());
  }
  if (low_precision) {  // the update reads fp32 gradients: widened once, here
    std::vector<at::Tensor> widened;
    for (const at::Tensor& master : masters) widened.push_back(torch::empty_like(master));
    base::ForeachCopy_(widened, grads);
    grads = std::move(widened);
  }
  const auto buffers = [&](const char* name) {
    std::vector<at::Tensor> result;
    for (const size_t i : bucket) result.push_back(slots_[i].buffers.at(name));
    return result;
  };
  switch (h.algorithm) {
    case OptimizerConfig::kAdamw:
    case OptimizerConfig::kAdam:
      internal::AdamUpdate(AdamStepOf(h, group, base_lr, first.steps), masters, grads,
                           buffers("exp_avg"), buffers("exp_avg_sq"));
      break;
    case OptimizerConfig::kSgd:
      internal::SgdUpdate(
          SgdStepOf(h, group, base_lr, first.steps), masters, grads,
          h.momentum != 0.0 ? buffers("momentum_buffer") : std::vector<at::Tensor>());
      break;
    case OptimizerConfig::kLion:
      internal::LionUpdate(LionStepOf(h, group, base_lr), masters, grads, buffers("exp_avg"));
      break;
    case OptimizerConfig::ALGORITHM_NOT_SET:
      return;  // rejected by Create
  }
  if (low_precision) {
    std::vector<at::Tensor> parameters;
    for (const size_t i : bucket) parameters.push_back(parameters_[i].tensor);
    base::ForeachCopy_(parameters, masters);
  }
}

void Optimizer::ZeroGrad() {
  for (parallel::TrainableParameter& parameter : parameters_)
    parameter.tensor.mutable_grad().reset();
}

OptimizerState Optimizer::SaveState() const { return DescribeState(HostCopy); }

OptimizerState Optimizer::StateLayout() const {
  return DescribeState([](const at::Tensor& tensor) {
    return torch::empty(tensor.sizes(), tensor.options().device(at::kMeta));
  });
}

OptimizerState Optimizer::DescribeState(
    const std::function<at::Tensor(const at::Tensor&)>& take) const {
  OptimizerState state;
  state.step = step_;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const std::string& name = parameters_[i].name;
    const Slot& slot = slots_[i];
    for (const std::string& buffer : BufferNames(slot.hyperparameters)) {
      // Before the first update: zeros of the master's shape, from one zero element
      // broadcast, so that describing the state allocates only what `take` makes of it.
      const auto allocated = slot.buffers.find(buffer);
      state.tensors[StateKey(name, buffer)] =
          take(allocated != slot.buffers.end()
                   ? allocated->second
                   : torch::zeros({}, slot.master.options()).expand(slot.master.sizes()));
    }
    state.tensors[StateKey(name, "step")] = take(torch::tensor(slot.steps, at::kLong));
    if (parameters_[i].tensor.scalar_type() != at::kFloat) {
      state.tensors[StateKey(name, "master")] = take(slot.master);
    }
  }
  return state;
}

absl::Status Optimizer::LoadState(const OptimizerState& state) {
  // Every key this optimizer expects, and the parameter each belongs to.
  std::map<std::string, size_t> expected;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const std::string& name = parameters_[i].name;
    for (const std::string& buffer : BufferNames(slots_[i].hyperparameters)) {
      expected[StateKey(name, buffer)] = i;
    }
    expected[StateKey(name, "step")] = i;
    if (parameters_[i].tensor.scalar_type() != at::kFloat) {
      expected[StateKey(name, "master")] = i;
    }
  }
  std::set<std::string> missing;
  for (const auto& [key, index] : expected) {
    if (state.tensors.count(key) == 0) missing.insert(parameters_[index].name);
  }
  std::set<std::string> unknown;
  for (const auto& [key, tensor] : state.tensors) {
    if (expected.count(key) == 0) unknown.insert(key);
  }
  if (!missing.empty() || !unknown.empty()) {
    std::string message = "optimizer state does not fit the parameters:";
    if (!missing.empty()) {
      absl::StrAppend(&message, " no state for ", absl::StrJoin(missing, ", "), ";");
    }
    if (!unknown.empty()) {
      absl::StrAppend(&message, " entries for no parameter here: ", absl::StrJoin(unknown, ", "));
    }
    return absl::InvalidArgumentError(message);
  }
  for (const auto& [key, index] : expected) {
    const at::Tensor& loaded = state.tensors.at(key);
    const bool is_step = key == StateKey(parameters_[index].name, "step");
    const auto want = is_step ? std::vector<int64_t>{} : slots_[index].master.sizes().vec();
    if (loaded.sizes().vec() != want) {
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer state ", key, " has shape [", absl::StrJoin(loaded.sizes(), ", "),
                       "], the parameter's is [", absl::StrJoin(want, ", "), "]"));
    }
  }
  at::NoGradGuard no_grad;
  for (const auto& [key, index] : expected) {
    Slot& slot = slots_[index];
    const std::string slot_name = key.substr(parameters_[index].name.size() + 1);
    const at::Tensor& loaded = state.tensors.at(key);
    if (slot_name == "step") {
      slot.steps = loaded.item<int64_t>();
    } else if (slot_name == "master") {
      slot.master.copy_(loaded);
      parameters_[index].tensor.copy_(slot.master);
    } else {
      slot.AllocateBuffers();
      slot.buffers.at(slot_name).copy_(loaded);
    }
  }
  step_ = state.step;
  return absl::OkStatus();
}

}  // namespace plait::optim
