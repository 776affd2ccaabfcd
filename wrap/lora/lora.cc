#include "wrap/lora/lora.h"

#include <fnmatch.h>

#include <array>
#include <cmath>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "ATen/ops/mm.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/forward_generator.h"
#include "base/hash.h"
#include "base/human.h"
#include "base/status.h"
#include "base/torch_compat.h"
#include "torch/csrc/autograd/generated/variable_factories.h"
#include "torch/nn/functional/linear.h"
#include "wrap/internal/torch_internals.h"
#include "wrap/lora/peft_adapter.h"
#include "wrap/lora/starting_adapters.h"

namespace plait::wrap::lora {
namespace {

namespace F = torch::nn::functional;

constexpr absl::string_view kWeight = ".weight";

// The module name of a block projection's weight `name` (its dims and tensor-parallel split as
// given), or "" when it is not one: a projection is a matrix that tensor parallelism splits by
// columns or rows (q/k/v/o, gate/up/down), never the vocabulary's embedding or output.
std::string ProjectionOf(const std::string& name, size_t dims, Wrappable::Split split) {
  using Split = Wrappable::Split;
  const bool projection_split =
      split == Split::kColumn || split == Split::kKeyValueColumn || split == Split::kRow;
  if (dims != 2 || !projection_split || !absl::EndsWith(name, kWeight)) return "";
  return name.substr(0, name.size() - kWeight.size());
}

// A parameter a target may adapt: its name, dimensions and tensor-parallel split.
struct Candidate {
  std::string name;
  size_t dims;
  Wrappable::Split split;
};

// What `config`'s targets match among `candidates`: every block projection's module name,
// the targeted ones (by index into `candidates`, with their module names), and a message for
// each target that matches none, by its index.
struct Matches {
  std::vector<std::string> projections;
  std::vector<std::pair<size_t, std::string>> targeted;
  std::vector<std::pair<int, std::string>> unmatched;
};

Matches Match(const LoraConfig& config, const std::vector<Candidate>& candidates) {
  Matches matches;
  std::vector<bool> used(config.target_size(), false);
  for (size_t c = 0; c < candidates.size(); ++c) {
    const Candidate& candidate = candidates[c];
    const std::string projection = ProjectionOf(candidate.name, candidate.dims, candidate.split);
    if (projection.empty()) continue;
    matches.projections.push_back(projection);
    bool targeted = false;
    for (int i = 0; i < config.target_size(); ++i) {
      if (fnmatch(config.target(i).c_str(), projection.c_str(), 0) == 0) {
        used[i] = true;
        targeted = true;
      }
    }
    if (targeted) matches.targeted.push_back({c, projection});
  }
  for (int i = 0; i < config.target_size(); ++i) {
    if (used[i]) continue;
    matches.unmatched.push_back(
        {i, matches.projections.empty()
                ? "the model's blocks have no projections to adapt"
                : absl::StrCat("\"", config.target(i),
                               "\" matches no projection of the model's blocks (a glob on module "
                               "names, which run from \"",
                               matches.projections.front(), "\" to \"", matches.projections.back(),
                               "\")")});
  }
  return matches;
}

// The candidates of a model's shape, as plans describe it.
std::vector<Candidate> CandidatesOf(const ModelShape& shape) {
  std::vector<Candidate> candidates;
  for (const ModelShape::Parameter& parameter : shape.parameter_list) {
    candidates.push_back({parameter.name, parameter.shape.size(), parameter.split});
  }
  return candidates;
}

// The buffers a projection holds its NF4 weight in, named for the tensors TensorsOf lists.
constexpr const char* kHeldBuffers[] = {"weight_nf4", "weight_absmax", "weight_absmax_codes",
                                        "weight_absmax_scales", "weight_absmax_offset"};

// The tensors of `nf4` (undefined ones too), in kHeldBuffers' order.
template <typename Nf4>  // Nf4Tensor or const Nf4Tensor
auto TensorsOf(Nf4& nf4) {
  return std::array{&nf4.packed, &nf4.absmax, &nf4.absmax_codes, &nf4.absmax_scales,
                    &nf4.absmax_offset};
}

// A module holding one parameter, `weight`: an adapter matrix (PEFT's lora_A / lora_B are
// nn.Linear without bias, whose only parameter is `weight`).
class AdapterMatrix : public torch::nn::Module {
 public:
  explicit AdapterMatrix(at::Tensor value) { weight = register_parameter("weight", value); }
  at::Tensor weight;
};

}  // namespace

double Scale(const LoraConfig& config) {
  return config.use_rslora() ? config.alpha() / std::sqrt(static_cast<double>(config.rank()))
                             : config.alpha() / config.rank();
}

at::Tensor InitialA(uint64_t seed, const std::string& name, int64_t rank, int64_t in) {
  // PEFT's reset_lora_parameters: nn.init.kaiming_uniform_(a=sqrt(5)) on [rank, in], whose
  // gain sqrt(2 / (1 + 5)) times sqrt(3 / in) is a bound of 1 / sqrt(in).
  const double bound = 1.0 / std::sqrt(static_cast<double>(in));
  at::Generator generator = base::MakeCpuGenerator(base::SplitMix64(seed ^ base::Fnv1a64(name)));
  return torch::empty({rank, in}, at::kFloat).uniform_(-bound, bound, generator);
}

absl::Status ValidateLoraConfig(const LoraConfig& config) {
  if (config.rank() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("lora.rank: ", config.rank(), "; the adapters' rank must be above 0"));
  }
  // An infinite alpha makes every adapter's output, and so the loss, infinite or NaN.
  if (!(config.alpha() > 0) || !std::isfinite(config.alpha())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lora.alpha: ", config.alpha(), "; it must be finite and above 0 (PEFT's lora_alpha)"));
  }
  if (!(config.dropout() >= 0 && config.dropout() < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("lora.dropout: ", config.dropout(), "; it must be in [0, 1)"));
  }
  if (config.target_size() == 0) {
    return absl::InvalidArgumentError(
        "lora.target: none; name the projections to adapt, e.g. target: \"*q_proj\"");
  }
  for (int i = 0; i < config.target_size(); ++i) {
    if (config.target(i).empty()) {
      return absl::InvalidArgumentError(absl::StrCat("lora.target[", i, "]: is empty"));
    }
  }
  if (config.double_quant() && config.base_quantization() != LoraConfig::NF4) {
    return absl::InvalidArgumentError(
        "lora.double_quant: quantizes the block maxima of an NF4 base; set base_quantization: "
        "NF4 or drop it");
  }
  return absl::OkStatus();
}

Lora::Lora(Wrappable& model, const LoraConfig& config)
    : model_(model),
      scale_(Scale(config)),
      dropout_(config.dropout()),
      double_quant_(config.double_quant()) {}

absl::StatusOr<std::unique_ptr<Lora>> Lora::Create(Wrappable& model, const LoraConfig& config) {
  PLAIT_RETURN_IF_ERROR(ValidateLoraConfig(config));
  std::unique_ptr<Lora> lora(new Lora(model, config));
  // The projections to adapt, found before anything changes: an unmatched target leaves the
  // model as it was.
  std::vector<Candidate> candidates;
  for (const Wrappable::NamedParameter& named : model.NamedParameters()) {
    candidates.push_back({named.name, named.parameter.sizes().size(), model.SplitOf(named.name)});
  }
  const Matches matches = Match(config, candidates);
  if (!matches.unmatched.empty()) {
    const auto& [i, message] = matches.unmatched.front();
    return absl::InvalidArgumentError(absl::StrCat("lora.target[", i, "]: ", message));
  }
  using Split = Wrappable::Split;
  const auto modules = model.RootModule().named_modules();
  std::vector<AdaptedProjection> projections;
  for (const auto& [candidate, projection] : matches.targeted) {
    lora->adapted_.push_back(projection);
    const auto sizes = modules[projection]->named_parameters(/*recurse=*/false)["weight"].sizes();
    projections.push_back({projection, sizes[0], sizes[1]});
    const Split split = candidates[candidate].split;
    const auto [a, b] = AdapterMatricesOf(projections.back(), config.rank());
    if (split == Split::kReplicated) {  // a projection every rank holds whole (an expert's)
      lora->splits_[a.name] = lora->splits_[b.name] = Split::kReplicated;
    } else {
      lora->splits_[a.name] =
          split == Split::kRow ? Split::kRow : Split::kReplicatedPartialGradient;
      lora->splits_[b.name] = split == Split::kRow ? Split::kReplicatedPartialGradient : split;
    }
  }
  std::map<std::string, at::Tensor> starting;
  if (!config.initial_adapter_dir().empty()) {
    // A pipeline's stage holds some of the model's projections; the folder's others are the
    // other stages'.
    const auto holds_module = [&modules](const std::string& module) {
      return modules.contains(module);
    };
    PLAIT_ASSIGN_OR_RETURN(starting,
                           base::Annotate(ReadStartingAdapters(config, projections, holds_module),
                                          "lora.initial_adapter_dir"));
  }
  for (const Wrappable::NamedParameter& named : model.NamedParameters()) {
    named.parameter.requires_grad_(false);
  }
  at::NoGradGuard no_grad;
  for (const AdaptedProjection& adapted : projections) {
    const std::string& name = adapted.module;
    const std::shared_ptr<torch::nn::Module>& projection = modules[name];
    const at::Tensor weight = projection->named_parameters(/*recurse=*/false)["weight"];
    // In the weight's dtype and on its device (also when the model is built deferred, whose
    // weights hold no memory yet: the adapters are small and get theirs now).
    const at::TensorOptions options = weight.options().requires_grad(false);
    const auto [a_matrix, b_matrix] = AdapterMatricesOf(adapted, config.rank());
    const at::Tensor a =
        starting.empty()
            ? InitialA(config.seed(), a_matrix.name, config.rank(), adapted.in).to(options)
            : starting[a_matrix.name].to(options);
    const at::Tensor b = starting.empty() ? torch::zeros(b_matrix.shape, options)
                                          : starting[b_matrix.name].to(options);
    auto a_module = projection->register_module("lora_A", std::make_shared<AdapterMatrix>(a));
    auto b_module = projection->register_module("lora_B", std::make_shared<AdapterMatrix>(b));
    lora->adapters_[projection.get()] = {a_module->weight, b_module->weight};
    if (config.base_quantization() != LoraConfig::NF4) continue;
    // The weight leaves the parameters for buffers in NF4 (of what it holds now; a deferred
    // weight's zeros give the buffers their shapes until its values are stored) and its
    // full-precision memory is freed: the module's own member keeps an empty tensor.
    Held& held = lora->held_[projection.get()];
    lora->held_order_.push_back(projection.get());
    held.name = absl::StrCat(name, kWeight);
    held.options = weight.options();
    held.nf4 = Nf4Quantize(weight, config.double_quant());
    const auto tensors = TensorsOf(held.nf4);
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (tensors[i]->defined()) {
        *tensors[i] = projection->register_buffer(kHeldBuffers[i], *tensors[i]);
      }
    }
    internal::UnregisterParameter(*projection, "weight");
    weight.set_data(torch::empty({0}, held.options));
  }
  model.seams().Add(lora.get());
  return lora;
}

