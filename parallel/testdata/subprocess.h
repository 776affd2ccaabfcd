// Test helpers for running a program as a child process with its stdout and stderr in files,
// and for waiting on the marker files such programs create:
//
//   SubprocessOptions options;
//   options.argv = {program_path, "arg"};
//   options.stdout_path = out_path;
//   options.stderr_path = err_path;
//   absl::StatusOr<pid_t> pid = StartSubprocess(options);
//   ASSERT_THAT(pid, IsOk());
//   EXPECT_THAT(WaitForSubprocess(*pid, absl::Seconds(10)), IsOkAndHolds(0));  // wait status
#ifndef PLAIT_PARALLEL_TESTDATA_SUBPROCESS_H_
#define PLAIT_PARALLEL_TESTDATA_SUBPROCESS_H_

#include <sys/types.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace plait::parallel::testdata {

struct SubprocessOptions {
  std::vector<std::string> argv;  // argv[0] is the path of the program
  // Changes to this process's environment: a value sets the variable, nullopt unsets it.
  std::map<std::string, std::optional<std::string>> environment_changes;
  std::string stdout_path;  // created or truncated
  std::string stderr_path;
};

// Starts the program; returns its pid.
absl::StatusOr<pid_t> StartSubprocess(const SubprocessOptions& options);

// Waits for `pid` to end and returns its wait status (see waitpid). After `timeout` it kills
// the process and returns DeadlineExceeded.
absl::StatusOr<int> WaitForSubprocess(pid_t pid, absl::Duration timeout);

// A child of `parent` whose environment holds RANK=`rank` (a rank a launcher started); -1
// when there is none.
pid_t ChildWithRank(pid_t parent, int rank);

// Waits until every one of `paths` exists; DeadlineExceeded naming the missing ones after
// `timeout`.
absl::Status WaitForFiles(const std::vector<std::string>& paths, absl::Duration timeout);

}  // namespace plait::parallel::testdata

#endif  // PLAIT_PARALLEL_TESTDATA_SUBPROCESS_H_
