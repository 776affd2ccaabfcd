#include "wrap/lora/lora.h"

#include <cmath>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "ATen/Context.h"
#include "ATen/core/Tensor.h"
#include "ATen/ops/allclose.h"
#include "ATen/ops/equal.h"
#include "ATen/ops/mm.h"
#include "ATen/ops/roll.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/allocation_counter.h"
#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "models/causal_lm.h"
#include "models/model_config.h"
#include "models/testing_models.h"
#include "optim/optimizer.h"
#include "parallel/device_mesh.h"
#include "parallel/test_ranks.h"
#include "torch/csrc/autograd/generated/variable_factories.h"
#include "torch/nn/functional/linear.h"
#include "wrap/checkpointing/activation_checkpointing.h"
#include "wrap/lora/nf4.h"
#include "wrap/lora/peft_adapter.h"
#include "wrap/preparation.h"
#include "wrap/rules.h"
#include "wrap/strategies.h"

namespace plait::wrap::lora {
namespace {

namespace F = torch::nn::functional;
using ::plait::base::testing::IsOk;
using ::plait::base::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// The tiny Llama: hidden 256, MLP 688, 4 blocks, 4 heads of 64, 2 key/value heads.
std::shared_ptr<models::CausalLM> MakeModel(const std::string& preset = "tiny") {
  return models::testing::SeededModel(preset, 7);
}

LoraConfig Config(const std::string& text) {
  LoraConfig config;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &config)) << text;
  return config;
}

PrepareStep LoraStep(const std::string& text) {
  PrepareStep step;
  *step.mutable_lora() = Config(text);
  return step;
}

at::Tensor Tokens() {
  at::manual_seed(11);
  return torch::randint(4096, {2, 16});
}

// Runs `body` with a one-rank mesh whose one dimension is "dp".
void OnOneRank(const std::function<void(parallel::DeviceMesh& mesh)>& body) {
  parallel::MeshConfig config;
  auto* dim = config.add_dims();
  dim->set_name("dp");
  dim->set_size(1);
  parallel::testing::RunOnMesh(parallel::MeshLayout::Create(config, 1).value(), at::kCPU,
                               [&](int, parallel::DeviceMesh& mesh) { body(mesh); });
}

// The model's projection module `name`.
std::shared_ptr<torch::nn::Module> Module(models::CausalLM& model, const std::string& name) {
  return model.named_modules()[name];
}

TEST(LoraTest, StepZeroComputesTheBaseModel) {
  std::shared_ptr<models::CausalLM> model = MakeModel();
  const at::Tensor tokens = Tokens();
  at::NoGradGuard no_grad;
  const at::Tensor base = model->Forward(tokens);
  auto lora = Lora::Create(*model, Config(R"pb(rank: 4 alpha: 8 target: "*proj")pb"));
  ASSERT_THAT(lora, IsOk());
  EXPECT_EQ((*lora)->adapted().size(), 4u * 7u);  // every projection of the 4 blocks
  EXPECT_TRUE(at::equal(model->Forward(tokens), base));
}

TEST(LoraTest, AdaptersAreNamedAndDrawnAsPeftDoes) {
  std::shared_ptr<models::CausalLM> model = MakeModel();
  auto lora = Lora::Create(
      *model, Config(R"pb(rank: 8 alpha: 16 target: "*q_proj" target: "*v_proj" seed: 3)pb"));
  ASSERT_THAT(lora, IsOk());
  std::vector<std::string> adapters;
  for (const auto& named : model->NamedParameters()) {
    if (named.name.find("lora_") == std::string::npos) continue;
    adapters.push_back(named.name);
  }
  ASSERT_EQ(adapters.size(), 16u);
  EXPECT_EQ(adapters[0], "model.layers.0.self_attn.q_proj.lora_A.weight");
  EXPECT_EQ(adapters[1], "model.layers.0.self_attn.q_proj.lora_B.weight");
  EXPECT_EQ(adapters[2], "model.layers.0.self_attn.v_proj.lora_A.weight");
  EXPECT_EQ(adapters[15], "model.layers.3.self_attn.v_proj.lora_B.weight");
  auto parameters = model->named_parameters();
  const at::Tensor a = parameters["model.layers.2.self_attn.v_proj.lora_A.weight"];
  const at::Tensor b = parameters["model.layers.2.self_attn.v_proj.lora_B.weight"];
  EXPECT_EQ(a.sizes(), (std::vector<int64_t>{8, 256}));
  EXPECT_EQ(b.sizes(), (std::vector<int64_t>{128, 8}));  // 2 key/value heads of 64
  EXPECT_TRUE(at::equal(a, InitialA(3, "model.layers.2.self_attn.v_proj.lora_A.weight", 8, 256)));
  // Kaiming-uniform with a = sqrt(5): uniform within 1 / sqrt(in), spread over it.
  EXPECT_LE(a.abs().max().item<double>(), 1.0 / 16.0);
  EXPECT_GT(a.abs().max().item<double>(), 0.9 / 16.0);
  EXPECT_TRUE(at::equal(b, torch::zeros_like(b)));
  // Another A is drawn from its own generator.
  EXPECT_FALSE(at::equal(a, parameters["model.layers.2.self_attn.q_proj.lora_A.weight"]));
}

