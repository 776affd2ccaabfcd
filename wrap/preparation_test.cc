#include "wrap/preparation.h"

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "ATen/ops/allclose.h"
#include "ATen/ops/equal.h"
#include "absl/strings/str_cat.h"
#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/causal_lm.h"
#include "models/model_config.h"
#include "optim/optimizer.h"
#include "parallel/device_mesh.h"
#include "parallel/ring_communicator.h"
#include "parallel/test_ranks.h"
#include "torch/csrc/autograd/generated/variable_factories.h"
#include "torch/csrc/distributed/c10d/HashStore.hpp"
#include "wrap/fsdp/fsdp.h"

namespace plait::wrap {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::base::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

// A one-rank mesh with two dimensions, enough for every guard rail.
class PreparationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    parallel::MeshConfig config;
    for (const char* name : {"dp", "shard"}) {
      auto* dim = config.add_dims();
      dim->set_name(name);
      dim->set_size(1);
    }
    auto layout = parallel::MeshLayout::Create(config, 1);
    ASSERT_THAT(layout, IsOk());
    auto mesh = parallel::DeviceMesh::Create(
        *layout, 0,
        parallel::RingCommunicatorFactory(*store_, parallel::RingCommunicator::kLoopback));
    ASSERT_THAT(mesh, IsOk());
    mesh_ = std::make_unique<parallel::DeviceMesh>(*std::move(mesh));
    // The tiny preset: 4 blocks, so "two blocks at once" is less than the whole model.
    model_ = models::CausalLM::Create(models::PresetConfig("tiny").value(), models::InitConfig())
                 .value();
  }

  static PrepareStep Ddp(const std::string& dim) {
    PrepareStep step;
    step.mutable_ddp()->set_mesh_dim(dim);
    return step;
  }
  static PrepareStep Fsdp(const std::string& dim, bool reshard_after_forward = true) {
    PrepareStep step;
    step.mutable_fsdp()->set_mesh_dim(dim);
    step.mutable_fsdp()->set_reshard_after_forward(reshard_after_forward);
    return step;
  }

  c10::intrusive_ptr<c10d::Store> store_ = c10::make_intrusive<c10d::HashStore>();
  std::unique_ptr<parallel::DeviceMesh> mesh_;
  std::shared_ptr<models::CausalLM> model_;
};

// A model must be on the mesh's device (a CUDA mesh's, for a model left on the CPU); a meta
// tensor stands for a device this machine may not have.
TEST_F(PreparationTest, TheModelMustBeOnTheMeshDevice) {
  model_->register_parameter("elsewhere", torch::empty({2}, at::Device(at::kMeta)));
  EXPECT_THAT(Preparation::Begin(*model_, *mesh_, "plan.prepare"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "plan.prepare: parameter elsewhere is on meta, but the mesh's "
                       "communicators run on cpu; move the model there before preparing it"));
}

// The preparation reads the same rules as the plan validator (rules.textproto).
TEST_F(PreparationTest, EachWrapperAppliesOnce) {
  auto preparation = Preparation::Begin(*model_, *mesh_, "plan.prepare");
  ASSERT_THAT(preparation, IsOk());
  ASSERT_THAT((*preparation)->Apply(Fsdp("shard")), IsOk());
  EXPECT_THAT((*preparation)->Apply(Fsdp("dp")),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "plan.prepare[1].fsdp: fsdp is applied 2 times; at most 1 per model (rule "
                       "fsdp_at_most_once)"));
}

// Activation checkpointing names no mesh dimension and needs a policy; it wraps the blocks
// FSDP gathers, so it comes first.
TEST_F(PreparationTest, ActivationCheckpointingNeedsAPolicyAndComesBeforeFsdp) {
  PrepareStep checkpointing;
  checkpointing.mutable_activation_checkpointing();
  auto preparation = Preparation::Begin(*model_, *mesh_, "plan.prepare");
  ASSERT_THAT(preparation, IsOk());
  EXPECT_THAT((*preparation)->Apply(checkpointing),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "plan.prepare[0]: activation_checkpointing.policy is not set; set FULL or "
                       "SELECTIVE"));
  ASSERT_THAT((*preparation)->Apply(Fsdp("dp")), IsOk());
  checkpointing.mutable_activation_checkpointing()->set_policy(ActivationCheckpointingConfig::FULL);
  EXPECT_THAT(
      (*preparation)->Apply(checkpointing),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("(rule checkpointing_before_fsdp)")));
}

