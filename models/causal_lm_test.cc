#include "models/causal_lm.h"

#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ATen/Context.h"
#include "ATen/Parallel.h"
#include "ATen/core/Tensor.h"
#include "ATen/ops/allclose.h"
#include "ATen/ops/cat.h"
#include "ATen/ops/equal.h"
#include "ATen/ops/matmul.h"
#include "ATen/ops/softmax.h"
#include "ATen/ops/stack.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/estimates.h"
#include "models/model_config.h"
#include "models/testing_activations.h"
#include "models/testing_gradients.h"
#include "parallel/tensor_slice.h"
#include "torch/csrc/autograd/generated/variable_factories.h"
#include "torch/nn/module.h"
#include "torch/optim/adam.h"

namespace plait::models {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::base::testing::StatusIs;
using ::plait::models::testing::BackwardOf;
using ::plait::models::testing::ExpectClose;
using ::plait::models::testing::LossAndGradients;
using ::testing::DoubleNear;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A model small enough for a test: 2 layers, hidden 64, 4 heads of 16, 2 kv heads.
ModelConfig Small(const std::string& type = "llama") {
  ModelConfig config = PresetConfig("tiny").value();
  config.set_model_type(type);
  config.set_hidden_size(64);
  config.set_intermediate_size(96);
  config.set_num_hidden_layers(2);
  config.set_num_attention_heads(4);
  config.set_num_key_value_heads(2);
  config.set_vocab_size(97);
  return config;
}

std::shared_ptr<CausalLM> Make(const ModelConfig& config, uint64_t seed = 7) {
  InitConfig init;
  init.set_seed(seed);
  absl::StatusOr<std::shared_ptr<CausalLM>> model = CausalLM::Create(config, init);
  EXPECT_THAT(model, IsOk());
  return *model;
}

at::Tensor Tokens(int64_t batch, int64_t seq, int64_t vocab, uint64_t seed) {
  at::manual_seed(seed);
  return torch::randint(vocab, {batch, seq}, at::kLong);
}

// The attention context CausalLM builds, for the tests that run Attention alone.
ForwardContext ContextFor(const ModelConfig& config, int64_t seq, int64_t groups) {
  ForwardContext context;
  context.rope = MakeRotaryTables(RotaryInverseFrequencies(config), torch::arange(seq));
  context.mask =
      torch::full({seq, seq}, -std::numeric_limits<float>::infinity()).triu(1).repeat({groups, 1});
  return context;
}

TEST(CausalLMTest, OutputShapeAndParameterCount) {
  for (const std::string type : {"llama", "qwen2"}) {
    for (bool tie : {false, true}) {
      ModelConfig config = Small(type);
      config.set_tie_word_embeddings(tie);
      std::shared_ptr<CausalLM> model = Make(config);
      const at::Tensor logits = model->Forward(Tokens(3, 10, 97, 1));
      EXPECT_THAT(logits.sizes(), ElementsAre(3, 10, 97));
      int64_t count = 0;
      for (const at::Tensor& p : model->parameters()) count += p.numel();
      EXPECT_EQ(count, NumParameters(config)) << type << " tie " << tie;
    }
  }
}

TEST(CausalLMTest, HuggingFaceParameterNames) {
  std::shared_ptr<CausalLM> qwen = Make(Small("qwen2"));
  std::vector<std::string> names;
  for (const auto& item : qwen->named_parameters()) names.push_back(item.key());
  EXPECT_THAT(names, ::testing::IsSupersetOf({
                         "model.embed_tokens.weight",
                         "model.layers.0.input_layernorm.weight",
                         "model.layers.0.self_attn.q_proj.weight",
                         "model.layers.0.self_attn.q_proj.bias",
                         "model.layers.1.self_attn.v_proj.bias",
                         "model.layers.1.self_attn.o_proj.weight",
                         "model.layers.1.post_attention_layernorm.weight",
                         "model.layers.1.mlp.gate_proj.weight",
                         "model.layers.1.mlp.up_proj.weight",
                         "model.layers.1.mlp.down_proj.weight",
                         "model.norm.weight",
                         "lm_head.weight",
                     }));
  EXPECT_THAT(names, ::testing::Not(::testing::Contains("model.layers.0.self_attn.o_proj.bias")));
  std::shared_ptr<CausalLM> llama = Make(Small("llama"));
  for (const auto& item : llama->named_parameters()) {
    EXPECT_THAT(item.key(), ::testing::Not(HasSubstr("bias")));
  }
}

TEST(CausalLMTest, ChangingATokenChangesNoEarlierLogit) {
  std::shared_ptr<CausalLM> model = Make(Small());
  at::NoGradGuard no_grad;
  const at::Tensor tokens = Tokens(2, 12, 97, 2);
  const at::Tensor before = model->Forward(tokens);
  for (int64_t t : {0, 5, 11}) {
    at::Tensor changed = tokens.clone();
    changed.index_put_({torch::indexing::Slice(), t},
                       (tokens.index({torch::indexing::Slice(), t}) + 1) % 97);
    const at::Tensor after = model->Forward(changed);
    const auto earlier = torch::indexing::Slice(0, t);
    EXPECT_TRUE(at::equal(after.index({torch::indexing::Slice(), earlier}),
                          before.index({torch::indexing::Slice(), earlier})))
        << "t = " << t;
    EXPECT_FALSE(at::allclose(after.index({torch::indexing::Slice(), t}),
                              before.index({torch::indexing::Slice(), t})))
        << "t = " << t;
  }
}

// Multi-head attention written out head by head, with kv head h / (heads / kv_heads) serving
// query head h (HF's repeat_kv), rotary embeddings and a causal softmax.
at::Tensor ReferenceAttention(Attention& attention, const ModelConfig& config,
                              const at::Tensor& x) {
  const int64_t batch = x.size(0), seq = x.size(1), d = attention.head_dim();
  const int64_t heads = attention.local_heads(), groups = heads / attention.local_kv_heads();
  const RotaryTables rope = MakeRotaryTables(RotaryInverseFrequencies(config), torch::arange(seq));
  const at::Tensor q =
      ApplyRotary(attention.q_proj(x).view({batch, seq, heads, d}), rope.cos, rope.sin);
  const at::Tensor k =
      ApplyRotary(attention.k_proj(x).view({batch, seq, heads / groups, d}), rope.cos, rope.sin);
  const at::Tensor v = attention.v_proj(x).view({batch, seq, heads / groups, d});
  std::vector<at::Tensor> outputs;
  for (int64_t h = 0; h < heads; ++h) {
    const at::Tensor qh = q.select(2, h);           // [B, T, D]
    const at::Tensor kh = k.select(2, h / groups);  // [B, T, D]
    const at::Tensor vh = v.select(2, h / groups);
    at::Tensor scores = at::matmul(qh, kh.transpose(1, 2)) / std::sqrt(double(d));
    const at::Tensor future = torch::ones({seq, seq}, at::kBool).triu(1);
    scores = scores.masked_fill(future, -std::numeric_limits<float>::infinity());
    outputs.push_back(at::matmul(at::softmax(scores, -1), vh));
  }
  return attention.o_proj(at::cat(outputs, -1));
}

TEST(AttentionTest, EqualsHeadByHeadReference) {
  at::manual_seed(3);
  for (int64_t kv_heads : {4, 2, 1}) {  // plain multi-head, grouped, multi-query
    ModelConfig config = Small("qwen2");
    config.set_num_key_value_heads(kv_heads);
    Attention attention(config);
    const at::Tensor x = torch::randn({2, 9, 64});
    const at::Tensor out = attention.forward(x, ContextFor(config, 9, 4 / kv_heads));
    EXPECT_TRUE(at::allclose(out, ReferenceAttention(attention, config, x), 1e-4, 1e-5))
        << "kv heads " << kv_heads;
  }
}

// Tensor parallelism's view of attention: each of two shards holds half the heads (rows of
// q/k/v, columns of o_proj); after SetLocalHeads their partial outputs sum to the full one.
TEST(AttentionTest, ShardedHeadsSumToTheFullOutput) {
  at::manual_seed(4);
  const ModelConfig config = Small();
  Attention full(config);
  const at::Tensor x = torch::randn({2, 7, 64});
  const ForwardContext context = ContextFor(config, 7, 2);
  const at::Tensor expected = full.forward(x, context);
  at::Tensor sum = torch::zeros_like(expected);
  at::NoGradGuard no_grad;
  for (int64_t shard = 0; shard < 2; ++shard) {
    Attention part(config);
    ASSERT_THAT(part.SetLocalHeads(2, 1), IsOk());
    part.q_proj->weight = full.q_proj->weight.narrow(0, shard * 32, 32);
    part.k_proj->weight = full.k_proj->weight.narrow(0, shard * 16, 16);
    part.v_proj->weight = full.v_proj->weight.narrow(0, shard * 16, 16);
    part.o_proj->weight = full.o_proj->weight.narrow(1, shard * 32, 32);
    sum += part.forward(x, context);
  }
  EXPECT_TRUE(at::allclose(sum, expected, 1e-4, 1e-5));
  Attention bad(config);
  EXPECT_THAT(bad.SetLocalHeads(3, 2), StatusIs(absl::StatusCode::kInvalidArgument,
                                                HasSubstr("kv heads must divide heads")));
}

TEST(CausalLMTest, LossAtInitialisationIsNearLogVocab) {
  ModelConfig config = Small();
  config.set_vocab_size(1000);
  std::shared_ptr<CausalLM> model = Make(config);
  const at::Tensor tokens = Tokens(4, 32, 1000, 5);
  const double loss = model->Loss(tokens, Tokens(4, 32, 1000, 6)).item<double>();
  EXPECT_NEAR(loss, std::log(1000.0), 0.1);
}

// The loss and every gradient of `model` for one batch with a few targets ignored.
LossAndGradients ForwardBackward(CausalLM& model) {
  const at::Tensor tokens = Tokens(2, 24, 97, 9);
  at::Tensor targets = Tokens(2, 24, 97, 10);
  targets.index_put_({0, torch::indexing::Slice(0, 3)}, kIgnoreIndex);
  return BackwardOf(model, model.Loss(tokens, targets));
}

// The generic ops (models/internal/ops.h), the path a GPU takes, run here on the CPU against
// the fused CPU kernels: the same loss and gradients for Llama and Qwen2 (biases) with
// grouped-query heads and rotary embeddings, in fp32 to fp32's rounding and in bf16 to bf16's.
TEST(CausalLMTest, GenericOpsMatchTheFusedKernels) {
  for (const std::string type : {"llama", "qwen2"}) {
    for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      SCOPED_TRACE(type + " " + c10::toString(dtype));
      std::shared_ptr<CausalLM> fused = Make(Small(type));
      std::shared_ptr<CausalLM> generic = Make(Small(type));
      fused->to(dtype);
      generic->to(dtype);
      internal::UseGenericOps(*generic, true);
      const LossAndGradients want = ForwardBackward(*fused);
      const LossAndGradients got = ForwardBackward(*generic);
      ExpectClose(got, want, dtype == at::kFloat ? 1e-5 : 2e-2);
      // Two paths ran: their roundings differ.
      const std::string q_proj = "model.layers.0.self_attn.q_proj.weight";
      EXPECT_FALSE(at::equal(got.gradients.at(q_proj), want.gradients.at(q_proj)));
    }
  }
}

