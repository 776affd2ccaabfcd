// The correctness anchor for DDP, FSDP, hybrid sharding (FSDP replicated across a second
// dimension), tensor parallelism, activation checkpointing and their combinations: the tiny
// Llama (and a tiny Qwen2, Qwen3, Qwen3-MoE and Mixtral) trained for 10 AdamW steps with clipping
// on several ranks (threads over TCP) gives the same per-step losses, gradient norms and final
// parameters as one process on the same global batch, within 1e-5 relative in fp32 (losses each,
// parameters as the norm of the difference over the norm of the tensor); and activation
// checkpointing gives the same run as without it. With LoRA adapters (the base frozen) the same
// holds, and FSDP reduce-scatters the adapters' gradients alone.
//
// Built with PLAIT_TEST_ON_CUDA (the gpu-tagged parity_gpu_test), the same scenarios run on
// CUDA over NCCL, rank r on cuda:r, against the single-device CUDA run (TF32 off); a
// scenario with more ranks than GPUs skips. The single-device CUDA run itself is held to the
// CPU's.
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ATen/Context.h"
#include "ATen/core/Tensor.h"
#include "ATen/ops/cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "models/causal_lm.h"
#include "models/model_config.h"
#include "optim/optimizer.h"
#include "parallel/device.h"
#include "parallel/device_mesh.h"
#include "parallel/test_ranks.h"
#include "torch/csrc/autograd/generated/variable_factories.h"
#include "wrap/lora/lora.h"
#include "wrap/preparation.h"

namespace plait::wrap {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::base::testing::StatusIs;
using ::testing::HasSubstr;

#ifdef PLAIT_TEST_ON_CUDA
constexpr at::DeviceType kDevice = at::kCUDA;

// The fp32 bounds need fp32 products: TF32 off for cuBLAS and cuDNN, for the whole process.
// Off is LibTorch's default unless TORCH_ALLOW_TF32_CUBLAS_OVERRIDE is set, and
// at::NoTF32Guard would not do: it holds for its own thread only, while backward runs on
// autograd's device threads.
class Fp32ProductsEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    at::globalContext().setAllowTF32CuBLAS(false);
    at::globalContext().setAllowTF32CuDNN(false);
  }
};
::testing::Environment* const kFp32Products =
    ::testing::AddGlobalTestEnvironment(new Fp32ProductsEnvironment);
#else
constexpr at::DeviceType kDevice = at::kCPU;
#endif

constexpr int kSteps = 10;
constexpr int64_t kGlobalBatch = 8;
constexpr int64_t kSeqLen = 32;

// The data-parallel strategy on the "dp" dimension, if any.
enum class Strategy { kNone, kDdp, kFsdp, kFsdpNoReshard, kFsdpBf16 };

// The tiny Llama as it is; with tied embeddings (the embedding is the output projection
// too); with a parameter the forward never uses, which one process leaves untouched; the
// tiny Qwen2 (tied embeddings, q/k/v biases) with 4 heads sharing 1 key/value head; the tiny
// Llama with a vocabulary of 4097 (one more than its data's ids), which tensor parallelism
// pads (pad_vocab_to_multiple); the tiny Qwen3 (heads of 64 on a hidden size of 128, each
// head's queries and keys RMS-normalised, whose norms' gradients tensor parallelism sums); the
// tiny Qwen3-MoE and Mixtral (8 experts, 2 a token, with their load-balancing loss).
enum class Variant {
  kPlain,
  kTied,
  kUnusedParameter,
  kQwen2,
  kOddVocabulary,
  kQwen3,
  kQwen3Moe,
  kMixtral
};

struct Scenario {
  std::string name;
  Strategy strategy;
  int ranks;        // of the "dp" dimension (1 without a data-parallel strategy)
  int micro_steps;  // gradient accumulation
  Variant variant = Variant::kPlain;
  int tp = 1;  // ranks of the "tp" dimension, tensor parallel first when above 1
  bool sequence_parallel = false;
  // Ranks of the "replicate" dimension: above 1, FSDP's hybrid sharding, the shards over "dp"
  // replicated across it (its ranks read different data too).
  int replicate = 1;
  // Activation checkpointing, applied first, unless POLICY_UNSPECIFIED.
  ActivationCheckpointingConfig::Policy checkpointing =
      ActivationCheckpointingConfig::POLICY_UNSPECIFIED;
  // LoRA adapters (LoraStep()), applied after checkpointing, before the data-parallel step.
  bool lora = false;
  // Ranks of the "ep" dimension: above 1, expert parallelism, applied before the data-parallel
  // step (its ranks read different data too).
  int ep = 1;
  // With expert parallelism and FSDP: FSDP shards the parameters that are not experts over
  // "dp" and "ep" (fsdp.shard_dense_over_mesh_dim), the experts over "dp".
  bool shard_dense_over_ep = false;

  // The ranks of every dimension: the GPUs a run on CUDA needs.
  int world() const { return replicate * ep * ranks * tp; }
};

struct TrainingRun {
  std::vector<double> losses;                       // per step, averaged over the global batch
  std::vector<double> grad_norms;                   // per step, before clipping
  std::map<std::string, at::Tensor> parameters;     // final, full
  // Rank 0's bytes sent over all steps' forward and backward passes (the wrappers'
  // collectives, not the optimizer's or the loss's), by "<mesh dimension>.<collective>".
  std::map<std::string, int64_t> bytes_sent;
  std::vector<int64_t> trainable_bytes;  // by rank: the tensors its optimizer trains
  std::vector<int64_t> gathered_bytes;   // by rank: whole parameters held after the run
};

