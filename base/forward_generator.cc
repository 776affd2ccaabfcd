#include "base/forward_generator.h"

#include <utility>

#include "ATen/Context.h"

namespace plait::base {
namespace {

// Undefined while none is installed.
thread_local at::Generator installed;

}  // namespace

at::Generator ForwardGenerator(const c10::Device& device) {
  if (installed.defined() && installed.device() == device) return installed;
  return at::globalContext().defaultGenerator(device);
}

ScopedForwardGenerator::ScopedForwardGenerator(at::Generator generator)
    : replaced_(std::exchange(installed, std::move(generator))) {}

ScopedForwardGenerator::~ScopedForwardGenerator() { installed = std::move(replaced_); }

}  // namespace plait::base
