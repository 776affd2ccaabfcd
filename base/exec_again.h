// Settings some libraries read only as a process starts, before main(): glibc's tunables
// (GLIBC_TUNABLES) and the OpenMP runtime's wait policy (OMP_WAIT_POLICY, read as LibTorch
// loads libgomp). A main() that needs one sets it in the environment and executes itself
// again, first thing, before anything it did could matter:
//
//   if (std::getenv("OMP_WAIT_POLICY") == nullptr) ExecAgainWith(argv, "OMP_WAIT_POLICY",
//   "passive");
#ifndef PLAIT_BASE_EXEC_AGAIN_H_
#define PLAIT_BASE_EXEC_AGAIN_H_

#include <string>

namespace plait::base {

// Executes this program again (/proc/self/exe) with the same arguments and environment, and
// `name` set to `value` there; processes it starts inherit the setting. Returns only when the
// execution failed, having put `name` back as it was.
void ExecAgainWith(char** argv, const char* name, const std::string& value);

}  // namespace plait::base

#endif  // PLAIT_BASE_EXEC_AGAIN_H_
