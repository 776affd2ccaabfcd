#include "plan/target_check.h"

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/file.h"
#include "base/human.h"
#include "base/status.h"
#include "base/text_proto.h"
#include "models/estimates.h"
#include "models/flop_convention.h"
#include "parallel/device.pb.h"
#include "parallel/device_mesh.h"
#include "plan/compute_dtype.h"
#include "plan/validate.h"
#include "wrap/strategies.h"
#include "wrap/strategy.h"

namespace plait::plan {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kGigabyte = 1e9;
constexpr double kTera = 1e12;
// The largest factor by which a suggestion grows a dimension.
constexpr int kMaxGrowth = 64;

constexpr char kBuiltinTargetsText[] =
#include "plan/targets_text.inc"
    ;

// The bounds of a target's figures in their units (GiB, TFLOP/s, GB/s): about a thousand
// times beyond the largest parts of 2025 (288 GB of memory, some 5,000 dense fp8 TFLOP/s,
// 900 GB/s of NVLink each way) and far within what the estimates' products (GiB x 2^30,
// TFLOP/s x 10^12, FLOPs / FLOP/s) take and stay finite. A figure outside them is a typo or
// a wrong unit, and would print an infinite or zero estimate.
constexpr double kMinTargetFigure = 1e-3;
constexpr double kMaxTargetFigure = 1e6;
// The least MFU and link efficiency: below 0.1% a step's time is no estimate.
constexpr double kMinEfficiency = 1e-3;

bool IsTargetFigure(double value) { return value >= kMinTargetFigure && value <= kMaxTargetFigure; }

void CheckTargetFields(const Target& target, const std::string& field,
                       std::vector<std::string>& problems) {
  const std::string which =
      target.name().empty() ? "" : absl::StrCat(" (target \"", target.name(), "\")");
  auto require = [&](bool ok, absl::string_view name, absl::string_view what) {
    if (!ok) problems.push_back(absl::StrCat(field, ".", name, ": ", what, which));
  };
  auto figure = [&](double value, absl::string_view name, absl::string_view unit) {
    require(IsTargetFigure(value), name,
            absl::StrCat(value, " ", unit, " is not within [", kMinTargetFigure, ", ",
                         kMaxTargetFigure, "]"));
  };
  require(!target.name().empty(), "name", "is empty");
  figure(target.memory_gib(), "memory_gib", "GiB");
  require(target.bf16_tflops() > 0 || target.fp32_tflops() > 0, "bf16_tflops",
          "a target needs a bf16 or an fp32 peak > 0");
  for (const auto& [peak, name] : {std::pair(target.bf16_tflops(), "bf16_tflops"),
                                   std::pair(target.fp8_tflops(), "fp8_tflops"),
                                   std::pair(target.fp32_tflops(), "fp32_tflops")}) {
    if (peak != 0) figure(peak, name, "TFLOP/s (0: the part has none)");
  }
  figure(target.intra_node_gb_per_s(), "intra_node_gb_per_s", "GB/s");
  figure(target.inter_node_gb_per_s(), "inter_node_gb_per_s", "GB/s");
  require(
      target.gpus_per_node() > 0 && target.gpus_per_node() <= parallel::kMaxMeshRanks,
      "gpus_per_node",
      absl::StrCat(target.gpus_per_node(), " is not within [1, ", parallel::kMaxMeshRanks, "]"));
}

// Every problem of `catalogue` read from `source`: its targets', two targets of one name, and
// its reserve's and speed's where it has them.
absl::Status CheckCatalogue(const TargetCatalogue& catalogue, const std::string& source) {
  std::vector<std::string> problems;
  for (int i = 0; i < catalogue.targets_size(); ++i) {
    const Target& target = catalogue.targets(i);
    const std::string field = absl::StrCat(source, ": targets[", i, "]");
    CheckTargetFields(target, field, problems);
    for (int earlier = 0; earlier < i && !target.name().empty(); ++earlier) {
      if (catalogue.targets(earlier).name() != target.name()) continue;
      problems.push_back(absl::StrCat(field, ".name: \"", target.name(), "\" is targets[", earlier,
                                      "]'s name too; each target needs its own"));
      break;
    }
  }
  if (catalogue.has_reserve()) {
    const MemoryReserve& reserve = catalogue.reserve();
    if (!(reserve.fixed_gib() >= 0 && reserve.fixed_gib() <= kMaxTargetFigure)) {
      problems.push_back(absl::StrCat(source, ": reserve.fixed_gib: ", reserve.fixed_gib(),
                                      " is not within [0, ", kMaxTargetFigure, "]"));
    }
    if (!(reserve.fragmentation() >= 0 && reserve.fragmentation() < 1)) {
      problems.push_back(absl::StrCat(source, ": reserve.fragmentation: ", reserve.fragmentation(),
                                      " is not within [0, 1)"));
    }
  }
  if (catalogue.has_speed()) {
    const SpeedAssumptions& speed = catalogue.speed();
    for (const auto& [share, name] :
         {std::pair(speed.mfu(), "mfu"), std::pair(speed.link_efficiency(), "link_efficiency")}) {
      if (!(share >= kMinEfficiency && share <= 1)) {
        problems.push_back(absl::StrCat(source, ": speed.", name, ": ", share, " is not within [",
                                        kMinEfficiency, ", 1]"));
      }
    }
  }
  if (problems.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrJoin(problems, "\n"));
}

absl::StatusOr<TargetCatalogue> ParseCatalogue(absl::string_view text, const std::string& source) {
  TargetCatalogue catalogue;
  PLAIT_RETURN_IF_ERROR(base::ParseTextProto(text, source, catalogue));
  PLAIT_RETURN_IF_ERROR(CheckCatalogue(catalogue, source));
  return catalogue;
}

// The peak FLOP/s of `target` for a model computing in `dtype` (16-bit: the tensor cores').
absl::StatusOr<double> PeakFlops(const Target& target, base::Dtype dtype) {
  const bool half = dtype == base::DTYPE_BFLOAT16 || dtype == base::DTYPE_FLOAT16;
  const double tflops = half ? target.bf16_tflops() : target.fp32_tflops();
  if (!(tflops > 0)) {
    return absl::FailedPreconditionError(
        absl::StrCat("target \"", target.name(), "\" has no ", half ? "bf16" : "fp32", " peak (",
                     half ? "bf16_tflops" : "fp32_tflops", " is 0) for plan.model.dtype ",
                     base::Dtype_Name(dtype)));
  }
  return tflops * kTera;
}

// Whether the ranks of a group of `mesh`'s dimension `dims` (or of the dimensions it names,
// joined by commas: Transfer::mesh_dim) sit on more than one node when the ranks fill nodes of
// `gpus_per_node` in order (the mesh is row-major: the last dimension's groups are the
// closest ranks).
bool AcrossNodes(const parallel::MeshConfig& mesh, const std::string& dims, int gpus_per_node) {
  const int64_t world = parallel::MeshRanks(mesh);
  absl::StatusOr<parallel::MeshLayout> layout =
      parallel::MeshLayout::Create(mesh, static_cast<int>(world));
  if (!layout.ok()) return false;  // the plan's validation reports the mesh
  std::vector<int> indices;
  for (absl::string_view dim : absl::StrSplit(dims, ',')) {
    const absl::StatusOr<int> index = layout->DimIndex(dim);
    if (index.ok()) indices.push_back(*index);
  }
  std::sort(indices.begin(), indices.end());
  for (int rank = 0; rank < world; ++rank) {
    if (layout->SubgridIndex(rank, indices) != 0) continue;  // not the first of its group
    for (int member : layout->SubgridRanks(rank, indices)) {
      if (member / gpus_per_node != rank / gpus_per_node) return true;
    }
  }
  return false;
}

absl::StatusOr<StepTime> EstimateStepTime(const ResolvedPlan& resolved,
                                          const MemoryEstimate& memory, const Target& target,
                                          const SpeedAssumptions& speed) {
  StepTime time;
  const double world = resolved.world_size;
  time.flops_per_gpu = resolved.flops_per_token * resolved.tokens_per_step / world;
  PLAIT_ASSIGN_OR_RETURN(const double peak, PeakFlops(target, resolved.plan.model().dtype()));
  time.compute_seconds = time.flops_per_gpu / (peak * speed.mfu());
  double overlapped = 0;
  double waited_for = 0;
  const StepTime::Link* longest_overlapped = nullptr;
  for (const wrap::StepEstimate& step : memory.preparation.steps) {
    for (const wrap::Transfer& transfer : step.transfers) {
      StepTime::Link& link = time.links.emplace_back();
      link.mesh_dim = transfer.mesh_dim;
      link.across_nodes =
          AcrossNodes(resolved.plan.mesh(), transfer.mesh_dim, target.gpus_per_node());
      link.bytes = transfer.BytesPerStep(resolved.grad_accumulation);
      link.seconds = link.bytes / ((link.across_nodes ? target.inter_node_gb_per_s()
                                                      : target.intra_node_gb_per_s()) *
                                   kGigabyte * speed.link_efficiency());
      link.overlaps_compute = transfer.overlaps_compute;
      (link.overlaps_compute ? overlapped : waited_for) += link.seconds;
    }
  }
  for (const StepTime::Link& link : time.links) {
    if (link.overlaps_compute &&
        (longest_overlapped == nullptr || link.seconds > longest_overlapped->seconds)) {
      longest_overlapped = &link;
    }
  }
  time.seconds = std::max(time.compute_seconds, overlapped) + waited_for;
  time.tokens_per_second_per_gpu = resolved.tokens_per_step / world / time.seconds;
  if (overlapped > time.compute_seconds) {
    time.bound = absl::StrCat("the collectives over ", longest_overlapped->mesh_dim,
                              longest_overlapped->across_nodes ? " (across nodes)" : "",
                              ", longer than the compute they overlap");
  } else {
    time.bound = "compute";
  }
  if (waited_for > 0) {
    std::vector<std::string> waited_dims;  // those of the collectives the compute waits for
    for (const StepTime::Link& link : time.links) {
      if (!link.overlaps_compute && link.seconds > 0 &&
          std::find(waited_dims.begin(), waited_dims.end(), link.mesh_dim) == waited_dims.end()) {
        waited_dims.push_back(link.mesh_dim);
      }
    }
    absl::StrAppendFormat(&time.bound,
                          ", plus %.0f%% of the step waiting for the collectives over %s",
                          100.0 * waited_for / time.seconds, absl::StrJoin(waited_dims, " and "));
  }
  return time;
}

// The check of `plan` on `target` without suggestions.
absl::StatusOr<TargetCheck> Evaluate(const Plan& plan, const TargetCatalogue& catalogue,
                                     const Target& target, std::optional<int> nodes) {
  TargetCheck check;
  check.target = target;
  const int per_node = target.gpus_per_node();
  Plan on_target = plan;
  on_target.set_device(parallel::DEVICE_CUDA);
  on_target = ResolveAutoDtypes(
      on_target, target.bf16_tflops() > 0
                     ? std::optional<std::string>(absl::StrCat(target.name(), "'s tensor cores"))
                     : std::nullopt);
  const int64_t world = nodes.has_value() ? int64_t{*nodes} * per_node
                                          : std::max<int64_t>(1, parallel::MeshRanks(plan.mesh()));
  if (world > parallel::kMaxMeshRanks) {
    return absl::InvalidArgumentError(
        absl::StrCat("--nodes=", *nodes, ": ", world, " GPUs; at most ", parallel::kMaxMeshRanks));
  }
  PLAIT_ASSIGN_OR_RETURN(check.resolved, Resolve(on_target, static_cast<int>(world)));
  check.nodes = nodes.value_or(static_cast<int>((world + per_node - 1) / per_node));
  PLAIT_ASSIGN_OR_RETURN(check.memory, EstimateMemory(check.resolved, models::kLibTorch2Kernels));
  check.usable_bytes = (target.memory_gib() - catalogue.reserve().fixed_gib()) * kGiB;
  check.needed_bytes = check.memory.total_bytes() * (1.0 + catalogue.reserve().fragmentation());
  PLAIT_ASSIGN_OR_RETURN(check.time,
                         EstimateStepTime(check.resolved, check.memory, target, catalogue.speed()));
  return check;
}

// Each kind of change lists the plans to try, smallest change first; the first that fits is
// suggested.

using StepKeepingLess = wrap::StepWith<wrap::SmallerVersions>;

// The plan's steps that are there to keep less of `saves` on a rank (wrap::SmallerVersions).
std::vector<StepKeepingLess> StepsKeepingLess(const Plan& plan,
                                              wrap::SmallerVersions::Saves saves) {
  std::vector<StepKeepingLess> found = wrap::StepsWith<wrap::SmallerVersions>(plan.prepare());
  found.erase(
      std::remove_if(found.begin(), found.end(),
                     [&](const StepKeepingLess& step) { return step.facet->saves() != saves; }),
      found.end());
  return found;
}

// `plan` with each of `steps` (StepsKeepingLess) replaced by each step that may take its place
// (SmallerVersions::Replacements).
std::vector<Suggestion> Replacements(const Plan& plan, std::optional<int> nodes,
                                     const std::vector<StepKeepingLess>& steps) {
  std::vector<Suggestion> candidates;
  for (const StepKeepingLess& step : steps) {
    const int i = step.index;
    for (const wrap::PrepareStep& replacement : step.facet->Replacements()) {
      Suggestion& replaced = candidates.emplace_back();
      replaced.change = absl::StrCat("prepare[", i, "]: ", replacement.ShortDebugString(),
                                     " in place of ", plan.prepare(i).ShortDebugString());
      replaced.plan = plan;
      replaced.nodes = nodes;
      *replaced.plan.mutable_prepare(i) = replacement;
    }
  }
  return candidates;
}

// Keeping less of the forward: a step that does so replaced by one that keeps less still, or,
// in a plan of none, one added (wrap::StepsThatSave) at the first place the rules accept.
std::vector<Suggestion> ActivationSuggestions(const Plan& plan, std::optional<int> nodes) {
  const auto saves = wrap::SmallerVersions::Saves::kActivations;
  const std::vector<StepKeepingLess> steps = StepsKeepingLess(plan, saves);
  if (!steps.empty()) return Replacements(plan, nodes, steps);
  std::vector<Suggestion> candidates;
  for (const wrap::PrepareStep& step : wrap::StepsThatSave(saves)) {
    for (int at = 0; at <= plan.prepare_size(); ++at) {
      Suggestion& added = candidates.emplace_back();
      added.change = absl::StrCat(step.ShortDebugString(), " added as prepare[", at, "]");
      added.plan = plan;
      added.nodes = nodes;
      added.plan.clear_prepare();
      for (int i = 0; i <= plan.prepare_size(); ++i) {
        if (i == at) *added.plan.add_prepare() = step;
        if (i < plan.prepare_size()) *added.plan.add_prepare() = plan.prepare(i);
      }
    }
  }
  return candidates;
}

// `plan` with mesh dimension `dim` `factor` times larger, its gradient accumulation divided by
// `factor` where it divides (the same global batch), else its global batch `factor` times
// larger; the change in words.
std::pair<Plan, std::string> GrowDimension(const Plan& plan, const std::string& dim, int factor) {
  Plan grown = plan;
  int64_t size = 1;
  for (parallel::MeshConfig::Dimension& mesh_dim : *grown.mutable_mesh()->mutable_dims()) {
    if (mesh_dim.name() != dim) continue;
    mesh_dim.set_size(mesh_dim.size() * factor);
    size = mesh_dim.size();
  }
  TrainingConfig& training = *grown.mutable_training();
  const int64_t accumulation = std::max<int64_t>(1, training.grad_accumulation());
  std::string batch;
  if (accumulation % factor == 0) {
    training.set_grad_accumulation(accumulation / factor);
    batch = absl::StrCat("grad_accumulation ", accumulation / factor, ", the same global batch");
  } else {
    training.clear_global_batch();
    batch = absl::StrCat("a global batch ", factor, " times larger");
  }
  return {std::move(grown), absl::StrCat("mesh dim ", dim, ": ", size, " (", batch, ")")};
}

// Keeping less of the parameters: a step that does so replaced by one that keeps less still,
// or over 2, 4, ... times more ranks of its dimension (more nodes), or, in a plan of none, one
// added (wrap::StepsThatSave) over a new outermost dimension.
std::vector<Suggestion> ParameterSuggestions(const Plan& plan, std::optional<int> nodes,
                                             int gpus_per_node) {
  const auto saves = wrap::SmallerVersions::Saves::kParameters;
  auto nodes_times = [&](int factor) -> std::optional<int> {
    if (!nodes.has_value()) return std::nullopt;
    return *nodes * factor;
  };
  const std::vector<StepKeepingLess> steps = StepsKeepingLess(plan, saves);
  std::vector<Suggestion> candidates = Replacements(plan, nodes, steps);
  for (const StepKeepingLess& step : steps) {
    if (!step.facet->keeps_less_over_more_ranks()) continue;
    const wrap::Strategy& strategy = *step.strategy;
    for (int factor = 2; factor <= kMaxGrowth; factor *= 2) {
      auto [grown, change] = GrowDimension(plan, strategy.mesh_dim(), factor);
      const int64_t world = parallel::MeshRanks(grown.mesh());
      candidates.push_back({.change = absl::StrCat(
                                strategy.name(), " over more ranks: ", change, ", ", world,
                                " GPUs on ", (world + gpus_per_node - 1) / gpus_per_node, " nodes"),
                            .plan = std::move(grown),
                            .nodes = nodes_times(factor)});
    }
  }
  if (!steps.empty()) return candidates;
  for (const wrap::PrepareStep& step : wrap::StepsThatSave(saves)) {
    absl::StatusOr<std::unique_ptr<wrap::Strategy>> strategy = wrap::MakeStrategy(step);
    if (!strategy.ok()) continue;
    const std::string& dim = (*strategy)->mesh_dim();
    for (int factor = 2; factor <= kMaxGrowth; factor *= 2) {
      Suggestion& added = candidates.emplace_back();
      added.plan = plan;
      // Outermost: the dimensions the plan has keep their closest ranks.
      parallel::MeshConfig& mesh = *added.plan.mutable_mesh();
      mesh.clear_dims();
      parallel::MeshConfig::Dimension* new_dim = mesh.add_dims();
      new_dim->set_name(dim);
      new_dim->set_size(factor);
      for (const parallel::MeshConfig::Dimension& kept : plan.mesh().dims()) {
        *mesh.add_dims() = kept;
      }
      *added.plan.add_prepare() = step;
      const int64_t world = parallel::MeshRanks(mesh);
      added.change =
          absl::StrCat(step.ShortDebugString(), " over a new mesh dim ", dim, ": ", factor, " (",
                       world, " GPUs; a global batch ", factor, " times larger)");
      added.nodes = nodes_times(factor);
    }
  }
  return candidates;
}

// Smaller micro-batches, each divisor of the micro-batch from the largest, with the gradient
// accumulation that keeps the global batch.
std::vector<Suggestion> MicroBatchSuggestions(const Plan& plan, std::optional<int> nodes) {
  std::vector<Suggestion> candidates;
  const int64_t micro_batch = plan.training().micro_batch();
  const int64_t accumulation = std::max<int64_t>(1, plan.training().grad_accumulation());
  for (int64_t smaller = micro_batch - 1; smaller >= 1; --smaller) {
    if (micro_batch % smaller != 0) continue;
    Suggestion& candidate = candidates.emplace_back();
    candidate.plan = plan;
    const int64_t more = accumulation * (micro_batch / smaller);
    candidate.plan.mutable_training()->set_micro_batch(smaller);
    candidate.plan.mutable_training()->set_grad_accumulation(more);
    candidate.change =
        absl::StrCat("--set=training.micro_batch=", smaller,
                     " --set=training.grad_accumulation=", more, " (the same global batch)");
    candidate.nodes = nodes;
  }
  return candidates;
}

}  // namespace

