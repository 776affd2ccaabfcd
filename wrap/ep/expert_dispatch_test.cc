// Expert parallelism's dispatch against one process: the tiny Qwen3-MoE on 2 and 4 ranks, each
// holding its share of the experts and computing its own part of a batch, gives each part the
// loss one process gives it, every rank's experts the gradients one process gives them from the
// whole batch, and the other parameters' gradients summed over the ranks one process's; the
// all-to-alls move exactly the routed rows (bytes against the routing's theory, 1.00). A router
// that sends every token to rank 0's experts leaves the other ranks' experts without rows, and
// every rank's backward still runs. Each rank's model keeps only its own experts.
#include "wrap/ep/expert_dispatch.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ATen/Context.h"
#include "ATen/Parallel.h"
#include "ATen/core/Tensor.h"
#include "base/status_matchers.h"
#include "gtest/gtest.h"
#include "models/causal_lm.h"
#include "models/model_config.h"
#include "models/testing_gradients.h"
#include "parallel/ring_communicator.h"
#include "parallel/test_ranks.h"
#include "torch/csrc/autograd/generated/variable_factories.h"

namespace plait::wrap::ep {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::models::testing::ExpectElementsClose;

constexpr int64_t kBatch = 4;
constexpr int64_t kSeqLen = 16;

std::shared_ptr<models::CausalLM> MakeModel(bool every_token_to_rank_0) {
  const models::ModelConfig config = *models::PresetConfig("qwen3-moe-tiny");
  models::InitConfig init;
  init.set_seed(5);
  const std::shared_ptr<models::CausalLM> model = *models::CausalLM::Create(config, init);
  if (every_token_to_rank_0) {
    // Equal probabilities: the ties go to the lowest experts, 0 and 1, rank 0's.
    at::NoGradGuard no_grad;
    for (const auto& named : model->named_parameters()) {
      if (named.key().find("mlp.gate.") != std::string::npos) named.value().zero_();
    }
  }
  return model;
}

// The rows of `x` rank `rank` of `ranks` computes.
at::Tensor PartOf(const at::Tensor& x, int rank, int ranks) {
  return x.narrow(0, rank * (kBatch / ranks), kBatch / ranks);
}

void ExpectDispatchEqualsOneProcess(int ranks, bool every_token_to_rank_0) {
  const std::string name = std::to_string(ranks) + " ranks" +
                           (every_token_to_rank_0 ? ", every token to rank 0's experts" : "");
  const models::ModelConfig config = *models::PresetConfig("qwen3-moe-tiny");
  at::manual_seed(6);
  const at::Tensor tokens = torch::randint(config.vocab_size(), {kBatch, kSeqLen});
  const at::Tensor targets = torch::randint(config.vocab_size(), {kBatch, kSeqLen});
  // One process: each part's loss, and the gradient of their sum.
  const std::shared_ptr<models::CausalLM> whole = MakeModel(every_token_to_rank_0);
  std::vector<double> expected_losses;
  std::vector<at::Tensor> routed;  // each part's rows per expert, over the layers
  for (int r = 0; r < ranks; ++r) {
    const at::Tensor loss = whole->Loss(PartOf(tokens, r, ranks), PartOf(targets, r, ranks));
    loss.backward();
    expected_losses.push_back(loss.item<double>());
    routed.push_back(whole->LastRouting()->Load().narrow(0, 0, config.num_experts()));
  }
  const auto expected_grads = whole->named_parameters();

  std::vector<std::map<std::string, at::Tensor>> grads(ranks);
  parallel::testing::RunOnRingGroup(
      "ep", ranks, [&](int rank, parallel::RingCommunicator& communicator) {
        at::set_num_threads(1);
        parallel::GraphGroup group(communicator);
        const std::string where = name + ", rank " + std::to_string(rank);
        const std::shared_ptr<models::CausalLM> model = MakeModel(every_token_to_rank_0);
        ExpertDispatch dispatch(group);
        const auto [first, count] = dispatch.LocalExperts(config.num_experts());
        EXPECT_EQ(first, rank * config.num_experts() / ranks) << where;
        EXPECT_EQ(count, config.num_experts() / ranks) << where;
        model->KeepExperts(first, count);
        model->seams().Add(&dispatch);
        const at::Tensor loss =
            model->Loss(PartOf(tokens, rank, ranks), PartOf(targets, rank, ranks));
        EXPECT_NEAR(loss.item<double>(), expected_losses[rank], 1e-6 * expected_losses[rank])
            << where;
        loss.backward();
        ASSERT_THAT(group.status(), IsOk()) << where;
        int64_t expert_parameters = 0;
        for (const auto& named : model->named_parameters()) {
          const std::string& key = named.key();
          const size_t experts_at = key.find(".experts.");
          if (experts_at == std::string::npos) {
            grads[rank][key] = named.value().grad();
            continue;
          }
          // Only this rank's experts are left in the model.
          const int64_t expert = std::stoll(key.substr(experts_at + 9));
          EXPECT_TRUE(expert >= first && expert < first + count) << where << ": " << key;
          ExpectElementsClose(named.value().grad(), expected_grads[key].grad(), 1e-5,
                              where + ": gradient of " + key);
          ++expert_parameters;
        }
        EXPECT_EQ(expert_parameters, config.num_hidden_layers() * count * 3) << where;
        // Each layer sends the counts of each other rank's experts' rows, then in forward the
        // rows to others' experts and the outputs of others' rows back, and in backward the
        // gradients of those outputs and of those rows, the other way.
        const int64_t layers = config.num_hidden_layers();
        const int64_t local = count;
        int64_t to_others = 0, from_others = 0;
        for (int64_t e = 0; e < config.num_experts(); ++e) {
          const bool mine = e >= first && e < first + count;
          for (int s = 0; s < ranks; ++s) {
            const int64_t rows = routed[s][e].item<int64_t>();
            if (s == rank && !mine) to_others += rows;
            if (s != rank && mine) from_others += rows;
          }
        }
        const int64_t row_bytes = config.hidden_size() * int64_t{sizeof(float)};
        const int64_t theory = layers * local * int64_t{sizeof(int64_t)} * (ranks - 1) +
                               2 * (to_others + from_others) * row_bytes;
        const int64_t sent = communicator.traffic(parallel::Collective::kAllToAll).bytes_sent;
        EXPECT_EQ(sent, theory) << where << ": " << static_cast<double>(sent) / theory
                                << " of the routing's theory";
        if (every_token_to_rank_0 && rank != 0) {
          EXPECT_EQ(from_others, 0) << where;
        }
      });
  // The other parameters: each rank's gradient of its part, summed, is one process's.
  for (const auto& [key, grad] : grads[0]) {
    at::Tensor sum = grad.clone();
    for (int r = 1; r < ranks; ++r) sum += grads[r].at(key);
    ExpectElementsClose(sum, expected_grads[key].grad(), 1e-5,
                        name + ": summed gradient of " + key);
  }
}

TEST(ExpertDispatchTest, EachRanksExpertsComputeEveryRanksRowsAsOneProcess) {
  ExpectDispatchEqualsOneProcess(2, false);
  ExpectDispatchEqualsOneProcess(4, false);
}

TEST(ExpertDispatchTest, RanksWhoseExpertsGetNoRowsStillRunTheirBackward) {
  ExpectDispatchEqualsOneProcess(2, true);
}

}  // namespace
}  // namespace plait::wrap::ep