// y = W x + b + scale * B A x: scale alpha / r, or alpha / sqrt(r) with rsLoRA.
TEST(LoraTest, ScalesAsPeftDoes) {
  for (const bool rslora : {false, true}) {
    std::shared_ptr<models::CausalLM> model = MakeModel("qwen2-tiny");  // q_proj has a bias
    LoraConfig config = Config(R"pb(rank: 4 alpha: 6 target: "model.layers.1.self_attn.q_proj")pb");
    config.set_use_rslora(rslora);
    EXPECT_DOUBLE_EQ(Scale(config), rslora ? 3.0 : 1.5);
    auto lora = Lora::Create(*model, config);
    ASSERT_THAT(lora, IsOk());
    auto parameters = model->named_parameters();
    const std::string name = "model.layers.1.self_attn.q_proj";
    at::NoGradGuard no_grad;
    at::manual_seed(1);
    parameters[name + ".lora_B.weight"].normal_();
    const at::Tensor x = torch::randn({3, parameters[name + ".weight"].size(1)});
    const at::Tensor base = F::linear(x, parameters[name + ".weight"], parameters[name + ".bias"]);
    const at::Tensor expected =
        base + Scale(config) * x.mm(parameters[name + ".lora_A.weight"].t())
                                   .mm(parameters[name + ".lora_B.weight"].t());
    const at::Tensor got = (*lora)->Adapt(*Module(*model, name), x, base);
    EXPECT_TRUE(at::allclose(got, expected, 1e-5, 1e-5)) << "rslora " << rslora;
    // A projection without adapters passes its output through.
    const at::Tensor k = torch::randn({3, 5});
    EXPECT_TRUE(
        at::equal((*lora)->Adapt(*Module(*model, "model.layers.0.self_attn.q_proj"), x, k), k));
  }
}

// Dropout 0 is deterministic; dropout acts in training mode only.
TEST(LoraTest, DropoutOnlyInTraining) {
  const at::Tensor tokens = Tokens();
  std::map<double, at::Tensor> first, second;
  for (const double dropout : {0.0, 0.5}) {
    std::shared_ptr<models::CausalLM> model = MakeModel();
    LoraConfig config = Config(R"pb(rank: 4 alpha: 8 target: "*mlp.*")pb");
    config.set_dropout(dropout);
    auto lora = Lora::Create(*model, config);
    ASSERT_THAT(lora, IsOk());
    at::NoGradGuard no_grad;
    at::manual_seed(2);
    for (const auto& named : model->NamedParameters()) {
      if (named.name.find("lora_B") != std::string::npos) named.parameter.normal_(0, 0.1);
    }
    first[dropout] = model->Forward(tokens);
    second[dropout] = model->Forward(tokens);
    model->eval();
    if (dropout > 0) {
      EXPECT_TRUE(at::equal(model->Forward(tokens), first[0.0]));
    }
  }
  EXPECT_TRUE(at::equal(first[0.0], second[0.0]));
  EXPECT_FALSE(at::allclose(first[0.5], first[0.0]));
  EXPECT_FALSE(at::allclose(first[0.5], second[0.5]));  // new masks each forward
}

// What a step of the model with the adapters of `lora` (their B drawn away from zero) on
// Tokens() computes: the gradients of every trainable parameter, and the bytes that the graph
// of its forward holds until the backward.
struct AdapterStep {
  std::map<std::string, at::Tensor> gradients;
  int64_t graph_bytes = 0;
};

// With activation checkpointing under `policy` (nullopt: without), and with the adapted
// weights rounded through NF4 when `nf4_rounded_base` (what QLoRA computes with).
AdapterStep AdaptersStep(const std::string& lora,
                         std::optional<ActivationCheckpointingConfig::Policy> policy,
                         bool nf4_rounded_base = false) {
  std::shared_ptr<models::CausalLM> model = MakeModel();
  std::unique_ptr<checkpointing::ActivationCheckpointing> checkpointing;
  if (policy.has_value()) {
    checkpointing = std::make_unique<checkpointing::ActivationCheckpointing>(*model, *policy);
  }
  auto adapters = Lora::Create(*model, Config(lora));
  EXPECT_THAT(adapters, IsOk());
  {
    at::NoGradGuard no_grad;
    at::manual_seed(2);
    for (const auto& named : model->NamedParameters()) {
      if (named.name.find("lora_B") != std::string::npos) named.parameter.normal_(0, 0.1);
    }
    for (const std::string& name : (*adapters)->adapted()) {
      if (!nf4_rounded_base) break;
      at::Tensor weight = model->named_parameters()[name + ".weight"];
      weight.copy_(Nf4Dequantize(Nf4Quantize(weight, false), at::kFloat));
    }
  }
  const at::Tensor tokens = Tokens();
  at::manual_seed(5);
  AdapterStep step;
  base::AllocationCounter counter;
  at::Tensor loss;
  {
    const base::AllocationCounter::Scope counting(counter);
    loss = model->Loss(tokens, at::roll(tokens, -1, 1));
  }
  step.graph_bytes = counter.current();
  loss.backward();
  for (const auto& named : model->NamedParameters()) {
    if (named.parameter.requires_grad()) step.gradients[named.name] = named.parameter.grad();
  }
  return step;
}

