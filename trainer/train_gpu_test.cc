// Whole plans trained on CUDA, through the trainer, against the same plans on the CPU: the
// single-device run (TF32 off) in fp32 and in bf16, FSDP and DDP over NCCL on a mesh of one
// rank and, with 2 GPUs, of two, tensor parallelism (2 GPUs), 2-D and hybrid sharding (4),
// DPO against its frozen reference, live or precomputed, and a checkpoint written on the GPU
// resumed on the GPU and on the CPU. The CUDA runs report their peak memory, a sharded model
// is never whole on a GPU, and a step waits for the device only to read what the host needs.
// A test that needs more GPUs than the machine has says so and skips.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "ATen/Context.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/dtype.pb.h"
#include "base/status_matchers.h"
#include "c10/cuda/CUDAFunctions.h"
#include "c10/util/Backtrace.h"
#include "c10/util/Exception.h"
#include "gtest/gtest.h"
#include "models/causal_lm.h"
#include "models/estimates.h"
#include "models/model_config.h"
#include "parallel/device.h"
#include "plan/plan.h"
#include "prepared/prepared_model.h"
#include "trainer/testing_ranks.h"
#include "trainer/trainer.h"

namespace plait::trainer {
namespace {

using ::plait::base::testing::IsOk;
using ::plait::prepared::PreparedModel;
using ::plait::prepared::Role;
using ::plait::trainer::testing::ConfigOf;
using ::plait::trainer::testing::LoadShippedPlan;
using ::plait::trainer::testing::ShortShippedPlan;
using ::plait::trainer::testing::TrainOnRanks;
using ::plait::trainer::testing::WithMesh;

// A shipped plan in fp32 for 10 steps on `ranks` ranks of one "dp" dimension (none for one
// rank without a wrapper), with `micro_batch` sequences per rank, evaluated at steps 5 and 10.
plan::Plan ShippedPlan(const std::string& name, int ranks, int64_t micro_batch) {
  plan::Plan plan = LoadShippedPlan(name);
  for (const std::string& setting :
       {std::string("training.steps=10"), std::string("training.eval_every=5"),
        std::string("training.eval_batches=1"), std::string("training.metrics_file="),
        absl::StrCat("training.micro_batch=", micro_batch)}) {
    EXPECT_THAT(plan::ApplyOverride(setting, plan), IsOk()) << setting;
  }
  if (plan.mesh().dims_size() > 0) plan.mutable_mesh()->mutable_dims(0)->set_size(ranks);
  return plan;
}

plan::Plan OnCuda(plan::Plan plan) {
  plan.set_device(parallel::DEVICE_CUDA);
  return plan;
}

// Per step: loss, gradient norm, the objective's metrics; the evaluations. Each within
// `tolerance` of the expected value or of `floor`, whichever is larger: DPO's rewards are
// differences of log-probabilities near -100, which start at exactly 0. A reward accuracy, a
// fraction of pairs, may differ by one pair whose rewards are within rounding of each other.
void ExpectSameRun(const TrainReport& actual, const TrainReport& expected, double tolerance,
                   double floor, int pairs_per_step = 0) {
  ASSERT_EQ(actual.steps.size(), expected.steps.size());
  const auto near = [&](double a, double e) {
    return std::abs(a - e) <= tolerance * std::max(std::abs(e), floor);
  };
  for (size_t i = 0; i < expected.steps.size(); ++i) {
    const metrics::StepMetrics& a = actual.steps[i];
    const metrics::StepMetrics& e = expected.steps[i];
    EXPECT_TRUE(near(a.loss, e.loss))
        << "step " << e.step << " loss " << a.loss << " vs " << e.loss;
    EXPECT_TRUE(near(*a.grad_norm, *e.grad_norm))
        << "step " << e.step << " grad_norm " << *a.grad_norm << " vs " << *e.grad_norm;
    ASSERT_EQ(a.named.size(), e.named.size());
    for (size_t m = 0; m < e.named.size(); ++m) {
      const auto& [name, value] = e.named[m];
      const bool ok = name == "rewards/accuracies"
                          ? std::abs(a.named[m].second - value) <= 1.0 / pairs_per_step + 1e-9
                          : near(a.named[m].second, value);
      EXPECT_TRUE(ok) << "step " << e.step << " " << name << " " << a.named[m].second << " vs "
                      << value;
    }
    ASSERT_EQ(a.eval_loss.has_value(), e.eval_loss.has_value());
    if (e.eval_loss) {
      EXPECT_TRUE(near(*a.eval_loss, *e.eval_loss)) << "step " << e.step << " eval";
    }
  }
  EXPECT_LT(expected.steps.back().loss, expected.steps.front().loss);  // it trained
}

// Whether the machine has `ranks` GPUs; says why not when it lacks them.
bool EnoughGpus(int ranks, const std::string& what) {
  if (parallel::CudaDeviceCount() >= ranks) return true;
  std::cout << "skipping " << what << ": it needs " << ranks << " GPUs, "
            << parallel::CudaDeviceCount() << " here\n";
  return false;
}

// fp32 on CUDA (cuBLAS, TF32 off) against the CPU's fused kernels, over 10 steps of AdamW.
constexpr double kCudaTolerance = 1e-4;

class TrainOnCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (parallel::CudaDeviceCount() == 0) GTEST_SKIP() << "no GPU here";
    ASSERT_FALSE(at::globalContext().allowTF32CuBLAS()) << "fp32 parity needs TF32 off";
  }