// bf16 (FSDP's mixed precision) on either path tracks the fp32 fused one to bf16's precision.
TEST(CausalLMTest, Bf16TracksFp32) {
  std::shared_ptr<CausalLM> fp32 = Make(Small());
  const LossAndGradients want = ForwardBackward(*fp32);
  for (const bool generic : {false, true}) {
    SCOPED_TRACE(generic ? "generic" : "fused");
    std::shared_ptr<CausalLM> bf16 = Make(Small());
    bf16->to(at::kBFloat16);
    internal::UseGenericOps(*bf16, generic);
    ExpectClose(ForwardBackward(*bf16), want, 5e-2);
  }
}

TEST(CausalLMTest, OverfitsOneBatch) {
  std::shared_ptr<CausalLM> model = Make(Small());
  const at::Tensor sequence = Tokens(2, 17, 97, 8);
  const auto all = torch::indexing::Slice();
  const at::Tensor inputs = sequence.index({all, torch::indexing::Slice(0, 16)});
  const at::Tensor targets = sequence.index({all, torch::indexing::Slice(1, 17)});
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(3e-3));
  double first = 0, last = 0;
  for (int step = 0; step < 150; ++step) {
    adam.zero_grad();
    const at::Tensor loss = model->Loss(inputs, targets);
    loss.backward();
    adam.step();
    (step == 0 ? first : last) = loss.item<double>();
  }
  EXPECT_GT(first, 4.0);
  EXPECT_LT(last, 0.05);
}

