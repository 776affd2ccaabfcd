// Test helpers that measure what LibTorch's CPU allocator holds for each rank of a plan while
// the trainer runs it (Train, as the jobs do, on threads of one process as testing_ranks.h),
// counted through base::AllocationCounter, for comparison with the estimate
// (memory_estimate.h); and the plans that comparison is made on:
//
//   for (const MemoryCheckPlan& check : MemoryCheckPlans()) {
//     std::vector<MeasuredMemory> ranks = MeasureTrainingMemory(check.plan, check.ranks);
//   }
#ifndef PLAIT_TRAINER_TESTING_MEMORY_H_
#define PLAIT_TRAINER_TESTING_MEMORY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "plan/plan.pb.h"

namespace plait::trainer::testing {

// What one rank held, counted from the start of its Train call.
struct MeasuredMemory {
  // Allocated when the last step starts: what lives between steps (parameters, optimizer
  // state, DDP's buckets, ...).
  int64_t between_steps_bytes = 0;
  // The most allocated at once in any step after the first (which allocates the optimizer
  // state as it goes).
  int64_t peak_bytes = 0;
};

// Trains `plan` (at least 2 steps) on `ranks` threads and measures each rank, in rank order.
// Failures are test failures.
std::vector<MeasuredMemory> MeasureTrainingMemory(const plan::Plan& plan, int ranks);

// A plan the estimate is checked against, shortened to 3 steps (memory does not change after
// the second) and one evaluation batch, with the ranks it runs on.
struct MemoryCheckPlan {
  std::string name;
  plan::Plan plan;
  int ranks = 1;
};

// The shipped jobs llama_fsdp and llama_ddp in fp32, the medium shape
// (testdata/runs/medium_single.textproto: the models and wrap benchmarks' model, batch 4 x 256
// tokens, one rank) in fp32, llama_fsdp in bf16 (with fp32 shards and optimizer state), and
// with activation checkpointing: the medium shape with FULL, llama_fsdp with SELECTIVE; and
// tensor parallelism in fp32: llama_tp, with sequence parallelism on its batch (16 x 64
// tokens), on one sequence of 1024 tokens and with SELECTIVE checkpointing, and llama_2d (FSDP
// over tensor-parallel slices, 4 ranks); llama_fsdp with 2 micro-batches a step; the
// pipelines llama_pp (1F1B), interleaved, and with each stage over 2 context-parallel ranks;
// context parallelism over 2 ranks on one sequence of 1024 tokens; a real shape, Qwen2.5-0.5B's
// widths and vocabulary with 2 of its layers, one sequence of 512 tokens in fp32; the tiny
// Qwen3 and the tiny Qwen3-MoE in llama_fsdp's plan; and LoRA and QLoRA plans.
std::vector<MemoryCheckPlan> MemoryCheckPlans();

// The job llama_long's model and optimizer (fp32) on one sequence of `seq_len` tokens a step,
// shortened as above, over `context_ranks` ranks of context parallelism (1: one process).
MemoryCheckPlan LongSequencePlan(int64_t seq_len, int context_ranks);

}  // namespace plait::trainer::testing

#endif  // PLAIT_TRAINER_TESTING_MEMORY_H_
