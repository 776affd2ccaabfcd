#include "optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ATen/Context.h"
#include "ATen/core/Tensor.h"
#include "ATen/ops/allclose.h"
#include "ATen/ops/equal.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/allocation_counter.h"
#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "optim/internal/cpu_updates.h"
#include "torch/csrc/autograd/generated/variable_factories.h"
#include "torch/nn/utils/clip_grad.h"
#include "torch/optim/adam.h"
#include "torch/optim/adamw.h"
#include "torch/optim/sgd.h"

namespace plait::optim {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::base::testing::StatusIs;
using ::testing::HasSubstr;

constexpr int kSteps = 100;

OptimizerConfig Parse(const std::string& text) {
  OptimizerConfig config;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &config)) << text;
  return config;
}

// A few parameters of assorted shapes, the same for every caller.
std::vector<at::Tensor> InitialTensors() {
  at::manual_seed(1);
  return {torch::randn({64, 33}), torch::randn({33}), torch::randn({7, 5, 3}), torch::randn({1})};
}

std::vector<parallel::TrainableParameter> Trainable(const std::vector<at::Tensor>& tensors) {
  std::vector<parallel::TrainableParameter> parameters;
  for (size_t i = 0; i < tensors.size(); ++i) {
    parameters.push_back({"p" + std::to_string(i), tensors[i], {}});
  }
  return parameters;
}

std::vector<at::Tensor> Copies(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> copies;
  for (const at::Tensor& tensor : tensors) copies.push_back(tensor.clone());
  return copies;
}

// The gradient of step `step` for parameter `index`: deterministic, varied in scale.
at::Tensor Gradient(int step, size_t index, const at::Tensor& like) {
  at::manual_seed(1000 * step + index);
  return torch::randn(like.sizes()) * (1.0 + step % 7);
}

void SetGradients(const std::vector<at::Tensor>& tensors, int step) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    tensors[i].mutable_grad() = Gradient(step, i, tensors[i]).to(tensors[i].scalar_type());
  }
}

// The learning rate of step `step`, changing every step as under a schedule.
double LearningRate(int step) { return 1e-3 * (1.0 + std::cos(step * 0.1)); }

void ExpectClose(const std::vector<at::Tensor>& actual, const std::vector<at::Tensor>& expected,
                 double relative) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    const double scale = expected[i].abs().max().item<double>();
    const double error = (actual[i] - expected[i]).abs().max().item<double>();
    EXPECT_LE(error, relative * scale)
        << "parameter " << i << ": max error " << error << " at scale " << scale;
  }
}

// Runs plait's optimizer from `config` and `reference` (one step given a learning rate) on
// the same initial tensors and gradients for kSteps steps, and compares the parameters.
void ExpectParity(
    const std::string& config,
    const std::function<std::function<void(double)>(std::vector<at::Tensor>&)>& make_reference) {
  std::vector<at::Tensor> ours = InitialTensors();
  std::vector<at::Tensor> theirs = Copies(ours);
  absl::StatusOr<std::unique_ptr<Optimizer>> optimizer =
      Optimizer::Create(Trainable(ours), Parse(config));
  ASSERT_THAT(optimizer, IsOk());
  std::function<void(double)> reference_step = make_reference(theirs);
  for (int step = 0; step < kSteps; ++step) {
    SetGradients(ours, step);
    SetGradients(theirs, step);
    ASSERT_THAT((*optimizer)->Step(LearningRate(step)), IsOk());
    reference_step(LearningRate(step));
  }
  ExpectClose(ours, theirs, 1e-6);
  // And the parameters moved: a comparison of unchanged tensors proves nothing.
  ExpectClose({(ours[0] - InitialTensors()[0]).abs().max().gt(1e-3).to(at::kFloat)},
              {torch::ones({})}, 0.0);
}

// A torch::optim optimizer stepped with a per-step learning rate.
template <typename TorchOptimizer, typename Options>
std::function<void(double)> TorchStepper(std::vector<at::Tensor>& tensors, Options options) {
  auto optimizer = std::make_shared<TorchOptimizer>(tensors, options);
  return [optimizer](double lr) {
    for (auto& group : optimizer->param_groups()) {
      static_cast<Options&>(group.options()).lr(lr);
    }
    optimizer->step();
  };
}

TEST(OptimizerParityTest, AdamWMatchesTorch) {
  ExpectParity("adamw { beta1: 0.8 beta2: 0.95 eps: 1e-6 } weight_decay: 0.1",
               [](std::vector<at::Tensor>& tensors) {
                 return TorchStepper<torch::optim::AdamW>(
                     tensors,
                     torch::optim::AdamWOptions(0).betas({0.8, 0.95}).eps(1e-6).weight_decay(0.1));
               });
}