std::map<std::string, at::Tensor> AdapterGradients(
    const std::string& lora, std::optional<ActivationCheckpointingConfig::Policy> policy) {
  return AdaptersStep(lora, policy).gradients;
}

// `actual` holds every gradient of `expected`, equal bit for bit.
void ExpectSameGradients(const std::map<std::string, at::Tensor>& actual,
                         const std::map<std::string, at::Tensor>& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (const auto& [name, want] : expected) {
    EXPECT_TRUE(at::equal(actual.at(name), want)) << name;
  }
}

// Full activation checkpointing recomputes a block with the dropout masks its forward drew:
// the same gradients, bit for bit.
TEST(LoraTest, CheckpointingRecomputesTheSameDropout) {
  constexpr char kLora[] = R"pb(rank: 4 alpha: 8 dropout: 0.3 target: "*_proj")pb";
  const auto plain = AdapterGradients(kLora, std::nullopt);
  EXPECT_EQ(plain.size(), 4u * 7u * 2u);
  ExpectSameGradients(AdapterGradients(kLora, ActivationCheckpointingConfig::FULL), plain);
}

// The base is frozen: no gradient for it; the optimizer owns exactly the adapters.
TEST(LoraTest, TheOptimizerOwnsExactlyTheAdapters) {
  OnOneRank([](parallel::DeviceMesh& mesh) {
    std::shared_ptr<models::CausalLM> model = MakeModel();
    auto preparation = Preparation::Begin(*model, mesh, "plan.prepare");
    ASSERT_THAT(preparation, IsOk());
    ASSERT_THAT((*preparation)->Apply(LoraStep(R"pb(rank: 2 alpha: 2 target: "*.0.*o_proj")pb")),
                IsOk());
    PrepareStep ddp;
    ddp.mutable_ddp()->set_mesh_dim("dp");
    ASSERT_THAT((*preparation)->Apply(ddp), IsOk());
    auto parameters = (*preparation)->TakeTrainableParameters();
    ASSERT_THAT(parameters, IsOk());
    std::vector<std::string> names;
    for (const auto& parameter : *parameters) names.push_back(parameter.name);
    EXPECT_THAT(names, ElementsAre("model.layers.0.self_attn.o_proj.lora_A.weight",
                                   "model.layers.0.self_attn.o_proj.lora_B.weight"));
    optim::OptimizerConfig config;
    ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString("adamw {}", &config));
    auto optimizer = optim::Optimizer::Create(*parameters, config);
    ASSERT_THAT(optimizer, IsOk());
    const at::Tensor tokens = Tokens();
    model->Loss(tokens, at::roll(tokens, -1, 1)).backward();
    ASSERT_THAT((*preparation)->BackwardStatus(), IsOk());
    for (const auto& named : model->NamedParameters()) {
      const bool adapter = named.name.find("lora_") != std::string::npos;
      EXPECT_EQ(named.parameter.requires_grad(), adapter) << named.name;
      EXPECT_EQ(named.parameter.grad().defined(), adapter) << named.name;
    }
    const at::Tensor b = model->named_parameters()["model.layers.0.self_attn.o_proj.lora_B.weight"];
    EXPECT_GT(b.grad().abs().max().item<double>(), 0.0);  // A's is zero while B is
    ASSERT_THAT((*optimizer)->Step(1e-2), IsOk());
    EXPECT_GT(b.abs().max().item<double>(), 0.0);
  });
}

// The frozen base is handed out for its values, apart from the optimizer's parameters; the
// merged export is a plain model that computes what the adapted one does.
TEST(LoraTest, FrozenPartsAndTheMergedModel) {
  OnOneRank([](parallel::DeviceMesh& mesh) {
    std::shared_ptr<models::CausalLM> model = MakeModel();
    auto preparation = Preparation::Begin(*model, mesh, "plan.prepare");
    ASSERT_THAT(preparation, IsOk());
    EXPECT_THAT((*preparation)->FrozenParameters(),
                StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("trainable ones first")));
    ASSERT_THAT((*preparation)->Apply(LoraStep(R"pb(rank: 4
                                                    alpha: 8
                                                    target: "*q_proj"
                                                    target: "*up_proj")pb")),
                IsOk());
    ASSERT_THAT((*preparation)->TakeTrainableParameters(), IsOk());
    auto frozen = (*preparation)->FrozenParameters();
    ASSERT_THAT(frozen, IsOk());
    std::set<std::string> frozen_names;
    for (const auto& parameter : *frozen) {
      EXPECT_FALSE(parameter.tensor.requires_grad()) << parameter.name;
      frozen_names.insert(parameter.name);
    }
    std::set<std::string> base_names;
    for (const auto& named : MakeModel()->NamedParameters()) base_names.insert(named.name);
    EXPECT_EQ(frozen_names, base_names);

    at::NoGradGuard no_grad;
    at::manual_seed(3);
    for (const auto& named : model->NamedParameters()) {
      if (named.name.find("lora_B") != std::string::npos) named.parameter.normal_(0, 0.1);
    }
    const at::Tensor tokens = Tokens();
    const at::Tensor adapted = model->Forward(tokens);
    auto merged = (*preparation)->MergedParameters();
    ASSERT_THAT(merged, IsOk());
    std::shared_ptr<models::CausalLM> plain = MakeModel();
    ASSERT_EQ(merged->size(), base_names.size());
    for (auto& item : plain->named_parameters()) item.value().copy_(merged->at(item.key()));
    EXPECT_FALSE(at::allclose(plain->Forward(tokens), MakeModel()->Forward(tokens)));
    EXPECT_TRUE(at::allclose(plain->Forward(tokens), adapted, 1e-4, 1e-5));
  });
}