Lora::~Lora() { model_.seams().Remove(this); }

at::Tensor Lora::Weight(const torch::nn::Module& projection, const at::Tensor& weight,
                        WeightNext next) {
  const auto it = held_.find(&projection);
  if (it == held_.end()) return next(projection, weight);
  Held& held = it->second;
  at::Tensor dequantized = held.Dequantize();
  // Only a forward that builds a graph keeps it for a backward (WithoutAdapters, which never
  // calls Adapt, runs without one).
  if (at::GradMode::is_enabled()) held.dequantized = dequantized;
  return dequantized;
}

void Lora::KeepOnlyForBackward(const Held& held, const at::Tensor& weight, const at::Tensor& input,
                               const at::Tensor& output) {
  internal::FreeStorage(weight);
  output.register_hook([&held, weight](const at::Tensor& /*grad*/) {
    at::NoGradGuard no_grad;
    internal::RestoreStorage(weight).copy_(held.Dequantize());
  });
  input.register_hook([weight](const at::Tensor& /*grad*/) { internal::FreeStorage(weight); });
}

std::vector<at::Tensor> Lora::HeldTensors(const torch::nn::Module& projection) const {
  const auto it = held_.find(&projection);
  if (it == held_.end()) return {};
  std::vector<at::Tensor> tensors;
  for (const at::Tensor* tensor : TensorsOf(it->second.nf4)) {
    if (tensor->defined()) tensors.push_back(*tensor);
  }
  return tensors;
}