TEST(OptimizerParityTest, AdamMatchesTorch) {
  ExpectParity("adam {} weight_decay: 0.01", [](std::vector<at::Tensor>& tensors) {
    return TorchStepper<torch::optim::Adam>(tensors,
                                            torch::optim::AdamOptions(0).weight_decay(0.01));
  });
}

TEST(OptimizerParityTest, SgdMatchesTorch) {
  ExpectParity("sgd {}", [](std::vector<at::Tensor>& tensors) {
    return TorchStepper<torch::optim::SGD>(tensors, torch::optim::SGDOptions(0));
  });
  ExpectParity("sgd { momentum: 0.9 dampening: 0.1 } weight_decay: 0.01",
               [](std::vector<at::Tensor>& tensors) {
                 return TorchStepper<torch::optim::SGD>(
                     tensors,
                     torch::optim::SGDOptions(0).momentum(0.9).dampening(0.1).weight_decay(0.01));
               });
  ExpectParity("sgd { momentum: 0.9 nesterov: true }", [](std::vector<at::Tensor>& tensors) {
    return TorchStepper<torch::optim::SGD>(
        tensors, torch::optim::SGDOptions(0).momentum(0.9).nesterov(true));
  });
}

// Lion as published (Chen et al., 2023, Algorithm 2), written with tensor operations.
TEST(OptimizerParityTest, LionMatchesThePublishedUpdate) {
  ExpectParity("lion { beta1: 0.9 beta2: 0.99 } weight_decay: 0.1",
               [](std::vector<at::Tensor>& tensors) {
                 auto momenta = std::make_shared<std::vector<at::Tensor>>();
                 for (const at::Tensor& tensor : tensors) {
                   momenta->push_back(torch::zeros_like(tensor));
                 }
                 return [tensors, momenta](double lr) {
                   at::NoGradGuard no_grad;
                   for (size_t i = 0; i < tensors.size(); ++i) {
                     const at::Tensor& g = tensors[i].grad();
                     at::Tensor& m = (*momenta)[i];
                     const at::Tensor update = (m * 0.9 + g * 0.1).sign();
                     tensors[i].mul_(1 - lr * 0.1).sub_(update * lr);
                     m.mul_(0.99).add_(g * 0.01);
                   }
                 };
               });
}