TEST_F(PreparationTest, DdpAndFsdpNeedDimensionsOfTheirOwn) {
  auto preparation = Preparation::Begin(*model_, *mesh_);
  ASSERT_THAT(preparation, IsOk());
  ASSERT_THAT((*preparation)->Apply(Ddp("dp")), IsOk());
  EXPECT_THAT((*preparation)->Apply(Fsdp("dp")),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("prepare[1].fsdp.mesh_dim: \"dp\" is already used by ddp "
                                 "(prepare[0]); fsdp needs its own dimension")));
  EXPECT_THAT((*preparation)->Apply(Fsdp("shard")),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("prepare[1].fsdp: fsdp cannot be applied with ddp (prepare[0]): "
                                 "FSDP replicates its own shards: for hybrid sharding set "
                                 "fsdp.replicate_mesh_dim to the dimension DDP would use, and drop "
                                 "DDP (rule hybrid_sharding_is_fsdp)")));
  // The failed steps left the preparation as it was: DDP alone.
  EXPECT_EQ((*preparation)->DataParallelDims(), std::vector<std::string>{"dp"});
}

// Hybrid sharding is one FSDP step over two dimensions, both of which split the batch.
TEST_F(PreparationTest, HybridShardingReplicatesAcrossADimensionOfItsOwn) {
  auto preparation = Preparation::Begin(*model_, *mesh_);
  ASSERT_THAT(preparation, IsOk());
  PrepareStep same = Fsdp("shard");
  same.mutable_fsdp()->set_replicate_mesh_dim("shard");
  EXPECT_THAT((*preparation)->Apply(same),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("prepare[0].fsdp.replicate_mesh_dim: \"shard\" is this step's "
                                 "mesh_dim too: hybrid sharding replicates the shards across "
                                 "another dimension than the one that splits them (rule "
                                 "hsdp_separate_dims)")));
  PrepareStep unknown = Fsdp("shard");
  unknown.mutable_fsdp()->set_replicate_mesh_dim("replicate");
  EXPECT_THAT((*preparation)->Apply(unknown),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "prepare[0].fsdp.replicate_mesh_dim: \"replicate\" is not a dimension of "
                       "the mesh (dp, shard)"));
  PrepareStep hybrid = Fsdp("shard");
  hybrid.mutable_fsdp()->set_replicate_mesh_dim("dp");
  ASSERT_THAT((*preparation)->Apply(hybrid), IsOk());
  EXPECT_EQ((*preparation)->DataParallelDims(), (std::vector<std::string>{"dp", "shard"}));
  EXPECT_THAT((*preparation)->Apply(Ddp("dp")),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("(rule hybrid_sharding_is_fsdp)"),
                             HasSubstr("prepare[1].ddp.mesh_dim: \"dp\" is already used by fsdp "
                                       "(prepare[0]); ddp needs its own dimension"))));
}

TEST_F(PreparationTest, NoWrapperAfterTheParametersWereTaken) {
  auto preparation = Preparation::Begin(*model_, *mesh_);
  ASSERT_THAT(preparation, IsOk());
  ASSERT_THAT((*preparation)->TakeTrainableParameters(), IsOk());
  EXPECT_THAT((*preparation)->Apply(Fsdp("dp")),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("prepare[0].fsdp: the model's parameters were already handed to "
                                 "an optimizer; apply every step before "
                                 "TakeTrainableParameters()")));
  EXPECT_THAT((*preparation)->TakeTrainableParameters(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("already taken")));
}

TEST_F(PreparationTest, UnknownMeshDimension) {
  auto preparation = Preparation::Begin(*model_, *mesh_);
  ASSERT_THAT(preparation, IsOk());
  EXPECT_THAT((*preparation)->Apply(Ddp("tp")),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "prepare[0].ddp.mesh_dim: \"tp\" is not a dimension of the mesh (dp, "
                       "shard)"));
  EXPECT_THAT(
      (*preparation)->Apply(PrepareStep()),
      StatusIs(absl::StatusCode::kInvalidArgument,
               "prepare[0]: names no strategy; set one of fsdp, ddp, tensor_parallel, "
               "activation_checkpointing, lora, pipeline, context_parallel, expert_parallel"));
}