ModelShape ShapeOf(models::CausalLM& model) {
  ModelShape shape;
  for (const auto& named : model.NamedParameters()) {
    shape.parameters += static_cast<double>(named.parameter.numel());
    shape.parameter_list.push_back(
        {named.name, named.parameter.sizes().vec(), model.SplitOf(named.name)});
  }
  shape.num_blocks = 4;
  return shape;
}

TEST(LoraTest, ATargetThatMatchesNothingIsAnErrorNamingIt) {
  std::shared_ptr<models::CausalLM> model = MakeModel();
  const PrepareStep step =
      LoraStep(R"pb(rank: 4 alpha: 8 target: "*q_proj" target: "*lm_head" target: "*qproj")pb");
  auto strategy = MakeStrategy(step);
  ASSERT_THAT(strategy, IsOk());
  const std::vector<base::Violation> violations =
      (*strategy)->Check(ShapeOf(*model), parallel::MeshConfig(), "plan.prepare[0]");
  ASSERT_EQ(violations.size(), 2u);
  EXPECT_EQ(violations[0].field, "plan.prepare[0].lora.target[1]");
  EXPECT_THAT(violations[0].message, HasSubstr("\"*lm_head\" matches no projection"));
  EXPECT_EQ(violations[1].field, "plan.prepare[0].lora.target[2]");
  // Applied, the same error, and the model is left as it was.
  OnOneRank([&](parallel::DeviceMesh& mesh) {
    auto preparation = Preparation::Begin(*model, mesh, "plan.prepare");
    ASSERT_THAT(preparation, IsOk());
    EXPECT_THAT((*preparation)->Apply(step),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("plan.prepare[0]: lora.target[1]: \"*lm_head\""),
                               HasSubstr("from \"model.layers.0.self_attn.q_proj\" to "
                                         "\"model.layers.3.mlp.down_proj\""))));
  });
  for (const auto& named : model->NamedParameters()) {
    EXPECT_TRUE(named.parameter.requires_grad()) << named.name;
    EXPECT_EQ(named.name.find("lora_"), std::string::npos) << named.name;
  }
}

TEST(LoraTest, InvalidConfigsNameTheirField) {
  for (const auto& [text, field] : std::vector<std::pair<std::string, std::string>>{
           {R"pb(alpha: 8 target: "*q_proj")pb", "lora.rank"},
           {R"pb(rank: 4 target: "*q_proj")pb", "lora.alpha"},
           {R"pb(rank: 4 alpha: inf target: "*q_proj")pb", "lora.alpha"},
           {R"pb(rank: 4 alpha: nan target: "*q_proj")pb", "lora.alpha"},
           {R"pb(rank: 4 alpha: 8 dropout: nan target: "*q_proj")pb", "lora.dropout"},
           {R"pb(rank: 4 alpha: 8 dropout: -inf target: "*q_proj")pb", "lora.dropout"},
           {R"pb(rank: 4 alpha: 8 dropout: 1 target: "*q_proj")pb", "lora.dropout"},
           {R"pb(rank: 4 alpha: 8)pb", "lora.target"},
           {R"pb(rank: 4 alpha: 8 target: "")pb", "lora.target[0]"}}) {
    EXPECT_THAT(MakeStrategy(LoraStep(text)),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(field + ":")))
        << text;
  }
}

// The adapters are the trainable parameters the later steps and the memory estimate count.
TEST(LoraTest, EstimateCountsTheAdapters) {
  std::shared_ptr<models::CausalLM> model = MakeModel();
  auto strategy =
      MakeStrategy(LoraStep(R"pb(rank: 8 alpha: 16 target: "*q_proj" target: "*k_proj")pb"));
  ASSERT_THAT(strategy, IsOk());
  const StepEstimate estimate = (*strategy)->Estimate(ShapeOf(*model), parallel::MeshConfig());
  const double adapters = 4 * 8 * ((256 + 256) + (256 + 128));
  EXPECT_EQ(estimate.added_parameters, adapters);
  ASSERT_TRUE(estimate.trainable_parameters.has_value());
  ASSERT_EQ(estimate.trainable_parameters->size(), 4u * 2u * 2u);
  EXPECT_EQ((*estimate.trainable_parameters)[3].name,
            "model.layers.0.self_attn.k_proj.lora_B.weight");
  EXPECT_EQ((*estimate.trainable_parameters)[3].shape, (std::vector<int64_t>{128, 8}));
  double trainable = 0;
  for (const auto& parameter : *estimate.trainable_parameters) trainable += parameter.numel();
  EXPECT_EQ(trainable, adapters);
  EXPECT_THAT(estimate.description, AllOf(HasSubstr("on 8 projections"), HasSubstr("28.7K")));
}