  static const TrainReport& CpuSingle() {
    static const auto* report =
        new TrainReport(TrainOnRanks(ShippedPlan("llama_single", 1, 16), 1));
    return *report;
  }
};

TEST_F(TrainOnCudaTest, SingleDeviceTracksTheCpuAndReportsPeakMemory) {
  const TrainReport cuda = TrainOnRanks(OnCuda(ShippedPlan("llama_single", 1, 16)), 1);
  ExpectSameRun(cuda, CpuSingle(), kCudaTolerance, /*floor=*/1e-2);
  EXPECT_FALSE(CpuSingle().peak_device_memory_bytes.has_value());
  ASSERT_TRUE(cuda.peak_device_memory_bytes.has_value());
  // At least the parameters, their gradients and AdamW's two buffers, fp32.
  const int64_t state_bytes = 4 * 4 * models::NumParameters(models::PresetConfig("tiny").value());
  EXPECT_GT(*cuda.peak_device_memory_bytes, state_bytes);
  for (const metrics::StepMetrics& step : cuda.steps) {
    ASSERT_TRUE(step.peak_device_memory_bytes.has_value());
    EXPECT_GT(*step.peak_device_memory_bytes, 0);
  }
}

// FSDP and DDP over NCCL: one rank with the whole batch, or two with half each.
TEST_F(TrainOnCudaTest, FsdpAndDdpTrackTheCpuSingleProcessRun) {
  for (const int ranks : {1, 2}) {
    if (!EnoughGpus(ranks, absl::StrCat("the ", ranks, "-rank FSDP and DDP runs"))) continue;
    for (const std::string name : {"llama_fsdp", "llama_ddp"}) {
      SCOPED_TRACE(absl::StrCat(name, " on ", ranks, " rank(s)"));
      ExpectSameRun(TrainOnRanks(OnCuda(ShippedPlan(name, ranks, 16 / ranks)), ranks), CpuSingle(),
                    kCudaTolerance, /*floor=*/1e-2);
    }
  }
}

