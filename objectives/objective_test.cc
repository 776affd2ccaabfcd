#include "objectives/objective.h"

#include <cmath>
#include <memory>
#include <tuple>
#include <vector>

#include "ATen/core/Tensor.h"
#include "ATen/ops/equal.h"
#include "ATen/ops/log_softmax.h"
#include "base/status_matchers.h"
#include "data/pairs.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/causal_lm.h"
#include "models/model_config.h"
#include "torch/csrc/autograd/generated/variable_factories.h"
#include "wrap/wrappable.h"

namespace plait::objectives {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::base::testing::StatusIs;
using ::testing::HasSubstr;

std::shared_ptr<models::CausalLM> TinyModel(uint64_t seed) {
  absl::StatusOr<models::ModelConfig> config = models::PresetConfig("tiny");
  EXPECT_THAT(config, IsOk());
  models::InitConfig init;
  init.set_seed(seed);
  absl::StatusOr<std::shared_ptr<models::CausalLM>> model = models::CausalLM::Create(*config, init);
  EXPECT_THAT(model, IsOk());
  return *model;
}

// The metrics' values, read on the host.
Metrics OnHost(const TensorMetrics& metrics) {
  Metrics values;
  for (const auto& [name, value] : metrics) values.emplace_back(name, value.item<double>());
  return values;
}

data::Batch TwoPairs() {
  static const data::PairExample first{{1, 2, 3}, {4, 5}, {6, 7, 8}};
  static const data::PairExample second{{9}, {10, 11, 12}, {13}};
  return data::PairRows({&first, &second}, data::PairKind::kPreference, data::PairFiles(), 6);
}

ObjectiveConfig DpoAgainst(const std::string& reference) {
  ObjectiveConfig config;
  config.mutable_dpo()->set_reference(reference);
  return config;
}

// At step 0 the policy is the reference: z = 0 for every pair, so the sigmoid loss is
// exactly -log sigmoid(0) = ln 2 and every reward is 0.
TEST(ObjectiveTest, DpoWithThePolicyAsItsReferenceLosesExactlyLn2) {
  auto policy = TinyModel(1);
  auto reference = TinyModel(1);
  auto objective = MakeObjective(DpoAgainst("ref"), {{"ref", reference.get()}}, "plan.objective");
  ASSERT_THAT(objective, IsOk());
  const ObjectiveOutput out = (*objective)->Compute(*policy, TwoPairs()).value();
  EXPECT_EQ(out.loss.item<float>(), static_cast<float>(std::log(2.0)));
  ASSERT_EQ(out.metrics.size(), 6u);
  for (const auto& [name, value] : OnHost(out.metrics)) {
    if (name.rfind("rewards/", 0) == 0) {
      EXPECT_EQ(value, 0.0) << name;
    } else {
      EXPECT_LT(value, 0.0) << name;  // logps/
    }
  }
  // The policy gets gradients, the reference none.
  out.loss.backward();
  EXPECT_TRUE(policy->OutputWeight().grad().defined());
  for (const auto& named : reference->NamedParameters()) {
    EXPECT_FALSE(named.parameter.grad().defined()) << named.name;
  }
}

// IPO's loss reads length-averaged log-probabilities, but its rewards and log-probabilities
// are reported of whole sequences, as for the other losses (TRL 1.x's metrics).
TEST(ObjectiveTest, IpoReportsTheRewardsOfWholeSequences) {
  auto policy = TinyModel(1);
  auto reference = TinyModel(2);
  ObjectiveConfig sigmoid = DpoAgainst("ref");
  ObjectiveConfig ipo = sigmoid;
  ipo.mutable_dpo()->set_loss_type(DPO_LOSS_IPO);
  auto sigmoid_objective = MakeObjective(sigmoid, {{"ref", reference.get()}}, "plan.objective");
  auto ipo_objective = MakeObjective(ipo, {{"ref", reference.get()}}, "plan.objective");
  ASSERT_THAT(sigmoid_objective, IsOk());
  ASSERT_THAT(ipo_objective, IsOk());
  const ObjectiveOutput sigmoid_out = (*sigmoid_objective)->Compute(*policy, TwoPairs()).value();
  const ObjectiveOutput ipo_out = (*ipo_objective)->Compute(*policy, TwoPairs()).value();
  EXPECT_EQ(OnHost(ipo_out.metrics), OnHost(sigmoid_out.metrics));
  EXPECT_NE(OnHost(sigmoid_out.metrics)[0].second, 0.0);  // rewards/chosen: the models differ
  EXPECT_NE(ipo_out.loss.item<float>(), sigmoid_out.loss.item<float>());
}

// Against a precomputed reference, DPO computes what it computes against the live model, bit
// for bit, and a row never precomputed is an error, not a guess.
TEST(ObjectiveTest, PrecomputedDpoEqualsDpoAgainstTheLiveReference) {
  auto policy = TinyModel(1);
  auto reference = TinyModel(2);
  const ObjectiveConfig config = DpoAgainst("ref");
  auto live = MakeObjective(config, {{"ref", reference.get()}}, "plan.objective");
  ASSERT_THAT(live, IsOk());
  auto table = std::make_shared<ReferenceLogProbs>();
  table->Add(*reference, TwoPairs());
  auto precomputed = MakePrecomputedDpo(config.dpo(), table);
  const ObjectiveOutput expected = (*live)->Compute(*policy, TwoPairs()).value();
  const ObjectiveOutput actual = precomputed->Compute(*policy, TwoPairs()).value();
  EXPECT_EQ(actual.loss.item<float>(), expected.loss.item<float>());
  EXPECT_EQ(OnHost(actual.metrics), OnHost(expected.metrics));
  static const data::PairExample other{{1, 2}, {3}, {4}};
  const data::Batch unknown =
      data::PairRows({&other}, data::PairKind::kPreference, data::PairFiles(), 6);
  EXPECT_THAT(precomputed->Compute(*policy, unknown),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no precomputed reference")));
}

// What a run reads from DPO's live reference ahead (ReadFrozen, through the reference's own
// stages under a pipeline) and hands to Compute gives what Compute computes with the reference
// itself, bit for bit; a precomputed reference reads no frozen model; the metric names are
// those Compute reports.
TEST(ObjectiveTest, DpoReadsItsReferenceAheadAsItWouldItself) {
  auto policy = TinyModel(1);
  auto reference = TinyModel(2);
  const ObjectiveConfig config = DpoAgainst("ref");
  auto live = MakeObjective(config, {{"ref", reference.get()}}, "plan.objective");
  ASSERT_THAT(live, IsOk());
  EXPECT_EQ((*live)->FrozenRead(), std::optional<std::string>("ref"));
  const data::Batch batch = TwoPairs();
  const absl::StatusOr<at::Tensor> read = (*live)->ReadFrozen(*reference, batch);
  ASSERT_THAT(read, IsOk());
  const ObjectiveOutput expected = (*live)->Compute(*policy, batch).value();
  const ObjectiveOutput actual =
      (*live)->Compute(*policy, batch, batch, *read, /*step=*/nullptr, /*micro=*/0).value();
  EXPECT_EQ(actual.loss.item<float>(), expected.loss.item<float>());
  EXPECT_EQ(OnHost(actual.metrics), OnHost(expected.metrics));
  std::vector<std::string> names;
  for (const auto& [name, value] : expected.metrics) names.push_back(name);
  EXPECT_EQ((*live)->MetricNames(), names);

  auto table = std::make_shared<ReferenceLogProbs>();
  table->Add(*reference, batch);
  EXPECT_EQ(MakePrecomputedDpo(config.dpo(), table)->FrozenRead(), std::nullopt);
  auto causal_lm = MakeObjective(ObjectiveConfig(), {}, "plan.objective");
  ASSERT_THAT(causal_lm, IsOk());
  EXPECT_EQ((*causal_lm)->FrozenRead(), std::nullopt);
  EXPECT_TRUE((*causal_lm)->MetricNames().empty());
  EXPECT_THAT((*causal_lm)->ReadFrozen(*reference, batch),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("the objective reads no frozen model")));
}

// Padding-free rows (PACKING_PADDING_FREE) of three pairs of very different lengths score as
// their padded rows do: the loss, every metric (IPO's length-averaged loss too) and the
// gradients, against a live and a precomputed reference.
TEST(ObjectiveTest, DpoOnPaddingFreeRowsEqualsDpoOnPaddedRows) {
  static const data::PairExample first{{1, 2, 3}, {4, 5}, {6, 7, 8, 9, 10, 11, 12, 13, 14}};
  static const data::PairExample second{{9}, {10, 11, 12, 13, 14, 15, 16, 17, 18, 19}, {13}};
  static const data::PairExample third{{20, 21}, {22}, {23, 24}};
  const std::vector<const data::PairExample*> examples = {&first, &second, &third};
  const data::PairFiles files;
  const data::Batch padded = data::PairRows(examples, data::PairKind::kPreference, files, 16);
  const data::Batch packed = data::RowsOf(
      data::PaddingFreeRows(examples, data::PairKind::kPreference, files, 16), files, 16,
      /*packed=*/true);
  ASSERT_LT(packed.inputs.size(0), padded.inputs.size(0));
  auto reference = TinyModel(2);
  for (const DpoLossType loss_type : {DPO_LOSS_SIGMOID, DPO_LOSS_IPO}) {
    ObjectiveConfig config = DpoAgainst("ref");
    config.mutable_dpo()->set_loss_type(loss_type);
    auto live = MakeObjective(config, {{"ref", reference.get()}}, "plan.objective");
    ASSERT_THAT(live, IsOk());
    auto table = std::make_shared<ReferenceLogProbs>();
    table->Add(*reference, packed);
    const std::unique_ptr<Objective> precomputed = MakePrecomputedDpo(config.dpo(), table);
    EXPECT_EQ((*live)->ScoredItems(packed), 3);
    const auto run = [](Objective& objective, const data::Batch& batch) {
      auto policy = TinyModel(1);
      const ObjectiveOutput out = objective.Compute(*policy, batch).value();
      out.loss.backward();
      return std::tuple(out.loss.item<double>(), OnHost(out.metrics),
                        policy->OutputWeight().grad().clone());
    };
    const auto [loss, metrics, grad] = run(**live, padded);
    for (Objective* objective : {live->get(), precomputed.get()}) {
      const auto [packed_loss, packed_metrics, packed_grad] = run(*objective, packed);
      EXPECT_NEAR(packed_loss, loss, 1e-6 * std::abs(loss)) << loss_type;
      ASSERT_EQ(packed_metrics.size(), metrics.size());
      for (size_t m = 0; m < metrics.size(); ++m) {
        EXPECT_NEAR(packed_metrics[m].second, metrics[m].second, 1e-5) << metrics[m].first;
      }
      EXPECT_LE((packed_grad - grad).abs().max().item<double>(),
                1e-5 * grad.abs().max().item<double>())
          << loss_type;
    }
  }
}

// Adapters for the tests: every block projection's output scaled by 1 + gain, a trained
// scalar.
class Gain final : public wrap::SeamLayer {
 public:
  std::vector<wrap::Seam> changes() const override { return {wrap::Seam::kProjection}; }
  bool is_adapter() const override { return true; }
  at::Tensor Project(const wrap::ProjectionSite& site, const at::Tensor& input,
                     wrap::ProjectNext next) override {
    return next(site, input) * (1 + gain);
  }
  at::Tensor gain = torch::full({}, 0.1).requires_grad_();
};

// With its adapters off (and only then), the policy is a frozen copy of its base: DPO against
// it computes bit for bit what DPO against that copy does, gradients reach the adapters, and
// the policy has its adapters and its training mode back afterwards.
TEST(ObjectiveTest, DpoAgainstThePolicyWithoutAdaptersIsDpoAgainstAFrozenCopyOfItsBase) {
  auto policy = TinyModel(1);
  Gain adapters;
  policy->seams().Add(&adapters);
  policy->train();
  auto base = TinyModel(1);
  ObjectiveConfig config;
  config.mutable_dpo()->set_policy_without_adapters(true);
  auto without_adapters = MakeObjective(config, {}, "plan.objective");
  ASSERT_THAT(without_adapters, IsOk());
  auto against_base = MakeObjective(DpoAgainst("base"), {{"base", base.get()}}, "plan.objective");
  ASSERT_THAT(against_base, IsOk());
  const ObjectiveOutput expected = (*against_base)->Compute(*policy, TwoPairs()).value();
  const ObjectiveOutput actual = (*without_adapters)->Compute(*policy, TwoPairs()).value();
  EXPECT_EQ(actual.loss.item<float>(), expected.loss.item<float>());
  EXPECT_EQ(OnHost(actual.metrics), OnHost(expected.metrics));
  EXPECT_NE(OnHost(actual.metrics)[0].second, 0.0);  // rewards/chosen: the adapters count
  // The adapters are on again.
  const at::Tensor tokens = torch::tensor({{1, 2, 3}}, at::kLong);
  EXPECT_FALSE(at::equal(policy->Forward(tokens), base->Forward(tokens)));
  EXPECT_TRUE(policy->is_training());
  actual.loss.backward();
  EXPECT_TRUE(adapters.gain.grad().defined());

  // A policy without adapters would be its own reference.
  EXPECT_THAT((*without_adapters)->Compute(*base, TwoPairs()),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("plan.objective.dpo.policy_without_adapters: the policy has no "
                                 "adapters to switch off")));
}

TEST(ObjectiveTest, DpoNeedsAKnownReference) {
  EXPECT_THAT(MakeObjective(DpoAgainst("ref"), {}, "plan.objective"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("plan.objective.dpo.reference: \"ref\" names no frozen model")));
}

// SFT scores the completion tokens only: its loss is the model's cross-entropy over them.
TEST(ObjectiveTest, SftIsTheCrossEntropyOfTheCompletionTokens) {
  auto policy = TinyModel(1);
  ObjectiveConfig config;
  config.mutable_sft();
  auto objective = MakeObjective(config, {}, "plan.objective");
  ASSERT_THAT(objective, IsOk());
  const data::PairExample example{{1, 2, 3}, {4, 5}, {}};
  const data::Batch batch = data::PairRows({&example}, data::PairKind::kSft, data::PairFiles(), 6);
  const at::Tensor loss = (*objective)->Compute(*policy, batch)->loss;
  const at::Tensor log_probs = at::log_softmax(policy->Forward(batch.inputs)[0], -1);
  const double expected = -(log_probs[2][4].item<double>() + log_probs[3][5].item<double>()) / 2;
  EXPECT_NEAR(loss.item<double>(), expected, 1e-5);
}

}  // namespace
}  // namespace plait::objectives