// QLoRA: the targeted projections compute with their NF4-dequantized weights, exactly what
// a model whose weights were replaced by Nf4Dequantize(Nf4Quantize(w)) computes, with and
// without double quantization; their weights leave the parameters for buffers of 0.5 byte a
// weight plus the scales; the adapters train and the base gets no gradient.
TEST(QLoraTest, ComputesTheDequantizedBaseFromHalfAByteAWeight) {
  const at::Tensor tokens = Tokens();
  for (const bool double_quant : {false, true}) {
    SCOPED_TRACE(double_quant ? "double quantization" : "fp32 maxima");
    std::shared_ptr<models::CausalLM> model = MakeModel();
    std::shared_ptr<models::CausalLM> expected = MakeModel();
    LoraConfig config = Config(R"pb(rank: 4 alpha: 8 target: "*q_proj" target: "*mlp.*")pb");
    auto plain = Lora::Create(*expected, config);
    ASSERT_THAT(plain, IsOk());
    {
      at::NoGradGuard no_grad;
      for (const std::string& name : (*plain)->adapted()) {
        at::Tensor weight = expected->named_parameters()[name + ".weight"];
        weight.copy_(Nf4Dequantize(Nf4Quantize(weight, double_quant), at::kFloat));
      }
    }
    config.set_base_quantization(LoraConfig::NF4);
    config.set_double_quant(double_quant);
    const std::set<std::string> before = [&] {
      std::set<std::string> names;
      for (const auto& named : model->NamedParameters()) names.insert(named.name);
      return names;
    }();
    auto lora = Lora::Create(*model, config);
    ASSERT_THAT(lora, IsOk());
    ASSERT_EQ((*lora)->adapted().size(), 4u * 4u);
    {
      at::NoGradGuard no_grad;
      EXPECT_TRUE(at::equal(model->Forward(tokens), expected->Forward(tokens)));
      EXPECT_FALSE(at::equal(model->Forward(tokens), MakeModel()->Forward(tokens)));
    }
    // The weights are buffers now: 0.5 byte a weight, 4 bytes a block of 64 (or 1 byte a
    // block and 4 per 256 blocks).
    std::set<std::string> listed;
    for (const auto& named : model->NamedParameters()) listed.insert(named.name);
    auto buffers = model->named_buffers();
    for (const std::string& name : (*lora)->adapted()) {
      EXPECT_EQ(listed.count(name + ".weight"), 0u) << name;
      EXPECT_EQ(before.count(name + ".weight"), 1u) << name;
      const int64_t numel = name.find("q_proj") != std::string::npos ? 256 * 256 : 256 * 688;
      const at::Tensor packed = buffers[name + ".weight_nf4"];
      EXPECT_EQ(packed.scalar_type(), at::kByte);
      EXPECT_EQ(packed.numel() * packed.element_size(), numel / 2) << name;
      int64_t scale_bytes = 0;
      for (const char* scales : {".weight_absmax", ".weight_absmax_codes", ".weight_absmax_scales",
                                 ".weight_absmax_offset"}) {
        if (buffers.contains(name + scales)) {
          const at::Tensor tensor = buffers[name + scales];
          scale_bytes += tensor.numel() * tensor.element_size();
        }
      }
      EXPECT_EQ(scale_bytes,
                double_quant ? numel / 64 + 4 * ((numel / 64 + 255) / 256) + 4 : numel / 64 * 4)
          << name;
      EXPECT_EQ(packed.numel() + scale_bytes, Nf4Bytes(numel, double_quant));
    }
    // Adapters train; nothing of the base gets a gradient.
    at::manual_seed(2);
    {
      at::NoGradGuard no_grad;
      for (const auto& named : model->NamedParameters()) {
        if (named.name.find("lora_B") != std::string::npos) named.parameter.normal_(0, 0.1);
      }
    }
    model->Loss(tokens, at::roll(tokens, -1, 1)).backward();
    for (const auto& named : model->NamedParameters()) {
      const bool adapter = named.name.find("lora_") != std::string::npos;
      EXPECT_EQ(named.parameter.grad().defined(), adapter) << named.name;
    }
    for (const auto& item : buffers) {
      EXPECT_FALSE(item.value().requires_grad()) << item.key();
      EXPECT_FALSE(item.value().grad().defined()) << item.key();
    }
    const at::Tensor a = model->named_parameters()["model.layers.1.mlp.down_proj.lora_A.weight"];
    EXPECT_GT(a.grad().abs().max().item<double>(), 0.0);
  }
}