TEST(OptimizerTest, GroupsScaleTheLearningRateAndSetTheDecay) {
  std::vector<at::Tensor> tensors = InitialTensors();
  std::vector<at::Tensor> initial = Copies(tensors);
  absl::StatusOr<std::unique_ptr<Optimizer>> optimizer = Optimizer::Create(
      Trainable(tensors), Parse(R"pb(
        sgd {}
        weight_decay: 0.5
        param_groups { name: "frozen" glob: "p0" lr_scale: 0 }
        param_groups { name: "fast_no_decay" glob: "p1" lr_scale: 2 weight_decay: 0 }
      )pb"));
  ASSERT_THAT(optimizer, IsOk());
  SetGradients(tensors, 0);
  ASSERT_THAT((*optimizer)->Step(0.1), IsOk());
  EXPECT_TRUE(at::equal(tensors[0], initial[0]));
  EXPECT_TRUE(at::allclose(tensors[1], initial[1] - 0.2 * Gradient(0, 1, initial[1])));
  EXPECT_TRUE(
      at::allclose(tensors[2], initial[2] - 0.1 * (Gradient(0, 2, initial[2]) + 0.5 * initial[2])));
}

// 16-bit parameters train through fp32 master weights, with every algorithm: the masters
// follow exactly the fp32 run fed the same gradients, and the parameters are the masters
// rounded (the update writes them chunk by chunk; p0's 2,112 elements span two chunks).
TEST(OptimizerTest, LowPrecisionParametersKeepFp32MastersAndState) {
  for (const char* config_text :
       {"adamw {} weight_decay: 0.1", "sgd { momentum: 0.9 } weight_decay: 0.01", "lion {}"}) {
    for (at::ScalarType dtype : {at::kBFloat16, at::kHalf}) {
      SCOPED_TRACE(absl::StrCat(config_text, ", ", c10::toString(dtype)));
      std::vector<at::Tensor> low;
      for (const at::Tensor& tensor : InitialTensors()) low.push_back(tensor.to(dtype));
      std::vector<at::Tensor> full;
      for (const at::Tensor& tensor : low) full.push_back(tensor.to(at::kFloat));
      const OptimizerConfig config = Parse(config_text);
      auto low_optimizer = Optimizer::Create(Trainable(low), config);
      auto full_optimizer = Optimizer::Create(Trainable(full), config);
      ASSERT_THAT(low_optimizer, IsOk());
      ASSERT_THAT(full_optimizer, IsOk());
      for (int step = 0; step < 10; ++step) {
        SetGradients(low, step);
        for (size_t i = 0; i < full.size(); ++i) {
          full[i].mutable_grad() = low[i].grad().to(at::kFloat);
        }
        ASSERT_THAT((*low_optimizer)->Step(1e-2), IsOk());
        ASSERT_THAT((*full_optimizer)->Step(1e-2), IsOk());
      }
      const OptimizerState state = (*low_optimizer)->SaveState();
      for (size_t i = 0; i < low.size(); ++i) {
        const std::string name = "p" + std::to_string(i);
        const at::Tensor& master = state.tensors.at(name + ":master");
        EXPECT_EQ(master.scalar_type(), at::kFloat);
        EXPECT_TRUE(at::equal(master, full[i])) << name;
        EXPECT_EQ(low[i].scalar_type(), dtype);
        EXPECT_TRUE(at::equal(low[i], master.to(dtype))) << name;
      }
    }
  }
}

// A 16-bit parameter given its fp32 values trains from them: its masters follow the fp32 run
// from those values exactly, not from their rounded copy, on both update paths. A master that
// is not the parameter's fp32 values is refused, naming the parameter.
TEST(OptimizerTest, GivenMastersAreTheStartingPoint) {
  for (const bool fused : {true, false}) {
    SCOPED_TRACE(fused ? "fused loops" : "multi-tensor updates");
    internal::UpdatePaths paths;
    if (!fused) paths.cpu_updates = internal::CpuUpdates::kMultiTensor;
    std::vector<at::Tensor> full = InitialTensors();
    std::vector<parallel::TrainableParameter> low = Trainable(full);
    for (parallel::TrainableParameter& parameter : low) {
      parameter.master = parameter.tensor.clone();
      parameter.tensor = parameter.tensor.to(at::kBFloat16);
    }
    const OptimizerConfig config = Parse("adamw {} weight_decay: 0.1");
    auto low_optimizer = internal::CreateOptimizer(low, config, paths);
    auto full_optimizer = Optimizer::Create(Trainable(full), config);
    ASSERT_THAT(low_optimizer, IsOk());
    ASSERT_THAT(full_optimizer, IsOk());
    for (int step = 0; step < 3; ++step) {
      for (size_t i = 0; i < low.size(); ++i) {
        low[i].tensor.mutable_grad() = Gradient(step, i, full[i]).to(at::kBFloat16);
        full[i].mutable_grad() = low[i].tensor.grad().to(at::kFloat);
      }
      ASSERT_THAT((*low_optimizer)->Step(1e-2), IsOk());
      ASSERT_THAT((*full_optimizer)->Step(1e-2), IsOk());
    }
    const OptimizerState state = (*low_optimizer)->SaveState();
    for (size_t i = 0; i < low.size(); ++i) {
      const at::Tensor& master = state.tensors.at(low[i].name + ":master");
      // The fused loops do the fp32 run's arithmetic; the multi-tensor kernels round otherwise.
      if (fused) {
        EXPECT_TRUE(at::equal(master, full[i])) << low[i].name;
      }
      ExpectClose({master}, {full[i]}, 1e-5);
      EXPECT_TRUE(at::equal(low[i].tensor, master.to(at::kBFloat16))) << low[i].name;
    }
  }
  std::vector<parallel::TrainableParameter> wrong = Trainable(InitialTensors());
  wrong[2].tensor = wrong[2].tensor.to(at::kBFloat16);
  wrong[2].master = torch::zeros({7, 5});
  EXPECT_THAT(Optimizer::Create(wrong, Parse("adamw {}")),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("parameter \"p2\" (BFloat16 [7, 5, 3] on cpu) was given a master "
                                 "of Float [7, 5] on cpu")));
  wrong[2].master = torch::zeros({7, 5, 3}, at::kBFloat16);
  EXPECT_THAT(Optimizer::Create(wrong, Parse("adamw {}")),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("a master of BFloat16")));
}

