// The generator a thread's forward draws its random masks from (LoRA's dropout): the one a
// ScopedForwardGenerator installed on the thread for that device, else the device's default
// generator (LibTorch's process-global one, as PEFT's nn.Dropout draws from).
//
// A trainer installs a generator it owns and seeds, so that its draws are the same run to run
// and neither depend on other draws of the process (an evaluation, another test's run) nor, with
// ranks as threads of one process, on how the ranks' draws interleave:
//
//   at::Generator generator = MakeCpuGenerator(seed);
//   const ScopedForwardGenerator installed(generator);
//   model.Loss(tokens, targets).backward();  // dropout draws from `generator`
//
// A recomputation in the backward (activation checkpointing) installs the generator its forward
// drew from, whatever thread the backward runs on.
#ifndef PLAIT_BASE_FORWARD_GENERATOR_H_
#define PLAIT_BASE_FORWARD_GENERATOR_H_

#include "ATen/core/Generator.h"
#include "c10/core/Device.h"

namespace plait::base {

// The installed generator when its device is `device`, else `device`'s default generator.
at::Generator ForwardGenerator(const c10::Device& device);

// Installs `generator` as the thread's forward generator for its device until destroyed, when
// the one it replaced (if any) is installed again.
class ScopedForwardGenerator {
 public:
  explicit ScopedForwardGenerator(at::Generator generator);
  ~ScopedForwardGenerator();

  ScopedForwardGenerator(const ScopedForwardGenerator&) = delete;
  ScopedForwardGenerator& operator=(const ScopedForwardGenerator&) = delete;

 private:
  at::Generator replaced_;  // undefined: none was installed
};

}  // namespace plait::base

#endif  // PLAIT_BASE_FORWARD_GENERATOR_H_