TEST_F(PreparationTest, OnePreparationPerModel) {
  auto first = Preparation::Begin(*model_, *mesh_);
  ASSERT_THAT(first, IsOk());
  EXPECT_THAT(Preparation::Begin(*model_, *mesh_),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("already being prepared")));
  first->reset();
  EXPECT_THAT(Preparation::Begin(*model_, *mesh_), IsOk());
}

// The motivating bug: an optimizer over the full (pre-wrap) parameters of an FSDP model.
TEST_F(PreparationTest, OptimizerOverTheOriginalParametersOfAnFsdpModelIsRefused) {
  std::vector<parallel::TrainableParameter> originals;
  for (const auto& named : model_->NamedParameters()) {
    originals.push_back({named.name, named.parameter, {}});
  }
  auto preparation = Preparation::Begin(*model_, *mesh_);
  ASSERT_THAT(preparation, IsOk());
  ASSERT_THAT((*preparation)->Apply(Fsdp("dp")), IsOk());
  optim::OptimizerConfig config;
  config.mutable_adamw();
  EXPECT_THAT(optim::Optimizer::Create(originals, config),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("has no memory: it is the full parameter of a sharded (FSDP) "
                                 "model; build the optimizer from the prepared model's "
                                 "trainable parameters")));
  auto shards = (*preparation)->TakeTrainableParameters();
  ASSERT_THAT(shards, IsOk());
  EXPECT_THAT(optim::Optimizer::Create(*shards, config), IsOk());
}

// The whole parameters of a prepared model, with and without a strategy that shards them.
TEST_F(PreparationTest, FullParametersAreTheModelsWholeParameters) {
  std::map<std::string, at::Tensor> initial;
  for (const auto& named : model_->NamedParameters()) {
    initial[named.name] = named.parameter.detach().clone();
  }
  for (const bool sharded : {false, true}) {
    auto preparation = Preparation::Begin(*model_, *mesh_);
    ASSERT_THAT(preparation, IsOk());
    ASSERT_THAT((*preparation)->Apply(sharded ? Fsdp("dp") : Ddp("dp")), IsOk());
    EXPECT_EQ((*preparation)->gathered_bytes(), 0);
    auto full = (*preparation)->FullParameters();
    ASSERT_THAT(full, IsOk());
    ASSERT_EQ(full->size(), initial.size());
    for (const auto& [name, tensor] : initial) {
      EXPECT_TRUE(at::equal(full->at(name), tensor)) << name;
    }
  }
}

// FSDP's full state dict round trip, and the memory it keeps between steps: only the
// shards, every full parameter freed.
TEST_F(PreparationTest, FsdpFullStateDictAndFreedParameters) {
  std::map<std::string, at::Tensor> initial;
  for (const auto& named : model_->NamedParameters()) {
    initial[named.name] = named.parameter.detach().clone();
  }
  FsdpConfig config;
  config.set_mesh_dim("dp");
  auto created = fsdp::Fsdp::Create(*model_, **mesh_->communicator("dp"), nullptr, config);
  ASSERT_THAT(created, IsOk());
  fsdp::Fsdp& fsdp = **created;
  EXPECT_EQ(fsdp.unsharded_bytes(), 0);
  auto full = fsdp.FullStateDict();
  ASSERT_THAT(full, IsOk());
  for (const auto& [name, tensor] : initial) {
    EXPECT_TRUE(at::equal(full->at(name), tensor)) << name;
  }
  // Loading changes what the model computes with.
  std::map<std::string, at::Tensor> doubled;
  for (const auto& [name, tensor] : initial) doubled[name] = tensor * 2;
  ASSERT_THAT(fsdp.LoadFullStateDict(doubled), IsOk());
  auto reloaded = fsdp.FullStateDict();
  ASSERT_THAT(reloaded, IsOk());
  EXPECT_TRUE(at::equal(reloaded->at("model.norm.weight"), initial["model.norm.weight"] * 2));
  doubled.erase("lm_head.weight");
  EXPECT_THAT(fsdp.LoadFullStateDict(doubled),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "full state dict: no tensor for parameter lm_head.weight"));

  // A training step gathers and frees: afterwards nothing full is alive.
  const at::Tensor tokens = torch::randint(100, {2, 8});
  model_->Loss(tokens, tokens).backward();
  ASSERT_THAT(fsdp.last_status(), IsOk());
  EXPECT_EQ(fsdp.unsharded_bytes(), 0);
}

