#include "base/threads.h"

#include <dlfcn.h>

#include <cstdlib>

#include "ATen/Context.h"
#include "ATen/Parallel.h"
#include "absl/strings/match.h"
#include "base/exec_again.h"

namespace plait::base {

bool SetComputeThreads(int count) {
  at::set_num_threads(count);
  // Looked up at run time, so that nothing links OpenBLAS itself (LibTorch does, through
  // libblas.so.3).
  using SetThreads = void (*)(int);
  auto set_openblas_threads =
      reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  if (set_openblas_threads == nullptr) return at::hasMKL();
  set_openblas_threads(1);
  return true;
}

bool UsePassiveOpenMpWait(char** argv) {
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  if (policy != nullptr) return absl::EqualsIgnoreCase(policy, "passive");
  ExecAgainWith(argv, "OMP_WAIT_POLICY", "passive");
  return false;
}

}  // namespace plait::base