TEST(CausalLMTest, LossIgnoresIgnoreIndexAndMatchesSequenceLogProbs) {
  std::shared_ptr<CausalLM> model = Make(Small());
  const at::Tensor tokens = Tokens(1, 8, 97, 9);
  at::Tensor targets = Tokens(1, 8, 97, 10);
  targets.index_put_({0, torch::indexing::Slice(0, 3)}, kIgnoreIndex);
  const at::Tensor loss = model->Loss(tokens, targets);
  const at::Tensor log_probs = model->SequenceLogProbs(tokens, targets);
  ASSERT_THAT(log_probs.sizes(), ElementsAre(1));
  EXPECT_NEAR(loss.item<double>(), -log_probs[0].item<double>() / 5.0, 1e-5);
  // Ignored positions contribute nothing: changing their targets changes nothing.
  at::Tensor other = targets.clone();
  other.index_put_({0, torch::indexing::Slice(0, 3)}, -7);
  EXPECT_NEAR(model->Loss(tokens, other, -7).item<double>(), loss.item<double>(), 1e-6);
  EXPECT_NEAR(model->SequenceLogProbs(tokens, other, -7)[0].item<double>(),
              log_probs[0].item<double>(), 1e-5);
}

// Positions of rows that each pack sequences of `lengths[b]`, as Hugging Face's position_ids.
at::Tensor PackedPositions(const std::vector<std::vector<int64_t>>& lengths) {
  std::vector<at::Tensor> rows;
  for (const std::vector<int64_t>& row : lengths) {
    std::vector<at::Tensor> parts;
    for (const int64_t length : row) parts.push_back(torch::arange(length, at::kLong));
    rows.push_back(at::cat(parts));
  }
  return at::stack(rows);
}