// Without shards, clipping equals torch::nn::utils::clip_grad_norm_ followed by the update.
TEST(OptimizerTest, ClippingMatchesTorchClipGradNorm) {
  std::vector<at::Tensor> ours = InitialTensors();
  std::vector<at::Tensor> theirs = Copies(ours);
  auto optimizer = Optimizer::Create(Trainable(ours), Parse("sgd {} clipping { max_norm: 1 }"));
  ASSERT_THAT(optimizer, IsOk());
  SetGradients(ours, 3);
  SetGradients(theirs, 3);
  absl::StatusOr<StepReport> report = (*optimizer)->Step(0.1);
  ASSERT_THAT(report, IsOk());
  const double norm = torch::nn::utils::clip_grad_norm_(theirs, 1.0);
  torch::optim::SGD(theirs, torch::optim::SGDOptions(0.1)).step();
  ASSERT_TRUE(report->grad_norm.has_value());
  EXPECT_NEAR(*report->grad_norm, norm, 1e-6 * norm);
  EXPECT_LT(report->clip_factor, 1.0);
  ExpectClose(ours, theirs, 1e-6);
}

TEST(OptimizerTest, NonFiniteNormSkipsTheStepOrFails) {
  std::vector<at::Tensor> tensors = InitialTensors();
  const std::vector<at::Tensor> initial = Copies(tensors);
  auto skipping = Optimizer::Create(Trainable(tensors), Parse("adamw {} clipping {}"));
  ASSERT_THAT(skipping, IsOk());
  SetGradients(tensors, 0);
  tensors[2].mutable_grad()[0][0][0] = std::nan("");
  absl::StatusOr<StepReport> report = (*skipping)->Step(0.1);
  ASSERT_THAT(report, IsOk());
  EXPECT_TRUE(report->skipped);
  EXPECT_TRUE(std::isnan(*report->grad_norm));
  EXPECT_EQ((*skipping)->step(), 0);
  for (size_t i = 0; i < tensors.size(); ++i) EXPECT_TRUE(at::equal(tensors[i], initial[i]));

  auto failing = Optimizer::Create(Trainable(tensors),
                                   Parse("adamw {} clipping { max_norm: 1 non_finite: FAIL }"));
  ASSERT_THAT(failing, IsOk());
  SetGradients(tensors, 0);
  ASSERT_THAT((*failing)->Step(0.1), IsOk());
  SetGradients(tensors, 1);
  tensors[0].mutable_grad()[3][4] = std::numeric_limits<float>::infinity();
  EXPECT_THAT((*failing)->Step(0.1), StatusIs(absl::StatusCode::kFailedPrecondition,
                                              "optimizer step 1: the gradient norm is inf "
                                              "(optimizer.clipping.non_finite is FAIL)"));
}

// A step whose loss is not finite is skipped without clipping too (its gradients, here
// finite, never reach the parameters), and fails under FAIL.
TEST(OptimizerTest, NonFiniteLossSkipsTheStepOrFails) {
  std::vector<at::Tensor> tensors = InitialTensors();
  const std::vector<at::Tensor> initial = Copies(tensors);
  auto skipping = Optimizer::Create(Trainable(tensors), Parse("adamw {}"));
  ASSERT_THAT(skipping, IsOk());
  SetGradients(tensors, 0);
  absl::StatusOr<StepReport> report = (*skipping)->SkipNonFiniteLoss(std::nan(""));
  ASSERT_THAT(report, IsOk());
  EXPECT_TRUE(report->skipped);
  EXPECT_FALSE(report->grad_norm.has_value());
  EXPECT_EQ((*skipping)->step(), 0);
  for (size_t i = 0; i < tensors.size(); ++i) EXPECT_TRUE(at::equal(tensors[i], initial[i]));
  EXPECT_THAT((*skipping)->SkipNonFiniteLoss(2.5),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "optimizer step 0: the loss 2.5 is finite; not skipped"));

  auto failing =
      Optimizer::Create(Trainable(tensors), Parse("adamw {} clipping { non_finite: FAIL }"));
  ASSERT_THAT(failing, IsOk());
  EXPECT_THAT(
      (*failing)->SkipNonFiniteLoss(std::numeric_limits<double>::infinity()),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               "optimizer step 0: the loss is inf (optimizer.clipping.non_finite is FAIL)"));
}

