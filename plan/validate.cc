#include "plan/validate.h"

#include <sys/stat.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/dtype.h"
#include "base/file.h"
#include "base/memory.h"
#include "base/own_output.h"
#include "base/status.h"
#include "checkpoint/checkpoint_config.h"
#include "data/data_config.h"
#include "generation/sampling_config.h"
#include "models/estimates.h"
#include "models/hf_checkpoint.h"
#include "models/model_config.h"
#include "models/parameter_shapes.h"
#include "objectives/objective_check.h"
#include "optim/optimizer.h"
#include "parallel/device.h"
#include "parallel/device_mesh.h"
#include "plan/compute_dtype.h"
#include "plan/memory_estimate.h"
#include "sched/schedule_builder.h"
#include "wrap/rules.h"
#include "wrap/strategies.h"

namespace plait::plan {
namespace {

// The most micro-batches a rank reads in one evaluation of a synthetic source (plan.proto).
constexpr int64_t kMaxSyntheticEvalMicroBatches = 65536;

// The most compute threads a rank may ask for (plan.proto): more than the cores of any one
// machine plait runs on, and few enough that a typo cannot start a million threads.
constexpr int32_t kMaxComputeThreadsPerRank = 1024;

bool DirectoryExists(const std::string& path) {
  struct stat info;
  return stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode);
}

// The files the data source `data` reads (its token or pair files, and a text pair source's
// tokenizer), by field under "plan.data".
std::vector<base::NamedPath> DataInputs(const data::DataConfig& data) {
  std::vector<base::NamedPath> inputs;
  const auto add = [&](const char* source, const char* name, const std::string& path) {
    if (!path.empty()) inputs.push_back({absl::StrCat("plan.data.", source, ".", name), path});
  };
  if (data.has_token_files()) {
    add("token_files", "train_path", data.token_files().train_path());
    add("token_files", "eval_path", data.token_files().eval_path());
  }
  for (const auto& [source, files] :
       {std::pair{"sft_files", data.has_sft_files() ? &data.sft_files() : nullptr},
        std::pair{"preference_files",
                  data.has_preference_files() ? &data.preference_files() : nullptr}}) {
    if (files == nullptr) continue;
    add(source, "train_path", files->train_path());
    add(source, "eval_path", files->eval_path());
    add(source, "tokenizer", files->tokenizer());
  }
  return inputs;
}

// One pass over a plan: each check records its violations and what it resolved, so that a
// plan without violations comes out resolved (resolved_plan.h) with each quantity derived once.
class Checker {
 public:
  Checker(const Plan& plan, int world_size, const wrap::PreparationRules& rules)
      : plan_(plan), rules_(rules) {
    resolved_.plan = plan;
    resolved_.world_size = world_size;
  }

  std::vector<Violation> Run() {
    const std::optional<models::ModelConfig> config = CheckModel(plan_.model(), "plan.model");
    if (config.has_value()) resolved_.model = *config;
    CheckWeights(plan_.hf_weights_dir(), "plan.hf_weights_dir");
    AddInput("plan.model.hf_config_path", plan_.model().hf_config_path());
    AddInput("plan.hf_weights_dir", plan_.hf_weights_dir());
    ResolvePaths();
    CheckMesh();
    CollectDimUse(CheckSteps(plan_.prepare(), "plan.prepare", plan_.model(), config));
    CheckMeshUse();
    CheckOptimizer(config);
    CheckTraining(config);
    CheckCheckpoint();
    CheckSchedule();
    CheckData(config);
    CheckSamples();
    CheckFrozen();
    CheckOutputs();
    AddAll(objectives::CheckObjective(plan_.objective(), config,
                                      HasEffect(plan_.prepare(), wrap::ADAPTS), frozen_configs_,
                                      plan_.data(), "plan.objective"));
    CheckFeatures(config);
    CheckFrozenStages();
    ResolveWork(config);
    return std::move(violations_);
  }

  // What Run resolved; complete when it found no violation.
  ResolvedPlan TakeResolved() { return std::move(resolved_); }

 private:
  void Add(std::string field, std::string message, std::string rule = "") {
    violations_.push_back({std::move(field), std::move(message), std::move(rule)});
  }

