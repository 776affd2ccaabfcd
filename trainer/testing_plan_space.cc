#include "trainer/testing_plan_space.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ATen/Context.h"
#include "ATen/core/Tensor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "base/status.h"
#include "data/testing_token_files.h"
#include "google/protobuf/text_format.h"
#include "models/causal_lm.h"
#include "models/hf_checkpoint.h"
#include "models/model_config.h"
#include "parallel/device.h"
#include "parallel/device_mesh.h"
#include "parallel/ring_communicator.h"
#include "parallel/test_ranks.h"
#include "plan/validate.h"
#include "prepared/prepared_model.h"
#include "torch/csrc/autograd/generated/variable_factories.h"
#include "torch/csrc/distributed/c10d/HashStore.hpp"
#include "wrap/lora/peft_adapter.h"
#include "wrap/rules.h"
#include "wrap/strategies.h"

namespace plait::trainer::testing {

namespace {

using ::plait::prepared::PreparedModel;
using ::plait::prepared::Role;
namespace fs = std::filesystem;

// A collective waits this long for the other ranks before it fails: a plan whose ranks
// disagree fails the check in minutes instead of hanging it (the tiny models' steps take
// seconds even with 8 ranks on 2 cores).
constexpr absl::Duration kCollectiveTimeout = absl::Seconds(120);

// The vocabulary of every tiny preset, which the data files' token ids stay below.
constexpr int64_t kVocab = 4096;

// Sequences a step of a drawn plan reads at most, over all its ranks: its steps stay short.
constexpr int64_t kMaxGlobalBatch = 16;

// A stream of draws from a seed: splitmix64, so that a seed draws the same plan with any
// standard library.
class Draws {
 public:
  explicit Draws(uint64_t seed) : state_(seed) {}

  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // In [0, n).
  int64_t Below(int64_t n) { return static_cast<int64_t>(Next() % static_cast<uint64_t>(n)); }
  bool Chance(double p) { return static_cast<double>(Next() >> 11) * 0x1.0p-53 < p; }
  template <typename T>
  const T& Pick(const std::vector<T>& options) {
    return options[Below(static_cast<int64_t>(options.size()))];
  }