TEST(OptimizerTest, ParametersWithoutGradientsAreLeftAlone) {
  std::vector<at::Tensor> tensors = InitialTensors();
  const at::Tensor initial = tensors[1].clone();
  auto optimizer = Optimizer::Create(Trainable(tensors), Parse("adamw {} weight_decay: 0.1"));
  ASSERT_THAT(optimizer, IsOk());
  SetGradients(tensors, 0);
  (*optimizer)->ZeroGrad();
  for (const at::Tensor& tensor : tensors) EXPECT_FALSE(tensor.grad().defined());
  tensors[0].mutable_grad() = torch::ones_like(tensors[0]);
  ASSERT_THAT((*optimizer)->Step(0.1), IsOk());
  EXPECT_TRUE(at::equal(tensors[1], initial));
  EXPECT_EQ((*optimizer)->SaveState().tensors.at("p1:step").item<int64_t>(), 0);
  EXPECT_EQ((*optimizer)->SaveState().tensors.at("p0:step").item<int64_t>(), 1);
}

// Saving, loading into a fresh optimizer over copies, and continuing gives the same run.
TEST(OptimizerTest, StateRoundTripContinuesTheRunExactly) {
  std::vector<at::Tensor> tensors = InitialTensors();
  const OptimizerConfig config = Parse("adamw {} weight_decay: 0.1");
  auto original = Optimizer::Create(Trainable(tensors), config);
  ASSERT_THAT(original, IsOk());
  for (int step = 0; step < 5; ++step) {
    SetGradients(tensors, step);
    ASSERT_THAT((*original)->Step(LearningRate(step)), IsOk());
  }
  std::vector<at::Tensor> resumed_tensors = Copies(tensors);
  auto resumed = Optimizer::Create(Trainable(resumed_tensors), config);
  ASSERT_THAT(resumed, IsOk());
  ASSERT_THAT((*resumed)->LoadState((*original)->SaveState()), IsOk());
  EXPECT_EQ((*resumed)->step(), 5);
  for (int step = 5; step < 10; ++step) {
    SetGradients(tensors, step);
    SetGradients(resumed_tensors, step);
    ASSERT_THAT((*original)->Step(LearningRate(step)), IsOk());
    ASSERT_THAT((*resumed)->Step(LearningRate(step)), IsOk());
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_TRUE(at::equal(tensors[i], resumed_tensors[i]));
  }
}

// The state is allocated by a parameter's first update (or a LoadState), not by Create: a
// run's start-up does not page in what its first step fills. Before that, SaveState
// describes it as zeros, which a resumed optimizer loads and continues from exactly.
TEST(OptimizerTest, StateIsAllocatedByTheFirstUpdate) {
  const OptimizerConfig config = Parse("adamw {}");
  std::vector<at::Tensor> tensors = {torch::randn({1 << 20})};
  const int64_t buffer_bytes = tensors[0].numel() * 4;
  base::AllocationCounter counter;
  absl::StatusOr<std::unique_ptr<Optimizer>> optimizer;
  {
    base::AllocationCounter::Scope counting(counter);
    optimizer = Optimizer::Create(Trainable(tensors), config);
  }
  ASSERT_THAT(optimizer, IsOk());
  EXPECT_LT(counter.peak(), buffer_bytes);

  const OptimizerState before = (*optimizer)->SaveState();
  for (const char* buffer : {"p0:exp_avg", "p0:exp_avg_sq"}) {
    ASSERT_EQ(before.tensors.count(buffer), 1) << buffer;
    const at::Tensor& zeros = before.tensors.at(buffer);
    EXPECT_EQ(zeros.sizes(), tensors[0].sizes()) << buffer;
    EXPECT_TRUE(zeros.is_contiguous()) << buffer;
    EXPECT_EQ(zeros.count_nonzero().item<int64_t>(), 0) << buffer;
  }

  std::vector<at::Tensor> resumed_tensors = Copies(tensors);
  auto resumed = Optimizer::Create(Trainable(resumed_tensors), config);
  ASSERT_THAT(resumed, IsOk());
  ASSERT_THAT((*resumed)->LoadState(before), IsOk());
  counter.Reset();
  for (int step = 0; step < 3; ++step) {
    SetGradients(tensors, step);
    SetGradients(resumed_tensors, step);
    {
      base::AllocationCounter::Scope counting(counter);
      ASSERT_THAT((*optimizer)->Step(LearningRate(step)), IsOk());
    }
    ASSERT_THAT((*resumed)->Step(LearningRate(step)), IsOk());
  }
  EXPECT_GE(counter.current(), 2 * buffer_bytes);
  EXPECT_TRUE(at::equal(tensors[0], resumed_tensors[0]));
}