// The bytes of the root unit's parameters and of the largest block's.
struct UnitBytes {
  int64_t root = 0;
  int64_t block = 0;
};
UnitBytes BytesOfUnits(Wrappable& model) {
  UnitBytes bytes;
  for (const auto& named : model.RootParameters()) bytes.root += named.parameter.nbytes();
  for (const Wrappable::Unit& block : model.Blocks()) {
    int64_t block_bytes = 0;
    for (const auto& parameter : block.module->parameters()) block_bytes += parameter.nbytes();
    bytes.block = std::max(bytes.block, block_bytes);
  }
  return bytes;
}

// Training steps gather at most the two largest units at once, counting prefetched ones:
// the root (larger than a block in the tiny model) is freed while the blocks compute, so
// the root and two blocks (the one computing and the one prefetched) are never all alive.
// With tied embeddings the root's one weight serves the lookup and the output projection.
// Without reshard_after_forward every block stays gathered from its forward to its
// backward.
TEST_F(PreparationTest, FsdpGathersAtMostTheTwoLargestUnits) {
  for (const bool tied : {false, true}) {
    for (const bool reshard : {true, false}) {
      SCOPED_TRACE(absl::StrCat("tied ", tied, ", reshard_after_forward ", reshard));
      models::ModelConfig config = models::PresetConfig("tiny").value();
      config.set_tie_word_embeddings(tied);
      std::shared_ptr<models::CausalLM> model =
          models::CausalLM::Create(config, models::InitConfig()).value();
      const UnitBytes bytes = BytesOfUnits(*model);
      ASSERT_GT(bytes.root, bytes.block);
      auto preparation = Preparation::Begin(*model, *mesh_);
      ASSERT_THAT(preparation, IsOk());
      ASSERT_THAT((*preparation)->Apply(Fsdp("dp", reshard)), IsOk());
      const at::Tensor tokens = torch::randint(100, {2, 8});
      for (int step = 0; step < 3; ++step) {
        model->Loss(tokens, tokens).backward();
        ASSERT_THAT((*preparation)->BackwardStatus(), IsOk());
        EXPECT_EQ((*preparation)->gathered_bytes(), 0);
      }
      if (reshard) {
        EXPECT_EQ((*preparation)->peak_gathered_bytes(), bytes.root + bytes.block);
      } else {
        int64_t all = 0;
        for (const auto& named : model->NamedParameters()) all += named.parameter.nbytes();
        EXPECT_EQ((*preparation)->peak_gathered_bytes(), all);
      }
    }
  }
}

// A Communicator over another that counts the reduce-scatters started and not yet waited
// for: the ones whose buffers an NcclWork still holds (a Work holds its tensors until it is
// waited for, so that CUDA's caching allocator cannot reuse memory NCCL still reads).
class UnwaitedReduceScatters final : public parallel::Communicator {
 public:
  explicit UnwaitedReduceScatters(std::unique_ptr<parallel::Communicator> inner)
      : Communicator(inner->name(), inner->rank(), inner->size(), inner->options()),
        inner_(std::move(inner)) {}

  at::Device device() const override { return inner_->device(); }
  int most() const { return most_; }

 private:
  class CountedWork final : public parallel::Work {
   public:
    CountedWork(std::shared_ptr<parallel::Work> inner, int& unwaited)
        : inner_(std::move(inner)), unwaited_(unwaited) {}
    ~CountedWork() override {
      if (!waited_) --unwaited_;
    }
    absl::Status Wait() override {
      if (!waited_) --unwaited_;
      waited_ = true;
      return inner_->Wait();
    }

   private:
    std::shared_ptr<parallel::Work> inner_;
    int& unwaited_;
    bool waited_ = false;
  };