// Two rows of 17 tokens: sequences of 5, 1 and 9 tokens then 2 tokens of tail padding (a
// sequence of their own, its positions restarting), and sequences of 9 and 8. Packed, every
// sequence's logits are those it gets alone, and the gradient of the packed rows' summed token
// log-probabilities is the sum of the sequences' alone; on the fused kernels and the generic
// ops (the GPU's path: SDPA's boolean mask on LibTorch 2.x, the composite's additive one on
// 1.13).
TEST(CausalLMTest, PackedRowsMatchEachSequenceAlone) {
  const std::vector<std::vector<int64_t>> lengths = {{5, 1, 9, 2}, {9, 8}};
  const at::Tensor positions = PackedPositions(lengths);
  const at::Tensor tokens = Tokens(2, 17, 97, 11);
  at::Tensor targets = Tokens(2, 17, 97, 12);
  targets.index_put_({0, torch::indexing::Slice(15, 17)}, kIgnoreIndex);  // the padding
  for (const bool generic : {false, true}) {
    SCOPED_TRACE(generic ? "generic" : "fused");
    std::shared_ptr<CausalLM> packed = Make(Small());
    std::shared_ptr<CausalLM> alone = Make(Small());
    internal::UseGenericOps(*packed, generic);
    internal::UseGenericOps(*alone, generic);
    const at::Tensor logits = packed->Forward(tokens, positions);
    at::Tensor alone_log_probs = torch::zeros({}, at::kFloat);
    for (int64_t b = 0; b < 2; ++b) {
      int64_t start = 0;
      for (const int64_t length : lengths[b]) {
        SCOPED_TRACE("row " + std::to_string(b) + " from " + std::to_string(start));
        const at::Tensor own_tokens = tokens.narrow(0, b, 1).narrow(1, start, length);
        const at::Tensor own_targets = targets.narrow(0, b, 1).narrow(1, start, length);
        const at::Tensor own = alone->Forward(own_tokens).detach();
        EXPECT_TRUE(at::allclose(logits.narrow(0, b, 1).narrow(1, start, length), own,
                                 /*rtol=*/1e-5, /*atol=*/1e-5));
        alone_log_probs = alone_log_probs + alone->TokenLogProbs(own_tokens, own_targets).sum();
        start += length;
      }
    }
    const at::Tensor packed_log_probs =
        packed->TokenLogProbs(tokens, targets, kIgnoreIndex, positions);
    ASSERT_THAT(packed_log_probs.sizes(), ElementsAre(2, 17));
    EXPECT_TRUE(at::equal(packed_log_probs[0].narrow(0, 15, 2), torch::zeros({2})));
    // As losses (ExpectClose's tolerance is relative to a positive loss).
    ExpectClose(BackwardOf(*packed, -packed_log_probs.sum()), BackwardOf(*alone, -alone_log_probs),
                1e-5);
    // The sequences' sum, and the packed row's mean loss over what it scores.
    EXPECT_NEAR(packed_log_probs.sum().item<double>(), alone_log_probs.item<double>(), 1e-3);
    EXPECT_NEAR(packed->Loss(tokens, targets, kIgnoreIndex, positions).item<double>(),
                -alone_log_probs.item<double>() / 32.0, 1e-5);
  }
}

// With positions, a document's logits do not depend on the documents before it in its row;
// without them (one sequence), they do: the test fails if the mask is ignored.
TEST(CausalLMTest, PositionsKeepDocumentsApart) {
  const at::Tensor positions = PackedPositions({{6, 10}});
  const at::Tensor tokens = Tokens(1, 16, 97, 13);
  at::Tensor changed = tokens.clone();
  changed.narrow(1, 0, 6).copy_((tokens.narrow(1, 0, 6) + 1) % 97);
  for (const bool generic : {false, true}) {
    SCOPED_TRACE(generic ? "generic" : "fused");
    std::shared_ptr<CausalLM> model = Make(Small());
    internal::UseGenericOps(*model, generic);
    at::NoGradGuard no_grad;
    const auto second = [](const at::Tensor& logits) { return logits.narrow(1, 6, 10); };
    EXPECT_TRUE(at::allclose(second(model->Forward(changed, positions)),
                             second(model->Forward(tokens, positions)), 1e-6, 1e-6));
    EXPECT_FALSE(
        at::allclose(second(model->Forward(changed)), second(model->Forward(tokens)), 1e-3, 1e-3));
  }
}

// A micro-batch that scores nothing (an SFT batch of prompts alone) adds nothing to a step:
// its loss is 0, not PyTorch's NaN, and its backward leaves every gradient 0, with the fused
// cross-entropy and with the chunked one (bf16, or the generic ops).
TEST(CausalLMTest, LossOfABatchWithNothingScoredIsZeroWithZeroGradients) {
  for (const auto& [dtype, generic] : std::vector<std::pair<at::ScalarType, bool>>{
           {at::kFloat, false}, {at::kBFloat16, false}, {at::kFloat, true}}) {
    SCOPED_TRACE(std::string(c10::toString(dtype)) + (generic ? " generic" : " fused"));
    std::shared_ptr<CausalLM> model = Make(Small());
    model->to(dtype);
    internal::UseGenericOps(*model, generic);
    const at::Tensor loss =
        model->Loss(Tokens(2, 8, 97, 9), torch::full({2, 8}, kIgnoreIndex, at::kLong));
    EXPECT_EQ(loss.item<float>(), 0.0f);
    loss.backward();
    for (const at::Tensor& parameter : model->parameters()) {
      ASSERT_TRUE(parameter.grad().defined());
      EXPECT_EQ(parameter.grad().abs().max().item<float>(), 0.0f);
    }
  }
}