  // The features of the data, the objective and the model that the rules' feature rules
  // refuse beside the kinds of step the trained model's preparation has.
  void CheckFeatures(const std::optional<models::ModelConfig>& config) {
    std::set<wrap::StepKind> kinds;
    // Some step's ranks compute slices of the sequences the data-parallel ranks share.
    if (resolved_.scoring_dims != resolved_.data_parallel_dims) kinds.insert(wrap::SPLITS_SEQUENCE);
    if (HasEffect(plan_.prepare(), wrap::SELECTS)) kinds.insert(wrap::CUTS_STAGES);
    if (resolved_.data_parallel_size > 1) kinds.insert(wrap::SPLITS_BATCH);
    // Some step's ranks run layers on slices of the tokens of rows they share.
    if (resolved_.routing_dims != resolved_.data_parallel_dims) kinds.insert(wrap::SLICES_TOKENS);
    std::vector<base::PlanFeature> features = data::FeaturesOf(resolved_.data, "plan.data");
    for (std::vector<base::PlanFeature> more :
         {objectives::FeaturesOf(plan_.objective(), "plan.objective"),
          config.has_value() ? models::FeaturesOf(*config, "plan.model")
                             : std::vector<base::PlanFeature>(),
          plan_.training().has_samples()
              ? generation::FeaturesOf(plan_.training().samples(), "plan.training.samples")
              : std::vector<base::PlanFeature>()}) {
      features.insert(features.end(), more.begin(), more.end());
    }
    AddAll(wrap::CheckFeatures(rules_, features, kinds));
  }

  // Violations a library found.
  void AddAll(std::vector<Violation> violations) {
    for (Violation& violation : violations) violations_.push_back(std::move(violation));
  }

  // A library's error for the subtree at `field`, whose message starts with the full field
  // path ("plan.model.preset: ...", as every plait library names its fields): recorded under
  // that path.
  void AddError(const std::string& field, absl::string_view error) {
    std::string message(error);
    std::string where = field;
    const size_t colon = message.find(": ");
    if (absl::StartsWith(message, field) && colon != std::string::npos) {
      where = message.substr(0, colon);
      message = message.substr(colon + 2);
    }
    Add(where, message);
  }

  std::optional<models::ModelConfig> CheckModel(const models::ModelSpec& spec,
                                                const std::string& field) {
    if (spec.dtype() == base::DTYPE_FLOAT16) {
      Add(field + ".dtype", base::kNoCpuFp16);
    }
    absl::StatusOr<models::ModelConfig> config = models::ResolveModelSpec(spec, field);
    if (config.ok()) return *config;
    AddError(field, config.status().message());
    return std::nullopt;
  }

  void CheckWeights(const std::string& dir, const std::string& field) {
    if (!dir.empty() && !DirectoryExists(dir)) {
      Add(field, absl::StrCat("\"", dir, "\" is not a folder"));
    }
  }

  // A path the run reads, named by `field`; none when empty.
  void AddInput(std::string field, const std::string& path) {
    if (!path.empty()) resolved_.inputs.push_back({std::move(field), path});
  }

  void CheckMesh() {
    AddAll(parallel::CheckMeshConfig(plan_.mesh(), resolved_.world_size, "plan.mesh"));
    for (const auto& dim : plan_.mesh().dims()) dims_.insert(dim.name());
  }

  // The rules, then each strategy's own checks against the shape of the model `spec` it
  // prepares (whose `config` is nullopt when invalid); the strategies of the steps that name
  // one.
  std::vector<std::unique_ptr<wrap::Strategy>> CheckSteps(
      const google::protobuf::RepeatedPtrField<wrap::PrepareStep>& steps, const std::string& field,
      const models::ModelSpec& spec, const std::optional<models::ModelConfig>& config) {
    AddAll(wrap::CheckSteps(rules_, steps, field, dims_, "plan.mesh"));
    std::optional<wrap::ModelShape> shape;
    if (config.has_value()) {
      shape = ShapeOf(*config, spec, plan_.device(), plan_.training(), wrap::ActivationSplit());
    }
    std::vector<std::unique_ptr<wrap::Strategy>> strategies;
    for (int i = 0; i < steps.size(); ++i) {
      absl::StatusOr<std::unique_ptr<wrap::Strategy>> strategy = wrap::MakeStrategy(steps[i]);
      if (!strategy.ok()) continue;  // wrap::CheckSteps says why
      AddAll((*strategy)->Check(shape, plan_.mesh(), absl::StrCat(field, "[", i, "]")));
      // What a step reads (the adapter folder it starts from) is never written.
      for (const wrap::Strategy::InputFile& input : (*strategy)->InputFiles()) {
        AddInput(absl::StrCat(field, "[", i, "].", input.field), input.path);
      }
      strategies.push_back(*std::move(strategy));
    }
    return strategies;
  }