  std::shared_ptr<parallel::Work> StartAllReduce(at::Tensor tensor,
                                                 parallel::ReduceOp op) override {
    return inner_->AllReduce(tensor, op);
  }
  std::shared_ptr<parallel::Work> StartAllGather(at::Tensor input, at::Tensor output) override {
    return inner_->AllGather(input, output);
  }
  std::shared_ptr<parallel::Work> StartReduceScatter(at::Tensor input, at::Tensor output,
                                                     parallel::ReduceOp op) override {
    most_ = std::max(most_, ++unwaited_);
    return std::make_shared<CountedWork>(inner_->ReduceScatter(input, output, op), unwaited_);
  }
  std::shared_ptr<parallel::Work> StartBroadcast(at::Tensor tensor, int root) override {
    return inner_->Broadcast(tensor, root);
  }
  std::shared_ptr<parallel::Work> StartBarrier() override { return inner_->Barrier(); }
  std::shared_ptr<parallel::Work> StartAllToAll(at::Tensor input, at::Tensor output,
                                                std::vector<int64_t> send_rows,
                                                std::vector<int64_t> receive_rows) override {
    return inner_->AllToAll(input, output, std::move(send_rows), std::move(receive_rows));
  }
  std::shared_ptr<parallel::Work> StartSend(at::Tensor tensor, int peer) override {
    return inner_->Send(tensor, peer);
  }
  std::shared_ptr<parallel::Work> StartReceive(at::Tensor tensor, int peer) override {
    return inner_->Receive(tensor, peer);
  }

  std::unique_ptr<parallel::Communicator> inner_;
  int unwaited_ = 0;
  int most_ = 0;
};

// Each unit's reduce-scatter is waited for when the next unit's starts, so that its input,
// the unit's whole gradient, is freed then rather than at the end of the backward pass, when
// every unit's would have been alive at once.
TEST_F(PreparationTest, FsdpWaitsForEachReduceScatterWhenTheNextStarts) {
  auto gloo = parallel::RingCommunicatorFactory(*store_, parallel::RingCommunicator::kLoopback)(
      "counted", 0, 1);
  ASSERT_THAT(gloo, IsOk());
  UnwaitedReduceScatters communicator(*std::move(gloo));
  FsdpConfig config;
  config.set_mesh_dim("dp");
  auto fsdp = fsdp::Fsdp::Create(*model_, communicator, nullptr, config);
  ASSERT_THAT(fsdp, IsOk());
  const at::Tensor tokens = torch::randint(100, {2, 8});
  model_->Loss(tokens, tokens).backward();
  ASSERT_THAT((*fsdp)->last_status(), IsOk());
  // The tiny model's 4 blocks and the root.
  EXPECT_EQ(communicator.traffic(parallel::Collective::kReduceScatter).calls, 5);
  EXPECT_EQ(communicator.most(), 2);
}

// A frozen parameter (a reference model's, or a frozen embedding) is sharded and gathered
// like the others but gets no gradient and is not handed to the optimizer.
TEST_F(PreparationTest, FsdpLeavesFrozenParametersOutOfTraining) {
  for (const auto& named : model_->NamedParameters()) {
    if (named.name == "model.embed_tokens.weight") named.parameter.requires_grad_(false);
  }
  auto preparation = Preparation::Begin(*model_, *mesh_);
  ASSERT_THAT(preparation, IsOk());
  ASSERT_THAT((*preparation)->Apply(Fsdp("dp")), IsOk());
  auto parameters = (*preparation)->TakeTrainableParameters();
  ASSERT_THAT(parameters, IsOk());
  EXPECT_EQ(parameters->size(), model_->NamedParameters().size() - 1);
  for (const auto& parameter : *parameters) {
    EXPECT_NE(parameter.name, "model.embed_tokens.weight");
  }
  const at::Tensor tokens = torch::randint(100, {2, 8});
  model_->Loss(tokens, tokens).backward();
  ASSERT_THAT((*preparation)->BackwardStatus(), IsOk());
  for (const auto& parameter : *parameters) {
    EXPECT_TRUE(parameter.tensor.grad().defined()) << parameter.name;
  }
}