// The multi-tensor updates a CUDA parameter's update takes, run here through the whole
// optimizer on CPU tensors (internal/cpu_updates.h), against the fused loops: every
// algorithm; fp32, bf16 and mixed fp32 / bf16 parameters in one group; a parameter that has
// no gradient every third step, so that the parameters' update counts, and with them their
// buckets, differ; buckets as large as they come and buckets of one or two parameters; with
// and without clipping; and state saved by one path and loaded by the other. On LibTorch 2.x
// the buckets run ATen's fused Adam(W) and SGD kernels, on 1.13 foreach operations. All see
// the same gradients, so their fp32 masters differ only by the rounding of their arithmetic
// (ATen's kernels contract multiply-adds; the fused loops do not); a 16-bit parameter is its
// master rounded on either path.
TEST(OptimizerTest, MultiTensorUpdatesMatchTheFusedLoops) {
  using internal::CpuUpdates;
  using internal::UpdatePaths;
  constexpr size_t kSometimesWithoutGradient = 2;
  const UpdatePaths fused_loops{CpuUpdates::kFusedLoops};
  for (const char* config_text :
       {"adamw { beta2: 0.95 } weight_decay: 0.1 clipping { max_norm: 1 }",
        "adam {} weight_decay: 0.01", "sgd { momentum: 0.9 nesterov: true } weight_decay: 0.01",
        "sgd { momentum: 0.9 dampening: 0.1 } clipping { max_norm: 5 }", "sgd {}",
        "lion {} weight_decay: 0.1 clipping { max_norm: 1 }"}) {
    for (const char* dtypes : {"fp32", "bf16", "mixed"}) {
      // The parameters' elements are 2112, 33, 105 and 1: at most 40 per bucket puts the first
      // and third alone, and the last two together when their update counts agree.
      for (const int64_t bucket_elements : {internal::kBucketElements, int64_t{40}}) {
        SCOPED_TRACE(absl::StrCat(config_text, ", ", dtypes, ", buckets of ", bucket_elements));
        const OptimizerConfig config = Parse(config_text);
        const UpdatePaths multi_tensor{CpuUpdates::kMultiTensor, bucket_elements};
        // Runs `steps` steps from `first` on `paths`'s optimizer over `tensors`, loading
        // `state` first when it has any, and appending the gradient norms to `norms`; returns
        // the optimizer's state.
        const auto run = [&](const UpdatePaths& paths, std::vector<at::Tensor>& tensors, int first,
                             int steps, const OptimizerState* state, std::vector<double>* norms) {
          auto optimizer = internal::CreateOptimizer(Trainable(tensors), config, paths);
          EXPECT_THAT(optimizer, IsOk());
          if (!optimizer.ok()) return OptimizerState();
          if (state != nullptr) {
            EXPECT_THAT((*optimizer)->LoadState(*state), IsOk());
          }
          for (int step = first; step < first + steps; ++step) {
            SetGradients(tensors, step);
            if (step % 3 == 1) tensors[kSometimesWithoutGradient].mutable_grad().reset();
            const absl::StatusOr<StepReport> report = (*optimizer)->Step(LearningRate(step));
            EXPECT_THAT(report, IsOk());
            if (norms != nullptr && report.ok() && report->grad_norm) {
              norms->push_back(*report->grad_norm);
            }
          }
          return (*optimizer)->SaveState();
        };
        // The masters: the parameters themselves for fp32.
        const auto masters = [&](const std::vector<at::Tensor>& tensors,
                                 const OptimizerState& state) {
          std::vector<at::Tensor> result;
          for (size_t i = 0; i < tensors.size(); ++i) {
            const at::ScalarType dtype = tensors[i].scalar_type();
            const at::Tensor& master = dtype == at::kFloat
                                           ? tensors[i]
                                           : state.tensors.at(absl::StrCat("p", i, ":master"));
            EXPECT_TRUE(at::equal(tensors[i], master.to(dtype))) << "p" << i;
            result.push_back(master.to(at::kFloat));
          }
          return result;
        };
        std::vector<at::Tensor> initial = InitialTensors();
        for (size_t i = 0; i < initial.size(); ++i) {
          const bool bf16 =
              std::string(dtypes) == "bf16" || (std::string(dtypes) == "mixed" && i % 2 == 1);
          initial[i] = initial[i].to(bf16 ? at::kBFloat16 : at::kFloat);
        }
        std::vector<at::Tensor> fused = Copies(initial);
        std::vector<at::Tensor> buckets = Copies(initial);
        std::vector<double> fused_norms;
        std::vector<double> bucket_norms;
        const OptimizerState fused_state = run(fused_loops, fused, 0, 10, nullptr, &fused_norms);
        const OptimizerState bucket_state =
            run(multi_tensor, buckets, 0, 10, nullptr, &bucket_norms);
        // The parameters' update counts differ, as the test means them to.
        EXPECT_EQ(bucket_state.tensors.at("p0:step").item<int64_t>(), 10);
        EXPECT_EQ(bucket_state.tensors.at("p2:step").item<int64_t>(), 7);
        ExpectClose(masters(buckets, bucket_state), masters(fused, fused_state), 1e-5);
        for (const auto& [key, tensor] : fused_state.tensors) {
          ExpectClose({bucket_state.tensors.at(key).to(at::kDouble)}, {tensor.to(at::kDouble)},
                      1e-5);
        }
        EXPECT_EQ(fused_norms.size(), bucket_norms.size());
        for (size_t i = 0; i < std::min(fused_norms.size(), bucket_norms.size()); ++i) {
          EXPECT_NEAR(bucket_norms[i], fused_norms[i], 1e-5 * fused_norms[i]) << "step " << i;
        }
        // Each path continues from the other's state as it would from its own.
        std::vector<at::Tensor> fused_from_buckets = Copies(buckets);
        std::vector<at::Tensor> buckets_from_fused = Copies(fused);
        const OptimizerState a = run(fused_loops, fused, 10, 5, &fused_state, nullptr);
        const OptimizerState b =
            run(multi_tensor, buckets_from_fused, 10, 5, &fused_state, nullptr);
        const OptimizerState c = run(multi_tensor, buckets, 10, 5, &bucket_state, nullptr);
        const OptimizerState d =
            run(fused_loops, fused_from_buckets, 10, 5, &bucket_state, nullptr);
        ExpectClose(masters(buckets_from_fused, b), masters(fused, a), 1e-5);
        ExpectClose(masters(fused_from_buckets, d), masters(buckets, c), 1e-5);
        ExpectClose(masters(buckets, c), masters(fused, a), 1e-5);
        // The runs moved every parameter, so that their agreement means something.
        const std::vector<at::Tensor> moved = masters(fused, a);
        for (size_t i = 0; i < moved.size(); ++i) {
          EXPECT_GT((moved[i] - initial[i].to(at::kFloat)).abs().max().item<double>(), 1e-4)
              << "p" << i;
        }
      }
    }
  }
}