  // The dimensions the plan's own `strategies` use, and the data-parallel dimensions and
  // width: the ranks of the dimensions whose strategies split the batch.
  void CollectDimUse(const std::vector<std::unique_ptr<wrap::Strategy>>& strategies) {
    for (const std::unique_ptr<wrap::Strategy>& strategy : strategies) {
      if (strategy->uses_mesh_dim()) used_dims_.insert(strategy->mesh_dim());
      used_dims_.insert(strategy->replicate_dim());
    }
    std::vector<std::string> mesh_dims;
    for (const auto& dim : plan_.mesh().dims()) mesh_dims.push_back(dim.name());
    resolved_.data_parallel_dims = wrap::DataParallelDimsOf(plan_.prepare(), mesh_dims);
    resolved_.scoring_dims = wrap::ScoringDimsOf(plan_.prepare(), mesh_dims);
    resolved_.routing_dims = wrap::RoutingDimsOf(plan_.prepare(), mesh_dims);
    resolved_.data_parallel_size = parallel::SubmeshRanks(
        plan_.mesh(), {resolved_.data_parallel_dims.begin(), resolved_.data_parallel_dims.end()});
  }

  // A mesh dimension of several ranks that no step uses would give its ranks the same data
  // and let their models drift apart.
  void CheckMeshUse() {
    for (int i = 0; i < plan_.mesh().dims_size(); ++i) {
      const auto& dim = plan_.mesh().dims(i);
      if (dim.size() > 1 && used_dims_.count(dim.name()) == 0) {
        Add(absl::StrCat("plan.mesh.dims[", i, "]"),
            absl::StrCat("\"", dim.name(), "\" has ", dim.size(),
                         " ranks but no preparation step in plan.prepare uses it"));
      }
    }
  }

  // The optimizer's own checks (hyperparameters, clipping, parameter-group rules against the
  // model's parameter names), made now rather than when the prepared model exists.
  void CheckOptimizer(const std::optional<models::ModelConfig>& config) {
    if (plan_.optimizer().algorithm_case() == optim::OptimizerConfig::ALGORITHM_NOT_SET) {
      Add("plan.optimizer", "names no algorithm; set one of adamw, adam, sgd, lion");
      return;
    }
    if (!config.has_value()) return;  // the model's error is reported; no names to match
    std::vector<std::string> names;
    for (const models::ParameterShape& shape : models::ParameterShapes(*config)) {
      names.push_back(shape.name);
    }
    const absl::Status status = optim::ValidateOptimizerConfig(plan_.optimizer(), names);
    if (!status.ok()) {
      // The optimizer names its fields from "optimizer".
      AddError("plan.optimizer", absl::StrCat("plan.", status.message()));
    }
  }