// Bytes `mesh`'s rank sent so far over each of its groups, by "<dimensions>.<collective>"
// ("dp.all_gather", "dp,ep.reduce_scatter").
std::map<std::string, int64_t> BytesSent(const parallel::DeviceMesh& mesh) {
  std::map<std::string, int64_t> sent;
  for (const parallel::Communicator* group : mesh.communicators()) {
    const std::string dims = group->name().substr(0, group->name().find('['));
    for (int c = 0; c < parallel::kNumCollectives; ++c) {
      const auto collective = static_cast<parallel::Collective>(c);
      sent[absl::StrCat(dims, ".", parallel::CollectiveName(collective))] =
          group->traffic(collective).bytes_sent;
    }
  }
  return sent;
}

models::ModelConfig Tiny() { return models::PresetConfig("tiny").value(); }

// On `device` when given, else on the CPU.
std::shared_ptr<models::CausalLM> MakeModel(Variant variant = Variant::kPlain,
                                            at::Device device = at::kCPU) {
  models::ModelConfig config = Tiny();
  config.set_tie_word_embeddings(variant == Variant::kTied);
  if (variant == Variant::kQwen2) {
    config = models::PresetConfig("qwen2-tiny").value();
    config.set_num_attention_heads(4);
    config.set_num_key_value_heads(1);
  }
  if (variant == Variant::kQwen3) config = models::PresetConfig("qwen3-tiny").value();
  // 8 experts, 2 a token: the ranks' batches route differently, some experts none of a rank's
  // tokens.
  // A load-balancing loss weighed enough that a wrong gradient of it shows.
  if (variant == Variant::kQwen3Moe || variant == Variant::kMixtral) {
    config = models::PresetConfig(variant == Variant::kQwen3Moe ? "qwen3-moe-tiny" : "mixtral-tiny")
                 .value();
    config.set_router_aux_loss_coef(0.1);
  }
  if (variant == Variant::kOddVocabulary) config.set_vocab_size(config.vocab_size() + 1);
  models::InitConfig init;
  init.set_seed(3);
  std::shared_ptr<models::CausalLM> model = models::CausalLM::Create(config, init).value();
  if (variant == Variant::kUnusedParameter) model->register_parameter("unused", torch::ones({16}));
  model->to(device);
  return model;
}

optim::OptimizerConfig AdamWWithClipping() {
  optim::OptimizerConfig config;
  google::protobuf::TextFormat::ParseFromString(
      "adamw {} weight_decay: 0.1 clipping { max_norm: 1.0 }", &config);
  return config;
}

// Step `step`'s global batch: tokens and next-token targets. Drawn once, before any rank
// thread starts (the global generator is not for concurrent use).
std::pair<at::Tensor, at::Tensor> Batch(int step) {
  static const auto* batches = [] {
    auto* batches = new std::vector<std::pair<at::Tensor, at::Tensor>>();
    at::manual_seed(100);
    for (int i = 0; i < kSteps; ++i) {
      const at::Tensor sequence = torch::randint(Tiny().vocab_size(), {kGlobalBatch, kSeqLen + 1});
      batches->emplace_back(sequence.narrow(1, 0, kSeqLen), sequence.narrow(1, 1, kSeqLen));
    }
    return batches;
  }();
  return (*batches)[step];
}

double LearningRate(int step) { return 1e-3 * (step + 1) / kSteps; }

// Adapters of rank 4 on attention and MLP projections of every shape (q: 256 x 256, v: 128 x
// 256, down: 256 x 688).
PrepareStep LoraStep() {
  PrepareStep step;
  google::protobuf::TextFormat::ParseFromString(
      R"pb(lora {
             rank: 4
             alpha: 8
             target: "*q_proj"
             target: "*v_proj"
             target: "*down_proj"
             seed: 1
           })pb",
      &step);
  return step;
}

// How a step's batch is cut into micro-batches: as `ranks` data-parallel ranks of
// `micro_steps` micro-batches each cut it together, micro-batch m holding micro-batch m of
// every rank's part (the rows Distributed gives each rank, in rank order). A mixture of
// experts' load-balancing loss is one of each such micro-batch, so the single process
// accumulates as the ranks do; the other losses are the same whole.
struct Accumulation {
  int ranks = 1;
  int micro_steps = 1;

  at::Tensor Rows(int m) const {
    const int64_t per_rank = kGlobalBatch / ranks;
    const int64_t micro = per_rank / micro_steps;
    std::vector<at::Tensor> rows;
    for (int r = 0; r < ranks; ++r) rows.push_back(torch::arange(micro) + r * per_rank + m * micro);
    return at::cat(rows);
  }
  bool operator<(const Accumulation& other) const {
    return std::pair{ranks, micro_steps} < std::pair{other.ranks, other.micro_steps};
  }
};

// `model`'s load-balancing loss in its last forward, router_aux_loss_coef * aux (0 for a dense
// model), its routing summed over `dims` of `mesh` (the ranks that routed the rest of the
// micro-batch), its gradient scaled by `gradient_scale` (models/router_statistics.h).
at::Tensor RouterLoss(models::CausalLM& model, double gradient_scale,
                      const parallel::DeviceMesh* mesh = nullptr,
                      const std::vector<std::string>& dims = {}) {
  const auto& routing = model.LastRouting();
  if (!routing) return torch::zeros({});
  at::Tensor total = routing->Load();
  for (const std::string& dim : dims) {
    EXPECT_THAT((*mesh->communicator(dim))->AllReduce(total, parallel::ReduceOp::kSum)->Wait(),
                IsOk());
  }
  return routing->coefficient() * routing->Loss(total, gradient_scale);
}