absl::StatusOr<TargetCatalogue> LoadTargets(const std::string& user_file) {
  PLAIT_ASSIGN_OR_RETURN(TargetCatalogue catalogue,
                         ParseCatalogue(kBuiltinTargetsText, "plan/targets.textproto (built in)"));
  if (user_file.empty()) return catalogue;
  PLAIT_ASSIGN_OR_RETURN(const std::string text, base::ReadFile(user_file));
  PLAIT_ASSIGN_OR_RETURN(const TargetCatalogue user, ParseCatalogue(text, user_file));
  for (const Target& target : user.targets()) {
    auto same_name =
        std::find_if(catalogue.mutable_targets()->begin(), catalogue.mutable_targets()->end(),
                     [&](const Target& known) { return known.name() == target.name(); });
    if (same_name != catalogue.mutable_targets()->end()) {
      *same_name = target;
    } else {
      *catalogue.add_targets() = target;
    }
  }
  if (user.has_reserve()) *catalogue.mutable_reserve() = user.reserve();
  if (user.has_speed()) *catalogue.mutable_speed() = user.speed();
  return catalogue;
}

absl::StatusOr<Target> FindTarget(const TargetCatalogue& catalogue, absl::string_view name) {
  std::vector<std::string> names;
  for (const Target& target : catalogue.targets()) {
    if (target.name() == name) return target;
    names.push_back(target.name());
  }
  return absl::NotFoundError(absl::StrCat("--target=", name,
                                          ": no such target; known: ", absl::StrJoin(names, ", "),
                                          " (--targets_file=FILE adds your own)"));
}