// Tensor parallelism (both ranks read the 16 sequences of a step), FSDP over dp=2 x tensor
// parallelism over tp=2, and hybrid sharding over 2 x 2: the CPU single process's run, as
// their CPU twins in trainer_test.
TEST_F(TrainOnCudaTest, TensorParallelTwoDimensionalAndHybridRunsTrackTheCpuSingleProcessRun) {
  for (const auto& [name, ranks] :
       {std::pair<std::string, int>{"llama_tp", 2}, std::pair<std::string, int>{"llama_2d", 4},
        std::pair<std::string, int>{"llama_hsdp", 4}}) {
    if (!EnoughGpus(ranks, name)) continue;
    SCOPED_TRACE(name);
    ExpectSameRun(TrainOnRanks(OnCuda(ShortShippedPlan(name)), ranks), CpuSingle(), kCudaTolerance,
                  /*floor=*/1e-2);
  }
}

// A bf16 model on the GPU (bf16 compute and parameters, fp32 masters in the optimizer)
// follows the fp32 CPU run at bf16's precision, as the CPU's bf16 runs do (trainer_test), and
// trains.
TEST_F(TrainOnCudaTest, Bf16TracksTheFp32CpuRun) {
  plan::Plan plan = OnCuda(ShippedPlan("llama_single", 1, 16));
  plan.mutable_model()->set_dtype(base::DTYPE_BFLOAT16);
  const TrainReport bf16 = TrainOnRanks(plan, 1);
  const TrainReport& fp32 = CpuSingle();
  ASSERT_EQ(bf16.steps.size(), fp32.steps.size());
  for (size_t i = 0; i < fp32.steps.size(); ++i) {
    EXPECT_NEAR(bf16.steps[i].loss, fp32.steps[i].loss, 0.03 * fp32.steps[i].loss) << i;
  }
  EXPECT_LT(bf16.steps.back().loss, bf16.steps.front().loss - 1.0);
}

// DPO with FSDP (its plan's layout) on CUDA against the same plan on the CPU, both on the
// same number of ranks, TCP rings against NCCL; and with the reference's log-probabilities
// precomputed on the GPU, as the live reference.
TEST_F(TrainOnCudaTest, DpoTracksTheCpuRun) {
  const int ranks = std::min(parallel::CudaDeviceCount(), 2);
  const plan::Plan plan = ShippedPlan("qwen_dpo_fsdp", ranks, 16 / ranks);
  const TrainReport cpu = TrainOnRanks(plan, ranks);
  const TrainReport cuda = TrainOnRanks(OnCuda(plan), ranks);
  EXPECT_FLOAT_EQ(cuda.steps[0].loss, std::log(2.0));  // the policy starts as its reference
  // 16 sequences a step: 8 pairs.
  ExpectSameRun(cuda, cpu, kCudaTolerance, /*floor=*/1.0, /*pairs_per_step=*/8);
  plan::Plan precomputed = OnCuda(plan);
  ASSERT_THAT(plan::ApplyOverride("objective.dpo.precompute_reference=true", precomputed), IsOk());
  ExpectSameRun(TrainOnRanks(precomputed, ranks), cuda, kCudaTolerance, /*floor=*/1.0,
                /*pairs_per_step=*/8);
}

// A checkpoint of step 5 written by a GPU run (its device tensors copied to host memory)
// resumes on the GPU and on the CPU (read back onto each device) to the uninterrupted GPU
// run's steps 6 to 10.
TEST_F(TrainOnCudaTest, ACheckpointResumesOnTheGpuAndOnTheCpu) {
  const std::string root = std::getenv("TEST_TMPDIR");
  plan::Plan plan = OnCuda(ShippedPlan("llama_fsdp", 1, 16));
  for (const std::string& setting : {std::string("training.checkpoint.every=5"),
                                     absl::StrCat("training.checkpoint.dir=", root, "/straight")}) {
    ASSERT_THAT(plan::ApplyOverride(setting, plan), IsOk()) << setting;
  }
  const TrainReport straight = TrainOnRanks(plan, 1);
  TrainReport after_five = straight;
  after_five.steps.erase(after_five.steps.begin(), after_five.steps.begin() + 5);
  for (const parallel::Device device : {parallel::DEVICE_CUDA, parallel::DEVICE_CPU}) {
    SCOPED_TRACE(parallel::Device_Name(device));
    const std::string dir = absl::StrCat(root, "/resumed_", parallel::Device_Name(device));
    std::filesystem::create_directories(dir);
    std::filesystem::copy(root + "/straight/step-00000005", dir + "/step-00000005",
                          std::filesystem::copy_options::recursive);
    plan::Plan resumed = plan;
    resumed.set_device(device);
    resumed.mutable_training()->mutable_checkpoint()->set_dir(dir);
    resumed.mutable_training()->mutable_checkpoint()->set_resume(true);
    ExpectSameRun(TrainOnRanks(resumed, 1), after_five, kCudaTolerance, /*floor=*/1e-2);
  }
}