// The final parameters are copied to the CPU. With `lora`, the adapters are added (and the
// base frozen) without a Preparation, as one process needs none.
TrainingRun SingleProcess(Variant variant = Variant::kPlain, at::DeviceType device_type = kDevice,
                          bool lora = false, Accumulation accumulation = {}) {
  const at::Device device = parallel::testing::RankDevice(device_type, 0);
  TrainingRun run;
  std::shared_ptr<models::CausalLM> model = MakeModel(variant, device);
  std::unique_ptr<lora::Lora> adapters;
  if (lora) adapters = lora::Lora::Create(*model, LoraStep().lora()).value();
  std::vector<parallel::TrainableParameter> parameters;
  for (const auto& named : model->NamedParameters()) {
    if (named.parameter.requires_grad()) parameters.push_back({named.name, named.parameter, {}});
  }
  auto optimizer = optim::Optimizer::Create(parameters, AdamWWithClipping()).value();
  for (int step = 0; step < kSteps; ++step) {
    auto [tokens, targets] = Batch(step);
    const int micro_steps = accumulation.micro_steps;
    double step_loss = 0.0;
    for (int m = 0; m < micro_steps; ++m) {
      const at::Tensor rows = accumulation.Rows(m);
      at::Tensor loss = model->Loss(tokens.index_select(0, rows).to(device),
                                    targets.index_select(0, rows).to(device));
      loss = (loss + RouterLoss(*model, 1.0 / micro_steps).to(device)) / micro_steps;
      loss.backward();
      step_loss += loss.item<double>();
    }
    absl::StatusOr<optim::StepReport> report = optimizer->Step(LearningRate(step));
    EXPECT_THAT(report, IsOk());
    optimizer->ZeroGrad();
    run.losses.push_back(step_loss);
    run.grad_norms.push_back(report->grad_norm.value_or(0.0));
  }
  for (const auto& named : model->NamedParameters()) {
    run.parameters[named.name] = named.parameter.detach().cpu().clone();
  }
  return run;
}

TrainingRun Distributed(const Scenario& scenario) {
  Batch(0);  // drawn here, on one thread
  parallel::MeshConfig mesh_config;
  const bool data_parallel = scenario.strategy != Strategy::kNone;
  if (scenario.replicate > 1) {
    auto* dim = mesh_config.add_dims();
    dim->set_name("replicate");
    dim->set_size(scenario.replicate);
  }
  if (scenario.ep > 1) {
    auto* dim = mesh_config.add_dims();
    dim->set_name("ep");
    dim->set_size(scenario.ep);
  }
  if (data_parallel) {
    auto* dim = mesh_config.add_dims();
    dim->set_name("dp");
    dim->set_size(scenario.ranks);
  }
  if (scenario.tp > 1) {
    auto* dim = mesh_config.add_dims();
    dim->set_name("tp");
    dim->set_size(scenario.tp);
  }
  const int world = scenario.world();
  const parallel::MeshLayout layout = parallel::MeshLayout::Create(mesh_config, world).value();
  TrainingRun result;
  result.trainable_bytes.resize(world);
  result.gathered_bytes.resize(world);
  parallel::testing::RunOnMesh(layout, kDevice, [&](int rank, parallel::DeviceMesh& mesh) {
    const at::Device device = mesh.device();
    std::shared_ptr<models::CausalLM> model = MakeModel(scenario.variant, device);
    auto preparation = Preparation::Begin(*model, mesh);
    ASSERT_THAT(preparation, IsOk());
    if (scenario.checkpointing != ActivationCheckpointingConfig::POLICY_UNSPECIFIED) {
      PrepareStep step;
      step.mutable_activation_checkpointing()->set_policy(scenario.checkpointing);
      ASSERT_THAT((*preparation)->Apply(step), IsOk());
    }
    if (scenario.lora) {
      ASSERT_THAT((*preparation)->Apply(LoraStep()), IsOk());
    }
    if (scenario.ep > 1) {
      PrepareStep step;
      step.mutable_expert_parallel()->set_mesh_dim("ep");
      ASSERT_THAT((*preparation)->Apply(step), IsOk());
    }
    if (scenario.tp > 1) {
      PrepareStep step;
      step.mutable_tensor_parallel()->set_mesh_dim("tp");
      step.mutable_tensor_parallel()->set_sequence_parallel(scenario.sequence_parallel);
      step.mutable_tensor_parallel()->set_pad_vocab_to_multiple(scenario.variant ==
                                                                Variant::kOddVocabulary);
      ASSERT_THAT((*preparation)->Apply(step), IsOk());
    }
    PrepareStep step;
    if (scenario.strategy == Strategy::kDdp) {
      DdpConfig& config = *step.mutable_ddp();
      config.set_mesh_dim("dp");
      config.set_bucket_cap_mb(1.0);  // several buckets even for the tiny model
    } else if (data_parallel) {
      FsdpConfig& config = *step.mutable_fsdp();
      config.set_mesh_dim("dp");
      if (scenario.replicate > 1) config.set_replicate_mesh_dim("replicate");
      if (scenario.shard_dense_over_ep) config.set_shard_dense_over_mesh_dim("ep");
      config.set_reshard_after_forward(scenario.strategy != Strategy::kFsdpNoReshard);
      if (scenario.strategy == Strategy::kFsdpBf16) {
        config.set_param_dtype(base::DTYPE_BFLOAT16);
        config.set_reduce_dtype(base::DTYPE_FLOAT32);
      }
    }
    if (data_parallel) {
      ASSERT_THAT((*preparation)->Apply(step), IsOk());
    }
    auto parameters = (*preparation)->TakeTrainableParameters();
    ASSERT_THAT(parameters, IsOk());
    for (const parallel::TrainableParameter& parameter : *parameters) {
      result.trainable_bytes[rank] += static_cast<int64_t>(parameter.tensor.nbytes());
    }
    auto optimizer = optim::Optimizer::Create(*parameters, AdamWWithClipping());
    ASSERT_THAT(optimizer, IsOk());

    // The ranks of one tensor-parallel group read the same part of the batch.
    const std::vector<std::string> data_dims = (*preparation)->DataParallelDims();
    const std::vector<std::string> routing_dims = (*preparation)->RoutingDims();
    const auto [dp_rank, dp_size] = *mesh.SubgridRankAndSize(data_dims);
    const int64_t per_rank = kGlobalBatch / dp_size;
    const int64_t micro = per_rank / scenario.micro_steps;
    std::map<std::string, int64_t> bytes_sent;
    for (int step = 0; step < kSteps; ++step) {
      auto [tokens, targets] = Batch(step);
      const std::map<std::string, int64_t> sent_before = BytesSent(mesh);
      double step_loss = 0.0;
      ASSERT_THAT(
          (*preparation)
              ->TrainMicroBatches(scenario.micro_steps,
                                  [&](int m, const at::Tensor&) -> absl::StatusOr<at::Tensor> {
                                    const int64_t first = dp_rank * per_rank + m * micro;
                                    at::Tensor loss =
                                        model->Loss(tokens.narrow(0, first, micro).to(device),
                                                    targets.narrow(0, first, micro).to(device));
                                    // The wrappers average over the dp_size ranks.
                                    const at::Tensor router = RouterLoss(
                                        *model, static_cast<double>(dp_size) / scenario.micro_steps,
                                        &mesh, routing_dims);
                                    loss = (loss + router.to(device)) / scenario.micro_steps;
                                    step_loss += loss.item<double>();
                                    return loss;
                                  }),
          IsOk());
      for (const auto& [key, sent] : BytesSent(mesh)) bytes_sent[key] += sent - sent_before.at(key);
      absl::StatusOr<optim::StepReport> report = (*optimizer)->Step(LearningRate(step));
      ASSERT_THAT(report, IsOk());
      (*optimizer)->ZeroGrad();
      if (rank == 0) result.grad_norms.push_back(report->grad_norm.value_or(0.0));
      at::Tensor global_loss =
          torch::full({1}, step_loss, at::TensorOptions(at::kFloat).device(device));
      for (const std::string& dim : data_dims) {
        ASSERT_THAT(
            (*mesh.communicator(dim))->AllReduce(global_loss, parallel::ReduceOp::kAverage)->Wait(),
            IsOk());
      }
      if (rank == 0) result.losses.push_back(global_loss.item<double>());
    }
    result.gathered_bytes[rank] = (*preparation)->gathered_bytes();
    if (rank == 0) result.bytes_sent = bytes_sent;
    auto full = (*preparation)->FullParameters();
    ASSERT_THAT(full, IsOk());
    if (rank == 0) {
      for (const auto& [name, tensor] : *full) result.parameters[name] = tensor.cpu();
    }
  });
  return result;
}

