#include "base/threads.h"

#include <dlfcn.h>

#include <cstdlib>
#include <map>
#include <string>

#include "ATen/Context.h"
#include "ATen/Parallel.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/exec_again.h"

namespace plait::base {
namespace {

// OpenBLAS's idle workers sleep after 2^n cycles of waiting; 4 is the least it accepts.
constexpr char kOpenBlasTimeout[] = "OPENBLAS_THREAD_TIMEOUT";
constexpr char kOpenBlasShortest[] = "4";
// libgomp's idle threads sleep after this many spins (about 3 ms); OMP_WAIT_POLICY, when
// set, decides instead.
constexpr char kOpenMpSpins[] = "GOMP_SPINCOUNT";
constexpr char kOpenMpPolicy[] = "OMP_WAIT_POLICY";
constexpr char kOpenMpThreeMilliseconds[] = "300000";

}  // namespace

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

std::string DescribeMatmulLibraries() {
  std::string fp32 = "none";
  Dl_info info;
  void* sgemm = dlsym(RTLD_DEFAULT, "sgemm_");
  if (sgemm != nullptr && dladdr(sgemm, &info) != 0 && info.dli_fname != nullptr) {
    const absl::string_view file = info.dli_fname;
    fp32 = absl::StrCat(file.substr(file.rfind('/') + 1), " (sgemm_)");
  }
  return absl::StrCat("fp32 ", fp32, ", bf16 ", at::hasMKLDNN() ? "oneDNN" : "LibTorch's loops");
}

bool SetIdleThreadWaits(char** argv) {
  std::map<std::string, std::string> unset;
  if (std::getenv(kOpenBlasTimeout) == nullptr) unset[kOpenBlasTimeout] = kOpenBlasShortest;
  if (std::getenv(kOpenMpSpins) == nullptr && std::getenv(kOpenMpPolicy) == nullptr) {
    unset[kOpenMpSpins] = kOpenMpThreeMilliseconds;
  }
  if (!unset.empty()) {
    ExecAgainWith(argv, unset);
    return false;
  }
  // OpenBLAS takes 1 to 4 as 4; 0, or what is not a number, as its default.
  int cycles_log2 = 0;
  const char* spins = std::getenv(kOpenMpSpins);
  return absl::SimpleAtoi(std::getenv(kOpenBlasTimeout), &cycles_log2) && cycles_log2 >= 1 &&
         cycles_log2 <= 4 && std::getenv(kOpenMpPolicy) == nullptr && spins != nullptr &&
         std::string(spins) == kOpenMpThreeMilliseconds;
}

}  // namespace plait::base