TEST(CausalLMTest, InitialisationDependsOnSeedAndNameOnly) {
  const ModelConfig config = Small();
  ModelConfig deeper = config;
  deeper.set_num_hidden_layers(3);
  std::shared_ptr<CausalLM> a = Make(config, 11);
  std::shared_ptr<CausalLM> b = Make(deeper, 11);
  std::shared_ptr<CausalLM> c = Make(config, 12);
  const auto pa = a->named_parameters();
  const auto pb = b->named_parameters();
  const auto pc = c->named_parameters();
  for (const auto& item : pa) {
    EXPECT_TRUE(at::equal(item.value(), pb[item.key()])) << item.key();
    if (item.key().find("norm") == std::string::npos) {
      EXPECT_FALSE(at::equal(item.value(), pc[item.key()])) << item.key();
    }
  }
  EXPECT_TRUE(at::equal(pa["model.norm.weight"], torch::ones({64})));
  const at::Tensor embed = pa["model.embed_tokens.weight"];
  EXPECT_NEAR(embed.std().item<double>(), 0.02, 0.002);
  EXPECT_NEAR(embed.mean().item<double>(), 0.0, 0.002);
}

// Deferred initialisation: the same parameters as Create's, by name, shape and the requested
// dtype, each holding one element of memory until MaterializeParameters gives it its own;
// InitialValues gives each the values Create gives it; an invalid config is refused.
TEST(CausalLMTest, DeferredParametersHoldNoMemoryAndInitialValuesAreCreates) {
  const ModelConfig config = Small("qwen2");  // biases too
  InitConfig init;
  init.set_seed(5);
  init.set_scaled_residual_init(true);
  std::shared_ptr<CausalLM> created = CausalLM::Create(config, init).value();
  absl::StatusOr<std::shared_ptr<CausalLM>> deferred =
      CausalLM::CreateDeferred(config, at::TensorOptions().dtype(at::kBFloat16));
  ASSERT_THAT(deferred, IsOk());
  const auto parameters = (*deferred)->named_parameters();
  ASSERT_EQ(parameters.size(), created->named_parameters().size());
  for (const auto& item : created->named_parameters()) {
    const at::Tensor* parameter = parameters.find(item.key());
    ASSERT_NE(parameter, nullptr) << item.key();
    EXPECT_EQ(parameter->sizes(), item.value().sizes()) << item.key();
    EXPECT_EQ(parameter->scalar_type(), at::kBFloat16) << item.key();
    EXPECT_TRUE(parameter->requires_grad()) << item.key();
    EXPECT_EQ(parameter->storage().nbytes(), 2u) << item.key();
    EXPECT_TRUE(CausalLM::InitialValues(config, init, item.key(),
                                        parallel::TensorSlice::Whole(item.value().sizes()))
                    .equal(item.value()))
        << item.key();
  }
  (*deferred)->MaterializeParameters();
  for (const auto& item : (*deferred)->named_parameters()) {
    EXPECT_EQ(item.value().storage().nbytes(), 2u * item.value().numel()) << item.key();
    EXPECT_TRUE(item.value().eq(0).all().item<bool>()) << item.key();
  }
  ModelConfig invalid = config;
  invalid.set_num_key_value_heads(3);
  EXPECT_THAT(CausalLM::CreateDeferred(invalid, at::TensorOptions()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("num_key_value_heads")));
}

// A slice's initial values are the whole parameter's in the slice's box, however the box
// lies across the draw's tiles (along rows as FSDP shards, along columns as row-parallel
// tensor parallelism splits, both, a vector), whatever the threads; drawing it draws the
// tiles it touches, not the whole.
TEST(CausalLMTest, InitialValuesOfASliceAreTheWholesAndCostItsTiles) {
  ModelConfig config = Small();
  config.set_vocab_size(600);
  config.set_hidden_size(320);
  InitConfig init;
  init.set_seed(3);
  const std::string name = "model.embed_tokens.weight";
  const parallel::TensorSlice whole = parallel::TensorSlice::Whole({600, 320});
  const int64_t before_whole = internal::SeededDraws();
  const at::Tensor values = CausalLM::InitialValues(config, init, name, whole);
  EXPECT_EQ(internal::SeededDraws() - before_whole, 600 * 320);
  EXPECT_NEAR(values.std().item<double>(), 0.02, 0.001);
  // Tiles are independent draws, not copies of one another.
  EXPECT_FALSE(
      values.slice(0, 0, 16).slice(1, 0, 64).equal(values.slice(0, 16, 32).slice(1, 0, 64)));
  for (const parallel::TensorSlice& slice :
       {whole.Narrow(0, 300, 300), whole.Narrow(1, 100, 200),
        whole.Narrow(0, 15, 3).Narrow(1, 255, 2), whole.Narrow(0, 599, 1)}) {
    for (const int threads : {1, 2}) {
      const int previous = at::get_num_threads();
      at::set_num_threads(threads);
      const at::Tensor part = CausalLM::InitialValues(config, init, name, slice);
      at::set_num_threads(previous);
      EXPECT_TRUE(part.equal(parallel::NarrowTo(values, whole.box, slice.box)))
          << slice.DebugString() << " on " << threads << " threads";
    }
  }
  // Rows 300..599 touch the row tiles from rows 288 on, across all columns.
  const int64_t before_half = internal::SeededDraws();
  CausalLM::InitialValues(config, init, name, whole.Narrow(0, 300, 300));
  EXPECT_EQ(internal::SeededDraws() - before_half, (600 - 288) * 320);
  // A 2 x 2 box across four tiles (rows 0..31, columns 0..319) draws those four.
  const int64_t before_corner = internal::SeededDraws();
  CausalLM::InitialValues(config, init, name, whole.Narrow(0, 15, 2).Narrow(1, 255, 2));
  EXPECT_EQ(internal::SeededDraws() - before_corner, 32 * 320);
}