void Lora::Store(Held& held, const at::Tensor& values) const {
  at::NoGradGuard no_grad;
  Nf4Tensor nf4 = Nf4Quantize(values.to(held.options), double_quant_);
  const auto to = TensorsOf(held.nf4);
  const auto from = TensorsOf(nf4);
  for (size_t i = 0; i < to.size(); ++i) {
    if (to[i]->defined()) to[i]->copy_(*from[i]);
  }
}

std::vector<parallel::TrainableParameter> Lora::HeldParameters() {
  std::vector<parallel::TrainableParameter> parts;
  for (const torch::nn::Module* projection : held_order_) {
    Held* held = &held_.at(projection);
    parallel::TrainableParameter& part = parts.emplace_back();
    part.name = held->name;
    part.tensor = torch::empty({0}, held->options);
    part.slice = parallel::TensorSlice::Whole(held->nf4.shape);
    part.store = [this, held](const at::Tensor& values) { Store(*held, values); };
  }
  return parts;
}

void Lora::AddHeldWeights(std::map<std::string, at::Tensor>& parameters) const {
  for (const auto& [projection, held] : held_) {
    if (parameters.count(held.name) > 0) continue;
    parameters[held.name] = held.Dequantize();
  }
}

at::Tensor Lora::Project(const ProjectionSite& site, const at::Tensor& input, ProjectNext next) {
  return Adapt(site.module, input, next(site, input));
}

