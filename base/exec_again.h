// Settings some libraries read only as a process starts, before main(): glibc's tunables
// (GLIBC_TUNABLES), the OpenMP runtime's spin before it sleeps (GOMP_SPINCOUNT, read as
// LibTorch loads libgomp) and OpenBLAS's (OPENBLAS_THREAD_TIMEOUT, read as it loads). A
// main() that needs one sets it in the environment and executes itself again, first thing,
// before anything it did could matter:
//
//   if (std::getenv("OPENBLAS_THREAD_TIMEOUT") == nullptr) {
//     ExecAgainWith(argv, {{"OPENBLAS_THREAD_TIMEOUT", "4"}});
//   }
#ifndef PLAIT_BASE_EXEC_AGAIN_H_
#define PLAIT_BASE_EXEC_AGAIN_H_

#include <map>
#include <string>

namespace plait::base {

// Executes this program again (/proc/self/exe) with the same arguments and environment, and
// each variable of `settings` set to its value there; processes it starts inherit them.
// Returns only when the execution failed, having put the variables back as they were.
void ExecAgainWith(char** argv, const std::map<std::string, std::string>& settings);

}  // namespace plait::base

#endif  // PLAIT_BASE_EXEC_AGAIN_H_