// Building a model deferred allocates none of its parameters, not even for a moment to run
// LibTorch's default initialisation: a model of over 4 TiB in fp32 is built.
TEST(CausalLMTest, DeferredModelsLargerThanMemoryAreBuilt) {
  ModelConfig config = Small();
  config.set_hidden_size(kMaxWidth / 16);
  config.set_intermediate_size(kMaxWidth);
  config.set_vocab_size(kMaxVocabOrPositions);
  config.set_tie_word_embeddings(false);
  absl::StatusOr<std::shared_ptr<CausalLM>> deferred =
      CausalLM::CreateDeferred(config, at::TensorOptions());
  ASSERT_THAT(deferred, IsOk());
  EXPECT_EQ((*deferred)->OutputWeight().sizes(),
            at::IntArrayRef({kMaxVocabOrPositions, kMaxWidth / 16}));
  EXPECT_EQ((*deferred)->decoder().layers[0]->mlp->up_proj->weight.sizes(),
            at::IntArrayRef({kMaxWidth, kMaxWidth / 16}));
}

TEST(CausalLMTest, ScaledResidualInit) {
  InitConfig init;
  init.set_std(0.05);
  init.set_scaled_residual_init(true);
  ModelConfig config = Small();
  config.set_intermediate_size(1024);
  std::shared_ptr<CausalLM> model = CausalLM::Create(config, init).value();
  auto params = model->named_parameters();
  EXPECT_NEAR(params["model.layers.0.mlp.down_proj.weight"].std().item<double>(), 0.05 / 2.0,
              0.002);
  EXPECT_NEAR(params["model.layers.0.mlp.up_proj.weight"].std().item<double>(), 0.05, 0.003);
}

TEST(CausalLMTest, CreateRejectsInvalidConfigs) {
  ModelConfig config = Small();
  config.set_num_key_value_heads(3);
  EXPECT_THAT(CausalLM::Create(config, InitConfig()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("num_key_value_heads")));
  InitConfig init;
  init.set_std(-1);
  EXPECT_THAT(CausalLM::Create(Small(), init),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("init.std")));
}

TEST(CausalLMTest, WrappableView) {
  std::shared_ptr<CausalLM> model = Make(Small());
  wrap::Wrappable& wrappable = *model;
  const std::vector<wrap::Wrappable::Unit> blocks = wrappable.Blocks();
  ASSERT_EQ(blocks.size(), 2u);
  EXPECT_EQ(blocks[0].name, "model.layers.0");
  EXPECT_EQ(blocks[1].module.get(), model->decoder().layers[1].get());
  std::vector<std::string> root;
  for (const auto& p : wrappable.RootParameters()) root.push_back(p.name);
  EXPECT_THAT(root,
              ElementsAre("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"));
  // Blocks and root together are every parameter, once.
  size_t in_blocks = 0;
  for (const auto& block : blocks) in_blocks += block.module->parameters().size();
  EXPECT_EQ(in_blocks + root.size(), wrappable.NamedParameters().size());
  EXPECT_EQ(wrappable.NamedParameters().size(), model->parameters().size());
  EXPECT_EQ(&wrappable.RootModule(), static_cast<torch::nn::Module*>(model.get()));
  EXPECT_THAT(wrappable.SetLocalHeads(2, 1), IsOk());
  EXPECT_EQ(model->decoder().layers[1]->self_attn->local_heads(), 2);
  // More shards than kv heads: one kv head per shard, shared.
  EXPECT_THAT(wrappable.SetLocalHeads(1, 1), IsOk());
  EXPECT_EQ(model->decoder().layers[1]->self_attn->local_kv_heads(), 1);
  EXPECT_THAT(wrappable.SetLocalHeads(2, 2),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("same shard count")));
  EXPECT_THAT(wrappable.SetLocalHeads(3, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("SetLocalHeads(3, 1)")));
}