at::Tensor Lora::Adapt(const torch::nn::Module& projection, const at::Tensor& input,
                       at::Tensor output) {
  if (const auto held = held_.find(&projection);
      held != held_.end() && held->second.dequantized.defined()) {
    const at::Tensor weight = std::exchange(held->second.dequantized, at::Tensor());
    // The product needs its weight in backward only for the input's gradient.
    if (output.requires_grad() && input.requires_grad()) {
      KeepOnlyForBackward(held->second, weight, input, output);
    }
  }
  const auto it = adapters_.find(&projection);
  if (it == adapters_.end()) return output;
  // As PEFT's Linear.forward: result + lora_B(lora_A(dropout(x))) * scaling, with dropout in
  // training mode only. Its mask is drawn as nn.Dropout's, from the thread's forward generator.
  at::Tensor x = input;
  if (dropout_ > 0 && projection.is_training()) {
    const at::Tensor keep =
        torch::empty_like(input).bernoulli_(1 - dropout_, base::ForwardGenerator(input.device()));
    x = input * keep.div_(1 - dropout_);
  }
  return output + F::linear(F::linear(x, it->second.a), it->second.b) * scale_;
}

std::optional<Wrappable::Split> Lora::AddedParameterSplit(const std::string& name) const {
  const auto it = splits_.find(name);
  if (it == splits_.end()) return std::nullopt;
  return it->second;
}

absl::Status Lora::Merge(std::map<std::string, at::Tensor>& parameters) const {
  at::NoGradGuard no_grad;
  // Its own projections, and those of the other stages of a pipeline (whose adapters the
  // pipeline gathered into `parameters`).
  std::set<std::string> modules(adapted_.begin(), adapted_.end());
  for (const auto& [name, tensor] : parameters) {
    if (std::optional<std::string> module = ModuleOfAdapterA(name)) modules.insert(*module);
  }
  for (const std::string& name : modules) {
    const auto [a, b] = AdapterMatricesOf({name}, 0);  // their names
    const std::string names[] = {absl::StrCat(name, kWeight), a.name, b.name};
    for (const std::string& tensor : names) {
      if (parameters.count(tensor) == 0) {
        return absl::InternalError(absl::StrCat("lora: merging ", name, ": no tensor ", tensor));
      }
    }
    at::Tensor& weight = parameters[names[0]];
    const at::Tensor delta =
        at::mm(parameters[names[2]].to(at::kFloat), parameters[names[1]].to(at::kFloat)) * scale_;
    weight = (weight.to(at::kFloat) + delta).to(weight.scalar_type());
    parameters.erase(names[1]);
    parameters.erase(names[2]);
  }
  return absl::OkStatus();
}

std::vector<base::Violation> LoraStrategy::Check(const std::optional<ModelShape>& shape,
                                                 const parallel::MeshConfig& /*mesh*/,
                                                 const std::string& field) const {
  if (!shape.has_value()) return {};
  std::vector<base::Violation> violations;
  const Matches matches = Match(config_, CandidatesOf(*shape));
  for (const auto& [i, message] : matches.unmatched) {
    violations.push_back({absl::StrCat(field, ".lora.target[", i, "]"), message, ""});
  }
  if (violations.empty() && !config_.initial_adapter_dir().empty()) {
    std::vector<AdaptedProjection> projections;
    for (const auto& [candidate, projection] : matches.targeted) {
      const std::vector<int64_t>& weight = shape->parameter_list[candidate].shape;
      projections.push_back({projection, weight[0], weight[1]});
    }
    // The whole model's projections: the folder is checked whole, every module held.
    const absl::Status read = ReadStartingAdapters(config_, projections, [](const std::string&) {
                                return true;
                              }).status();
    if (!read.ok()) {
      violations.push_back(
          {absl::StrCat(field, ".lora.initial_adapter_dir"), std::string(read.message()), ""});
    }
  }
  return violations;
}

