// Test helpers that run a plan's ranks as threads of one process: over TCP rings on the CPU, or,
// for a plan with device: DEVICE_CUDA, over NCCL with rank r on cuda:r (a plan that leaves the
// device to its default runs on the CPU here, wherever the test runs).
#ifndef PLAIT_TRAINER_TESTING_RANKS_H_
#define PLAIT_TRAINER_TESTING_RANKS_H_

#include <functional>
#include <map>
#include <string>

#include "ATen/core/Tensor.h"
#include "models/model.pb.h"
#include "parallel/device_mesh.h"
#include "plan/plan.pb.h"
#include "trainer/trainer.h"

namespace plait::trainer::testing {

// The shipped plan plan/examples/<name>.textproto (a data dependency of the test) as the
// parity tests run it: every model in fp32, where the shipped jobs compute in bf16 on devices
// that have it natively (DTYPE_AUTO). Failures are test failures.
plan::Plan LoadShippedPlan(const std::string& name);

// Runs `body(rank, mesh)` on `ranks` threads, each with the plan's mesh on the plan's device.
void WithMesh(const plan::Plan& plan, int ranks,
              const std::function<void(int, const parallel::DeviceMesh&)>& body);

// LoadShippedPlan's plan shortened for a test: 10 steps, evaluated every 5 on one batch, no
// metrics file. Read from the test's runfiles, so a test may change directory first.
plan::Plan ShortShippedPlan(const std::string& name);

// Resolves `plan` for `ranks` and trains it on that many threads with `options`; rank 0's
// report. Failures are test failures.
TrainReport TrainOnRanks(const plan::Plan& plan, int ranks, const TrainOptions& options = {});

// Every step's loss, gradient norm and training and evaluation metrics of `run` are those of
// `expected` within `tolerance`, relative, and below `floor` absolute, tolerance * floor (DPO's
// rewards start at exactly 0); failures name `layout`, the step and the metric.
void ExpectSameSteps(const TrainReport& run, const TrainReport& expected, const std::string& layout,
                     double tolerance = 1e-5, double floor = 1e-2);

// A run's report and its parameters at the end, by Hugging Face name.
struct SavedRun {
  TrainReport report;
  std::map<std::string, at::Tensor> parameters;
};

// TrainOnRanks, with the trained model saved as a Hugging Face folder (training.save_hf_dir,
// `name` in the test's temporary folder) and read back.
SavedRun TrainAndSave(plan::Plan plan, int ranks, const std::string& name,
                      const TrainOptions& options = {});

// TrainAndSave, once per test process for each `name`: later calls return the first run.
const SavedRun& TrainAndSaveOnce(const plan::Plan& plan, int ranks, const std::string& name);

// Adds a mesh dimension `dim` of `size` ranks to `plan`, and a preparation step after its
// others, for the caller to set (on `dim`).
wrap::PrepareStep& AddMeshStep(plan::Plan& plan, const std::string& dim, int size);

// Every parameter of `run` is `expected`'s within `tolerance` of its norm; failures name
// `layout` and the parameter. But key projections' biases (Qwen2's), whose gradient is zero in
// exact arithmetic (softmax ignores what they add to every key of a query), so that AdamW
// steps them by rounding noise alone: a layout that sums gradients in another order than one
// process (a pipeline's tied embedding, context parallelism's ranks) draws other noise, which
// moves them by about 6e-3 over a run; they are held within 1e-4 absolute (a thirtieth of one
// step at the peak learning rate, 3e-3).
void ExpectSameParameters(const SavedRun& run, const SavedRun& expected, const std::string& layout,
                          double tolerance = 1e-5);

// ExpectSameSteps, the last step's evaluation loss within 1e-5 relative (it must have one), and
// ExpectSameParameters: `run` trained as `expected` did.
void ExpectSameTraining(const SavedRun& run, const SavedRun& expected, const std::string& layout);

// The config `spec` resolves to (models::ResolveModelSpec), for prepared::PreparedModel::Prepare.
// Failures are test failures.
models::ModelConfig ConfigOf(const models::ModelSpec& spec);

}  // namespace plait::trainer::testing

#endif  // PLAIT_TRAINER_TESTING_RANKS_H_