// A model cut into pipeline stages (deferred models keeping their blocks, given their values
// by name) computes, stage by stage, the whole model's loss and gradients: each stage runs its
// blocks on the hidden state the stage before handed over and hands back its gradient. A model
// may hold several stages (an interleaved pipeline's rank), selected in turn. With tied
// embeddings the first and the last stage both hold the embedding, and their gradients sum to
// the whole model's.
TEST(CausalLMTest, PipelineStagesComputeTheWholeModel) {
  using Stages = std::vector<std::pair<int64_t, int64_t>>;
  struct Layout {
    std::string name;
    std::vector<Stages> models;        // the stages each model keeps
    std::vector<std::string> blocks1;  // the blocks model 1 holds
  };
  const std::vector<Layout> layouts = {
      {"one stage per model", {{{0, 1}}, {{1, 3}}, {{3, 4}}}, {"model.layers.1", "model.layers.2"}},
      {"two stages per model",
       {{{0, 1}, {2, 3}}, {{1, 2}, {3, 4}}},
       {"model.layers.1", "model.layers.3"}},
  };
  for (const bool tied : {false, true}) {
    for (const Layout& layout : layouts) {
      SCOPED_TRACE(absl::StrCat(tied ? "tied embeddings, " : "lm_head, ", layout.name));
      ModelConfig config = Small("qwen2");
      config.set_num_hidden_layers(4);
      config.set_tie_word_embeddings(tied);
      InitConfig init;
      init.set_seed(3);
      const at::Tensor tokens = Tokens(2, 17, 97, 9);
      at::Tensor targets = Tokens(2, 17, 97, 10);
      targets.index_put_({0, torch::indexing::Slice(0, 3)}, kIgnoreIndex);
      const at::Tensor positions = PackedPositions({{5, 1, 9, 2}, {9, 8}});

      std::shared_ptr<CausalLM> whole = CausalLM::Create(config, init).value();
      const at::Tensor whole_loss = whole->Loss(tokens, targets, kIgnoreIndex, positions);
      whole_loss.backward();

      std::vector<std::shared_ptr<CausalLM>> models;
      // (model, its stage) of each stage of the whole model, in block order.
      std::map<int64_t, std::pair<int, int>> stage_at_block;
      for (const Stages& stages : layout.models) {
        std::shared_ptr<CausalLM> model =
            CausalLM::CreateDeferred(config, at::TensorOptions()).value();
        ASSERT_THAT(model->KeepStages(stages), IsOk());
        model->MaterializeParameters();
        ASSERT_THAT(model->ResetParameters(init), IsOk());
        for (size_t i = 0; i < stages.size(); ++i) {
          stage_at_block[stages[i].first] = {static_cast<int>(models.size()), static_cast<int>(i)};
        }
        models.push_back(model);
      }
      std::vector<std::string> block_names;
      for (const wrap::Wrappable::Unit& block : models[1]->Blocks())
        block_names.push_back(block.name);
      EXPECT_EQ(block_names, layout.blocks1);

      // Forward stage by stage, each stage's input a leaf as a received tensor is; backward
      // from the loss, each stage's output given the gradient its next stage's input got.
      std::vector<at::Tensor> outputs, inputs(stage_at_block.size());
      at::Tensor loss;
      int stage = 0;
      const int last = static_cast<int>(stage_at_block.size()) - 1;
      for (const auto& [block, place] : stage_at_block) {
        CausalLM& model = *models[place.first];
        ASSERT_THAT(model.SelectStage(place.second), IsOk());
        EXPECT_EQ(model.HoldsInputLayers(), stage == 0) << "stage " << stage;
        EXPECT_EQ(model.HoldsOutputLayers(), stage == last) << "stage " << stage;
        if (stage > 0) {
          inputs[stage] = outputs[stage - 1].detach().requires_grad_(true);
          model.SetStageInput(inputs[stage]);
        }
        if (stage < last) {
          outputs.push_back(model.StageOutput(tokens, positions));
        } else {
          loss = model.Loss(tokens, targets, kIgnoreIndex, positions);
        }
        ++stage;
      }
      loss.backward();
      for (size_t i = outputs.size(); i-- > 0;) outputs[i].backward(inputs[i + 1].grad());
      EXPECT_NEAR(loss.item<double>(), whole_loss.item<double>(), 1e-6);

      // Every parameter is held by one model under the whole model's name (the tied
      // embedding by those of the first and the last stage), and its gradients sum to the
      // whole model's.
      std::map<std::string, at::Tensor> gradients;
      std::map<std::string, int> holders;
      for (const std::shared_ptr<CausalLM>& model : models) {
        for (const wrap::Wrappable::NamedParameter& item : model->NamedParameters()) {
          at::Tensor& sum = gradients[item.name];
          sum = sum.defined() ? sum + item.parameter.grad() : item.parameter.grad().clone();
          ++holders[item.name];
        }
      }
      const auto whole_parameters = whole->named_parameters();
      ASSERT_EQ(gradients.size(), whole_parameters.size());
      for (const auto& item : whole_parameters) {
        ASSERT_EQ(gradients.count(item.key()), 1u) << item.key();
        EXPECT_EQ(holders[item.key()], tied && item.key() == "model.embed_tokens.weight" ? 2 : 1)
            << item.key();
        EXPECT_TRUE(at::allclose(gradients[item.key()], item.value().grad(), 1e-5, 1e-7))
            << item.key();
      }
    }
  }
}