// Deferred initialisation on GPUs: a rank of a model FSDP shards over 2 GPUs allocates on its
// device, while the model is prepared, its fp32 shards and one whole parameter at a time,
// never the whole model. The model: 16 of tiny's blocks, 55 MB in fp32, whose largest
// parameter is 4 MB.
TEST_F(TrainOnCudaTest, PreparingAnFsdpModelPutsOnlyItsShardsOnEachGpu) {
  if (!EnoughGpus(2, "preparing a model FSDP shards over 2 GPUs")) return;
  models::ModelConfig config = models::PresetConfig("tiny").value();
  config.set_num_hidden_layers(16);
  const double model_bytes = 4.0 * static_cast<double>(models::NumParameters(config));
  plan::Plan plan = OnCuda(LoadShippedPlan("llama_fsdp"));
  *plan.mutable_model()->mutable_config() = config;
  WithMesh(plan, 2, [&](int rank, const parallel::DeviceMesh& mesh) {
    parallel::ResetPeakMemory(mesh.device());
    ASSERT_THAT(PreparedModel::Prepare(plan.model(), ConfigOf(plan.model()), "", plan.prepare(),
                                       mesh, Role::kTrained, "plan"),
                IsOk());
    const std::optional<int64_t> peak = parallel::PeakMemory(mesh.device());
    ASSERT_TRUE(peak.has_value());
    std::cout << "rank " << rank << " allocated at most " << *peak / model_bytes
              << " of the model's fp32 bytes on " << mesh.device() << "\n";
    EXPECT_GT(*peak, 0.5 * model_bytes) << "rank " << rank;
    EXPECT_LT(*peak, 0.7 * model_bytes) << "rank " << rank;
  });
}

// The host's waits for the device through LibTorch's synchronising operations (a blocking
// copy to the host, .item(), a stream or device synchronisation), which c10's sync debug mode
// reports as warnings, per rank (thread) and training step, each with the backtrace of where
// it was made (a backward pass's are replayed on the rank's thread after it, without theirs).
// The NCCL communicator's waits for a collective query its event, and are not among them.
class DeviceSyncLog {
 public:
  DeviceSyncLog() {
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_WARN);
  }
  ~DeviceSyncLog() {
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
  }

  // Installs the log on the calling thread, a rank's (TrainOptions::before_step); what it
  // synchronises from now on counts towards `step` (0-based).
  void BeginStep(int64_t step) {
    absl::MutexLock lock(&mu_);
    std::unique_ptr<Rank>& rank = ranks_[std::this_thread::get_id()];
    if (rank == nullptr) rank = std::make_unique<Rank>();
    rank->step = step;
    c10::WarningUtils::set_warning_handler(rank.get());
  }

  // For each rank (in no particular order), the backtraces of each step's synchronisations.
  std::vector<std::map<int64_t, std::vector<std::string>>> PerRank() {
    absl::MutexLock lock(&mu_);
    std::vector<std::map<int64_t, std::vector<std::string>>> result;
    for (const auto& [thread, rank] : ranks_) result.push_back(rank->syncs);
    return result;
  }

 private:
  struct Rank final : public c10::WarningHandler {
    void process(const c10::Warning& warning) override {
      if (absl::StrContains(warning.msg(), "synchronizing CUDA operation")) {
        syncs[step].push_back(c10::get_backtrace(/*frames_to_skip=*/1,
                                                 /*maximum_number_of_frames=*/24));
      } else {
        c10::WarningHandler().process(warning);
      }
    }
    int64_t step = 0;
    std::map<int64_t, std::vector<std::string>> syncs;
  };

  absl::Mutex mu_;
  std::map<std::thread::id, std::unique_ptr<Rank>> ranks_;
};