// QLoRA computes what LoRA over the NF4-rounded base computes, gradients bit for bit, and
// keeps no dequantized weight for the backward: its graph holds what LoRA's holds (the
// dequantized weights of the 4 blocks' 7 projections would be 12.6 MB more).
TEST(QLoraTest, ComputesLoraOverTheRoundedBaseKeepingNoDequantizedWeight) {
  const AdapterStep qlora =
      AdaptersStep(R"pb(rank: 4 alpha: 8 target: "*_proj" base_quantization: NF4)pb", std::nullopt);
  const AdapterStep lora = AdaptersStep(R"pb(rank: 4 alpha: 8 target: "*_proj")pb", std::nullopt,
                                        /*nf4_rounded_base=*/true);
  ExpectSameGradients(qlora.gradients, lora.gradients);
  std::cout << "graph between forward and backward: QLoRA " << qlora.graph_bytes << " bytes, LoRA "
            << lora.graph_bytes << " bytes\n";
  EXPECT_LE(qlora.graph_bytes, lora.graph_bytes + 64 * 1024);
}

// Under selective activation checkpointing (the projections' outputs kept) QLoRA's gradients
// are those without checkpointing, bit for bit.
TEST(QLoraTest, SelectiveCheckpointingKeepsTheGradients) {
  constexpr char kQLora[] = R"pb(rank: 4 alpha: 8 target: "*_proj" base_quantization: NF4)pb";
  const auto plain = AdapterGradients(kQLora, std::nullopt);
  EXPECT_EQ(plain.size(), 4u * 7u * 2u);
  ExpectSameGradients(AdapterGradients(kQLora, ActivationCheckpointingConfig::SELECTIVE), plain);
}

// The held weights are frozen parts with a `store`: values stored there are quantized and
// computed with; the whole parameters hold them dequantized, and the merged export folds the
// adapters into the dequantized weight.
TEST(QLoraTest, StoredValuesAreQuantizedAndMergedDequantized) {
  OnOneRank([](parallel::DeviceMesh& mesh) {
    std::shared_ptr<models::CausalLM> model = MakeModel();
    auto preparation = Preparation::Begin(*model, mesh, "plan.prepare");
    ASSERT_THAT(preparation, IsOk());
    ASSERT_THAT((*preparation)->Apply(LoraStep(R"pb(rank: 4
                                                    alpha: 8
                                                    target: "*v_proj"
                                                    base_quantization: NF4
                                                    double_quant: true)pb")),
                IsOk());
    ASSERT_THAT((*preparation)->TakeTrainableParameters(), IsOk());
    auto frozen = (*preparation)->FrozenParameters();
    ASSERT_THAT(frozen, IsOk());
    std::set<std::string> frozen_names;
    std::shared_ptr<models::CausalLM> other = MakeModel("tiny");
    {
      at::NoGradGuard no_grad;
      at::manual_seed(9);
      for (auto& item : other->named_parameters()) item.value().normal_(0, 0.05);
    }
    const auto other_parameters = other->named_parameters();
    for (const parallel::TrainableParameter& part : *frozen) {
      frozen_names.insert(part.name);
      const bool held = part.name.find("v_proj.weight") != std::string::npos;
      EXPECT_EQ(static_cast<bool>(part.store), held) << part.name;
      if (!held) continue;
      EXPECT_EQ(part.tensor.numel(), 0);
      EXPECT_EQ(part.slice.global_shape, (std::vector<int64_t>{128, 256}));
      part.store(other_parameters[part.name]);
    }
    std::set<std::string> base_names;
    for (const auto& named : MakeModel()->NamedParameters()) base_names.insert(named.name);
    EXPECT_EQ(frozen_names, base_names);

    auto full = (*preparation)->FullParameters();
    ASSERT_THAT(full, IsOk());
    const std::string name = "model.layers.2.self_attn.v_proj.weight";
    const at::Tensor quantized =
        Nf4Dequantize(Nf4Quantize(other_parameters[name], true), at::kFloat);
    EXPECT_TRUE(at::equal(full->at(name), quantized));

    at::NoGradGuard no_grad;
    at::manual_seed(3);
    for (const auto& named : model->NamedParameters()) {
      if (named.name.find("lora_B") != std::string::npos) named.parameter.normal_(0, 0.1);
    }
    const at::Tensor tokens = Tokens();
    const at::Tensor adapted = model->Forward(tokens);
    auto merged = (*preparation)->MergedParameters();
    ASSERT_THAT(merged, IsOk());
    ASSERT_EQ(merged->size(), base_names.size());
    auto parameters = model->named_parameters();
    const at::Tensor delta = at::mm(parameters["model.layers.2.self_attn.v_proj.lora_B.weight"],
                                    parameters["model.layers.2.self_attn.v_proj.lora_A.weight"]);
    EXPECT_TRUE(at::allclose(merged->at(name), quantized + 2.0 * delta, 1e-5, 1e-7));
    std::shared_ptr<models::CausalLM> plain = MakeModel();
    for (auto& item : plain->named_parameters()) item.value().copy_(merged->at(item.key()));
    EXPECT_TRUE(at::allclose(plain->Forward(tokens), adapted, 1e-4, 1e-5));
  });
}

TEST(QLoraTest, DoubleQuantNeedsNf4AndTheEstimateSaysNf4) {
  EXPECT_THAT(
      MakeStrategy(LoraStep(R"pb(rank: 4 alpha: 8 target: "*q_proj" double_quant: true)pb")),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("lora.double_quant:")));
  std::shared_ptr<models::CausalLM> model = MakeModel();
  auto strategy =
      MakeStrategy(LoraStep(R"pb(rank: 8 alpha: 16 target: "*q_proj" base_quantization: NF4)pb"));
  ASSERT_THAT(strategy, IsOk());
  const StepEstimate estimate = (*strategy)->Estimate(ShapeOf(*model), parallel::MeshConfig());
  // 4 q_proj of 256 x 256: 128 KiB in NF4 (+ 16 KiB of maxima) instead of 1 MiB in fp32.
  EXPECT_THAT(estimate.description,
              HasSubstr("the 262.1K weights of the targeted projections in NF4: 144.0 KiB "
                        "(0.562 bytes a weight) instead of 1.0 MiB"));
  // A rank holding half of each fp32 parameter keeps half of the NF4 bytes in their place.
  ASSERT_TRUE(estimate.memory_on_rank);
  const std::vector<MemoryTerm> terms =
      estimate.memory_on_rank({.parameter_fraction = 0.5, .parameter_element_bytes = 4});
  ASSERT_EQ(terms.size(), 1u);
  EXPECT_EQ(terms[0].part, MemoryTerm::Part::kParameters);
  EXPECT_EQ(terms[0].bytes, (144 * 1024 - 4 * 256 * 256 * 4) * 0.5);
}

