// For tests of the activation estimates (ActivationBytes in causal_lm.h): what one training
// step of a model holds at its peak beyond its parameters and their gradients, counted as
// LibTorch's CPU allocator hands it out (base/allocation_counter.h), for comparison with the
// estimate, in one process or on one rank of a tensor-parallel group:
//
//   const int64_t peak = MeasureActivationPeak(*model, /*batch=*/4, /*seq_len=*/64);
//   EXPECT_THAT(peak / ActivationBytes(config, 4, 64, dtype, device_type), DoubleNear(1, 0.03));
#ifndef PLAIT_MODELS_TESTING_ACTIVATIONS_H_
#define PLAIT_MODELS_TESTING_ACTIVATIONS_H_

#include <cstdint>

#include "models/causal_lm.h"
#include "models/estimates.h"

namespace plait::models::testing {

// The peak of the bytes allocated during Loss(...).backward() of `model` on `batch` sequences
// of `seq_len` tokens (the same on every rank: drawn from a fixed seed), after a first such
// step has allocated the parameters' gradients, so that only the step's own allocations count.
int64_t MeasureActivationPeak(CausalLM& model, int64_t batch, int64_t seq_len);

}  // namespace plait::models::testing

#endif  // PLAIT_MODELS_TESTING_ACTIVATIONS_H_