// Hybrid sharding over 2 x 2 ranks sends what the algorithm needs, no more: per micro-batch,
// each unit gathered twice over "dp" (forward and backward) and its gradients (and one usage
// flag per parameter) reduce-scattered there, then all-reduced across "replicate". Each rank
// keeps 1/2 of the parameters, and none whole once a step is over.
void ExpectHybridShardingCosts(const Scenario& scenario, const TrainingRun& run) {
  ASSERT_EQ(scenario.ranks, 2);
  ASSERT_EQ(scenario.replicate, 2);
  std::shared_ptr<models::CausalLM> model = MakeModel(scenario.variant);
  int64_t full_bytes = 0;
  for (const auto& named : model->NamedParameters()) full_bytes += named.parameter.nbytes();
  // The tiny model's dim 0s are even: its shards need no padding.
  for (size_t rank = 0; rank < run.trainable_bytes.size(); ++rank) {
    EXPECT_EQ(run.trainable_bytes[rank] * scenario.ranks, full_bytes) << "rank " << rank;
    EXPECT_EQ(run.gathered_bytes[rank], 0) << "rank " << rank;
  }
  // Ring collectives over 2 ranks: a rank sends 1/2 of an all-gather's or a reduce-scatter's
  // buffer of 2 shards, and 2 x 1/2 of an all-reduce's of 1 shard.
  const int64_t shard = run.trainable_bytes[0];
  const int64_t flags =
      static_cast<int64_t>(model->NamedParameters().size()) * static_cast<int64_t>(sizeof(float));
  const int64_t micro_batches = kSteps * scenario.micro_steps;
  std::map<std::string, int64_t> expected;
  for (const auto& [key, bytes] : run.bytes_sent) expected[key] = 0;
  expected["dp.all_gather"] = micro_batches * 2 * shard;
  expected["dp.reduce_scatter"] = micro_batches * (shard + flags);
  expected["replicate.all_reduce"] = micro_batches * (shard + flags);
  EXPECT_EQ(run.bytes_sent, expected);
}

// FSDP with LoRA over 2 ranks reduce-scatters the adapters' gradients and nothing of the
// frozen base: per micro-batch, a rank sends its adapter shards (half of each unit's buffer of
// 2 shards) and one usage flag per adapter.
void ExpectLoraFsdpCosts(const Scenario& scenario, const TrainingRun& run) {
  ASSERT_EQ(scenario.ranks, 2);
  // A and B of 3 projections in each block.
  const int64_t adapters = MakeModel(scenario.variant)->config().num_hidden_layers() * 3 * 2;
  const int64_t micro_batches = kSteps * scenario.micro_steps;
  EXPECT_EQ(run.bytes_sent.at("dp.reduce_scatter"),
            micro_batches * (run.trainable_bytes[0] + adapters * int64_t{sizeof(float)}));
}