// A fully frozen model (a reference model in preference training) runs forward under FSDP.
TEST_F(PreparationTest, FsdpRunsAFrozenModel) {
  const at::Tensor tokens = torch::randint(100, {2, 8});
  const at::Tensor expected = model_->SequenceLogProbs(tokens, tokens).detach();
  for (const auto& named : model_->NamedParameters()) named.parameter.requires_grad_(false);
  auto preparation = Preparation::Begin(*model_, *mesh_);
  ASSERT_THAT(preparation, IsOk());
  ASSERT_THAT((*preparation)->Apply(Fsdp("dp")), IsOk());
  auto parameters = (*preparation)->TakeTrainableParameters();
  ASSERT_THAT(parameters, IsOk());
  EXPECT_TRUE(parameters->empty());
  EXPECT_TRUE(at::allclose(model_->SequenceLogProbs(tokens, tokens), expected));
  EXPECT_EQ((*preparation)->gathered_bytes(), 0);
}

std::map<std::string, at::Tensor> ClonedParameters(Wrappable& model) {
  std::map<std::string, at::Tensor> parameters;
  for (const auto& named : model.NamedParameters()) {
    parameters[named.name] = named.parameter.detach().clone();
  }
  return parameters;
}

// A frozen model beside a trained one, as preference training prepares its reference: both
// FSDP-sharded on the same 2 ranks (threads over TCP), the frozen one's parameters frozen
// after its preparation (as prepared::PreparedModel does for Role::kFrozen). Each Preparation
// gathers its own model's whole parameters on every rank: the unsharded model's values, bit
// for bit.
TEST(PreparationOnRanksTest, FullParametersOfAFrozenFsdpModelBesideATrainedOne) {
  const auto make_model = [](uint64_t seed) {
    models::InitConfig init;
    init.set_seed(seed);
    return models::CausalLM::Create(models::PresetConfig("tiny").value(), init).value();
  };
  // Different seeds, so that one model's values in the other's result would show.
  const std::map<std::string, at::Tensor> trained_values = ClonedParameters(*make_model(1));
  const std::map<std::string, at::Tensor> frozen_values = ClonedParameters(*make_model(2));
  parallel::MeshConfig config;
  auto* dim = config.add_dims();
  dim->set_name("dp");
  dim->set_size(2);
  const parallel::MeshLayout layout = parallel::MeshLayout::Create(config, 2).value();
  PrepareStep fsdp;
  fsdp.mutable_fsdp()->set_mesh_dim("dp");
  const at::Tensor tokens = torch::arange(32, at::kLong).view({2, 16});
  parallel::testing::RunOnRingMesh(layout, [&](int rank, parallel::DeviceMesh& mesh) {
    std::shared_ptr<models::CausalLM> trained = make_model(1);
    std::shared_ptr<models::CausalLM> frozen = make_model(2);
    auto trained_preparation = Preparation::Begin(*trained, mesh);
    ASSERT_THAT(trained_preparation, IsOk());
    ASSERT_THAT((*trained_preparation)->Apply(fsdp), IsOk());
    ASSERT_THAT((*trained_preparation)->TakeTrainableParameters(), IsOk());
    auto frozen_preparation = Preparation::Begin(*frozen, mesh);
    ASSERT_THAT(frozen_preparation, IsOk());
    ASSERT_THAT((*frozen_preparation)->Apply(fsdp), IsOk());
    auto shards = (*frozen_preparation)->TakeTrainableParameters();
    ASSERT_THAT(shards, IsOk());
    for (parallel::TrainableParameter& shard : *shards) shard.tensor.requires_grad_(false);
    for (const auto& named : frozen->NamedParameters()) named.parameter.requires_grad_(false);
    // Both models compute first, so that their units were gathered and freed again.
    {
      at::NoGradGuard no_grad;
      frozen->SequenceLogProbs(tokens, tokens);
    }
    trained->Loss(tokens, tokens).backward();
    ASSERT_THAT((*trained_preparation)->BackwardStatus(), IsOk());
    const struct {
      const char* role;
      Preparation* preparation;
      const std::map<std::string, at::Tensor>& expected;
    } cases[] = {{"frozen", frozen_preparation->get(), frozen_values},
                 {"trained", trained_preparation->get(), trained_values}};
    for (const auto& model : cases) {
      SCOPED_TRACE(absl::StrCat(model.role, " model, rank ", rank));
      // Held in a variable: a range-for over FullParameters().value() would iterate a map
      // destroyed with its temporary StatusOr.
      absl::StatusOr<std::map<std::string, at::Tensor>> full = model.preparation->FullParameters();
      ASSERT_THAT(full, IsOk());
      ASSERT_EQ(full->size(), model.expected.size());
      for (const auto& [name, tensor] : model.expected) {
        ASSERT_EQ(full->count(name), 1u) << name;
        EXPECT_TRUE(at::equal(full->at(name), tensor)) << name;
      }
    }
  });
}