// StateLayout names what SaveState saves, with the same shapes and dtypes, and holds no data.
TEST(OptimizerTest, StateLayoutDescribesSaveStateWithoutCopying) {
  for (const char* config_text : {"adamw {}", "sgd {}", "lion {}"}) {
    SCOPED_TRACE(config_text);
    std::vector<at::Tensor> tensors = InitialTensors();
    tensors[1] = tensors[1].to(at::kBFloat16);
    auto optimizer = Optimizer::Create(Trainable(tensors), Parse(config_text));
    ASSERT_THAT(optimizer, IsOk());
    SetGradients(tensors, 0);
    ASSERT_THAT((*optimizer)->Step(LearningRate(0)), IsOk());
    const OptimizerState saved = (*optimizer)->SaveState();
    const OptimizerState layout = (*optimizer)->StateLayout();
    EXPECT_EQ(layout.step, saved.step);
    ASSERT_EQ(layout.tensors.size(), saved.tensors.size());
    for (const auto& [key, tensor] : saved.tensors) {
      ASSERT_EQ(layout.tensors.count(key), 1) << key;
      const at::Tensor& described = layout.tensors.at(key);
      EXPECT_EQ(described.sizes(), tensor.sizes()) << key;
      EXPECT_EQ(described.scalar_type(), tensor.scalar_type()) << key;
      EXPECT_TRUE(described.is_meta()) << key;
    }
  }
}

TEST(OptimizerTest, LoadingStateOfOtherParametersNamesThem) {
  std::vector<at::Tensor> tensors = InitialTensors();
  auto optimizer = Optimizer::Create(Trainable(tensors), Parse("adamw {}"));
  ASSERT_THAT(optimizer, IsOk());
  OptimizerState state = (*optimizer)->SaveState();
  state.tensors.erase("p1:exp_avg");
  state.tensors["p9:exp_avg"] = torch::zeros({1});
  EXPECT_THAT((*optimizer)->LoadState(state),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "optimizer state does not fit the parameters: no state for p1; entries "
                       "for no parameter here: p9:exp_avg"));
  state = (*optimizer)->SaveState();
  state.tensors["p0:exp_avg_sq"] = torch::zeros({64, 32});
  EXPECT_THAT((*optimizer)->LoadState(state),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "optimizer state p0:exp_avg_sq has shape [64, 32], the parameter's is "
                       "[64, 33]"));
}