// The loss is read on the host once a step, before the update (a step whose loss is not finite
// skips it); the gradient norm once, for clipping's decision; and, with more than one data-parallel
// rank, the step's item count once, before the first micro-batch. Nothing else waits for the
// device, micro-batches (gradient accumulation), FSDP and bf16 masters included. The first step may
// make one-time waits and the last evaluates, so the steps between are counted.
TEST_F(TrainOnCudaTest, AStepWaitsForTheDeviceOnlyForWhatTheHostReads) {
  for (const auto& [name, ranks, dtype, accumulation] :
       {std::tuple<std::string, int, base::Dtype, int>{"llama_single", 1, base::DTYPE_FLOAT32, 1},
        {"llama_single", 1, base::DTYPE_BFLOAT16, 2},
        {"llama_fsdp", 1, base::DTYPE_BFLOAT16, 2},
        {"llama_fsdp", 2, base::DTYPE_BFLOAT16, 2}}) {
    const std::string run =
        absl::StrCat(name, " in ", base::Dtype_Name(dtype), " with ", accumulation,
                     " micro-batch(es) a step on ", ranks, " GPU(s)");
    if (!EnoughGpus(ranks, run)) continue;
    SCOPED_TRACE(run);
    plan::Plan plan = OnCuda(LoadShippedPlan(name));
    plan.mutable_model()->set_dtype(dtype);
    for (const std::string& setting :
         {std::string("training.steps=5"), std::string("training.eval_every=0"),
          std::string("training.eval_batches=1"), std::string("training.metrics_file="),
          absl::StrCat("training.micro_batch=", 16 / (ranks * accumulation)),
          absl::StrCat("training.grad_accumulation=", accumulation)}) {
      ASSERT_THAT(plan::ApplyOverride(setting, plan), IsOk()) << setting;
    }
    if (plan.mesh().dims_size() > 0) plan.mutable_mesh()->mutable_dims(0)->set_size(ranks);
    DeviceSyncLog log;
    TrainOptions options;
    options.before_step = [&log](int64_t step) { log.BeginStep(step); };
    TrainOnRanks(plan, ranks, options);
    const size_t expected = ranks > 1 ? 3 : 2;
    const std::vector<std::map<int64_t, std::vector<std::string>>> per_rank = log.PerRank();
    ASSERT_EQ(per_rank.size(), static_cast<size_t>(ranks));
    for (const auto& steps : per_rank) {
      const auto count = [&](int64_t step) {
        const auto it = steps.find(step);
        return it == steps.end() ? size_t{0} : it->second.size();
      };
      std::cout << run << ": step 1 waited " << count(0) << " time(s), steps 2 to 4 " << count(1)
                << ", " << count(2) << ", " << count(3) << "\n";
      for (int64_t step = 1; step < 4; ++step) {
        if (count(step) == expected) continue;
        std::string where;
        for (const std::string& backtrace : steps.at(step))
          absl::StrAppend(&where, "\n", backtrace);
        ADD_FAILURE() << "step " << step + 1 << " waited for the device " << count(step)
                      << " times, not " << expected << ":" << where;
      }
    }
  }
}

}  // namespace
}  // namespace plait::trainer