// FSDP over dp = 2 sharding the dense parts over ep x dp = 4 sends what the algorithm needs:
// per micro-batch, each unit's dense part gathered twice (forward and backward) over the 4
// ranks and its gradients (and one usage flag per parameter) reduce-scattered there, its
// experts the same over the 2 dp ranks; expert parallelism then averages nothing more. Each
// rank keeps 1/4 of the dense parameters and 1/2 of its 4 experts of each layer.
void ExpectDenseShardedOverExpertsCosts(const Scenario& scenario, const TrainingRun& run) {
  ASSERT_EQ(scenario.ranks, 2);
  ASSERT_EQ(scenario.ep, 2);
  struct Group {
    int ranks;
    int64_t shard_bytes = 0;
    int64_t flags = 0;
  };
  Group dense{4};
  Group experts{2};
  const int64_t experts_per_rank =
      MakeModel(scenario.variant)->config().num_experts() / scenario.ep;
  for (const auto& named : MakeModel(scenario.variant)->NamedParameters()) {
    const bool expert = IsExpertParameter(named.name);
    // Rank 0 keeps the first experts of each layer.
    if (ExpertIndexOf(named.name) >= experts_per_rank) continue;
    Group& group = expert ? experts : dense;
    const at::Tensor& full = named.parameter;
    const int64_t rows = full.dim() == 0 ? 1 : full.size(0);
    group.shard_bytes += (rows + group.ranks - 1) / group.ranks * (full.numel() / rows) *
                         static_cast<int64_t>(sizeof(float));
    group.flags += static_cast<int64_t>(sizeof(float));
  }
  for (size_t rank = 0; rank < run.trainable_bytes.size(); ++rank) {
    EXPECT_EQ(run.trainable_bytes[rank], dense.shard_bytes + experts.shard_bytes)
        << "rank " << rank;
  }
  const int64_t micro_batches = kSteps * scenario.micro_steps;
  std::map<std::string, int64_t> expected;
  for (const auto& [key, bytes] : run.bytes_sent) expected[key] = 0;
  expected["ep.all_to_all"] = run.bytes_sent.at("ep.all_to_all");  // the routed rows
  // The load-balancing loss's routing statistics, summed over both dimensions (the test's own
  // reductions, RouterLoss): the same bytes on each, none averaging gradients over "ep".
  expected["dp.all_reduce"] = run.bytes_sent.at("dp.all_reduce");
  expected["ep.all_reduce"] = run.bytes_sent.at("dp.all_reduce");
  for (const auto& [dims, group] : {std::pair{"ep,dp", dense}, std::pair{"dp", experts}}) {
    // Ring collectives: a rank sends (n - 1) of a buffer's n shards.
    expected[absl::StrCat(dims, ".all_gather")] =
        micro_batches * 2 * (group.ranks - 1) * group.shard_bytes;
    expected[absl::StrCat(dims, ".reduce_scatter")] =
        micro_batches * (group.ranks - 1) * (group.shard_bytes + group.flags);
  }
  EXPECT_EQ(run.bytes_sent, expected);
}

class DataParallelParityTest : public ::testing::TestWithParam<Scenario> {
 protected:
  // The single-process run of each variant, with and without adapters, run once; a mixture
  // of experts' cut into micro-batches as `scenario`'s ranks cut them (Accumulation).
  static const TrainingRun& Reference(const Scenario& scenario) {
    using Key = std::tuple<Variant, bool, Accumulation>;
    static auto* references = new std::map<Key, TrainingRun>();
    Accumulation accumulation;
    if (scenario.variant == Variant::kQwen3Moe || scenario.variant == Variant::kMixtral) {
      accumulation = {scenario.replicate * scenario.ep * scenario.ranks, scenario.micro_steps};
    }
    const Key key{scenario.variant, scenario.lora, accumulation};
    auto it = references->find(key);
    if (it == references->end()) {
      it = references
               ->emplace(key, SingleProcess(scenario.variant, kDevice, scenario.lora, accumulation))
               .first;
    }
    return it->second;
  }
};