 private:
  uint64_t state_;
};

const std::vector<std::string>& Presets() {
  static const auto* presets = new std::vector<std::string>{"tiny", "qwen2-tiny", "qwen3-tiny",
                                                            "qwen3-moe-tiny", "mixtral-tiny"};
  return *presets;
}

// The mesh dimension each strategy is given by default: FSDP and DDP share "dp", so that a
// plan with both exercises the rules that keep them apart.
std::string DefaultDim(const std::string& strategy) {
  static const auto* dims = new std::map<std::string, std::string>{{"fsdp", "dp"},
                                                                   {"ddp", "dp"},
                                                                   {"tensor_parallel", "tp"},
                                                                   {"pipeline", "pp"},
                                                                   {"context_parallel", "cp"},
                                                                   {"expert_parallel", "ep"}};
  const auto it = dims->find(strategy);
  return it == dims->end() ? "" : it->second;
}

const wrap::PreparationRules& Rules() {
  static const wrap::PreparationRules* rules = *wrap::BuiltinRules();
  return *rules;
}

// `names` in a random order the rules' must_follow relations allow (each strategy after those
// it must follow that are present), every such order possible.
std::vector<std::string> RuleOrder(std::vector<std::string> names, Draws& draws) {
  std::vector<std::string> order;
  while (!names.empty()) {
    std::vector<size_t> ready;
    for (size_t i = 0; i < names.size(); ++i) {
      const wrap::StrategyRule* rule = wrap::FindStrategy(Rules(), names[i]);
      bool waits = false;
      for (size_t j = 0; j < names.size() && rule != nullptr && !waits; ++j) {
        for (const auto& follow : rule->must_follow()) {
          if (j != i && follow.strategy() == names[j]) waits = true;
        }
      }
      if (!waits) ready.push_back(i);
    }
    // Relations forming a cycle (none do) would leave no step ready: the rest in any order.
    if (ready.empty()) ready.push_back(0);
    const size_t chosen = ready[draws.Below(static_cast<int64_t>(ready.size()))];
    order.push_back(names[chosen]);
    names.erase(names.begin() + static_cast<std::ptrdiff_t>(chosen));
  }
  return order;
}

// The data files of the plans that read files, written once under `dir`.
struct DataFiles {
  std::string tokens_train, tokens_eval;
  std::string sft_train, sft_eval;
  std::string pairs_train, pairs_eval;
};

// `count` tokens of an order-1 chain with a few successors per token, so that a model learns
// something from them; token 0 (a document start) every 20 to 40 tokens.
std::vector<uint16_t> ChainTokens(int count, uint64_t seed) {
  Draws draws(seed);
  std::vector<uint16_t> tokens;
  int64_t token = 1;
  int64_t next_document = 0;
  for (int i = 0; i < count; ++i) {
    if (i == next_document) {
      tokens.push_back(0);
      next_document = i + 20 + draws.Below(21);
      continue;
    }
    token = 1 + (token * 31 + 7 * draws.Below(3)) % (kVocab - 1);
    tokens.push_back(static_cast<uint16_t>(token));
  }
  return tokens;
}

std::string Ids(const std::vector<int64_t>& ids) {
  return absl::StrCat("[", absl::StrJoin(ids, ", "), "]");
}

// `count` SFT examples (or, with `pairs`, preference pairs) of 1- to 10-token prompts and 1- to
// 24-token completions counting up from the prompt's last token (the rejected ones down).
void WriteExamples(const std::string& path, int count, bool pairs, uint64_t seed) {
  Draws draws(seed);
  std::ofstream out(path);
  for (int i = 0; i < count; ++i) {
    std::vector<int64_t> prompt, chosen, rejected;
    int64_t token = 1 + draws.Below(kVocab - 1);
    const int64_t stride = 1 + draws.Below(5);
    for (int64_t t = 1 + draws.Below(10); t > 0; --t) {
      prompt.push_back(token = 1 + draws.Below(kVocab - 1));
    }
    for (int64_t t = 1 + draws.Below(24); t > 0; --t) {
      chosen.push_back((token + stride * (static_cast<int64_t>(chosen.size()) + 1)) % kVocab);
    }
    for (int64_t t = 1 + draws.Below(24); t > 0; --t) {
      rejected.push_back(
          ((token - stride * (static_cast<int64_t>(rejected.size()) + 1)) % kVocab + kVocab) %
          kVocab);
    }
    if (pairs) {
      out << "{\"prompt\": " << Ids(prompt) << ", \"chosen\": " << Ids(chosen)
          << ", \"rejected\": " << Ids(rejected) << "}\n";
    } else {
      out << "{\"prompt\": " << Ids(prompt) << ", \"completion\": " << Ids(chosen) << "}\n";
    }
  }
}

const DataFiles& Files(const std::string& dir) {
  static auto* files = new std::map<std::string, DataFiles>();
  auto [it, added] = files->try_emplace(dir);
  if (!added) return it->second;
  DataFiles& made = it->second;
  fs::create_directories(dir + "/data");
  made.tokens_train = dir + "/data/train.bin";
  made.tokens_eval = dir + "/data/eval.bin";
  data::testing::WriteLlmcFile(made.tokens_train, ChainTokens(40000, 1));
  data::testing::WriteLlmcFile(made.tokens_eval, ChainTokens(8000, 2));
  made.sft_train = dir + "/data/sft_train.jsonl";
  made.sft_eval = dir + "/data/sft_eval.jsonl";
  WriteExamples(made.sft_train, 200, /*pairs=*/false, 3);
  WriteExamples(made.sft_eval, 40, /*pairs=*/false, 4);
  made.pairs_train = dir + "/data/pairs_train.jsonl";
  made.pairs_eval = dir + "/data/pairs_eval.jsonl";
  WriteExamples(made.pairs_train, 200, /*pairs=*/true, 5);
  WriteExamples(made.pairs_eval, 40, /*pairs=*/true, 6);
  return made;
}

// Draws pair files' options.
data::PairFiles PairFilesOf(const std::string& train, const std::string& eval, bool sft,
                            Draws& draws) {
  data::PairFiles files;
  files.set_train_path(train);
  files.set_eval_path(eval);
  files.set_shuffle(draws.Chance(0.2));
  files.set_shuffle_seed(draws.Below(100));
  if (draws.Chance(0.2)) files.set_truncation(data::TRUNCATION_KEEP_END);
  // Best fit decreasing packs SFT examples only: drawn rarely for pairs.
  const double bfd = sft ? 0.35 : 0.1;
  const double roll = static_cast<double>(draws.Below(1000)) / 1000;
  files.set_packing(roll < bfd         ? data::PACKING_BFD
                    : roll < bfd + 0.3 ? data::PACKING_PADDING_FREE
                                       : data::PACKING_NONE);
  return files;
}

data::SyntheticPairs SyntheticPairsOf(int64_t seq_len, Draws& draws) {
  data::SyntheticPairs pairs;
  pairs.mutable_chain()->set_seed(draws.Below(100));
  pairs.set_rejected_seed(100 + draws.Below(100));
  pairs.set_prompt_length(1 + draws.Below(seq_len / 2));
  return pairs;
}

// The objective and data: mostly a data form the objective reads, sometimes any.
void DrawObjectiveAndData(plan::Plan& plan, const DataFiles& files, Draws& draws) {
  const int64_t seq_len = plan.training().seq_len();
  const int objective = static_cast<int>(draws.Below(10));  // 0-3 causal LM, 4-6 SFT, 7-9 DPO
  int form = objective < 4 ? 0 : objective < 7 ? 1 : 2;
  if (draws.Chance(0.1)) form = static_cast<int>(draws.Below(3));
  data::DataConfig& data = *plan.mutable_data();
  const bool from_files = draws.Chance(0.45);
  if (form == 0 && !from_files) {
    data.mutable_synthetic()->set_seed(draws.Below(100));
  } else if (form == 0) {
    data::TokenFiles& tokens = *data.mutable_token_files();
    tokens.set_train_path(files.tokens_train);
    tokens.set_eval_path(files.tokens_eval);
    tokens.set_format(data::TOKEN_FORMAT_LLMC);
    tokens.set_shuffle(draws.Chance(0.2));
    if (draws.Chance(0.3)) tokens.set_document_start_token(0);
  } else if (form == 1 && !from_files) {
    *data.mutable_synthetic_sft() = SyntheticPairsOf(seq_len, draws);
  } else if (form == 1) {
    *data.mutable_sft_files() = PairFilesOf(files.sft_train, files.sft_eval, true, draws);
  } else if (!from_files) {
    *data.mutable_synthetic_pairs() = SyntheticPairsOf(seq_len, draws);
  } else {
    *data.mutable_preference_files() =
        PairFilesOf(files.pairs_train, files.pairs_eval, false, draws);
  }
  if (objective < 4) {
    if (draws.Chance(0.5)) plan.mutable_objective()->mutable_causal_lm();
    return;
  }
  if (objective < 7) {
    plan.mutable_objective()->mutable_sft();
    return;
  }
  objectives::Dpo& dpo = *plan.mutable_objective()->mutable_dpo();
  dpo.set_beta(draws.Pick(std::vector<double>{0.1, 0.5}));
  dpo.set_loss_type(static_cast<objectives::DpoLossType>(draws.Below(4)));
  if (draws.Chance(0.15)) dpo.set_label_smoothing(0.1);
  dpo.set_precompute_reference(draws.Chance(0.3));
  const bool has_lora = std::any_of(plan.prepare().begin(), plan.prepare().end(),
                                    [](const wrap::PrepareStep& s) { return s.has_lora(); });
  if (has_lora ? draws.Chance(0.6) : draws.Chance(0.1)) {
    dpo.set_policy_without_adapters(true);
    return;
  }
  dpo.set_reference("reference");
  plan::FrozenModel& frozen = *plan.add_frozen();
  frozen.set_name("reference");
  *frozen.mutable_model() = plan.model();
  // The reference prepared as the policy (without its adapters), or whole on every rank.
  if (draws.Chance(0.5)) {
    for (const wrap::PrepareStep& step : plan.prepare()) {
      if (!step.has_lora()) *frozen.add_prepare() = step;
    }
  }
}

// The preparation steps and the mesh they name, of at most 8 ranks.
void DrawLayout(plan::Plan& plan, const models::ModelConfig& config, Draws& draws) {
  const bool moe = config.num_experts() > 0;
  std::vector<std::string> names;
  for (const auto& [name, p] : std::vector<std::pair<std::string, double>>{
           {"fsdp", 0.45},
           {"ddp", 0.25},
           {"tensor_parallel", 0.3},
           // A mixture of experts is refused a pipeline: mostly drawn for the dense models.
           {"pipeline", moe ? 0.1 : 0.4},
           {"context_parallel", 0.2},
           {"expert_parallel", moe ? 0.6 : 0.08},
           {"activation_checkpointing", 0.25},
           {"lora", 0.3}}) {
    if (draws.Chance(p)) names.push_back(name);
  }
  if (!names.empty() && draws.Chance(0.04)) names.push_back(draws.Pick(names));  // twice
  // At most 3 strategies on mesh dimensions, so that the mesh fits in 8 ranks.
  int on_mesh = 0;
  names.erase(std::remove_if(names.begin(), names.end(),
                             [&](const std::string& name) {
                               return !DefaultDim(name).empty() && ++on_mesh > 3;
                             }),
              names.end());
  if (draws.Chance(0.8)) {
    names = RuleOrder(names, draws);
  } else {
    for (size_t i = names.size(); i > 1; --i) {
      std::swap(names[i - 1], names[draws.Below(static_cast<int64_t>(i))]);
    }
  }

  std::vector<std::pair<std::string, int>> dims;  // in the order they are named
  int budget = 8;                                 // ranks left for the mesh
  const auto add_dim = [&](const std::string& name) {
    for (const auto& dim : dims) {
      if (dim.first == name) return;
    }
    int size = 1;
    if (budget >= 4 && draws.Chance(0.25)) {
      size = 4;
    } else if (budget >= 2 && !draws.Chance(0.03)) {
      size = 2;
    }
    budget /= size;
    dims.emplace_back(name, size);
  };
  std::vector<std::string> used;  // the dimensions steps named, for borrowing
  std::string ep_dim;
  for (const std::string& name : names) {
    wrap::PrepareStep& step = *plan.add_prepare();
    std::string dim = DefaultDim(name);
    if (!dim.empty()) {
      if (!used.empty() && draws.Chance(0.08)) dim = draws.Pick(used);  // another step's
      if (draws.Chance(0.02)) dim = "nowhere";                          // not on the mesh
      if (dim != "nowhere") add_dim(dim);
      used.push_back(dim);
    }
    if (name == "fsdp") {
      wrap::FsdpConfig& fsdp = *step.mutable_fsdp();
      fsdp.set_mesh_dim(dim);
      if (draws.Chance(0.25)) {
        fsdp.set_replicate_mesh_dim("dp_replicate");
        add_dim("dp_replicate");
      }
      if (draws.Chance(0.4)) fsdp.set_reshard_after_forward(draws.Chance(0.5));
      if (!ep_dim.empty() ? draws.Chance(0.5) : draws.Chance(0.04)) {
        fsdp.set_shard_dense_over_mesh_dim(!ep_dim.empty() ? ep_dim : draws.Pick(used));
      }
    } else if (name == "ddp") {
      wrap::DdpConfig& ddp = *step.mutable_ddp();
      ddp.set_mesh_dim(dim);
      if (draws.Chance(0.3)) ddp.set_bucket_cap_mb(draws.Pick(std::vector<double>{0.05, 1, 25}));
      if (draws.Chance(0.2)) ddp.set_first_bucket_cap_mb(draws.Pick(std::vector<double>{0.01, 1}));
    } else if (name == "tensor_parallel") {
      wrap::TensorParallelConfig& tp = *step.mutable_tensor_parallel();
      tp.set_mesh_dim(dim);
      tp.set_sequence_parallel(draws.Chance(0.5));
      tp.set_pad_vocab_to_multiple(draws.Chance(0.15));
    } else if (name == "pipeline") {
      wrap::PipelineConfig& pipeline = *step.mutable_pipeline();
      pipeline.set_mesh_dim(dim);
      pipeline.set_schedule(
          draws.Chance(0.02)
              ? "ZB_V"
              : draws.Pick(std::vector<std::string>{"GPIPE", "1F1B", "ZB_H1", "INTERLEAVED_1F1B"}));
      if (pipeline.schedule() == "INTERLEAVED_1F1B") {
        pipeline.set_stages_per_rank(draws.Chance(0.9) ? 2 : draws.Pick(std::vector<int>{1, 3}));
      } else if (draws.Chance(0.08)) {
        pipeline.set_stages_per_rank(2);
      }
    } else if (name == "context_parallel") {
      step.mutable_context_parallel()->set_mesh_dim(dim);
    } else if (name == "expert_parallel") {
      step.mutable_expert_parallel()->set_mesh_dim(dim);
      ep_dim = dim;
    } else if (name == "activation_checkpointing") {
      step.mutable_activation_checkpointing()->set_policy(
          draws.Chance(0.03)  ? wrap::ActivationCheckpointingConfig::POLICY_UNSPECIFIED
          : draws.Chance(0.5) ? wrap::ActivationCheckpointingConfig::FULL
                              : wrap::ActivationCheckpointingConfig::SELECTIVE);
    } else if (name == "lora") {
      wrap::LoraConfig& lora = *step.mutable_lora();
      lora.set_rank(draws.Pick(std::vector<int>{2, 4, 8}));
      lora.set_alpha(draws.Pick(std::vector<double>{4, 8, 16}));
      const std::vector<std::string> targets = {"*q_proj",      "*k_proj",    "*v_proj", "*o_proj",
                                                "*self_attn.*", "*mlp.*",     "*_proj",  "*up_proj",
                                                "*gate_proj",   "*down_proj", "*nothing"};
      for (int64_t n = 1 + draws.Below(2); n > 0; --n) lora.add_target(draws.Pick(targets));
      lora.set_use_rslora(draws.Chance(0.25));
      lora.set_seed(draws.Below(100));
      if (draws.Chance(0.2)) {
        lora.set_base_quantization(wrap::LoraConfig::NF4);
        lora.set_double_quant(draws.Chance(0.5));
      }
    }
  }
  // Uneven pipeline stages, once the mesh says how many there are.
  for (wrap::PrepareStep& step : *plan.mutable_prepare()) {
    if (!step.has_pipeline() || !draws.Chance(0.25)) continue;
    int size = 1;
    for (const auto& dim : dims) {
      if (dim.first == step.pipeline().mesh_dim()) size = dim.second;
    }
    const int64_t stages =
        static_cast<int64_t>(size) * std::max(1, step.pipeline().stages_per_rank());
    const int64_t blocks = config.num_hidden_layers();
    std::vector<int64_t> starts;
    for (int64_t b = 1; b < blocks; ++b) starts.push_back(b);
    for (size_t i = starts.size(); i > 1; --i) {
      std::swap(starts[i - 1], starts[draws.Below(static_cast<int64_t>(i))]);
    }
    starts.resize(std::min<size_t>(starts.size(), std::max<int64_t>(stages - 1, 0)));
    std::sort(starts.begin(), starts.end());
    for (const int64_t start : starts) step.mutable_pipeline()->add_stage_starts(start);
  }
  if (budget >= 2 && draws.Chance(0.03)) add_dim("spare");  // a dimension no step uses
  if (draws.Chance(0.3)) {
    for (size_t i = dims.size(); i > 1; --i) {
      std::swap(dims[i - 1], dims[draws.Below(static_cast<int64_t>(i))]);
    }
  }
  for (const auto& [name, size] : dims) {
    parallel::MeshConfig::Dimension& dim = *plan.mutable_mesh()->add_dims();
    dim.set_name(name);
    dim.set_size(size);
  }
}

// The batch: micro-batches of 1 to 4 sequences, accumulated 1 to 8 times, at most
// kMaxGlobalBatch sequences a step over the data-parallel ranks; global_batch mostly their
// product, sometimes unset or wrong.
void DrawBatch(plan::Plan& plan, Draws& draws) {
  std::vector<std::string> mesh_dims;
  for (const auto& dim : plan.mesh().dims()) mesh_dims.push_back(dim.name());
  const std::vector<std::string> dp_dims = wrap::DataParallelDimsOf(plan.prepare(), mesh_dims);
  const int64_t dp = parallel::SubmeshRanks(plan.mesh(), {dp_dims.begin(), dp_dims.end()});
  int64_t micro = draws.Pick(std::vector<int64_t>{1, 2, 4});
  // A pipeline needs micro-batches to fill its stages: mostly 2 or more.
  const bool pipeline = std::any_of(plan.prepare().begin(), plan.prepare().end(),
                                    [](const wrap::PrepareStep& s) { return s.has_pipeline(); });
  int64_t accumulation =
      draws.Pick(pipeline ? std::vector<int64_t>{1, 2, 4, 4, 8} : std::vector<int64_t>{0, 1, 2, 4});
  while (micro * dp * std::max<int64_t>(accumulation, 1) > kMaxGlobalBatch && micro > 1) micro /= 2;
  while (micro * dp * std::max<int64_t>(accumulation, 1) > kMaxGlobalBatch && accumulation > 1) {
    accumulation /= 2;
  }
  plan::TrainingConfig& training = *plan.mutable_training();
  training.set_micro_batch(micro);
  training.set_grad_accumulation(accumulation);
  const int64_t global = micro * dp * std::max<int64_t>(accumulation, 1);
  const int64_t roll = draws.Below(20);
  training.set_global_batch(roll < 15 ? global : roll < 18 ? 0 : global + micro);
}

void DrawOptimizer(plan::Plan& plan, Draws& draws) {
  optim::OptimizerConfig& optimizer = *plan.mutable_optimizer();
  double lr = 3e-3;
  switch (draws.Below(20)) {
    case 0:
    case 1:
    case 2:
      optimizer.mutable_sgd()->set_momentum(0.9);
      lr = 3e-2;
      break;
    case 3:
    case 4:
    case 5:
      optimizer.mutable_lion();
      lr = 3e-4;
      break;
    case 6:
    case 7:
    case 8:
      optimizer.mutable_adam();
      break;
    default:
      optimizer.mutable_adamw()->set_beta2(0.95);
      if (draws.Chance(0.3)) optimizer.set_weight_decay(0.1);
  }
  // A max_norm no gradient reaches still has the run report the gradient norm, which the
  // comparison with one process then checks before any update.
  optimizer.mutable_clipping()->set_max_norm(draws.Chance(0.5) ? 1.0 : 1e6);
  plan.mutable_schedule()->set_lr(lr);
  plan.mutable_schedule()->mutable_constant();
}

// A Hugging Face folder of `config` initialised from another seed than the plan's.
std::string HfFolder(const models::ModelConfig& config, uint64_t seed, const std::string& dir) {
  const std::string folder = dir + "/hf";
  fs::remove_all(folder);
  fs::create_directories(folder);
  models::InitConfig init;
  init.set_seed(1000 + seed);
  init.set_std(0.05);
  absl::StatusOr<std::shared_ptr<models::CausalLM>> model = models::CausalLM::Create(config, init);
  if (!model.ok() || !models::SaveHfModel(**model, folder).ok()) return "";
  return folder;
}

// A PEFT adapter folder for `lora` on the model `spec` (`config`): the adapters LoRA draws,
// with every B drawn too (not zero), so that they change what the model computes.
std::string AdapterFolder(const models::ModelSpec& spec, const models::ModelConfig& config,
                          wrap::LoraConfig lora, uint64_t seed, const std::string& dir) {
  const std::string folder = dir + "/adapter";
  fs::remove_all(folder);
  lora.clear_initial_adapter_dir();
  lora.set_base_quantization(wrap::LoraConfig::NONE);
  google::protobuf::RepeatedPtrField<wrap::PrepareStep> steps;
  *steps.Add()->mutable_lora() = lora;
  absl::StatusOr<parallel::MeshLayout> layout = parallel::MeshLayout::Create({}, 1);
  if (!layout.ok()) return "";
  auto store = c10::make_intrusive<c10d::HashStore>();
  absl::StatusOr<parallel::DeviceMesh> mesh = parallel::DeviceMesh::Create(
      *layout, 0,
      parallel::DeviceCommunicatorFactory(at::Device(at::kCPU), *store,
                                          parallel::RingCommunicator::kLoopback, {}));
  if (!mesh.ok()) return "";
  absl::StatusOr<std::unique_ptr<PreparedModel>> prepared =
      PreparedModel::Prepare(spec, config, "", steps, *mesh, Role::kTrained, "plan");
  if (!prepared.ok()) return "";  // an invalid LoRA step: the plan is refused for it
  absl::StatusOr<std::map<std::string, at::Tensor>> full =
      (*prepared)->preparation().FullParameters();
  if (!full.ok()) return "";
  at::manual_seed(static_cast<int64_t>(seed));
  std::vector<std::pair<std::string, at::Tensor>> adapters;
  for (const auto& [name, values] : *full) {
    if (name.find(".lora_") == std::string::npos) continue;
    adapters.emplace_back(name, name.find(".lora_B") != std::string::npos
                                    ? torch::randn_like(values) * 0.05
                                    : values);
  }
  if (!wrap::lora::SavePeftAdapter(folder, lora, adapters, "").ok()) return "";
  return folder;
}

void SetStart(DrawnPlan& drawn, const models::ModelConfig& config, Draws& draws) {
  const std::string& dir = drawn.folder;
  plan::Plan& plan = drawn.plan;
  const bool lora = std::any_of(plan.prepare().begin(), plan.prepare().end(),
                                [](const wrap::PrepareStep& s) { return s.has_lora(); });
  const int64_t roll = draws.Below(20);
  drawn.start = roll < 7    ? Start::kSeed
                : roll < 11 ? Start::kHfFolder
                : roll < 14 ? Start::kOtherLayoutCheckpoint
                : roll < 17 ? (lora ? Start::kPeftAdapter : Start::kSeed)
                            : Start::kResumeAfterKill;
  const bool resumes =
      drawn.start == Start::kOtherLayoutCheckpoint || drawn.start == Start::kResumeAfterKill;
  plan.mutable_training()->set_steps(resumes ? 3 : 2);
  if (drawn.start == Start::kHfFolder) {
    const std::string folder = HfFolder(config, drawn.seed, dir);
    plan.set_hf_weights_dir(folder);
    if (draws.Chance(0.4)) plan.mutable_model()->set_hf_config_path(folder + "/config.json");
    for (plan::FrozenModel& frozen : *plan.mutable_frozen()) {
      *frozen.mutable_model() = plan.model();
      if (draws.Chance(0.7)) frozen.set_hf_weights_dir(folder);
    }
  }
  if (drawn.start == Start::kPeftAdapter) {
    for (wrap::PrepareStep& step : *plan.mutable_prepare()) {
      if (!step.has_lora()) continue;
      step.mutable_lora()->set_initial_adapter_dir(
          AdapterFolder(plan.model(), config, step.lora(), drawn.seed, dir));
    }
  }
}

// How far a layout's objective metrics may be from one process's, absolutely, below which
// the 1e-5 is relative: DPO's rewards are beta times differences of sums of log-probabilities
// over up to 32 tokens (up to about 250 nats), whose rounding noise is that of the sums.
constexpr double kMetricFloor = 10.0;

// Whether the objective's metric `name` may differ by layout at all: DPO's accuracies count
// the pairs whose chosen reward exceeds the rejected one, and at the first step, where the
// policy is its reference, both rewards are 0 but for rounding, which decides the count.
bool DecidedByRounding(const std::string& name) {
  return name.size() >= 10 && name.compare(name.size() - 10, 10, "accuracies") == 0;
}

// Where a mixture of experts' run may part from one process's: a token whose router scores
// two experts within rounding noise of each other goes to either, and changes the loss a
// little. The experts' loads (expert_load_max, expert_load_min: an expert's routed slots
// over an even share, summed over the layers) then differ by a slot or two. A step whose
// loads differ by at most kFlipSlots slots and every other value by at most kFlipTolerance
// is such a flip; anything more is a failure.
constexpr double kFlipSlots = 2;
constexpr double kFlipTolerance = 1e-2;

// An even share of the routed slots of a step's batch and of an evaluation, for the expert
// loads' differences in slots; 0 for a dense model. Rows packed several sequences to a row
// (fewer rows) are counted as unpacked: more slots, a stricter bound.
struct EvenShares {
  double step = 0;
  double evaluation = 0;
};

EvenShares EvenSharesOf(const plan::ResolvedPlan& resolved) {
  const models::ModelConfig& config = resolved.model;
  if (config.num_experts() == 0) return {};
  const std::set<int64_t> dense(config.mlp_only_layers().begin(), config.mlp_only_layers().end());
  const int64_t every = std::max<int64_t>(config.decoder_sparse_step(), 1);
  int64_t layers = 0;
  for (int64_t layer = 0; layer < config.num_hidden_layers(); ++layer) {
    if ((layer + 1) % every == 0 && dense.count(layer) == 0) ++layers;
  }
  const double rows_per_sequence = resolved.plan.objective().has_dpo() ? 2 : 1;
  const double per_sequence =
      rows_per_sequence *
      static_cast<double>(resolved.training().seq_len() * layers * config.num_experts_per_tok()) /
      static_cast<double>(config.num_experts());
  const double sequences = static_cast<double>(resolved.global_batch);
  return {per_sequence * sequences,
          per_sequence * sequences * static_cast<double>(resolved.training().eval_batches())};
}

// How a run compares with one process's: the differences of its first step that differs, and
// whether they are a routing flip.
struct Comparison {
  std::string differences;  // empty: every step within its tolerance
  bool routing_flip = false;
};

// What a value may differ by from one process's, relative: 1e-5 where both runs compute from
// the same weights (rounding noise alone); after an update of AdamW, Adam or Lion 1e-4, as
// they move each parameter by about the learning rate whatever its gradient's size (AdamW's
// first update by lr g / (|g| + eps)), so that a parameter whose gradient is at the level of
// rounding noise moves either way: seen on DPO (step 2's loss 2.5e-5 apart with AdamW; 1e-7
// with eps 1e-5 or with SGD). SGD's update is proportional to the gradient: 1e-5.
constexpr double kTolerance = 1e-5;
constexpr double kSignUpdateTolerance = 1e-4;

double AfterUpdateTolerance(const optim::OptimizerConfig& optimizer) {
  return optimizer.has_sgd() ? kTolerance : kSignUpdateTolerance;
}

struct Tolerances {
  double after_update = kTolerance;
  // Whether the first step compared computes from the same weights in both runs (a fresh
  // start, or the one-process run's checkpoint), not from weights that each run updated.
  bool same_first_weights = true;
  EvenShares shares;
};

// `run` against `expected` from its step `first` on: the loss, gradient norm and evaluation
// loss within the tolerance (absolute below 1e-2), the objective's metrics within it above
// kMetricFloor (absolute below it).
Comparison Compare(const TrainReport& run, const TrainReport& expected, int64_t first,
                   const std::string& what, const Tolerances& tolerances) {
  constexpr double kFloor = 1e-2;
  std::vector<const metrics::StepMetrics*> want;
  for (const metrics::StepMetrics& step : expected.steps) {
    if (step.step >= first) want.push_back(&step);
  }
  if (run.steps.size() != want.size()) {
    return {
        absl::StrCat(what, ": ", run.steps.size(), " steps, the one-process run ", want.size())};
  }
  for (size_t i = 0; i < want.size(); ++i) {
    const metrics::StepMetrics& have = run.steps[i];
    const metrics::StepMetrics& expect = *want[i];
    const std::string where = absl::StrCat(what, " step ", expect.step, ": ");
    if (have.step != expect.step) return {absl::StrCat(where, "is step ", have.step)};
    if (have.named.size() != expect.named.size() ||
        have.eval_named.size() != expect.eval_named.size()) {
      return {absl::StrCat(where, "reports other metrics than the one-process run")};
    }
    // A step's loss, gradient norm and metrics are computed before its update, its
    // evaluation after.
    const double before =
        i == 0 && tolerances.same_first_weights ? kTolerance : tolerances.after_update;
    const double after = tolerances.after_update;
    struct Value {
      std::string name;
      std::optional<double> have, expect;
      double floor;
      double tolerance;
    };
    std::vector<Value> values = {{"loss", have.loss, expect.loss, kFloor, before},
                                 {"grad_norm", have.grad_norm, expect.grad_norm, kFloor, before},
                                 {"eval_loss", have.eval_loss, expect.eval_loss, kFloor, after}};
    for (const auto& [named, expected_named, prefix, tolerance] :
         {std::tuple{&have.named, &expect.named, "", before},
          std::tuple{&have.eval_named, &expect.eval_named, "eval_", after}}) {
      for (size_t m = 0; m < expected_named->size(); ++m) {
        const std::string& name = (*expected_named)[m].first;
        if (DecidedByRounding(name)) continue;
        values.push_back({prefix + name, (*named)[m].second, (*expected_named)[m].second,
                          kMetricFloor, tolerance});
      }
    }
    std::vector<std::string> differences;
    bool loads_differ = false;
    bool within_a_flip = have.skipped == expect.skipped;
    for (const Value& value : values) {
      if (value.have.has_value() != value.expect.has_value()) {
        differences.push_back(absl::StrCat(value.name, " ",
                                           value.have.has_value() ? "reported" : "missing",
                                           " here, not in the one-process run"));
        within_a_flip = false;
        continue;
      }
      if (!value.have.has_value()) continue;
      const double difference = std::abs(*value.have - *value.expect);
      const double relative = difference / std::max(std::abs(*value.expect), value.floor);
      if (relative <= value.tolerance) continue;
      differences.push_back(absl::StrFormat("%s %.9g, the one-process run %.9g (relative %.3g)",
                                            value.name, *value.have, *value.expect, relative));
      if (value.name.find("expert_load") != std::string::npos) {
        loads_differ = true;
        const double even = value.name.rfind("eval_", 0) == 0 ? tolerances.shares.evaluation
                                                              : tolerances.shares.step;
        if (difference * even > kFlipSlots) within_a_flip = false;
      } else if (relative > kFlipTolerance) {
        within_a_flip = false;
      }
    }
    if (have.skipped != expect.skipped) differences.push_back("skipped differs");
    if (!differences.empty()) {
      return {where + absl::StrJoin(differences, "; "), loads_differ && within_a_flip};
    }
  }
  return {};
}

// `plan` writing a checkpoint of every step into `dir`, or resuming from the newest in it.
plan::Plan WithCheckpoints(plan::Plan plan, const std::string& dir, bool resume) {
  checkpoint::CheckpointConfig& checkpoint = *plan.mutable_training()->mutable_checkpoint();
  checkpoint.set_dir(dir);
  if (resume) {
    checkpoint.set_resume(true);
  } else {
    checkpoint.set_every(1);
  }
  return plan;
}

// A copy of the checkpoint of step 1 in `from` as the only one in a fresh `to`: what a run
// killed after saving it leaves for its restart.
absl::Status CopyStepOne(const std::string& from, const std::string& to) {
  std::error_code error;
  fs::remove_all(to, error);
  fs::create_directories(to, error);
  fs::copy(from + "/step-00000001", to + "/step-00000001", fs::copy_options::recursive, error);
  if (error) {
    return absl::InternalError(absl::StrCat("copying ", from, "/step-00000001: ", error.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<TrainReport> ResolveAndTrain(const plan::Plan& plan, int world_size,
                                            const std::string& what,
                                            const TrainOptions& options = {}) {
  absl::StatusOr<plan::ResolvedPlan> resolved = plan::Resolve(plan, world_size);
  if (!resolved.ok()) {
    return absl::Status(resolved.status().code(),
                        absl::StrCat(what, " is refused: ", resolved.status().message()));
  }
  absl::StatusOr<TrainReport> report = TrainOnThreads(*resolved, options);
  if (!report.ok()) {
    return absl::Status(report.status().code(),
                        absl::StrCat(what, " failed: ", report.status().message()));
  }
  return report;
}

// Trains the accepted `drawn` (resolved to `resolved`) with its start, and how it compares
// with the one-process run.
absl::StatusOr<Comparison> TrainAndCompare(const DrawnPlan& drawn,
                                           const plan::ResolvedPlan& resolved) {
  const plan::Plan one = OneProcessPlan(drawn.plan, resolved.global_batch);
  Tolerances tolerances{AfterUpdateTolerance(drawn.plan.optimizer()), true, EvenSharesOf(resolved)};
  const std::string base = drawn.folder + "/checkpoints";
  fs::remove_all(base);
  switch (drawn.start) {
    case Start::kSeed:
    case Start::kHfFolder:
    case Start::kPeftAdapter: {
      PLAIT_ASSIGN_OR_RETURN(const TrainReport expected,
                             ResolveAndTrain(one, 1, "the one-process plan"));
      PLAIT_ASSIGN_OR_RETURN(const TrainReport run,
                             ResolveAndTrain(drawn.plan, drawn.world_size, "the plan"));
      return Compare(run, expected, 1, "the plan", tolerances);
    }
    case Start::kOtherLayoutCheckpoint: {
      PLAIT_ASSIGN_OR_RETURN(
          const TrainReport expected,
          ResolveAndTrain(WithCheckpoints(one, base + "/one", false), 1, "the one-process plan"));
      PLAIT_RETURN_IF_ERROR(CopyStepOne(base + "/one", base + "/resumed"));
      PLAIT_ASSIGN_OR_RETURN(
          const TrainReport run,
          ResolveAndTrain(WithCheckpoints(drawn.plan, base + "/resumed", true), drawn.world_size,
                          "the plan resuming the one-process run's checkpoint of step 1"));
      return Compare(run, expected, 2, "the plan resumed from the one-process checkpoint",
                     tolerances);
    }
    case Start::kResumeAfterKill: {
      PLAIT_ASSIGN_OR_RETURN(const TrainReport expected,
                             ResolveAndTrain(one, 1, "the one-process plan"));
      PLAIT_ASSIGN_OR_RETURN(const TrainReport straight,
                             ResolveAndTrain(WithCheckpoints(drawn.plan, base + "/killed", false),
                                             drawn.world_size, "the plan"));
      Comparison straight_comparison = Compare(straight, expected, 1, "the plan", tolerances);
      if (!straight_comparison.differences.empty()) return straight_comparison;
      PLAIT_RETURN_IF_ERROR(CopyStepOne(base + "/killed", base + "/restarted"));
      TrainOptions restart;
      restart.restart_count = 1;
      restart.restart_cause = "killed after the checkpoint of step 1";
      PLAIT_ASSIGN_OR_RETURN(
          const TrainReport run,
          ResolveAndTrain(WithCheckpoints(drawn.plan, base + "/restarted", true), drawn.world_size,
                          "the plan restarted from its checkpoint of step 1", restart));
      // Its checkpoint holds the weights its own step 1 updated.
      tolerances.same_first_weights = false;
      return Compare(run, expected, 2, "the plan restarted after step 1", tolerances);
    }
  }
  return absl::InternalError("unknown start");
}

}  // namespace

const char* StartName(Start start) {
  switch (start) {
    case Start::kSeed:
      return "seed";
    case Start::kHfFolder:
      return "Hugging Face folder";
    case Start::kOtherLayoutCheckpoint:
      return "one-process checkpoint";
    case Start::kPeftAdapter:
      return "PEFT adapter";
    case Start::kResumeAfterKill:
      return "resume after a kill";
  }
  return "?";
}

DrawnPlan DrawPlan(uint64_t seed, const std::string& dir) {
  Draws draws(seed);
  DrawnPlan drawn;
  drawn.seed = seed;
  drawn.folder = absl::StrCat(dir, "/plan_", seed);
  fs::remove_all(drawn.folder);
  fs::create_directories(drawn.folder);
  plan::Plan& plan = drawn.plan;
  models::ModelSpec& model = *plan.mutable_model();
  const std::string preset = draws.Pick(Presets());
  models::ModelConfig config = *models::PresetConfig(preset);
  if (draws.Chance(0.2)) {
    // Fewer blocks are cheaper; more let 4 pipeline ranks hold 2 stages each.
    config.set_num_hidden_layers(draws.Chance(0.6) ? 2 : 8);
    *model.mutable_config() = config;
  } else {
    model.set_preset(preset);
  }
  model.mutable_init()->set_seed(1 + draws.Below(100));
  if (draws.Chance(0.5)) model.mutable_init()->set_std(0.05);

  plan::TrainingConfig& training = *plan.mutable_training();
  training.set_seq_len(draws.Pick(std::vector<int64_t>{16, 32}));
  if (draws.Chance(0.2)) training.set_eval_batches(1);  // evaluated after the last step

  DrawLayout(plan, config, draws);
  DrawObjectiveAndData(plan, Files(dir), draws);
  DrawBatch(plan, draws);
  DrawOptimizer(plan, draws);
  for (const auto& dim : plan.mesh().dims()) drawn.world_size *= dim.size();
  SetStart(drawn, config, draws);
  return drawn;
}

plan::Plan OneProcessPlan(const plan::Plan& plan, int64_t global_batch) {
  plan::Plan one = plan;
  one.clear_mesh();
  one.clear_prepare();
  for (const wrap::PrepareStep& step : plan.prepare()) {
    const wrap::StrategyRule* rule = wrap::FindStrategy(Rules(), wrap::StrategyName(step));
    if (rule != nullptr && rule->effect() == wrap::ADAPTS) *one.add_prepare() = step;
  }
  for (plan::FrozenModel& frozen : *one.mutable_frozen()) frozen.clear_prepare();
  plan::TrainingConfig& training = *one.mutable_training();
  const int64_t micro_steps = std::max<int64_t>(training.grad_accumulation(), 1);
  training.set_micro_batch(global_batch / micro_steps);
  training.set_global_batch(global_batch);
  return one;
}

absl::StatusOr<TrainReport> TrainOnThreads(const plan::ResolvedPlan& resolved,
                                           const TrainOptions& options) {
  const int ranks = resolved.world_size;
  PLAIT_ASSIGN_OR_RETURN(const parallel::MeshLayout layout,
                         parallel::MeshLayout::Create(resolved.plan.mesh(), ranks));
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<absl::Status> statuses(ranks);
  TrainReport report;
  parallel::testing::RunRanks(ranks, [&](int rank) {
    const auto train = [&]() -> absl::Status {
      PLAIT_ASSIGN_OR_RETURN(const parallel::DeviceMesh mesh,
                             parallel::DeviceMesh::Create(
                                 layout, rank,
                                 parallel::DeviceCommunicatorFactory(
                                     at::Device(at::kCPU), *store,
                                     parallel::RingCommunicator::kLoopback, {kCollectiveTimeout})));
      PLAIT_ASSIGN_OR_RETURN(TrainReport trained, Train(resolved, mesh, options));
      if (rank == 0) report = std::move(trained);
      return absl::OkStatus();
    };
    try {
      statuses[rank] = train();
    } catch (const std::exception& error) {
      statuses[rank] = absl::InternalError(absl::StrCat("threw ", error.what()));
    }
  });
  // The first rank that failed of itself, rather than one that lost a peer (Unavailable) or
  // timed out waiting for one.
  const auto of_itself = [](const absl::Status& status) {
    return !absl::IsDeadlineExceeded(status) && !absl::IsUnavailable(status);
  };
  std::optional<int> failed;
  for (int rank = 0; rank < ranks; ++rank) {
    if (statuses[rank].ok()) continue;
    if (!failed.has_value() || (!of_itself(statuses[*failed]) && of_itself(statuses[rank]))) {
      failed = rank;
    }
  }
  if (failed.has_value()) {
    return absl::Status(statuses[*failed].code(),
                        absl::StrCat("rank ", *failed, ": ", statuses[*failed].message()));
  }
  return report;
}

std::string RefusalKey(const base::Violation& violation) {
  if (!violation.rule.empty()) return "rule " + violation.rule;
  std::string field;
  bool in_index = false;
  for (const char c : violation.field) {
    if (c == '[') {
      in_index = true;
      field += "[]";
    } else if (c == ']') {
      in_index = false;
    } else if (!in_index) {
      field += c;
    }
  }
  return "field " + field;
}

std::string PlanText(const plan::Plan& plan) {
  std::string text;
  google::protobuf::TextFormat::PrintToString(plan, &text);
  return text;
}

PlanOutcome CheckDrawnPlan(const DrawnPlan& drawn) {
  PlanOutcome outcome;
  const std::vector<base::Violation> violations =
      plan::CheckPlan(drawn.plan, drawn.world_size, Rules());
  if (!violations.empty()) {
    outcome.kind = PlanOutcome::kRefused;
    outcome.violations = violations;
    for (const base::Violation& violation : violations) {
      if (violation.rule.empty() && violation.field.rfind("plan.", 0) != 0) {
        outcome.kind = PlanOutcome::kFailed;
        outcome.failure = absl::StrCat("a violation names neither a rule nor a plan field: ",
                                       violation.ToString());
        return outcome;
      }
    }
    return outcome;
  }
  absl::StatusOr<plan::ResolvedPlan> resolved = plan::Resolve(drawn.plan, drawn.world_size);
  if (!resolved.ok()) {
    outcome.failure = absl::StrCat("CheckPlan found no violation, Resolve refused it: ",
                                   resolved.status().message());
    return outcome;
  }
  absl::StatusOr<Comparison> comparison = TrainAndCompare(drawn, *resolved);
  if (!comparison.ok()) {
    outcome.failure = std::string(comparison.status().message());
  } else if (comparison->differences.empty()) {
    outcome.kind = PlanOutcome::kTrained;
  } else {
    outcome.kind = comparison->routing_flip ? PlanOutcome::kRoutingFlip : PlanOutcome::kFailed;
    outcome.failure = comparison->differences;
  }
  return outcome;
}

}  // namespace plait::trainer::testing