// Each layout's trainable parameters name the part of the whole parameter they hold: over
// every rank, the boxes that replica 0 holds cover each parameter once, and each rank's
// data (its padding left out) is the unsharded model's values in its box. FSDP over 3 ranks
// pads; tensor parallelism over 4 ranks shares the tiny model's 2 key/value heads.
TEST(PreparationOnRanksTest, TrainableParametersNameTheirSliceOfTheWholeParameter) {
  const std::map<std::string, at::Tensor> whole = ClonedParameters(
      *models::CausalLM::Create(models::PresetConfig("tiny").value(), models::InitConfig())
           .value());
  const auto step = [](const std::string& kind, const std::string& dim) {
    PrepareStep step;
    if (kind == "fsdp") step.mutable_fsdp()->set_mesh_dim(dim);
    if (kind == "ddp") step.mutable_ddp()->set_mesh_dim(dim);
    if (kind == "tp") step.mutable_tensor_parallel()->set_mesh_dim(dim);
    return step;
  };
  const struct {
    std::vector<std::pair<std::string, int>> dims;
    std::vector<PrepareStep> steps;
  } layouts[] = {
      {{{"dp", 3}}, {step("fsdp", "dp")}},
      {{{"dp", 2}}, {step("ddp", "dp")}},
      {{{"tp", 4}}, {step("tp", "tp")}},
      {{{"dp", 2}, {"tp", 2}}, {step("tp", "tp"), step("fsdp", "dp")}},
      {{{"dp", 2}, {"tp", 2}}, {step("tp", "tp"), step("ddp", "dp")}},
  };
  for (const auto& layout : layouts) {
    parallel::MeshConfig config;
    int ranks = 1;
    std::string name;
    for (const auto& [dim_name, size] : layout.dims) {
      auto* dim = config.add_dims();
      dim->set_name(dim_name);
      dim->set_size(size);
      ranks *= size;
    }
    for (const PrepareStep& s : layout.steps) absl::StrAppend(&name, s.ShortDebugString(), "; ");
    SCOPED_TRACE(name);
    std::mutex mutex;
    std::map<std::string, int64_t> saved_elements;
    parallel::testing::RunOnRingMesh(
        parallel::MeshLayout::Create(config, ranks).value(),
        [&](int rank, parallel::DeviceMesh& mesh) {
          std::shared_ptr<models::CausalLM> model =
              models::CausalLM::Create(models::PresetConfig("tiny").value(), models::InitConfig())
                  .value();
          auto preparation = Preparation::Begin(*model, mesh);
          ASSERT_THAT(preparation, IsOk());
          for (const PrepareStep& s : layout.steps) ASSERT_THAT((*preparation)->Apply(s), IsOk());
          auto parameters = (*preparation)->TakeTrainableParameters();
          ASSERT_THAT(parameters, IsOk());
          for (const parallel::TrainableParameter& parameter : *parameters) {
            const parallel::TensorSlice& slice = parameter.slice;
            const at::Tensor& full = whole.at(parameter.name);
            ASSERT_EQ(slice.global_shape, full.sizes().vec()) << parameter.name;
            const parallel::Box all = parallel::TensorSlice::Whole(full.sizes()).box;
            EXPECT_TRUE(parallel::NarrowTo(full, all, slice.box)
                            .equal(slice.DataOf(parameter.tensor.detach())))
                << "rank " << rank << ": " << parameter.name << " " << slice.DebugString();
            if (slice.replica == 0) {
              std::lock_guard<std::mutex> lock(mutex);
              saved_elements[parameter.name] += slice.box.numel();
            }
          }
        });
    for (const auto& [parameter, tensor] : whole) {
      EXPECT_EQ(saved_elements[parameter], tensor.numel()) << parameter;
    }
  }
}

}  // namespace
}  // namespace plait::wrap
