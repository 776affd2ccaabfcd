#include "models/testing_activations.h"

#include "ATen/core/Tensor.h"
#include "base/allocation_counter.h"
#include "torch/csrc/autograd/generated/variable_factories.h"

namespace plait::models::testing {

int64_t MeasureActivationPeak(CausalLM& model, int64_t batch, int64_t seq_len) {
  const at::Tensor tokens =
      torch::randint(model.config().vocab_size(), {batch, seq_len + 1},
                     at::Generator(at::detail::createCPUGenerator(/*seed_in=*/2)));
  const at::Tensor inputs = tokens.narrow(1, 0, seq_len);
  const at::Tensor targets = tokens.narrow(1, 1, seq_len);
  model.Loss(inputs, targets).backward();  // allocates the gradients
  base::AllocationCounter counter;
  {
    base::AllocationCounter::Scope counting(counter);
    model.Loss(inputs, targets).backward();
  }
  return counter.peak();
}

}  // namespace plait::models::testing
