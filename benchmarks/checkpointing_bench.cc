// Activation checkpointing's memory and time on the medium model (bench_setup.h), fp32, one
// thread, batch 4 x 256 tokens: a training step (forward and backward) with the plan step
// `activation_checkpointing { policy: FULL | SELECTIVE }` against the same step without it,
// the two run side by side in every iteration. Memory is what LibTorch's CPU allocator hands
// out during the step (base/allocation_counter.h), the parameters and their gradients' first
// allocation excluded:
//   saved_MiB: bytes the forward leaves allocated for the backward (the saved activations,
//     the logits and the loss), at the end of the forward;
//   peak_MiB: the most allocated at once during the step, over what was allocated before it;
//   saved_vs_none, peak_vs_none: the same over the step without checkpointing;
//   block_inputs_MiB: the L block inputs [B, T, hidden] (what FULL keeps of the blocks);
//   block_MiB: one block's saved activations without checkpointing, measured as
//     (saved without - saved with FULL) / L + one input;
//   time_vs_none: the step's time over the step without checkpointing (the median of the
//     iterations' ratios): recomputation costs about one more forward, ~1.33 for FULL.
// The goal for FULL: its peak over the step's fall to about one block's activations plus the
// L block inputs (plus what lies outside the blocks: logits, loss).
//
//   bazel run --config=opt //benchmarks:checkpointing_bench
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "ATen/Context.h"
#include "ATen/core/Tensor.h"
#include "absl/strings/str_cat.h"
#include "base/allocation_counter.h"
#include "benchmark/benchmark.h"
#include "benchmarks/bench_setup.h"
#include "models/causal_lm.h"
#include "parallel/device_mesh.h"
#include "parallel/ring_communicator.h"
#include "torch/csrc/autograd/generated/variable_factories.h"
#include "torch/csrc/distributed/c10d/HashStore.hpp"
#include "wrap/preparation.h"

namespace plait::wrap {
namespace {

constexpr int64_t kBatch = 4;
constexpr int64_t kSeqLen = 256;
constexpr double kMiB = 1024.0 * 1024.0;

using base::AllocationCounter;

struct StepMemory {
  double seconds = 0;
  int64_t saved_bytes = 0;
  int64_t peak_bytes = 0;
};

// One model, prepared with `policy` (POLICY_UNSPECIFIED: no preparation step), on a mesh of
// one rank.
class Trainer {
 public:
  explicit Trainer(ActivationCheckpointingConfig::Policy policy)
      : mesh_(parallel::DeviceMesh::Create(
                  parallel::MeshLayout::Create(parallel::MeshConfig(), 1).value(), 0,
                  parallel::RingCommunicatorFactory(*store_, parallel::RingCommunicator::kLoopback))
                  .value()) {
    models::InitConfig init;
    init.set_seed(1);
    model_ = models::CausalLM::Create(benchmarks::MediumModel(), init).value();
    preparation_ = Preparation::Begin(*model_, mesh_).value();
    if (policy != ActivationCheckpointingConfig::POLICY_UNSPECIFIED) {
      PrepareStep step;
      step.mutable_activation_checkpointing()->set_policy(policy);
      TORCH_CHECK(preparation_->Apply(step).ok());
    }
    at::manual_seed(2);
    const at::Tensor tokens = torch::randint(model_->config().vocab_size(), {kBatch, kSeqLen + 1});
    inputs_ = tokens.narrow(1, 0, kSeqLen);
    targets_ = tokens.narrow(1, 1, kSeqLen);
    // One step first: it allocates the gradients, which every later step reuses.
    Step(nullptr);
  }

  // A forward and backward step, counting its allocations in `counter` when given.
  StepMemory Step(AllocationCounter* counter) {
    StepMemory memory;
    const auto start = std::chrono::steady_clock::now();
    {
      std::optional<AllocationCounter::Scope> counting;
      if (counter != nullptr) {
        counter->Reset();
        counting.emplace(*counter);
      }
      at::Tensor loss = model_->Loss(inputs_, targets_);
      if (counter != nullptr) memory.saved_bytes = counter->current();
      loss.backward();
    }
    memory.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (counter != nullptr) memory.peak_bytes = counter->peak();
    at::NoGradGuard no_grad;
    for (auto& parameter : model_->parameters()) parameter.mutable_grad().zero_();
    return memory;
  }

  models::CausalLM& model() { return *model_; }

 private:
  c10::intrusive_ptr<c10d::Store> store_ = c10::make_intrusive<c10d::HashStore>();
  parallel::DeviceMesh mesh_;
  std::shared_ptr<models::CausalLM> model_;
  std::unique_ptr<Preparation> preparation_;
  at::Tensor inputs_, targets_;
};

// range(0): 0 no checkpointing, 1 FULL, 2 SELECTIVE.
void BM_CheckpointedStep(benchmark::State& state) {
  const auto policy = static_cast<ActivationCheckpointingConfig::Policy>(state.range(0));
  state.SetLabel(policy == ActivationCheckpointingConfig::POLICY_UNSPECIFIED
                     ? "none"
                     : ActivationCheckpointingConfig::Policy_Name(policy));
  Trainer none(ActivationCheckpointingConfig::POLICY_UNSPECIFIED);
  Trainer checkpointed(policy);
  Trainer full(ActivationCheckpointingConfig::FULL);
  AllocationCounter counter;
  // The allocations of each are the same every step: measured once.
  const StepMemory none_memory = none.Step(&counter);
  const StepMemory full_memory = full.Step(&counter);
  const StepMemory memory = checkpointed.Step(&counter);
  std::vector<double> time_ratios;
  for (auto _ : state) {
    const double seconds = checkpointed.Step(nullptr).seconds;
    state.SetIterationTime(seconds);
    time_ratios.push_back(seconds / none.Step(nullptr).seconds);
  }
  const models::ModelConfig& config = checkpointed.model().config();
  const double layers = static_cast<double>(config.num_hidden_layers());
  const double input_bytes = static_cast<double>(kBatch * kSeqLen * config.hidden_size()) * 4.0;
  state.counters["saved_MiB"] = static_cast<double>(memory.saved_bytes) / kMiB;
  state.counters["peak_MiB"] = static_cast<double>(memory.peak_bytes) / kMiB;
  state.counters["saved_vs_none"] =
      static_cast<double>(memory.saved_bytes) / static_cast<double>(none_memory.saved_bytes);
  state.counters["peak_vs_none"] =
      static_cast<double>(memory.peak_bytes) / static_cast<double>(none_memory.peak_bytes);
  state.counters["block_inputs_MiB"] = layers * input_bytes / kMiB;
  state.counters["block_MiB"] =
      (static_cast<double>(none_memory.saved_bytes - full_memory.saved_bytes) / layers +
       input_bytes) /
      kMiB;
  state.counters["time_vs_none"] = benchmarks::Median(time_ratios);
}

BENCHMARK(BM_CheckpointedStep)
    ->Arg(0)
    ->Arg(1)
    ->Arg(2)
    ->Iterations(3)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace plait::wrap

int main(int argc, char** argv) { return plait::benchmarks::BenchmarkMain(argc, argv); }