  void CheckTraining(const std::optional<models::ModelConfig>& config) {
    const TrainingConfig& t = plan_.training();
    auto positive = [&](const char* name, int64_t value) {
      if (value <= 0)
        Add(absl::StrCat("plan.training.", name), absl::StrCat(value, "; must be > 0"));
    };
    auto non_negative = [&](const char* name, int64_t value) {
      if (value < 0) {
        Add(absl::StrCat("plan.training.", name), absl::StrCat(value, "; must be >= 0"));
      }
    };
    positive("steps", t.steps());
    positive("micro_batch", t.micro_batch());
    positive("seq_len", t.seq_len());
    non_negative("eval_batches", t.eval_batches());
    non_negative("grad_accumulation", t.grad_accumulation());
    non_negative("global_batch", t.global_batch());
    non_negative("eval_every", t.eval_every());
    non_negative("log_every", t.log_every());
    non_negative("max_skipped_steps", t.max_skipped_steps());
    non_negative("compute_threads_per_rank", t.compute_threads_per_rank());
    if (t.compute_threads_per_rank() > kMaxComputeThreadsPerRank) {
      Add("plan.training.compute_threads_per_rank",
          absl::StrCat(t.compute_threads_per_rank(), "; must be at most ",
                       kMaxComputeThreadsPerRank, " (0: from the machine)"));
    }
    if (!t.run_dir().empty()) {
      if (absl::Status writable = base::CheckFolderIsWritable(base::UserPath(t.run_dir()));
          !writable.ok()) {
        Add("plan.training.run_dir", std::string(writable.message()));
      }
    }
    if (t.eval_batches() == 0 && t.eval_every() > 0) {
      Add("plan.training.eval_every",
          absl::StrCat(t.eval_every(), " asks for an evaluation every ", t.eval_every(),
                       " steps, but plan.training.eval_batches is 0 (no evaluation); set both "
                       "or neither"));
    }
    for (const auto& [name, peak] :
         {std::pair{"peak_flops_per_rank", t.peak_flops_per_rank()},
          std::pair{"peak_bf16_flops_per_rank", t.peak_bf16_flops_per_rank()}}) {
      if (!(peak >= 0.0 && std::isfinite(peak))) {
        Add(absl::StrCat("plan.training.", name), absl::StrCat(peak, "; must be >= 0 and finite"));
      }
    }
    if (config.has_value() && t.seq_len() > config->max_position_embeddings()) {
      Add("plan.training.seq_len",
          absl::StrCat(t.seq_len(), " exceeds the model's ", "max_position_embeddings (",
                       config->max_position_embeddings(), ")"));
    }
    resolved_.grad_accumulation = t.grad_accumulation() == 0 ? 1 : t.grad_accumulation();
    resolved_.log_every = t.log_every() == 0 ? 10 : t.log_every();
    resolved_.max_skipped_steps = t.max_skipped_steps() == 0 ? 5 : t.max_skipped_steps();
    if (__builtin_mul_overflow(t.eval_batches(), resolved_.grad_accumulation,
                               &resolved_.eval_micro_batches)) {
      Add("plan.training.eval_batches",
          absl::StrCat(t.eval_batches(), " x grad_accumulation (", resolved_.grad_accumulation,
                       ") micro-batches per evaluation is more than 2^63 - 1"));
    }
    if (t.micro_batch() <= 0 || t.grad_accumulation() < 0) return;  // reported above
    // Checked products: a huge micro_batch could wrap them to any value, 0 included.
    int64_t across_ranks = 0, per_step = 0;
    const bool ranks_overflow =
        __builtin_mul_overflow(t.micro_batch(), resolved_.data_parallel_size, &across_ranks);
    const bool overflow =
        ranks_overflow ||
        __builtin_mul_overflow(across_ranks, resolved_.grad_accumulation, &per_step);
    if (!overflow) resolved_.global_batch = per_step;
    // Every count of tokens the run computes and prints is at most a step's.
    int64_t tokens_per_step = 0;
    if (t.seq_len() > 0 &&
        (overflow || __builtin_mul_overflow(per_step, t.seq_len(), &tokens_per_step))) {
      Add("plan.training.micro_batch",
          absl::StrCat("micro_batch (", t.micro_batch(), ") x data-parallel ranks (",
                       resolved_.data_parallel_size, ") x grad_accumulation (",
                       resolved_.grad_accumulation, ") x seq_len (", t.seq_len(),
                       ") tokens a step is more than 2^63 - 1"));
    }
    if (t.global_batch() > 0 && (overflow || per_step != t.global_batch())) {
      Add("plan.training.global_batch",
          absl::StrCat(t.global_batch(), " is not micro_batch (", t.micro_batch(),
                       ") x data-parallel ranks (", resolved_.data_parallel_size,
                       ") x grad_accumulation (", resolved_.grad_accumulation,
                       ") = ", overflow ? "more than 2^63 - 1" : absl::StrCat(per_step),
                       !ranks_overflow && t.global_batch() % across_ranks == 0
                           ? ""
                           : "; micro_batch x ranks does not divide it"));
    }
  }

