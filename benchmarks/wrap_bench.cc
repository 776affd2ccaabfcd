// DDP and FSDP training steps of the medium model (bench_setup.h) on 2 ranks x 1 thread (two
// threads of this process, TCP rings over loopback) against the single-process step on the same
// per-rank batch, AdamW. The argument is the per-rank batch in sequences of 256 tokens: 8,
// the medium shape's batch (the headline), and 2, where communication weighs 4x more:
//   scaling_efficiency: the 2-rank job's tokens/s / (2 x the single process's);
//   cpu_scaling_efficiency: the same from the process's CPU time per step (every rank and
//     communication thread), which other jobs on a shared machine disturb less than wall
//     time: 2 x the single process's CPU seconds per step / the 2-rank job's;
//   vs_ddp: the step time / DDP's (FSDP's goal <= 1.10);
//   sent_vs_theory: bytes rank 0 sent per step (its communicator's counters) / the volume
//     the algorithm needs: DDP 2(N-1)/N x gradient bytes; FSDP (N-1)/N x parameter bytes
//     (padded) for each of 2 gathers and 1 reduce-scatter;
//   persistent_vs_single: rank 0's bytes of parameters + gradients + optimizer state kept
//     between steps / the single process's (FSDP's goal <= 1/N + 0.05);
//   peak_unsharded_blocks: FSDP's most gathered parameter bytes alive at once (a unit
//     counted from the start of its gather), in blocks (the root unit is ~1.33 of them);
//   peak_vs_two_largest_units: the same over the two largest units' bytes (goal <= 1).
// Tensor parallelism (BM_Tp, tp=2: both ranks compute the same batch of the given size) and
// FSDP over dp=2 x tensor parallelism over tp=2 (BM_FsdpTp, 4 ranks, each dp pair on its own
// batch) report:
//   vs_single: the step time / the single process's on the same per-rank batch (TP's
//     ideal on 2 idle cores is 1/2);
//   sent_vs_theory: rank 0's bytes sent per step over every group / the algorithm's volume:
//     TP's 4 all-reduces per block and 2 more of the [batch x 256, hidden] activations and
//     the loss's 3 floats per token (2(N-1)/N each), plus FSDP's as above on the TP slices
//     (goal 1.00);
//   persistent_vs_single: as above (goal <= 1/2 + 0.05 for TP, 1/4 + 0.05 for both).
// The bf16 rows (BM_SingleProcessBf16, BM_FsdpBf16) train bf16 parameters with fp32 master
// weights (the optimizer's, or FSDP's fp32 shards; FSDP gathers bf16 and reduce-scatters
// fp32), each against the bf16 single process, and report vs_fp32: the step time / the
// same row's in fp32.
// Hybrid sharding (BM_Hsdp: FSDP over dp=2, its shards replicated across replicate=2; 4
// ranks, each on its own batch) reports scaling_efficiency and cpu_scaling_efficiency as
// above against 4 x the single process (4 ranks share the 2 cores, so wall time can reach
// 1/2 at best), sent_vs_theory (FSDP's volume over dp plus an all-reduce of the gradient
// shards across replicate, 2(N-1)/N x shard bytes; goal 1.00) and persistent_vs_single
// (goal <= 1/2 + 0.05).
// Pipelines (BM_PipelineGPipe, BM_Pipeline1F1B, BM_PipelineZeroBubble: 2 stages over pp=2;
// BM_PipelineInterleaved: INTERLEAVED_1F1B, 4 stages, 2 per rank; both ranks on the same batch,
// one sequence a micro-batch) report vs_single (the step time / the
// single process's on the batch; the ideal on 2 idle cores is 1/2 over 1 - the bubble),
// waiting_rank0/1 (the share of the micro-batches' passes each rank spent waiting for the
// other's tensors) beside bubble_rank0/1 (its idle share in the schedule's own timing, equal
// stages, a backward twice a forward), sent_vs_theory (rank 0's bytes sent / the hidden states
// and gradients its schedule sends; goal 1.00) and params_vs_single_rank0/1 (each rank's parameter
// bytes / the whole model's; goal about 1/2).
// Context parallelism (BM_ContextParallel: cp=2, both ranks on the same batch, each computing
// 128 of every sequence's 256 tokens by ring attention) reports vs_single (the step time / the
// single process's on the batch; the ideal on 2 idle cores is 1/2), sent_vs_theory (rank
// 0's bytes sent / the ring's: per block 1 hop of its keys and values forward, 1 back and 2
// of their fp32 gradients, plus the gradients' average, 2(N-1)/N x their bytes; goal 1.00)
// and activations_vs_single (the most rank 0's forward and backward allocate beyond what lives
// between steps / the single process's; goal 1/2).
// Ring attention's load balance (BM_RingAttentionBalance: cp=2, attention alone, forward and
// backward, over one sequence of 8192 tokens, 8 heads on 2 key/value heads of 64; arg 0 the
// causal chunking, rank r keeping chunks r and 3 - r; arg 1 the contiguous split, chunks 2r
// and 2r + 1; second arg 0 the fused CPU kernels, 1 the generic ops in tiles, the GPU's path)
// reports busy_rank0/1 (each rank's seconds computing: its wall time less what it waited for
// the ring) and busy_max_vs_min (goal 1.00 with the causal chunking; the contiguous split's
// second rank meets 3 times the keys of the first).
// Expert parallelism (BM_ExpertParallel: ep=2, each rank keeping 4 of the 8 experts of every
// layer of a mixture of experts of the medium model's widths (4 layers, hidden 512, experts of
// 512, 2 a token), each rank's forward and backward on its own batch of 4 x 256 tokens; arg 0
// the router as initialised, arg 1 one sending every token to rank 0's experts) reports
// vs_single (the step time / the single process's on one rank's batch with every expert: each
// rank does one batch's work, so the ideal on 2 idle cores is 1, at twice the tokens),
// sent_vs_theory (rank 0's all-to-all bytes / the routing's: the rows its tokens send to the
// other rank's experts and those it receives, each way forward and backward, and each layer's
// counts; goal 1.00) and rows_max_vs_mean (the rows the busier rank's experts computed / the
// ranks' mean: the expert load balance, 1 when even, 2 when one rank computes them all).
// Tensor parallelism of that mixture of experts (BM_MoeTensorParallel: tp=2, both ranks on one
// batch of 4 x 256 tokens; arg 0 without sequence parallelism, every rank then computing the
// experts of every token, arg 1 with it, each rank its slice's and the experts' gradients
// summed) reports vs_single (the median step time of 5 / the single process's on the batch; the
// ideal on 2 idle cores is 1/2) and sent_vs_theory (rank 0's bytes sent / the attention's
// collectives, the loss's and the summed gradients'; goal 1.00).
// Expert parallelism under FSDP (BM_ExpertParallelFsdp: ep=2 x dp=2, 4 ranks, each training its
// own batch of 2 x 256 tokens of that mixture of experts; arg 0 the dense parts sharded over
// dp, whole on each ep rank and their gradients averaged over ep after the backward, arg 1
// sharded over dp and ep, fsdp.shard_dense_over_mesh_dim) reports kept_vs_whole (the bytes rank
// 0 trains / the model's), sent_vs_theory (rank 0's bytes over every group but the routed
// rows' all-to-alls / each trained shard gathered twice and its gradient, with one usage flag,
// reduce-scattered over its FSDP group, and in arg 0 the dense shards all-reduced over ep;
// goal 1.00); its time is the median step's slowest rank's (4 ranks on the machine's cores).
//
//   bazel run --config=opt //benchmarks:wrap_bench
#include <time.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ATen/Context.h"
#include "ATen/Parallel.h"
#include "ATen/core/Tensor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/allocation_counter.h"
#include "benchmark/benchmark.h"
#include "benchmarks/bench_setup.h"
#include "models/causal_lm.h"
#include "models/model_config.h"
#include "optim/optimizer.h"
#include "parallel/device_mesh.h"
#include "parallel/graph_group.h"
#include "parallel/ring_communicator.h"
#include "parallel/test_ranks.h"
#include "torch/csrc/autograd/generated/variable_factories.h"
#include "torch/csrc/distributed/c10d/HashStore.hpp"
#include "wrap/cp/ring_attention.h"
#include "wrap/ep/expert_dispatch.h"
#include "wrap/micro_batch_executor.h"
#include "wrap/pp/schedule.h"
#include "wrap/preparation.h"