struct InvalidCase {
  std::string name;
  std::string config;
  std::string message;
};

class InvalidConfigTest : public ::testing::TestWithParam<InvalidCase> {};

TEST_P(InvalidConfigTest, NamesTheFieldInCreateAndValidateOptimizerConfig) {
  const std::vector<parallel::TrainableParameter> parameters = Trainable(InitialTensors());
  std::vector<std::string> names;
  for (const parallel::TrainableParameter& parameter : parameters) names.push_back(parameter.name);
  EXPECT_THAT(Optimizer::Create(parameters, Parse(GetParam().config)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(GetParam().message)));
  EXPECT_THAT(ValidateOptimizerConfig(Parse(GetParam().config), names),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(GetParam().message)));
}

INSTANTIATE_TEST_SUITE_P(
    Errors, InvalidConfigTest,
    ::testing::Values(
        InvalidCase{"no_algorithm", "weight_decay: 0.1",
                    "optimizer: no algorithm is set; set one of adamw, adam, sgd, lion"},
        InvalidCase{"beta1", "adamw { beta1: 1 }", "optimizer.adamw.beta1: 1 must be in [0, 1)"},
        InvalidCase{"beta2", "adam { beta2: -0.1 }",
                    "optimizer.adam.beta2: -0.1 must be in [0, 1)"},
        InvalidCase{"eps", "adamw { eps: 0 }", "optimizer.adamw.eps: 0 must be > 0"},
        // An infinite eps made every update 0, an infinite weight decay the parameters NaN.
        InvalidCase{"eps_infinite", "adam { eps: inf }", "optimizer.adam.eps: inf must be finite"},
        InvalidCase{"weight_decay_infinite", "sgd {} weight_decay: inf",
                    "optimizer.weight_decay: inf must be finite"},
        InvalidCase{"lion_beta", "lion { beta2: 1.5 }",
                    "optimizer.lion.beta2: 1.5 must be in [0, 1)"},
        InvalidCase{"momentum", "sgd { momentum: 1 }",
                    "optimizer.sgd.momentum: 1 must be in [0, 1)"},
        InvalidCase{"dampening", "sgd { momentum: 0.5 dampening: 2 }",
                    "optimizer.sgd.dampening: 2 must be in [0, 1]"},
        InvalidCase{"nesterov", "sgd { nesterov: true }",
                    "optimizer.sgd.nesterov: needs momentum > 0 and dampening 0"},
        InvalidCase{"max_norm", "sgd {} clipping { max_norm: -1 }",
                    "optimizer.clipping.max_norm: -1 must be >= 0 and finite"},
        InvalidCase{"weight_decay", "sgd {} weight_decay: -0.1",
                    "optimizer.weight_decay: -0.1 must be >= 0"},
        InvalidCase{"unmatched_rule", "sgd {} param_groups { glob: \"*.bias\" }",
                    "glob \"*.bias\" matches no parameter"}),
    [](const ::testing::TestParamInfo<InvalidCase>& info) { return info.param.name; });

TEST(OptimizerTest, RejectsBadParametersAndLearningRates) {
  const OptimizerConfig config = Parse("sgd {}");
  EXPECT_THAT(Optimizer::Create({}, config),
              StatusIs(absl::StatusCode::kInvalidArgument, "optimizer: no parameters to train"));
  EXPECT_THAT(Optimizer::Create({{"w", torch::ones({2}), {}}, {"w", torch::ones({2}), {}}}, config),
              StatusIs(absl::StatusCode::kInvalidArgument, "parameter \"w\" is listed twice"));
  EXPECT_THAT(Optimizer::Create({{"w", torch::ones({2}, at::kLong), {}}}, config),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("has dtype Long")));
  EXPECT_THAT(Optimizer::Create({{"w", torch::ones({3, 2}).t(), {}}}, config),
              StatusIs(absl::StatusCode::kInvalidArgument, "parameter \"w\" is not contiguous"));
  EXPECT_THAT(Optimizer::Create({{"w", torch::ones({2}), {}},
                                 {"m", torch::empty({2}, at::Device(at::kMeta)), {}}},
                                config),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "parameter \"m\" is on meta, parameter \"w\" on cpu; an optimizer's "
                       "parameters share one device"));
  auto optimizer = Optimizer::Create({{"w", torch::ones({2}), {}}}, config);
  ASSERT_THAT(optimizer, IsOk());
  EXPECT_THAT((*optimizer)->Step(-0.1),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "optimizer step 0: learning rate -0.1 must be >= 0 and finite"));
}

}  // namespace
}  // namespace plait::optim