  // Where the run writes, checked now so that nothing is lost at its end: its outputs apart
  // from each other and from what it reads (after CheckData and CheckFrozen, which find the
  // inputs), then each folder's own writer's checks.
  void CheckOutputs() {
    for (base::NamedPath& input : DataInputs(resolved_.data)) {
      resolved_.inputs.push_back(std::move(input));
    }
    constexpr char kSaveHf[] = "plan.training.save_hf_dir";
    constexpr char kSaveAdapter[] = "plan.training.save_adapter_dir";
    const std::vector<base::Violation> collisions =
        base::CheckOutputsApart({{"plan.training.checkpoint.dir", resolved_.checkpoint_dir},
                                 {"plan.training.metrics_file", resolved_.metrics_path},
                                 {"plan.training.tensorboard_dir", resolved_.tensorboard_dir},
                                 {"plan.training.samples.file", resolved_.samples_path},
                                 {kSaveHf, resolved_.save_hf_dir, /*whole_folder=*/true},
                                 {kSaveAdapter, resolved_.save_adapter_dir, /*whole_folder=*/true}},
                                resolved_.inputs);
    std::set<std::string> collided;
    for (const base::Violation& collision : collisions) collided.insert(collision.field);
    AddAll(collisions);
    // A folder that is another path of the run already has its one violation.
    if (collided.count(kSaveHf) == 0) {
      AddAll(models::CheckHfExportFolder(resolved_.save_hf_dir, {}, kSaveHf));
    }
    if (resolved_.save_adapter_dir.empty()) return;
    const std::vector<wrap::StepWith<wrap::AdapterExport>> adapters =
        wrap::StepsWith<wrap::AdapterExport>(plan_.prepare());
    if (!adapters.empty()) {
      if (collided.count(kSaveAdapter) == 0) {
        AddAll(
            adapters.front().facet->CheckAdapterFolder(resolved_.save_adapter_dir, kSaveAdapter));
      }
      return;
    }
    Add(kSaveAdapter,
        "the preparation adds no adapters to save (no step that exports the adapters it adds, "
        "such as lora)");
  }

  // Whether a step of `steps` has `effect` by its rule: ADAPTS adds adapters to the model,
  // SELECTS cuts it into pipeline stages.
  bool HasEffect(const google::protobuf::RepeatedPtrField<wrap::PrepareStep>& steps,
                 wrap::ParameterEffect effect) const {
    for (const wrap::PrepareStep& step : steps) {
      const wrap::StrategyRule* rule = wrap::FindStrategy(rules_, wrap::StrategyName(step));
      if (rule != nullptr && rule->effect() == effect) return true;
    }
    return false;
  }

  // The mesh dimension a step of `steps` whose rule's effect is SELECTS cuts the model into
  // pipeline stages over, or "" when none does.
  std::string StagesDim(const google::protobuf::RepeatedPtrField<wrap::PrepareStep>& steps) const {
    for (const wrap::PrepareStep& step : steps) {
      const wrap::StrategyRule* rule = wrap::FindStrategy(rules_, wrap::StrategyName(step));
      if (rule == nullptr || rule->effect() != wrap::SELECTS) continue;
      const absl::StatusOr<std::unique_ptr<wrap::Strategy>> strategy = wrap::MakeStrategy(step);
      if (strategy.ok()) return (*strategy)->mesh_dim();
    }
    return "";
  }

  // What the objective reads from a frozen model cut into pipeline stages comes out of its last
  // stage, where the trained model's loss must be computed: both cut over one dimension.
  void CheckFrozenStages() {
    const std::string trained = StagesDim(plan_.prepare());
    for (int i = 0; i < plan_.frozen_size(); ++i) {
      const std::string frozen = StagesDim(plan_.frozen(i).prepare());
      if (frozen.empty() || frozen == trained) continue;
      Add(absl::StrCat("plan.frozen[", i, "].prepare"),
          absl::StrCat("cuts the frozen model into pipeline stages over \"", frozen,
                       "\", but the trained model ",
                       trained.empty() ? std::string("is not cut into stages")
                                       : absl::StrCat("is cut over \"", trained, "\""),
                       ": what the objective reads from a frozen model comes out of its last "
                       "stage, which must hold the trained model's last stage too; cut both over "
                       "one dimension, or leave the frozen model whole"));
    }
  }

  void CheckCheckpoint() {
    AddAll(checkpoint::CheckConfig(plan_.training().checkpoint(), "plan.training.checkpoint"));
  }

  void CheckSchedule() {
    resolved_.schedule = plan_.schedule();
    resolved_.schedule.set_total_steps(plan_.training().steps());
    const int64_t total = plan_.schedule().total_steps();
    if (total != 0 && total != plan_.training().steps()) {
      Add("plan.schedule.total_steps",
          absl::StrCat(total, " differs from plan.training.steps (", plan_.training().steps(),
                       "); leave it unset, it is taken from training.steps"));
      return;
    }
    if (plan_.training().steps() <= 0) return;  // reported above
    absl::StatusOr<sched::Schedule> schedule =
        sched::BuildSchedule(resolved_.schedule, "plan.schedule");
    if (!schedule.ok()) AddError("plan.schedule", schedule.status().message());
  }