// The violations the strategy of `config` finds on the tiny model, one "field: message" each
// (starting_adapters.h).
std::vector<std::string> StepViolations(const LoraConfig& config) {
  PrepareStep step;
  *step.mutable_lora() = config;
  auto strategy = MakeStrategy(step);
  EXPECT_THAT(strategy, IsOk());
  std::vector<std::string> lines;
  for (const base::Violation& violation :
       (*strategy)->Check(ShapeOf(*MakeModel()), parallel::MeshConfig(), "plan.prepare[0]")) {
    lines.push_back(violation.ToString());
  }
  return lines;
}

constexpr char kSaved[] = R"pb(rank: 4 alpha: 8 target: "*q_proj" target: "*v_proj" seed: 3)pb";

// A folder holding the adapters of kSaved, trained away from their start (B no longer zero),
// and the logits of the adapted model on `tokens`.
std::pair<std::string, at::Tensor> SavedFolder(const at::Tensor& tokens) {
  const std::string dir = ::testing::TempDir() + "/starting_adapters";
  std::filesystem::remove_all(dir);
  std::shared_ptr<models::CausalLM> model = MakeModel();
  auto lora = Lora::Create(*model, Config(kSaved));
  EXPECT_THAT(lora, IsOk());
  std::vector<std::pair<std::string, at::Tensor>> adapters;
  at::manual_seed(5);
  at::NoGradGuard no_grad;
  for (const auto& named : model->NamedParameters()) {
    if (named.name.find(".lora_") == std::string::npos) continue;
    named.parameter.copy_(torch::randn_like(named.parameter) * 0.05);
    adapters.emplace_back(named.name, named.parameter);
  }
  EXPECT_THAT(wrap::lora::SavePeftAdapter(dir, Config(kSaved), adapters, "base"), IsOk());
  return {dir, model->Forward(tokens)};
}

TEST(StartingAdaptersTest, AStepStartsFromTheFolderAndComputesWhatItsModelDid) {
  at::manual_seed(11);
  const at::Tensor tokens = torch::randint(4096, {2, 16});
  const auto [dir, saved_logits] = SavedFolder(tokens);
  LoraConfig config = Config(kSaved);
  config.set_seed(99);      // the draw is not used
  config.set_dropout(0.1);  // the step's own
  config.set_initial_adapter_dir(dir);
  EXPECT_THAT(StepViolations(config), IsEmpty());
  std::shared_ptr<models::CausalLM> model = MakeModel();
  auto lora = Lora::Create(*model, config);
  ASSERT_THAT(lora, IsOk());
  model->eval();
  at::NoGradGuard no_grad;
  EXPECT_TRUE(at::equal(model->Forward(tokens), saved_logits));
  auto parameters = model->named_parameters();
  const at::Tensor b = parameters["model.layers.3.self_attn.v_proj.lora_B.weight"];
  EXPECT_TRUE(b.requires_grad());
  EXPECT_GT(b.abs().max().item<double>(), 0.0);
}