absl::StatusOr<TargetCheck> CheckOnTarget(const Plan& plan, const TargetCatalogue& catalogue,
                                          absl::string_view target_name, std::optional<int> nodes) {
  PLAIT_ASSIGN_OR_RETURN(const Target target, FindTarget(catalogue, target_name));
  PLAIT_ASSIGN_OR_RETURN(TargetCheck check, Evaluate(plan, catalogue, target, nodes));
  if (check.fits()) return check;
  for (const std::vector<Suggestion>& kind :
       {ActivationSuggestions(plan, nodes),
        ParameterSuggestions(plan, nodes, target.gpus_per_node()),
        MicroBatchSuggestions(plan, nodes)}) {
    for (const Suggestion& candidate : kind) {
      // A change the rules refuse (checkpointing after FSDP) is no suggestion.
      const absl::StatusOr<TargetCheck> changed =
          Evaluate(candidate.plan, catalogue, target, candidate.nodes);
      if (!changed.ok() || !changed->fits()) continue;
      Suggestion& fitting = check.suggestions.emplace_back(candidate);
      fitting.spare_bytes = changed->usable_bytes - changed->needed_bytes;
      break;
    }
  }
  return check;
}

std::string DescribeTargetCheck(const TargetCheck& check, const TargetCatalogue& catalogue) {
  const Target& target = check.target;
  const MemoryReserve& reserve = catalogue.reserve();
  const SpeedAssumptions& speed = catalogue.speed();
  std::vector<std::string> lines;
  lines.push_back(absl::StrFormat("target: %s, %d node%s x %d GPUs (%d ranks): %s", target.name(),
                                  check.nodes, check.nodes == 1 ? "" : "s", target.gpus_per_node(),
                                  check.resolved.world_size, target.description()));
  lines.push_back(absl::StrFormat(
      "memory per GPU (estimate, LibTorch 2.x's CUDA ops): %s; with the allocator's "
      "fragmentation (%.0f%%) %s of %s usable (%.2f GiB less %.1f GiB for the CUDA context, "
      "LibTorch's kernels and NCCL)",
      DescribeMemory(check.memory), 100.0 * reserve.fragmentation(),
      base::HumanBytes(check.needed_bytes), base::HumanBytes(check.usable_bytes),
      target.memory_gib(), reserve.fixed_gib()));
  const double spare = check.usable_bytes - check.needed_bytes;
  if (check.fits()) {
    lines.push_back(absl::StrCat("fits: ", base::HumanBytes(spare), " spare per GPU"));
  } else {
    lines.push_back(absl::StrCat("does not fit: over by ", base::HumanBytes(-spare), " per GPU"));
    if (check.suggestions.empty()) {
      lines.push_back(
          absl::StrCat("  no single change tried fits (keeping less of the forward, keeping "
                       "less of the parameters over up to ",
                       kMaxGrowth, "x the ranks, a smaller micro-batch)"));
    }
    for (const Suggestion& suggestion : check.suggestions) {
      lines.push_back(absl::StrCat("  fits with ", suggestion.change, ": ",
                                   base::HumanBytes(suggestion.spare_bytes), " spare"));
    }
  }
  const StepTime& time = check.time;
  std::vector<std::string> links;
  for (const StepTime::Link& link : time.links) {
    links.push_back(absl::StrFormat(
        "%s %s sent a GPU over %s in %.3f s, %s", link.mesh_dim, base::HumanBytes(link.bytes),
        link.across_nodes ? "the network" : "the node's links", link.seconds,
        link.overlaps_compute ? "overlapping the compute" : "the compute waiting"));
  }
  lines.push_back(absl::StrFormat(
      "step time (estimate): %.3f s, %.0f tokens/s per GPU, bound by %s; compute %.3f s (%.3g "
      "model FLOPs a GPU at MFU %.0f%% of the %s peak, MFU by %s)%s",
      time.seconds, time.tokens_per_second_per_gpu, time.bound, time.compute_seconds,
      time.flops_per_gpu, 100.0 * speed.mfu(),
      check.resolved.plan.model().dtype() == base::DTYPE_FLOAT32 ? "fp32" : "bf16",
      models::kFlopConvention,
      links.empty() ? "" : absl::StrCat("; ", absl::StrJoin(links, "; "))));
  lines.push_back(absl::StrFormat(
      "  assumed: MFU %.0f%%, collectives at %.0f%% of the links' bandwidth (%s GB/s within a "
      "node, %s GB/s a GPU across nodes); targets.textproto's speed sets both",
      100.0 * speed.mfu(), 100.0 * speed.link_efficiency(),
      absl::StrFormat("%g", target.intra_node_gb_per_s()),
      absl::StrFormat("%g", target.inter_node_gb_per_s())));
  return absl::StrJoin(lines, "\n");
}

}  // namespace plait::plan