TEST(CausalLMTest, KeepStagesRefusesEmptyOutsideOrUnorderedStagesAndASecondCut) {
  ModelConfig config = Small();
  config.set_num_hidden_layers(3);
  std::shared_ptr<CausalLM> model = CausalLM::CreateDeferred(config, at::TensorOptions()).value();
  EXPECT_THAT(model->KeepStages({{1, 1}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("KeepStages([1, 1)): each stage holds blocks [begin, end) of the "
                                 "3, at least one, after the stage before")));
  EXPECT_THAT(model->KeepStages({{0, 4}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("KeepStages([0, 4))")));
  EXPECT_THAT(model->KeepStages({{-1, 1}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("KeepStages([-1, 1))")));
  EXPECT_THAT(
      model->KeepStages({{1, 2}, {0, 1}}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("KeepStages([1, 2), [0, 1))")));
  EXPECT_THAT(model->KeepStages({}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("keeps at least one stage")));
  ASSERT_THAT(model->KeepStages({{1, 2}}), IsOk());
  EXPECT_THAT(model->KeepStages({{1, 2}}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("the model was already cut to KeepStages([1, 2))")));
  EXPECT_THAT(model->SelectStage(1), StatusIs(absl::StatusCode::kInvalidArgument,
                                              "SelectStage(1): the model holds 1 stage(s)"));
  for (const wrap::Wrappable::NamedParameter& item : model->NamedParameters()) {
    EXPECT_TRUE(absl::StartsWith(item.name, "model.layers.1.")) << item.name;
  }
}

TEST(CausalLMTest, UnitHooksRunAroundEveryUnitInOrder) {
  std::shared_ptr<CausalLM> model = Make(Small());
  const at::Tensor tokens = Tokens(2, 5, 97, 1);
  const at::Tensor plain = model->Forward(tokens);
  std::vector<std::string> calls;
  model->SetUnitHooks({
      [&](int unit) { calls.push_back("before " + std::to_string(unit)); },
      [&](int unit, at::Tensor output) {
        calls.push_back("after " + std::to_string(unit));
        return unit == wrap::Wrappable::kRootUnit ? output * 2 : output;
      },
  });
  const at::Tensor hooked = model->Forward(tokens);
  EXPECT_THAT(calls,
              ElementsAre("before -1", "before 0", "after 0", "before 1", "after 1", "after -1"));
  EXPECT_TRUE(at::allclose(hooked, plain * 2));  // the model continues with after's result
  model->SetUnitHooks({});
  EXPECT_TRUE(at::equal(model->Forward(tokens), plain));
}

// 6N + 6Lsh: the matmuls' parameters and the causal half of attention's score matrix.
TEST(FlopsTest, CountsMatmulsAndCausalAttention) {
  ModelConfig config = Small();  // hidden 64, kv width 32, inner 96, 2 layers, vocab 97
  const double per_layer = 64.0 * 64 * 2 + 64.0 * 32 * 2 + 3.0 * 64 * 96;
  const double expected = 6.0 * (2 * per_layer + 64.0 * 97) + 6.0 * 2 * 16 * 64;
  EXPECT_DOUBLE_EQ(TrainingFlopsPerToken(config, 16), expected);
}

// Qwen3's heads are wider than hidden / heads: q_proj, o_proj and attention count their
// width. A mixture of experts counts the parameters a token meets: the router and its
// num_experts_per_tok experts, not all of them.
TEST(FlopsTest, CountsTheQueryHeadsWidthAndTheActiveExperts) {
  ModelConfig config = *PresetConfig("qwen3-moe-tiny");  // hidden 128, heads 4 x 64, kv 2 x 64
  config.set_num_hidden_layers(2);
  config.add_mlp_only_layers(0);  // layer 0 dense (intermediate 384), layer 1 8 experts, 2 a token
  const double attention = 128.0 * 256 * 2 + 128.0 * 128 * 2;
  const double dense = 3.0 * 128 * 384;
  const double moe = 128.0 * 8 + 2 * 3.0 * 128 * 128;
  const double expected = 6.0 * (2 * attention + dense + moe + 128.0 * 4096) + 6.0 * 2 * 16 * 256;
  EXPECT_DOUBLE_EQ(TrainingFlopsPerToken(config, 16), expected);
}

// The activations a step holds at its peak, measured as LibTorch's CPU allocator hands them
// out, against the estimate derived from what the ops save: in fp32 and bf16, with the fused
// CPU kernels and with the generic ops a GPU runs (the composite forms, and LibTorch 2.x's
// fused attention where it has one), whose estimate is the GPU's. The parameters' gradients
// exist before the measured step, so only the step's own allocations count.
TEST(ActivationBytesTest, IsWhatAStepHoldsAtItsPeak) {
  constexpr int64_t kBatch = 4;
  constexpr int64_t kSeqLen = 64;
  for (const auto& [dtype, generic] :
       std::vector<std::pair<at::ScalarType, bool>>{{at::kFloat, false},
                                                    {at::kBFloat16, false},
                                                    {at::kFloat, true},
                                                    {at::kBFloat16, true}}) {
    SCOPED_TRACE(std::string(c10::toString(dtype)) + (generic ? " generic" : " fused"));
    const ModelConfig config = PresetConfig("tiny").value();
    InitConfig init;
    init.set_seed(1);
    absl::StatusOr<std::shared_ptr<CausalLM>> model = CausalLM::Create(config, init);
    ASSERT_THAT(model, IsOk());
    (*model)->to(dtype);
    internal::UseGenericOps(**model, generic);
    const int64_t peak = testing::MeasureActivationPeak(**model, kBatch, kSeqLen);
    const double estimate =
        ActivationBytes(config, kBatch, kSeqLen, dtype, generic ? at::kCUDA : at::kCPU);
    EXPECT_THAT(static_cast<double>(peak) / estimate, DoubleNear(1.0, 0.03))
        << peak << " bytes measured, " << estimate << " estimated";
  }
}

}  // namespace
}  // namespace plait::models