TEST(StartingAdaptersTest, AFolderThatDoesNotFitTheStepIsAViolationNamingWhy) {
  at::manual_seed(11);
  const std::string dir = SavedFolder(torch::randint(4096, {2, 16})).first;
  const std::string field = "plan.prepare[0].lora.initial_adapter_dir: " + dir + ": ";
  for (const auto& [text, why] : std::vector<std::pair<std::string, std::string>>{
           {R"pb(rank: 8 alpha: 8 target: "*q_proj" target: "*v_proj")pb",
            "its adapters have rank (r) 4, the step's rank is 8"},
           {R"pb(rank: 4 alpha: 16 target: "*q_proj" target: "*v_proj")pb",
            "its lora_alpha is 8, the step's alpha is 16"},
           {R"pb(rank: 4 alpha: 8 use_rslora: true target: "*q_proj" target: "*v_proj")pb",
            "its use_rslora is false, the step's true"},
           {R"pb(rank: 4 alpha: 8 target: "*q_proj")pb",
            "it adapts model.layers.0.self_attn.v_proj, which the step's targets (*q_proj) do "
            "not match"},
           {R"pb(rank: 4 alpha: 8 target: "*_proj")pb",
            "it has no adapters for model.layers.0.mlp.down_proj, which the step's targets "
            "(*_proj) match"}}) {
    LoraConfig config = Config(text);
    config.set_initial_adapter_dir(dir);
    EXPECT_THAT(StepViolations(config), ElementsAre(field + why)) << text;
    // Applied, the same error, and the model is left as it was.
    std::shared_ptr<models::CausalLM> model = MakeModel();
    EXPECT_THAT(Lora::Create(*model, config),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("lora.initial_adapter_dir: " + dir + ": " + why)));
    for (const auto& named : model->NamedParameters()) {
      EXPECT_TRUE(named.parameter.requires_grad()) << named.name;
    }
  }
  LoraConfig missing = Config(kSaved);
  missing.set_initial_adapter_dir(dir + "/nowhere");
  const std::vector<std::string> violations = StepViolations(missing);
  ASSERT_EQ(violations.size(), 1u);
  EXPECT_THAT(violations[0], HasSubstr("plan.prepare[0].lora.initial_adapter_dir: "));
  EXPECT_THAT(violations[0], HasSubstr(dir + "/nowhere/adapter_config.json"));
}

// The rule violations of the steps `text` gives, separated by ';', as one status's text.
std::string Violations(const std::string& text) {
  google::protobuf::RepeatedPtrField<PrepareStep> steps;
  for (absl::string_view one : absl::StrSplit(text, ';')) {
    EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(std::string(one), steps.Add()))
        << one;
  }
  return base::ViolationsToStatus(
             CheckSteps(**BuiltinRules(), steps, "plan.prepare", {"dp", "tp"}, "plan.mesh"))
      .ToString();
}

TEST(LoraRulesTest, LoraComesBeforeTensorParallelismFsdpAndDdpOnce) {
  const std::string lora = R"pb(lora { rank: 4 alpha: 8 target: "*q_proj" })pb";
  EXPECT_EQ(Violations(lora + ";fsdp { mesh_dim: \"dp\" }"), "OK");
  EXPECT_EQ(Violations(lora + ";ddp { mesh_dim: \"dp\" }"), "OK");
  EXPECT_EQ(Violations("activation_checkpointing { policy: SELECTIVE };" + lora +
                       ";fsdp { mesh_dim: \"dp\" }"),
            "OK");
  EXPECT_THAT(Violations("fsdp { mesh_dim: \"dp\" };" + lora),
              AllOf(HasSubstr("plan.prepare[0].fsdp: lora (plan.prepare[1]) must come before "
                              "fsdp"),
                    HasSubstr("(rule lora_before_fsdp)")));
  EXPECT_THAT(Violations("ddp { mesh_dim: \"dp\" };" + lora), HasSubstr("(rule lora_before_ddp)"));
  EXPECT_THAT(Violations(lora + ";" + lora),
              AllOf(HasSubstr("plan.prepare[1].lora: lora is applied 2 times"),
                    HasSubstr("(rule lora_at_most_once)")));
  EXPECT_EQ(Violations(lora + ";tensor_parallel { mesh_dim: \"tp\" };fsdp { mesh_dim: \"dp\" }"),
            "OK");
  EXPECT_THAT(Violations("tensor_parallel { mesh_dim: \"tp\" };" + lora),
              AllOf(HasSubstr("plan.prepare[0].tensor_parallel: lora (plan.prepare[1]) must come "
                              "before tensor_parallel"),
                    HasSubstr("(rule lora_before_tp)")));
  // QLoRA's held weights are blocks of flattened elements: DDP or FSDP, not tensor
  // parallelism.
  const std::string qlora =
      R"pb(lora { rank: 4 alpha: 8 target: "*q_proj" base_quantization: NF4 })pb";
  EXPECT_EQ(Violations(qlora + ";ddp { mesh_dim: \"dp\" }"), "OK");
  EXPECT_EQ(Violations(qlora + ";fsdp { mesh_dim: \"dp\" }"), "OK");
  EXPECT_THAT(Violations(qlora + ";tensor_parallel { mesh_dim: \"tp\" }"),
              AllOf(HasSubstr("plan.prepare[1].tensor_parallel: tensor_parallel cannot be "
                              "applied with qlora (plan.prepare[0])"),
                    HasSubstr("(rule qlora_without_tp)")));
}

}  // namespace
}  // namespace plait::wrap::lora
