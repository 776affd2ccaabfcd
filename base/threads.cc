#include "base/threads.h"

#include <dlfcn.h>

#include "ATen/Context.h"
#include "ATen/Parallel.h"

namespace plait::base {

bool SetComputeThreads(int count) {
  at::set_num_threads(count);
  // Looked up at run time, so that nothing links OpenBLAS itself (LibTorch does, through
  // libblas.so.3).
  using SetThreads = void (*)(int);
  auto set_openblas_threads =
      reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  if (set_openblas_threads == nullptr) return at::hasMKL();
  set_openblas_threads(count);
  return true;
}

}  // namespace plait::base