TEST_P(DataParallelParityTest, EqualsTheSingleProcessRun) {
  if (!parallel::testing::EnoughDevices(kDevice, GetParam().world())) {
    GTEST_SKIP() << GetParam().name << " needs " << GetParam().world() << " GPUs; this machine has "
                 << parallel::CudaDeviceCount();
  }
  const TrainingRun& expected = Reference(GetParam());
  const TrainingRun actual = Distributed(GetParam());
  ASSERT_EQ(actual.losses.size(), expected.losses.size());
  for (size_t step = 0; step < expected.losses.size(); ++step) {
    EXPECT_NEAR(actual.losses[step], expected.losses[step], 1e-5 * expected.losses[step])
        << "step " << step;
  }
  // The gradient norms (clipping and Adam would hide a wrongly scaled gradient).
  ASSERT_EQ(actual.grad_norms.size(), expected.grad_norms.size());
  for (size_t step = 0; step < expected.grad_norms.size(); ++step) {
    EXPECT_NEAR(actual.grad_norms[step], expected.grad_norms[step],
                1e-5 * expected.grad_norms[step])
        << "step " << step;
  }
  ASSERT_EQ(actual.parameters.size(), expected.parameters.size());
  for (const auto& [name, want] : expected.parameters) {
    ASSERT_EQ(actual.parameters.count(name), 1u) << name;
    const at::Tensor& got = actual.parameters.at(name);
    ASSERT_EQ(got.sizes(), want.sizes()) << name;
    // Relative to the tensor's norm: AdamW moves an element whose gradient is near zero by
    // about +-lr whatever its sign, so reduction-order noise in such gradients shows as
    // isolated element differences of that size; the norm weighs them as the noise they are.
    // Biases (Qwen2's q/k/v) start at zero, so their norm is only ten steps of about lr
    // each, and a key bias's gradient is near zero by construction (it shifts a query's
    // scores almost uniformly, which softmax ignores): the same noise weighs about 1e-3 of
    // that norm, in FSDP's run (fsdp_2_ranks_qwen2) as much as in tensor-parallel ones.
    // Other weights stay within 1e-5 of their norm on AMD EPYC; on an Intel Xeon with AMX,
    // whose BLAS kernels sum in another order, tp_2_ranks's embedding reached 1.05e-5.
    // A frozen bias (under adapters) stays zero, in every run.
    const double tolerance = absl::EndsWith(name, ".bias") ? 1e-2 : 3e-5;
    const double scale = want.norm().item<double>();
    const double error = (got - want).norm().item<double>() / (scale > 0 ? scale : 1.0);
    EXPECT_LE(error, tolerance) << name << ": max element error "
                                << (got - want).abs().max().item<double>();
  }
  if (GetParam().replicate > 1 && GetParam().ep == 1) ExpectHybridShardingCosts(GetParam(), actual);
  if (GetParam().shard_dense_over_ep && GetParam().replicate == 1 && GetParam().tp == 1) {
    ExpectDenseShardedOverExpertsCosts(GetParam(), actual);
  }
  if (GetParam().lora && GetParam().strategy == Strategy::kFsdp) {
    ExpectLoraFsdpCosts(GetParam(), actual);
  }
  // The run trained: the parameters moved away from their initial values (with adapters, B
  // from zero, and the frozen base not at all).
  const at::Tensor initial =
      MakeModel(GetParam().variant)->named_parameters()["model.embed_tokens.weight"];
  const at::Tensor embedding_moved =
      (expected.parameters.at("model.embed_tokens.weight") - initial).abs().max();
  if (GetParam().lora) {
    EXPECT_EQ(embedding_moved.item<double>(), 0.0);
    EXPECT_GT(expected.parameters.at("model.layers.3.mlp.down_proj.lora_B.weight")
                  .abs()
                  .max()
                  .item<double>(),
              1e-4);
  } else {
    EXPECT_GT(embedding_moved.item<double>(), 1e-4);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Strategies, DataParallelParityTest,
    ::testing::Values(
        // One rank: the wrappers' collectives over a group of one (NCCL's too on CUDA).
        Scenario{"ddp_1_rank", Strategy::kDdp, 1, 1},
        Scenario{"fsdp_1_rank_accumulating", Strategy::kFsdp, 1, 2},
        Scenario{"ddp_2_ranks", Strategy::kDdp, 2, 1},
        Scenario{"ddp_4_ranks", Strategy::kDdp, 4, 1},
        Scenario{"ddp_2_ranks_accumulating", Strategy::kDdp, 2, 2},
        Scenario{"fsdp_2_ranks", Strategy::kFsdp, 2, 1},
        Scenario{"fsdp_4_ranks", Strategy::kFsdp, 4, 1},
        Scenario{"fsdp_2_ranks_no_reshard", Strategy::kFsdpNoReshard, 2, 1},
        Scenario{"fsdp_4_ranks_no_reshard", Strategy::kFsdpNoReshard, 4, 1},
        Scenario{"fsdp_2_ranks_accumulating", Strategy::kFsdp, 2, 2},
        Scenario{"ddp_2_ranks_unused_parameter", Strategy::kDdp, 2, 1, Variant::kUnusedParameter},
        Scenario{"fsdp_2_ranks_unused_parameter", Strategy::kFsdp, 2, 1, Variant::kUnusedParameter},
        Scenario{"fsdp_2_ranks_tied", Strategy::kFsdp, 2, 1, Variant::kTied},
        Scenario{"fsdp_4_ranks_tied_accumulating", Strategy::kFsdp, 4, 2, Variant::kTied},
        Scenario{"fsdp_2_ranks_qwen2", Strategy::kFsdp, 2, 1, Variant::kQwen2},
        Scenario{"tp_2_ranks", Strategy::kNone, 1, 1, Variant::kPlain, 2},
        // 4 heads, 2 key/value heads: each shared by 2 ranks.
        Scenario{"tp_4_ranks_shared_kv_heads", Strategy::kNone, 1, 1, Variant::kPlain, 4},
        Scenario{"tp_2_ranks_sequence_parallel", Strategy::kNone, 1, 1, Variant::kPlain, 2, true},
        Scenario{"tp_2_ranks_accumulating", Strategy::kNone, 1, 2, Variant::kPlain, 2},
        Scenario{"tp_2_ranks_qwen2", Strategy::kNone, 1, 1, Variant::kQwen2, 2},
        Scenario{"tp_2_ranks_qwen2_sequence_parallel", Strategy::kNone, 1, 1, Variant::kQwen2, 2,
                 true},
        Scenario{"fsdp_2_ranks_qwen3", Strategy::kFsdp, 2, 1, Variant::kQwen3},
        Scenario{"tp_2_ranks_qwen3", Strategy::kNone, 1, 1, Variant::kQwen3, 2},
        Scenario{"fsdp_2_ranks_qwen3_moe", Strategy::kFsdp, 2, 1, Variant::kQwen3Moe},
        Scenario{"ddp_2_ranks_qwen3_moe_accumulating", Strategy::kDdp, 2, 2, Variant::kQwen3Moe},
        Scenario{"fsdp_2_ranks_mixtral_accumulating", Strategy::kFsdp, 2, 2, Variant::kMixtral},
        // Expert parallelism: each "ep" rank keeps 4 of the 8 experts, alone and under FSDP or
        // DDP on another dimension.
        Scenario{"ep_2_ranks_qwen3_moe", Strategy::kNone, 1, 1, Variant::kQwen3Moe, 1, false, 1,
                 ActivationCheckpointingConfig::POLICY_UNSPECIFIED, false, 2},
        Scenario{"ep_2_x_fsdp_2_qwen3_moe", Strategy::kFsdp, 2, 1, Variant::kQwen3Moe, 1, false, 1,
                 ActivationCheckpointingConfig::POLICY_UNSPECIFIED, false, 2},
        Scenario{"ep_2_x_ddp_2_mixtral_accumulating", Strategy::kDdp, 2, 2, Variant::kMixtral, 1,
                 false, 1, ActivationCheckpointingConfig::POLICY_UNSPECIFIED, false, 2},
        // torchtitan's layout: the dense parts sharded over dp x ep, the experts over dp.
        Scenario{"ep_2_x_fsdp_2_qwen3_moe_dense_over_ep", Strategy::kFsdp, 2, 1, Variant::kQwen3Moe,
                 1, false, 1, ActivationCheckpointingConfig::POLICY_UNSPECIFIED, false, 2, true},
        Scenario{"ep_2_x_fsdp_2_mixtral_dense_over_ep_accumulating", Strategy::kFsdp, 2, 2,
                 Variant::kMixtral, 1, false, 1, ActivationCheckpointingConfig::POLICY_UNSPECIFIED,
                 false, 2, true},
        // The same, its shards replicated across replicate=2 (hybrid sharding), and inside
        // tensor parallelism over tp=2 (sequence parallel): 8 ranks each.
        Scenario{"ep_2_x_hsdp_2_x_2_qwen3_moe_dense_over_ep", Strategy::kFsdp, 2, 1,
                 Variant::kQwen3Moe, 1, false, 2, ActivationCheckpointingConfig::POLICY_UNSPECIFIED,
                 false, 2, true},
        Scenario{"ep_2_x_fsdp_2_x_tp_2_qwen3_moe_dense_over_ep", Strategy::kFsdp, 2, 1,
                 Variant::kQwen3Moe, 2, true, 1, ActivationCheckpointingConfig::POLICY_UNSPECIFIED,
                 false, 2, true},
        // Tensor parallelism of a mixture of experts: attention split, the experts whole on
        // every rank (each routing every token, or its slice of the sequence), alone and with
        // expert parallelism on another dimension.
        Scenario{"tp_2_ranks_qwen3_moe", Strategy::kNone, 1, 1, Variant::kQwen3Moe, 2},
        Scenario{"tp_2_ranks_mixtral_sequence_parallel_accumulating", Strategy::kNone, 1, 2,
                 Variant::kMixtral, 2, true},
        Scenario{"ep_2_x_tp_2_qwen3_moe_sequence_parallel", Strategy::kNone, 1, 1,
                 Variant::kQwen3Moe, 2, true, 1, ActivationCheckpointingConfig::POLICY_UNSPECIFIED,
                 false, 2},
        Scenario{"fsdp_2_x_tp_2", Strategy::kFsdp, 2, 1, Variant::kPlain, 2},
        // 4097 rows padded to 4098 (2 ranks: rank 1's last row is padding, in its second
        // FSDP shard) and to 4100 (4 ranks: 3 padding rows).
        Scenario{"tp_2_ranks_padded_vocabulary", Strategy::kNone, 1, 1, Variant::kOddVocabulary, 2},
        Scenario{"tp_4_ranks_padded_vocabulary", Strategy::kNone, 1, 1, Variant::kOddVocabulary, 4},
        Scenario{"fsdp_2_x_tp_2_padded_vocabulary", Strategy::kFsdp, 2, 1, Variant::kOddVocabulary,
                 2},
        Scenario{"ddp_2_x_tp_2", Strategy::kDdp, 2, 1, Variant::kPlain, 2},
        Scenario{"fsdp_2_x_tp_2_qwen2_sequence_parallel", Strategy::kFsdp, 2, 2, Variant::kQwen2, 2,
                 true},
        // Hybrid sharding: FSDP over dp=2, replicated across replicate=2.
        Scenario{"hsdp_2_x_2", Strategy::kFsdp, 2, 1, Variant::kPlain, 1, false, 2},
        Scenario{"hsdp_2_x_2_tied_accumulating", Strategy::kFsdp, 2, 2, Variant::kTied, 1, false,
                 2},
        Scenario{"fsdp_2_ranks_full_checkpointing", Strategy::kFsdp, 2, 1, Variant::kPlain, 1,
                 false, 1, ActivationCheckpointingConfig::FULL},
        Scenario{"ddp_2_ranks_selective_checkpointing", Strategy::kDdp, 2, 1, Variant::kPlain, 1,
                 false, 1, ActivationCheckpointingConfig::SELECTIVE},
        Scenario{"fsdp_2_x_tp_2_qwen2_selective_checkpointing", Strategy::kFsdp, 2, 1,
                 Variant::kQwen2, 2, true, 1, ActivationCheckpointingConfig::SELECTIVE},
        // LoRA adapters on a frozen base.
        Scenario{"lora_fsdp_2_ranks", Strategy::kFsdp, 2, 1, Variant::kPlain, 1, false, 1,
                 ActivationCheckpointingConfig::POLICY_UNSPECIFIED, true},
        Scenario{"lora_fsdp_2_ranks_qwen2_accumulating", Strategy::kFsdp, 2, 2, Variant::kQwen2, 1,
                 false, 1, ActivationCheckpointingConfig::POLICY_UNSPECIFIED, true},
        Scenario{"lora_ddp_2_ranks", Strategy::kDdp, 2, 1, Variant::kPlain, 1, false, 1,
                 ActivationCheckpointingConfig::POLICY_UNSPECIFIED, true},
        Scenario{"lora_ddp_2_ranks_accumulating", Strategy::kDdp, 2, 2, Variant::kPlain, 1, false,
                 1, ActivationCheckpointingConfig::POLICY_UNSPECIFIED, true},
        Scenario{"lora_fsdp_2_ranks_selective_checkpointing", Strategy::kFsdp, 2, 1,
                 Variant::kPlain, 1, false, 1, ActivationCheckpointingConfig::SELECTIVE, true}),
    [](const ::testing::TestParamInfo<Scenario>& info) { return info.param.name; });

// Activation checkpointing against the same run without it: FULL recomputes exactly what the
// forward computed, so losses, gradient norms and parameters are equal bit for bit; SELECTIVE
// back-propagates through its kept projections with products of its own, within 1e-6.
class CheckpointingParityTest : public ::testing::TestWithParam<Scenario> {};

TEST_P(CheckpointingParityTest, EqualsTheRunWithoutCheckpointing) {
  if (!parallel::testing::EnoughDevices(kDevice, GetParam().world())) {
    GTEST_SKIP() << GetParam().name << " needs " << GetParam().world() << " GPUs; this machine has "
                 << parallel::CudaDeviceCount();
  }
  Scenario without = GetParam();
  without.checkpointing = ActivationCheckpointingConfig::POLICY_UNSPECIFIED;
  const TrainingRun expected = Distributed(without);
  const TrainingRun actual = Distributed(GetParam());
  const bool bitwise = GetParam().checkpointing == ActivationCheckpointingConfig::FULL;
  auto expect_equal = [&](double got, double want, const std::string& what) {
    if (bitwise) {
      EXPECT_EQ(got, want) << what;
    } else {
      EXPECT_NEAR(got, want, 1e-6 * std::abs(want)) << what;
    }
  };
  ASSERT_EQ(actual.losses.size(), expected.losses.size());
  for (size_t step = 0; step < expected.losses.size(); ++step) {
    expect_equal(actual.losses[step], expected.losses[step], absl::StrCat("loss ", step));
    expect_equal(actual.grad_norms[step], expected.grad_norms[step],
                 absl::StrCat("gradient norm ", step));
  }
  for (const auto& [name, want] : expected.parameters) {
    const double error = (actual.parameters.at(name) - want).norm().item<double>();
    EXPECT_LE(error, bitwise ? 0.0 : 1e-6 * want.norm().item<double>()) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Policies, CheckpointingParityTest,
    ::testing::Values(
        Scenario{"full_1_rank", Strategy::kNone, 1, 1, Variant::kPlain, 1, false, 1,
                 ActivationCheckpointingConfig::FULL},
        Scenario{"selective_1_rank", Strategy::kNone, 1, 1, Variant::kPlain, 1, false, 1,
                 ActivationCheckpointingConfig::SELECTIVE},
        Scenario{"fsdp_2_ranks_full", Strategy::kFsdp, 2, 1, Variant::kPlain, 1, false, 1,
                 ActivationCheckpointingConfig::FULL},
        Scenario{"fsdp_2_ranks_accumulating_selective", Strategy::kFsdp, 2, 2, Variant::kPlain, 1,
                 false, 1, ActivationCheckpointingConfig::SELECTIVE},
        // The load-balancing loss's gradient reaches the routers through
        // the recomputed layers.
        Scenario{"fsdp_2_ranks_qwen3_moe_full", Strategy::kFsdp, 2, 1, Variant::kQwen3Moe, 1, false,
                 1, ActivationCheckpointingConfig::FULL},
        Scenario{"fsdp_2_ranks_no_reshard_full", Strategy::kFsdpNoReshard, 2, 1, Variant::kPlain, 1,
                 false, 1, ActivationCheckpointingConfig::FULL},
        Scenario{"ddp_2_ranks_full", Strategy::kDdp, 2, 1, Variant::kPlain, 1, false, 1,
                 ActivationCheckpointingConfig::FULL},
        Scenario{"ddp_2_ranks_accumulating_selective", Strategy::kDdp, 2, 2, Variant::kPlain, 1,
                 false, 1, ActivationCheckpointingConfig::SELECTIVE},
        Scenario{"tp_2_ranks_sequence_parallel_full", Strategy::kNone, 1, 1, Variant::kPlain, 2,
                 true, 1, ActivationCheckpointingConfig::FULL},
        Scenario{"tp_2_ranks_selective", Strategy::kNone, 1, 1, Variant::kPlain, 2, false, 1,
                 ActivationCheckpointingConfig::SELECTIVE}),
    [](const ::testing::TestParamInfo<Scenario>& info) { return info.param.name; });

// Mixed precision: parameters gathered and computed in bf16, gradients reduced in fp32,
// shards and optimizer state fp32. The run follows the fp32 one to bf16's precision.
TEST(FsdpMixedPrecisionTest, Bf16ComputeTracksTheFp32Run) {
  if (!parallel::testing::EnoughDevices(kDevice, 2)) GTEST_SKIP() << "needs 2 GPUs";
  const TrainingRun expected = SingleProcess();
  const TrainingRun actual = Distributed({"fsdp_bf16", Strategy::kFsdpBf16, 2, 1});
  ASSERT_EQ(actual.losses.size(), expected.losses.size());
  for (size_t step = 0; step < expected.losses.size(); ++step) {
    EXPECT_NEAR(actual.losses[step], expected.losses[step], 1e-2 * expected.losses[step])
        << "step " << step;
  }
  for (const auto& [name, want] : expected.parameters) {
    const at::Tensor& got = actual.parameters.at(name);
    EXPECT_EQ(got.scalar_type(), at::kFloat) << name;  // the shards stayed fp32
    EXPECT_LE((got - want).norm().item<double>() / want.norm().item<double>(), 1e-2) << name;
  }
}

#ifdef PLAIT_TEST_ON_CUDA
// The single-device CUDA run, every parity scenario's reference, against the CPU's: cuBLAS
// and LibTorch's CUDA kernels sum in other orders than the CPU's, so the two differ by fp32
// rounding, which ten steps of AdamW amplify a little; TF32 would show as ~1e-3.
TEST(CudaSingleDeviceTest, TracksTheCpuRun) {
  if (!parallel::testing::EnoughDevices(kDevice, 1)) GTEST_SKIP() << "no GPU here";
  ASSERT_FALSE(at::globalContext().allowTF32CuBLAS()) << "the fp32 parity tests need TF32 off";
  const TrainingRun cpu = SingleProcess(Variant::kPlain, at::kCPU);
  const TrainingRun cuda = SingleProcess(Variant::kPlain, at::kCUDA);
  for (size_t step = 0; step < cpu.losses.size(); ++step) {
    EXPECT_NEAR(cuda.losses[step], cpu.losses[step], 1e-5 * cpu.losses[step]) << "step " << step;
    EXPECT_NEAR(cuda.grad_norms[step], cpu.grad_norms[step], 1e-4 * cpu.grad_norms[step])
        << "step " << step;
  }
  for (const auto& [name, want] : cpu.parameters) {
    const at::Tensor& got = cuda.parameters.at(name);
    EXPECT_LE((got - want).norm().item<double>() / want.norm().item<double>(), 1e-4) << name;
  }
}
#endif

}  // namespace
}  // namespace plait::wrap