  // After CheckTraining, which resolves the micro-batches an evaluation reads.
  void CheckData(const std::optional<models::ModelConfig>& config) {
    resolved_.data = ResolveData(plan_);
    const std::optional<int64_t> vocab_size =
        config.has_value() ? std::optional<int64_t>(config->vocab_size()) : std::nullopt;
    AddAll(data::CheckDataConfig(resolved_.data, vocab_size, "plan.data"));
    const data::DataConfig& data = resolved_.data;
    const bool synthetic =
        data.has_synthetic() || data.has_synthetic_pairs() || data.has_synthetic_sft();
    if (synthetic && resolved_.eval_micro_batches > kMaxSyntheticEvalMicroBatches) {
      Add("plan.training.eval_batches",
          absl::StrCat(plan_.training().eval_batches(), " global batches (",
                       resolved_.eval_micro_batches, " micro-batches per rank) exceed the ",
                       kMaxSyntheticEvalMicroBatches,
                       " an evaluation of a synthetic source reads: its held-out stream never "
                       "ends, so an evaluation is bounded as a held-out file's is"));
    }
  }

  // The samples' own fields, and the tokenizer that encodes their prompts: theirs, else the
  // data's text tokenizer, else the one beside the model's config.json.
  void CheckSamples() {
    if (!plan_.training().has_samples()) return;
    const generation::SamplesConfig& samples = plan_.training().samples();
    const std::string field = "plan.training.samples";
    AddAll(generation::CheckSamplesConfig(samples, field));
    std::string tokenizer = samples.tokenizer();
    const data::DataConfig& data = resolved_.data;
    for (const data::PairFiles* files :
         {data.has_sft_files() ? &data.sft_files() : nullptr,
          data.has_preference_files() ? &data.preference_files() : nullptr}) {
      if (tokenizer.empty() && files != nullptr) tokenizer = files->tokenizer();
    }
    if (tokenizer.empty() && !plan_.model().hf_config_path().empty()) {
      const std::filesystem::path folder =
          std::filesystem::path(plan_.model().hf_config_path()).parent_path();
      tokenizer = folder.empty() ? "." : folder.string();
    }
    if (tokenizer.empty()) {
      Add(field + ".tokenizer",
          "is empty, and neither the data (text pair files) nor the model (model.hf_config_path) "
          "has a tokenizer to encode the prompts with; give a tokenizer.json or tokenizer.model, "
          "or their folder");
      return;
    }
    resolved_.samples_tokenizer = tokenizer;
    if (!std::filesystem::exists(base::UserPath(tokenizer))) {
      Add(field + ".tokenizer",
          absl::StrCat("the prompts' tokenizer \"", tokenizer,
                       "\" does not exist (a tokenizer.json or tokenizer.model, or their folder)"));
    }
  }

  void CheckFrozen() {
    std::set<std::string> names;
    for (int i = 0; i < plan_.frozen_size(); ++i) {
      const FrozenModel& frozen = plan_.frozen(i);
      const std::string field = absl::StrCat("plan.frozen[", i, "]");
      if (frozen.name().empty()) Add(field + ".name", "is empty; name every frozen model");
      if (!names.insert(frozen.name()).second) {
        Add(field + ".name", absl::StrCat("\"", frozen.name(), "\" appears twice"));
      }
      const std::optional<models::ModelConfig> config =
          CheckModel(frozen.model(), field + ".model");
      frozen_configs_[frozen.name()] = config;
      resolved_.frozen.push_back(config.value_or(models::ModelConfig()));
      CheckWeights(frozen.hf_weights_dir(), field + ".hf_weights_dir");
      AddInput(field + ".model.hf_config_path", frozen.model().hf_config_path());
      AddInput(field + ".hf_weights_dir", frozen.hf_weights_dir());
      CheckSteps(frozen.prepare(), field + ".prepare", frozen.model(), config);
    }
  }