namespace plait::wrap {
namespace {

constexpr int kRanks = 2;
constexpr int64_t kSeqLen = 256;
// Timed steps per run; a run's step time is their median, which a hiccup of the shared
// machine during one step does not move.
constexpr int kTimedSteps = 5;

enum class Mode {
  kSingle,
  kDdp,
  kFsdp,
  kTp,
  kFsdpTp,
  kHsdp,
  kSingleBf16,
  kFsdpBf16,
  kPipelineGPipe,
  kPipeline1F1B,
  kPipelineZeroBubble,
  kPipelineInterleaved,
  kContextParallel
};

bool TensorParallel(Mode mode) { return mode == Mode::kTp || mode == Mode::kFsdpTp; }
// The pipeline's schedule over "pp" ("" for the modes without one).
std::string PipelineSchedule(Mode mode) {
  switch (mode) {
    case Mode::kPipelineGPipe:
      return "GPIPE";
    case Mode::kPipeline1F1B:
      return "1F1B";
    case Mode::kPipelineZeroBubble:
      return "ZB_H1";
    case Mode::kPipelineInterleaved:
      return "INTERLEAVED_1F1B";
    default:
      return "";
  }
}
// The stages each pipeline rank holds.
int StagesPerRank(Mode mode) { return mode == Mode::kPipelineInterleaved ? 2 : 1; }
bool Pipeline(Mode mode) { return !PipelineSchedule(mode).empty(); }
// The pipeline's schedule of `batch` micro-batches over the 2 ranks.
pp::PipelineSchedule Schedule(Mode mode, int64_t batch) {
  return pp::BuildSchedule(pp::ScheduleKindFromName(PipelineSchedule(mode)).value(), kRanks,
                           StagesPerRank(mode), static_cast<int>(batch))
      .value();
}
bool Replicated(Mode mode) { return mode == Mode::kHsdp; }
bool ContextParallel(Mode mode) { return mode == Mode::kContextParallel; }
bool DataParallel(Mode mode) {
  return mode == Mode::kDdp || mode == Mode::kFsdp || mode == Mode::kFsdpTp ||
         mode == Mode::kFsdpBf16 || Replicated(mode);
}
// The ranks that read different batches.
int DataParallelRanks(Mode mode) {
  return (DataParallel(mode) ? kRanks : 1) * (Replicated(mode) ? kRanks : 1);
}
bool Fsdp(Mode mode) {
  return mode == Mode::kFsdp || mode == Mode::kFsdpTp || mode == Mode::kFsdpBf16 ||
         mode == Mode::kHsdp;
}
// bf16 parameters with fp32 masters (the optimizer's, or FSDP's fp32 shards); FSDP gathers
// bf16 and reduce-scatters fp32 gradients.
bool Bf16(Mode mode) { return mode == Mode::kSingleBf16 || mode == Mode::kFsdpBf16; }
// The single-process run a mode is measured against: the same dtype.
Mode SingleOf(Mode mode) { return Bf16(mode) ? Mode::kSingleBf16 : Mode::kSingle; }

struct Measurement {
  double step_seconds = 0.0;
  double process_cpu_seconds_per_step = 0.0;
  int64_t bytes_sent_per_step = 0;
  double theoretical_bytes_per_step = 0.0;
  int64_t persistent_bytes = 0;
  int64_t peak_unsharded_bytes = 0;
  int64_t block_bytes = 0;
  int64_t two_largest_units_bytes = 0;
  // Pipelines: the share of the micro-batches' passes this rank spent waiting for the other
  // rank's tensors, and the bytes of the parameters it holds; both by rank in Run's result.
  double wait_fraction = 0.0;
  int64_t stage_parameter_bytes = 0;
  // Context parallelism and the single process: the most one step's passes allocate beyond
  // what lives between steps (activations and working tensors).
  int64_t passes_peak_bytes = 0;
  std::vector<double> wait_fraction_by_rank;
  std::vector<int64_t> parameter_bytes_by_rank;
};

std::shared_ptr<models::CausalLM> MakeModel() {
  return models::CausalLM::Create(benchmarks::MediumModel(), models::InitConfig()).value();
}

double ProcessCpuSeconds() {
  timespec now;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
}

int64_t Bytes(const at::Tensor& tensor) {
  return tensor.defined() ? static_cast<int64_t>(tensor.nbytes()) : 0;
}

// One rank's run: a warm-up step, then kTimedSteps timed ones, on `batch` sequences.
Measurement RunRank(Mode mode, int64_t batch, int rank, parallel::DeviceMesh* mesh) {
  Measurement m;
  std::shared_ptr<models::CausalLM> model = MakeModel();
  if (Bf16(mode)) model->to(at::kBFloat16);
  for (const auto& parameter : model->Blocks()[0].module->parameters()) {
    m.block_bytes += Bytes(parameter);
  }
  int64_t root_bytes = 0;
  for (const auto& named : model->RootParameters()) root_bytes += Bytes(named.parameter);
  m.two_largest_units_bytes = m.block_bytes + std::max(m.block_bytes, root_bytes);
  int64_t parameter_bytes = 0;
  for (const auto& named : model->NamedParameters()) parameter_bytes += Bytes(named.parameter);

  std::unique_ptr<Preparation> preparation;
  std::vector<parallel::TrainableParameter> parameters;
  std::vector<parallel::Communicator*> groups;
  if (mode == SingleOf(mode)) {
    for (const auto& named : model->NamedParameters()) {
      parameters.push_back({named.name, named.parameter, {}});
    }
  } else {
    preparation = Preparation::Begin(*model, *mesh).value();
    std::vector<PrepareStep> steps;
    if (TensorParallel(mode)) {
      groups.push_back(mesh->communicator("tp").value());
      steps.emplace_back().mutable_tensor_parallel()->set_mesh_dim("tp");
    }
    if (ContextParallel(mode)) {
      groups.push_back(mesh->communicator("cp").value());
      steps.emplace_back().mutable_context_parallel()->set_mesh_dim("cp");
    }
    if (Pipeline(mode)) {
      groups.push_back(mesh->communicator("pp").value());
      PipelineConfig& pipeline = *steps.emplace_back().mutable_pipeline();
      pipeline.set_mesh_dim("pp");
      pipeline.set_schedule(PipelineSchedule(mode));
      pipeline.set_stages_per_rank(StagesPerRank(mode));
    }
    if (DataParallel(mode)) {
      groups.push_back(mesh->communicator("dp").value());
      PrepareStep& step = steps.emplace_back();
      if (mode == Mode::kDdp) {
        step.mutable_ddp()->set_mesh_dim("dp");
      } else {
        step.mutable_fsdp()->set_mesh_dim("dp");
      }
      if (Replicated(mode)) {
        groups.push_back(mesh->communicator("replicate").value());
        step.mutable_fsdp()->set_replicate_mesh_dim("replicate");
      }
    }
    for (const PrepareStep& step : steps) preparation->Apply(step).IgnoreError();
    parameters = preparation->TakeTrainableParameters().value();
  }
  for (const auto& named : model->NamedParameters()) {
    m.stage_parameter_bytes += Bytes(named.parameter);
  }
  optim::OptimizerConfig optimizer_config;
  optimizer_config.mutable_adamw();
  auto optimizer = optim::Optimizer::Create(parameters, optimizer_config).value();

  // The ranks of a tensor-parallel group compute the same batch.
  at::manual_seed(preparation == nullptr
                      ? 0
                      : mesh->SubgridRankAndSize(preparation->DataParallelDims()).value().first);
  const at::Tensor tokens = torch::randint(4096, {batch, kSeqLen + 1});
  // The timed steps' forward and backward passes, and a pipeline's waits in them.
  double passes_seconds = 0.0;
  double wait_seconds = 0.0;
  // A pipeline's micro-batch: one sequence, through the schedule.
  const MicroBatchForward forward = [&](int micro,
                                        const at::Tensor& input) -> absl::StatusOr<at::Tensor> {
    const at::Tensor sequence = tokens.narrow(0, micro, 1);
    if (input.defined()) model->SetStageInput(input);
    if (!model->HoldsOutputLayers()) return model->StageOutput(sequence.narrow(1, 0, kSeqLen));
    return model->Loss(sequence.narrow(1, 0, kSeqLen), sequence.narrow(1, 1, kSeqLen)) /
           static_cast<double>(batch);
  };
  // A step's forward and backward passes: a pipeline's micro-batches, context parallelism's
  // whole batch (whose gradients it averages after the backward), or the whole batch.
  auto passes = [&] {
    if (Pipeline(mode)) {
      preparation->TrainMicroBatches(static_cast<int>(batch), forward).IgnoreError();
    } else if (ContextParallel(mode)) {
      preparation
          ->TrainMicroBatches(1,
                              [&](int, const at::Tensor&) -> absl::StatusOr<at::Tensor> {
                                return model->Loss(tokens.narrow(1, 0, kSeqLen),
                                                   tokens.narrow(1, 1, kSeqLen));
                              })
          .IgnoreError();
    } else {
      model->Loss(tokens.narrow(1, 0, kSeqLen), tokens.narrow(1, 1, kSeqLen)).backward();
    }
  };
  auto step = [&] {
    const auto start = std::chrono::steady_clock::now();
    passes();
    passes_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (Pipeline(mode)) wait_seconds += preparation->Executor().last_wait_seconds();
    optimizer->Step(1e-4).value();
    optimizer->ZeroGrad();
  };
  auto bytes_sent = [&] {
    int64_t sent = 0;
    for (parallel::Communicator* group : groups) {
      for (auto collective : {parallel::Collective::kAllReduce, parallel::Collective::kAllGather,
                              parallel::Collective::kReduceScatter, parallel::Collective::kSend}) {
        sent += group->traffic(collective).bytes_sent;
      }
    }
    return sent;
  };

  step();  // warm-up: first-touch allocations, lazily built attention tables
  passes_seconds = wait_seconds = 0.0;
  if (preparation != nullptr) preparation->ResetPeak();
  const int64_t sent_before = bytes_sent();
  const double cpu_start = ProcessCpuSeconds();
  std::vector<double> step_seconds;
  for (int i = 0; i < kTimedSteps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    step();
    step_seconds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  m.process_cpu_seconds_per_step = (ProcessCpuSeconds() - cpu_start) / kTimedSteps;
  m.step_seconds = benchmarks::Median(step_seconds);
  m.bytes_sent_per_step = (bytes_sent() - sent_before) / kTimedSteps;
  m.wait_fraction = wait_seconds / passes_seconds;

  // Persistent state: what the optimizer trains, gradients (kept after backward; DDP's are
  // views of its buckets, FSDP's are the shards'), and the optimizer's state.
  passes();
  for (const auto& parameter : parameters) {
    m.persistent_bytes += Bytes(parameter.tensor) + Bytes(parameter.tensor.grad());
  }
  for (const auto& [key, tensor] : optimizer->SaveState().tensors) {
    m.persistent_bytes += Bytes(tensor);
  }
  if (ContextParallel(mode) || mode == Mode::kSingle) {
    // Counted from here, where the gradients the passes accumulate into already exist.
    base::AllocationCounter counter;
    base::AllocationCounter::Scope counting(counter);
    passes();
    m.passes_peak_bytes = counter.peak();
  }
  optimizer->ZeroGrad();

  const double one_way = static_cast<double>(kRanks - 1) / kRanks;
  if (mode == Mode::kDdp) {
    m.theoretical_bytes_per_step = 2 * one_way * parameter_bytes;
  }
  if (Fsdp(mode)) {
    // The padded shards' bytes over the ranks: each of 2 gathers sends them in the gather
    // dtype (half of them in bf16), the reduce-scatter in fp32.
    int64_t shard_bytes = 0;
    for (const auto& parameter : parameters) shard_bytes += Bytes(parameter.tensor);
    m.theoretical_bytes_per_step = (Bf16(mode) ? 2 : 3) * one_way * shard_bytes * kRanks;
    // Hybrid sharding: one all-reduce of the gradient shards across the replicas.
    if (Replicated(mode)) m.theoretical_bytes_per_step += 2 * one_way * shard_bytes;
    m.peak_unsharded_bytes = preparation->peak_gathered_bytes();
  }
  if (Pipeline(mode) && rank == 0) {
    // Rank 0 sends one hidden state or gradient, [1, seq_len, hidden] in fp32, per send of its
    // schedule: each micro-batch's hidden state (and with 2 stages per rank, its stage 2's
    // hidden state and stage 2's input gradient too).
    const int64_t sends = pp::CountSends(Schedule(mode, batch).ranks[0]);
    m.theoretical_bytes_per_step = static_cast<double>(sends) * kSeqLen *
                                   benchmarks::MediumModel().hidden_size() * sizeof(float);
  }
  if (ContextParallel(mode)) {
    // Per block, the rank's keys and values ([batch, seq_len / 2, kv heads, head size], fp32)
    // hop once forward and once backward, their fp32 gradients twice; then the gradients'
    // all-reduce.
    const models::ModelConfig config = benchmarks::MediumModel();
    const double block = 2.0 * batch * (kSeqLen / kRanks) * config.num_key_value_heads() *
                         (config.hidden_size() / config.num_attention_heads()) * sizeof(float);
    m.theoretical_bytes_per_step =
        config.num_hidden_layers() * ((kRanks - 1) * 2 * block + kRanks * block) +
        2 * one_way * parameter_bytes;
  }
  if (TensorParallel(mode)) {
    const models::ModelConfig config = benchmarks::MediumModel();
    const double tokens = static_cast<double>(batch * kSeqLen);
    const double activations = tokens * config.hidden_size();
    m.theoretical_bytes_per_step +=
        2 * one_way * sizeof(float) *
        ((4.0 * config.num_hidden_layers() + 2) * activations + 3 * tokens);
  }
  return m;
}

Measurement Run(Mode mode, int64_t batch) {
  if (mode == SingleOf(mode)) return RunRank(mode, batch, 0, nullptr);
  parallel::MeshConfig config;
  int world = 1;
  for (const auto& [name, used] : {std::pair{"pp", Pipeline(mode)},
                                   {"cp", ContextParallel(mode)},
                                   {"replicate", Replicated(mode)},
                                   {"dp", DataParallel(mode)},
                                   {"tp", TensorParallel(mode)}}) {
    if (!used) continue;
    auto* dim = config.add_dims();
    dim->set_name(name);
    dim->set_size(kRanks);
    world *= kRanks;
  }
  const parallel::MeshLayout layout = parallel::MeshLayout::Create(config, world).value();
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<Measurement> results(world);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      parallel::DeviceMesh mesh =
          parallel::DeviceMesh::Create(
              layout, rank,
              parallel::RingCommunicatorFactory(*store, parallel::RingCommunicator::kLoopback))
              .value();
      results[rank] = RunRank(mode, batch, rank, &mesh);
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (const Measurement& result : results) {
    results[0].wait_fraction_by_rank.push_back(result.wait_fraction);
    results[0].parameter_bytes_by_rank.push_back(result.stage_parameter_bytes);
  }
  return results[0];
}

// Each mode's measurement on each batch, run once: the DDP and FSDP rows compare against
// the single process's and FSDP's against DDP's.
const Measurement& Measured(Mode mode, int64_t batch) {
  static auto* measured = new std::map<std::pair<Mode, int64_t>, Measurement>();
  auto it = measured->find({mode, batch});
  if (it == measured->end()) it = measured->emplace(std::pair{mode, batch}, Run(mode, batch)).first;
  return it->second;
}

void Report(benchmark::State& state, Mode mode) {
  const int64_t batch = state.range(0);
  const Measurement& m = Measured(mode, batch);
  const Measurement& single = Measured(SingleOf(mode), batch);
  state.SetIterationTime(m.step_seconds);
  const int batches = DataParallelRanks(mode);  // different batches per step
  state.counters["tokens_per_s"] = static_cast<double>(batch * kSeqLen * batches) / m.step_seconds;
  state.counters["persistent_vs_single"] =
      static_cast<double>(m.persistent_bytes) / single.persistent_bytes;
  if (TensorParallel(mode) || ContextParallel(mode)) {
    state.counters["vs_single"] = m.step_seconds / single.step_seconds;
    state.counters["sent_vs_theory"] = m.bytes_sent_per_step / m.theoretical_bytes_per_step;
    if (ContextParallel(mode)) {
      state.counters["activations_vs_single"] =
          static_cast<double>(m.passes_peak_bytes) / single.passes_peak_bytes;
    }
    return;
  }
  if (Pipeline(mode)) {
    state.counters["vs_single"] = m.step_seconds / single.step_seconds;
    state.counters["sent_vs_theory"] = m.bytes_sent_per_step / m.theoretical_bytes_per_step;
    // The schedule's own idle share per rank, with equal stages and a backward twice a
    // forward (F = 1, B = I + W = 2).
    const pp::SimulationResult simulated = pp::Simulate(Schedule(mode, batch)).value();
    for (int rank = 0; rank < kRanks; ++rank) {
      const std::string suffix = absl::StrCat("_rank", rank);
      state.counters["waiting" + suffix] = m.wait_fraction_by_rank[rank];
      state.counters["bubble" + suffix] = 1.0 - simulated.ranks[rank].busy / simulated.makespan;
      state.counters["params_vs_single" + suffix] =
          static_cast<double>(m.parameter_bytes_by_rank[rank]) / single.stage_parameter_bytes;
    }
    return;
  }
  if (Bf16(mode)) {
    const Mode fp32 = mode == Mode::kFsdpBf16 ? Mode::kFsdp : Mode::kSingle;
    state.counters["vs_fp32"] = m.step_seconds / Measured(fp32, batch).step_seconds;
  }
  if (mode == SingleOf(mode)) return;
  state.counters["scaling_efficiency"] = single.step_seconds / m.step_seconds;
  state.counters["cpu_scaling_efficiency"] =
      batches * single.process_cpu_seconds_per_step / m.process_cpu_seconds_per_step;
  state.counters["sent_vs_theory"] = m.bytes_sent_per_step / m.theoretical_bytes_per_step;
  if (mode == Mode::kFsdp) {
    state.counters["vs_ddp"] = m.step_seconds / Measured(Mode::kDdp, batch).step_seconds;
  }
  if (Fsdp(mode)) {
    state.counters["peak_unsharded_blocks"] =
        static_cast<double>(m.peak_unsharded_bytes) / m.block_bytes;
    state.counters["peak_vs_two_largest_units"] =
        static_cast<double>(m.peak_unsharded_bytes) / m.two_largest_units_bytes;
  }
}

void BM_SingleProcess(benchmark::State& state) {
  for (auto _ : state) Report(state, Mode::kSingle);
}
void BM_Ddp(benchmark::State& state) {
  for (auto _ : state) Report(state, Mode::kDdp);
}
void BM_Fsdp(benchmark::State& state) {
  for (auto _ : state) Report(state, Mode::kFsdp);
}
void BM_Tp(benchmark::State& state) {
  for (auto _ : state) Report(state, Mode::kTp);
}
void BM_FsdpTp(benchmark::State& state) {
  for (auto _ : state) Report(state, Mode::kFsdpTp);
}
void BM_SingleProcessBf16(benchmark::State& state) {
  for (auto _ : state) Report(state, Mode::kSingleBf16);
}
void BM_FsdpBf16(benchmark::State& state) {
  for (auto _ : state) Report(state, Mode::kFsdpBf16);
}
void BM_Hsdp(benchmark::State& state) {
  for (auto _ : state) Report(state, Mode::kHsdp);
}
void BM_PipelineGPipe(benchmark::State& state) {
  for (auto _ : state) Report(state, Mode::kPipelineGPipe);
}
void BM_Pipeline1F1B(benchmark::State& state) {
  for (auto _ : state) Report(state, Mode::kPipeline1F1B);
}
void BM_PipelineZeroBubble(benchmark::State& state) {
  for (auto _ : state) Report(state, Mode::kPipelineZeroBubble);
}
void BM_PipelineInterleaved(benchmark::State& state) {
  for (auto _ : state) Report(state, Mode::kPipelineInterleaved);
}
void BM_ContextParallel(benchmark::State& state) {
  for (auto _ : state) Report(state, Mode::kContextParallel);
}
// Per-rank batches: 8 (the medium shape's) first, then 2.
#define PLAIT_WRAP_BENCHMARK(name) \
  BENCHMARK(name)->Arg(8)->Arg(2)->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond)
PLAIT_WRAP_BENCHMARK(BM_SingleProcess);
PLAIT_WRAP_BENCHMARK(BM_Ddp);
PLAIT_WRAP_BENCHMARK(BM_Fsdp);
PLAIT_WRAP_BENCHMARK(BM_Tp);
PLAIT_WRAP_BENCHMARK(BM_FsdpTp);
PLAIT_WRAP_BENCHMARK(BM_SingleProcessBf16);
PLAIT_WRAP_BENCHMARK(BM_FsdpBf16);
PLAIT_WRAP_BENCHMARK(BM_Hsdp);
PLAIT_WRAP_BENCHMARK(BM_PipelineGPipe);
PLAIT_WRAP_BENCHMARK(BM_Pipeline1F1B);
PLAIT_WRAP_BENCHMARK(BM_PipelineZeroBubble);
PLAIT_WRAP_BENCHMARK(BM_PipelineInterleaved);
PLAIT_WRAP_BENCHMARK(BM_ContextParallel);

void BM_RingAttentionBalance(benchmark::State& state) {
  constexpr int kRanks = 2;
  constexpr int64_t kSeqLen = 8192, kHeads = 8, kKeyValueHeads = 2, kHeadDim = 64;
  const cp::ChunkOrder order =
      state.range(0) == 0 ? cp::ChunkOrder::kLoadBalanced : cp::ChunkOrder::kContiguous;
  const bool generic = state.range(1) == 1;
  std::array<double, kRanks> busy{};
  for (auto _ : state) {
    std::array<double, kRanks> wall{};
    parallel::testing::RunOnRingGroup(
        "cp", kRanks,
        [&](int rank, parallel::RingCommunicator& communicator) {
          at::set_num_threads(1);
          parallel::GraphGroup group(communicator);
          const cp::ChunkLayout layout = *cp::ChunkLayout::Create(kSeqLen, kRanks, rank, order);
          at::manual_seed(rank);
          const auto draw = [&](int64_t heads) {
            return torch::randn({1, layout.local_len(), heads, kHeadDim}).requires_grad_();
          };
          const at::Tensor q = draw(kHeads), k = draw(kKeyValueHeads), v = draw(kKeyValueHeads);
          const auto pass = [&] {
            cp::RingAttention(q, k, v, group, {cp::kMaxScoreElements, order, generic})
                .sum()
                .backward();
          };
          pass();  // the allocator's first pass
          const absl::Duration waited_before = group.waited();
          const absl::Time start = absl::Now();
          pass();
          const absl::Duration elapsed = absl::Now() - start;
          wall[rank] = absl::ToDoubleSeconds(elapsed);
          busy[rank] = absl::ToDoubleSeconds(elapsed - (group.waited() - waited_before));
        },
        absl::Minutes(10));
    state.SetIterationTime(*std::max_element(wall.begin(), wall.end()));
  }
  state.counters["busy_rank0"] = busy[0];
  state.counters["busy_rank1"] = busy[1];
  state.counters["busy_max_vs_min"] =
      *std::max_element(busy.begin(), busy.end()) / *std::min_element(busy.begin(), busy.end());
}
BENCHMARK(BM_RingAttentionBalance)
    ->Args({0, 0})
    ->Args({1, 0})
    ->Args({0, 1})
    ->Iterations(1)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// The mixture of experts of the medium model's widths that BM_ExpertParallel and
// BM_MoeTensorParallel train: 4 layers, hidden 512, 8 experts of 512, 2 a token.
models::ModelConfig MediumMixtureOfExperts() {
  models::ModelConfig config = *models::PresetConfig("qwen3-moe-tiny");
  config.set_hidden_size(512);
  config.set_moe_intermediate_size(512);
  config.set_num_attention_heads(8);
  config.set_num_key_value_heads(8);
  config.set_head_dim(64);
  return config;
}

void BM_ExpertParallel(benchmark::State& state) {
  constexpr int kRanks = 2;
  constexpr int64_t kBatch = 4, kSeqLen = 256;
  const bool to_rank_0 = state.range(0) == 1;
  const models::ModelConfig config = MediumMixtureOfExperts();
  models::InitConfig init;
  init.set_seed(1);
  const auto make_model = [&] {
    std::shared_ptr<models::CausalLM> model = *models::CausalLM::Create(config, init);
    if (to_rank_0) {
      // Equal probabilities: every token's ties go to experts 0 and 1, rank 0's.
      at::NoGradGuard no_grad;
      for (const auto& named : model->named_parameters()) {
        if (named.key().find("mlp.gate.") != std::string::npos) named.value().zero_();
      }
    }
    return model;
  };
  const auto batch_of = [&](int rank) {
    at::manual_seed(100 + rank);
    return torch::randint(config.vocab_size(), {kBatch, kSeqLen + 1});
  };
  const auto step = [](models::CausalLM& model, const at::Tensor& tokens) {
    model.zero_grad();
    model.Loss(tokens.narrow(1, 0, kSeqLen), tokens.narrow(1, 1, kSeqLen)).backward();
  };
  // One process: rank 0's batch through every expert.
  double single_seconds = 0;
  {
    at::set_num_threads(1);
    const std::shared_ptr<models::CausalLM> model = make_model();
    const at::Tensor tokens = batch_of(0);
    step(*model, tokens);  // the allocator's first pass
    const absl::Time start = absl::Now();
    step(*model, tokens);
    single_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  }
  const int64_t local = config.num_experts() / kRanks;
  std::array<at::Tensor, kRanks> routed;  // each rank's rows per expert, over the layers
  std::array<int64_t, kRanks> sent{};
  double step_seconds = 0;
  for (auto _ : state) {
    std::array<double, kRanks> wall{};
    parallel::testing::RunOnRingGroup(
        "ep", kRanks,
        [&](int rank, parallel::RingCommunicator& communicator) {
          at::set_num_threads(1);
          parallel::GraphGroup group(communicator);
          ep::ExpertDispatch dispatch(group);
          const std::shared_ptr<models::CausalLM> model = make_model();
          const auto [first, count] = dispatch.LocalExperts(config.num_experts());
          model->KeepExperts(first, count);
          model->seams().Add(&dispatch);
          const at::Tensor tokens = batch_of(rank);
          step(*model, tokens);  // the allocator's first pass
          const parallel::Traffic before = communicator.traffic(parallel::Collective::kAllToAll);
          const absl::Time start = absl::Now();
          step(*model, tokens);
          wall[rank] = absl::ToDoubleSeconds(absl::Now() - start);
          sent[rank] =
              communicator.traffic(parallel::Collective::kAllToAll).bytes_sent - before.bytes_sent;
          routed[rank] =
              model->LastRouting()->Load().narrow(0, 0, config.num_experts()).to(at::kLong);
        },
        absl::Minutes(10));
    step_seconds = *std::max_element(wall.begin(), wall.end());
    state.SetIterationTime(step_seconds);
  }
  std::array<int64_t, kRanks> computed{};
  for (int r = 0; r < kRanks; ++r) {
    for (int s = 0; s < kRanks; ++s) {
      computed[r] += routed[s].narrow(0, r * local, local).sum().item<int64_t>();
    }
  }
  const auto rows_of = [&](int sender, int holder) {
    return routed[sender].narrow(0, holder * local, local).sum().item<int64_t>();
  };
  const double theory =
      static_cast<double>(config.num_hidden_layers() * local * int64_t{sizeof(int64_t)}) *
          (kRanks - 1) +
      2.0 * static_cast<double>(rows_of(0, 1) + rows_of(1, 0)) *
          static_cast<double>(config.hidden_size() * int64_t{sizeof(float)});
  state.counters["vs_single"] = step_seconds / single_seconds;
  state.counters["sent_vs_theory"] = static_cast<double>(sent[0]) / theory;
  state.counters["rows_max_vs_mean"] = static_cast<double>(std::max(computed[0], computed[1])) /
                                       (static_cast<double>(computed[0] + computed[1]) / kRanks);
}
BENCHMARK(BM_ExpertParallel)
    ->Arg(0)
    ->Arg(1)
    ->Iterations(1)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

void BM_ExpertParallelFsdp(benchmark::State& state) {
  constexpr int kEpRanks = 2, kDpRanks = 2, kWorld = kEpRanks * kDpRanks;
  constexpr int64_t kBatch = 2;  // sequences of kSeqLen tokens a rank
  const bool dense_over_ep = state.range(0) == 1;
  const models::ModelConfig config = MediumMixtureOfExperts();
  models::InitConfig init;
  init.set_seed(1);
  parallel::MeshConfig mesh_config;
  for (const auto& [name, size] : {std::pair{"dp", kDpRanks}, {"ep", kEpRanks}}) {
    auto* dim = mesh_config.add_dims();
    dim->set_name(name);
    dim->set_size(size);
  }
  const parallel::MeshLayout layout = *parallel::MeshLayout::Create(mesh_config, kWorld);
  std::array<std::vector<double>, kWorld> seconds;
  int64_t whole_bytes = 0, kept_bytes = 0, sent = 0;
  double theory = 0;
  for (auto _ : state) {
    parallel::testing::RunOnRingMesh(layout, [&](int rank, parallel::DeviceMesh& mesh) {
      at::set_num_threads(1);
      const std::shared_ptr<models::CausalLM> model = *models::CausalLM::Create(config, init);
      int64_t model_bytes = 0;
      for (const auto& named : model->NamedParameters()) model_bytes += Bytes(named.parameter);
      std::unique_ptr<Preparation> preparation = *Preparation::Begin(*model, mesh);
      PrepareStep ep;
      ep.mutable_expert_parallel()->set_mesh_dim("ep");
      PrepareStep fsdp;
      fsdp.mutable_fsdp()->set_mesh_dim("dp");
      if (dense_over_ep) fsdp.mutable_fsdp()->set_shard_dense_over_mesh_dim("ep");
      if (!preparation->Apply(ep).ok() || !preparation->Apply(fsdp).ok()) std::abort();
      const std::vector<parallel::TrainableParameter> parameters =
          *preparation->TakeTrainableParameters();
      at::manual_seed(100 + mesh.SubgridRankAndSize({"dp", "ep"})->first);
      const at::Tensor tokens = torch::randint(config.vocab_size(), {kBatch, kSeqLen + 1});
      const auto train = [&] {
        for (const auto& parameter : parameters) parameter.tensor.mutable_grad().reset();
        const absl::Status trained = preparation->TrainMicroBatches(1, [&](int, const at::Tensor&) {
          return absl::StatusOr<at::Tensor>(
              model->Loss(tokens.narrow(1, 0, kSeqLen), tokens.narrow(1, 1, kSeqLen)));
        });
        if (!trained.ok()) std::abort();
      };
      const auto bytes = [&] {
        int64_t total = 0;
        for (const parallel::Communicator* group : mesh.communicators()) {
          for (auto collective :
               {parallel::Collective::kAllGather, parallel::Collective::kReduceScatter,
                parallel::Collective::kAllReduce}) {
            total += group->traffic(collective).bytes_sent;
          }
        }
        return total;
      };
      train();  // the allocator's first pass
      const int64_t before = bytes();
      for (int i = 0; i < kTimedSteps; ++i) {
        const absl::Time start = absl::Now();
        train();
        seconds[rank].push_back(absl::ToDoubleSeconds(absl::Now() - start));
      }
      if (rank != 0) return;
      sent = (bytes() - before) / kTimedSteps;
      whole_bytes = model_bytes;
      kept_bytes = 0;
      theory = 0;
      for (const parallel::TrainableParameter& parameter : parameters) {
        const double shard = static_cast<double>(Bytes(parameter.tensor));
        const int ranks = parameter.sharded_over.back()->size();  // FSDP's group
        kept_bytes += Bytes(parameter.tensor);
        theory += (ranks - 1) * (3 * shard + sizeof(float));
        if (!dense_over_ep && !IsExpertParameter(parameter.name)) {
          theory += 2.0 * (kEpRanks - 1) / kEpRanks * shard;
        }
      }
    });
    std::vector<double> slowest;
    for (int i = 0; i < kTimedSteps; ++i) {
      double most = 0;
      for (const std::vector<double>& rank_seconds : seconds) {
        most = std::max(most, rank_seconds[i]);
      }
      slowest.push_back(most);
    }
    state.SetIterationTime(benchmarks::Median(slowest));
  }
  state.counters["kept_vs_whole"] = static_cast<double>(kept_bytes) / whole_bytes;
  state.counters["sent_vs_theory"] = static_cast<double>(sent) / theory;
}
BENCHMARK(BM_ExpertParallelFsdp)
    ->Arg(0)
    ->Arg(1)
    ->Iterations(1)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

void BM_MoeTensorParallel(benchmark::State& state) {
  constexpr int64_t kBatch = 4;  // sequences of kSeqLen tokens, the batch of both ranks
  const bool sequence_parallel = state.range(0) == 1;
  const models::ModelConfig config = MediumMixtureOfExperts();
  models::InitConfig init;
  init.set_seed(1);
  at::manual_seed(100);
  const at::Tensor tokens = torch::randint(config.vocab_size(), {kBatch, kSeqLen + 1});
  const auto step = [&](models::CausalLM& model) {
    model.zero_grad();
    model.Loss(tokens.narrow(1, 0, kSeqLen), tokens.narrow(1, 1, kSeqLen)).backward();
  };
  double single_seconds = 0;
  // The theory: per block the attention's 2 activations' collectives (all-reduces, or
  // all-gather and reduce-scatter pairs, the same bytes) and 2 more outside the blocks, the
  // loss's 3 floats a token, and the gradients of the whole parameters each rank computes
  // part of (Qwen3's per-head norms; with sequence parallelism every replicated one's: norms,
  // routers, experts), each an all-reduce: 2 (n - 1) / n of the bytes.
  double theory = 0;
  {
    at::set_num_threads(1);
    const std::shared_ptr<models::CausalLM> model = *models::CausalLM::Create(config, init);
    step(*model);  // the allocator's first pass
    std::vector<double> seconds;
    for (int i = 0; i < kTimedSteps; ++i) {
      const absl::Time start = absl::Now();
      step(*model);
      seconds.push_back(absl::ToDoubleSeconds(absl::Now() - start));
    }
    single_seconds = benchmarks::Median(seconds);
    double summed = 0;
    for (const auto& named : model->NamedParameters()) {
      const Wrappable::Split split = model->SplitOf(named.name);
      if (split == Wrappable::Split::kReplicatedPartialGradient ||
          (sequence_parallel && split == Wrappable::Split::kReplicated)) {
        summed += static_cast<double>(named.parameter.numel());
      }
    }
    const double tokens_per_step = static_cast<double>(kBatch * kSeqLen);
    const double activations = tokens_per_step * static_cast<double>(config.hidden_size());
    theory = 2.0 * (kRanks - 1) / kRanks * sizeof(float) *
             ((2.0 * config.num_hidden_layers() + 2) * activations + 3 * tokens_per_step + summed);
  }
  parallel::MeshConfig mesh_config;
  auto* dim = mesh_config.add_dims();
  dim->set_name("tp");
  dim->set_size(kRanks);
  const parallel::MeshLayout layout = *parallel::MeshLayout::Create(mesh_config, kRanks);
  std::array<double, kRanks> wall{};
  int64_t sent = 0;
  for (auto _ : state) {
    parallel::testing::RunOnRingMesh(layout, [&](int rank, parallel::DeviceMesh& mesh) {
      at::set_num_threads(1);
      const std::shared_ptr<models::CausalLM> model = *models::CausalLM::Create(config, init);
      std::unique_ptr<Preparation> preparation = *Preparation::Begin(*model, mesh);
      PrepareStep tp;
      tp.mutable_tensor_parallel()->set_mesh_dim("tp");
      tp.mutable_tensor_parallel()->set_sequence_parallel(sequence_parallel);
      if (!preparation->Apply(tp).ok() || !preparation->TakeTrainableParameters().ok()) {
        std::abort();
      }
      // The forward and backward, then the sums of the gradients each rank computed part of.
      const auto train = [&] {
        model->zero_grad();
        const absl::Status trained = preparation->TrainMicroBatches(1, [&](int, const at::Tensor&) {
          return absl::StatusOr<at::Tensor>(
              model->Loss(tokens.narrow(1, 0, kSeqLen), tokens.narrow(1, 1, kSeqLen)));
        });
        if (!trained.ok()) std::abort();
      };
      train();  // the allocator's first pass
      const parallel::Communicator& group = **mesh.communicator("tp");
      const auto bytes = [&] {
        int64_t total = 0;
        for (int c = 0; c < parallel::kNumCollectives; ++c) {
          total += group.traffic(static_cast<parallel::Collective>(c)).bytes_sent;
        }
        return total;
      };
      const int64_t before = bytes();
      std::vector<double> seconds;
      for (int i = 0; i < kTimedSteps; ++i) {
        const absl::Time start = absl::Now();
        train();
        seconds.push_back(absl::ToDoubleSeconds(absl::Now() - start));
      }
      wall[rank] = benchmarks::Median(seconds);
      if (rank == 0) sent = (bytes() - before) / kTimedSteps;
    });
    state.SetIterationTime(*std::max_element(wall.begin(), wall.end()));
  }
  state.counters["vs_single"] = *std::max_element(wall.begin(), wall.end()) / single_seconds;
  state.counters["sent_vs_theory"] = static_cast<double>(sent) / theory;
}
BENCHMARK(BM_MoeTensorParallel)
    ->Arg(0)
    ->Arg(1)
    ->Iterations(1)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace plait::wrap

int main(int argc, char** argv) { return plait::benchmarks::BenchmarkMain(argc, argv); }