StepEstimate LoraStrategy::Estimate(const ModelShape& shape,
                                    const parallel::MeshConfig& /*mesh*/) const {
  const Matches matches = Match(config_, CandidatesOf(shape));
  std::vector<ModelShape::Parameter> trainable;
  double adapters = 0;
  double targeted_weights = 0;
  double nf4_bytes = 0;
  for (const auto& [candidate, projection] : matches.targeted) {
    const std::vector<int64_t>& weight = shape.parameter_list[candidate].shape;
    for (auto& [name, adapter_shape] :
         AdapterMatricesOf({projection, weight[0], weight[1]}, config_.rank())) {
      trainable.push_back({std::move(name), std::move(adapter_shape)});
      adapters += trainable.back().numel();
    }
    targeted_weights += static_cast<double>(weight[0] * weight[1]);
    nf4_bytes += static_cast<double>(Nf4Bytes(weight[0] * weight[1], config_.double_quant()));
  }
  const int projections = static_cast<int>(matches.targeted.size());
  StepEstimate estimate;
  estimate.description = absl::StrFormat(
      "lora (rank %d, alpha %g%s: scale %g) on %d projections (%s): %s trainable adapter "
      "parameters; the %s parameters of the base frozen (no gradients, no optimizer state)",
      config_.rank(), config_.alpha(), config_.use_rslora() ? ", rsLoRA" : "", Scale(config_),
      projections, absl::StrJoin(config_.target(), ", "), base::HumanCount(adapters),
      base::HumanCount(shape.parameters));
  if (config_.base_quantization() == LoraConfig::NF4) {
    absl::StrAppendFormat(
        &estimate.description,
        "; the %s weights of the targeted projections in NF4%s: %s (%.3g bytes a weight) "
        "instead of %s, dequantized for each use",
        base::HumanCount(targeted_weights),
        config_.double_quant() ? " with double quantization" : "",
        base::HumanBytesAnySize(nf4_bytes), nf4_bytes / targeted_weights,
        base::HumanBytesAnySize(targeted_weights * shape.parameter_bytes));
    // A rank keeps its share of the NF4 bytes in place of those weights.
    estimate.memory_on_rank = [targeted_weights, nf4_bytes](const RankHolding& rank) {
      return std::vector<MemoryTerm>{
          {.name = "by holding the targeted weights in NF4",
           .part = MemoryTerm::Part::kParameters,
           .bytes = (nf4_bytes - targeted_weights * rank.parameter_element_bytes) *
                    rank.parameter_fraction}};
    };
  }
  estimate.added_parameters = adapters;
  estimate.trainable_parameters = std::move(trainable);
  return estimate;
}

std::vector<std::string> LoraStrategy::rule_aliases() const {
  if (config_.base_quantization() == LoraConfig::NF4) return {"qlora"};
  return {};
}

std::vector<Strategy::InputFile> LoraStrategy::InputFiles() const {
  if (config_.initial_adapter_dir().empty()) return {};
  return {{"lora.initial_adapter_dir", config_.initial_adapter_dir()}};
}

absl::Status LoraStrategy::SaveAdapters(
    const std::string& dir, const std::vector<std::pair<std::string, at::Tensor>>& adapters,
    const std::string& base_model) const {
  return SavePeftAdapter(dir, config_, adapters, base_model);
}

std::vector<base::Violation> LoraStrategy::CheckAdapterFolder(const std::string& dir,
                                                              const std::string& field) const {
  return CheckPeftAdapterFolder(dir, field);
}

absl::Status LoraStrategy::Apply(Wrappable& model, const parallel::DeviceMesh& /*mesh*/) {
  PLAIT_ASSIGN_OR_RETURN(lora_, Lora::Create(model, config_));
  return absl::OkStatus();
}

}  // namespace plait::wrap::lora