  // What a step computes, as the objective says (objectives::WorkOf), for the trained model
  // `config` (nullopt when invalid: no FLOPs to count).
  void ResolveWork(const std::optional<models::ModelConfig>& config) {
    const objectives::WorkPerSequence work = objectives::WorkOf(plan_.objective());
    const int64_t seq_len = plan_.training().seq_len();
    resolved_.tokens_per_step =
        static_cast<double>(resolved_.global_batch) * seq_len * work.trained_rows;
    if (!config.has_value()) return;
    resolved_.flops_per_token = models::TrainingFlopsPerToken(*config, seq_len) +
                                work.trained_forward_rows / work.trained_rows *
                                    models::ForwardFlopsPerToken(*config, seq_len);
    for (const auto& [name, rows] : work.frozen_forward_rows) {
      const auto frozen = frozen_configs_.find(name);
      if (frozen == frozen_configs_.end() || !frozen->second.has_value()) continue;
      resolved_.flops_per_token +=
          rows / work.trained_rows * models::ForwardFlopsPerToken(*frozen->second, seq_len);
    }
  }

  // The files the run writes, where the user meant them.
  void ResolvePaths() {
    const TrainingConfig& t = plan_.training();
    resolved_.metrics_path = base::UserPath(t.metrics_file());
    resolved_.save_hf_dir = base::UserPath(t.save_hf_dir());
    resolved_.save_adapter_dir = base::UserPath(t.save_adapter_dir());
    resolved_.checkpoint_dir = base::UserPath(t.checkpoint().dir());
    resolved_.tensorboard_dir = base::UserPath(t.tensorboard_dir());
    if (t.has_samples())
      resolved_.samples_path = base::UserPath(generation::SamplesFile(t.samples()));
  }

  const Plan& plan_;
  const wrap::PreparationRules& rules_;
  ResolvedPlan resolved_;
  std::set<std::string> dims_;
  std::set<std::string> used_dims_;
  std::map<std::string, std::optional<models::ModelConfig>> frozen_configs_;  // by name
  std::vector<Violation> violations_;
};

}  // namespace

data::DataConfig ResolveData(const Plan& plan) {
  data::DataConfig data = data::ResolvedDataConfig(plan.data());
  data::PairFiles* files = data.has_sft_files()          ? data.mutable_sft_files()
                           : data.has_preference_files() ? data.mutable_preference_files()
                                                         : nullptr;
  const std::string& config_path = plan.model().hf_config_path();
  if (files != nullptr && files->format() == data::PAIR_FORMAT_TEXT && files->tokenizer().empty() &&
      !config_path.empty()) {
    const std::filesystem::path folder = std::filesystem::path(config_path).parent_path();
    files->set_tokenizer(folder.empty() ? "." : folder.string());
  }
  return data;
}

std::vector<Violation> CheckPlan(const Plan& plan, int world_size,
                                 const wrap::PreparationRules& rules) {
  return Checker(plan, world_size, rules).Run();
}

absl::StatusOr<ResolvedPlan> Resolve(const Plan& plan, int world_size) {
  PLAIT_ASSIGN_OR_RETURN(const wrap::PreparationRules* rules, wrap::BuiltinRules());
  Checker checker(plan, world_size, *rules);
  PLAIT_RETURN_IF_ERROR(base::ViolationsToStatus(checker.Run()));
  return checker.TakeResolved();
}

absl::StatusOr<ResolvedPlan> ResolveForMachine(const Plan& plan, int world_size, int local_ranks,
                                               bool skip_memory_check) {
  PLAIT_ASSIGN_OR_RETURN(ResolvedPlan resolved, Resolve(plan, world_size));
  PLAIT_ASSIGN_OR_RETURN(
      const at::Device device,
      parallel::ResolveDevice(plan.device(), /*local_rank=*/0, local_ranks, "plan.device"));
  if (skip_memory_check) return resolved;
  // For the dtypes the run computes in.
  ResolvedPlan on_device = resolved;
  on_device.plan = ResolveAutoDtypes(resolved.plan, device);
  PLAIT_ASSIGN_OR_RETURN(const MemoryEstimate estimate, EstimateMemory(on_device));
  // On CUDA each rank computes in a GPU of its own.
  if (const std::optional<int64_t> device_bytes = parallel::DeviceMemoryBytes(device)) {
    PLAIT_RETURN_IF_ERROR(CheckMemoryFits(estimate, /*local_ranks=*/1, *device_bytes));
    return resolved;
  }
  PLAIT_ASSIGN_OR_RETURN(const int64_t available, base::AvailableMemoryBytes());
  PLAIT_RETURN_IF_ERROR(CheckMemoryFits(estimate, local_ranks, available));
  return resolved;
}

}  // namespace plait::plan
