// A reward program of the user's (rewards.proto's RewardProgram) as a Reward: started once, in
// a process group of its own, talking JSON lines over a socket pair that is its standard input
// and output (its standard error is the run's). Written by hand, small, for what no library
// here serves: a child process answering lines within a timeout, killed with all it started
// when it fails or when the reward goes, so none outlives the run.
#ifndef PLAIT_REWARDS_PROGRAM_H_
#define PLAIT_REWARDS_PROGRAM_H_

#include <sys/types.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "rewards/reward.h"
#include "rewards/rewards.pb.h"

namespace plait::rewards {

class ProgramReward final : public Reward {
 public:
  // Starts the program; InvalidArgument naming `field` for no command or a timeout that is
  // not positive, FailedPrecondition for a command that cannot be started.
  static absl::StatusOr<std::unique_ptr<ProgramReward>> Start(const RewardProgram& config,
                                                              const std::string& field);
  // Ends the program: its input closed, then its process group terminated (killed after a
  // second), and waited for.
  ~ProgramReward() override;

  // Writes the completion's line and reads the answer. The first failure (the program
  // exited, timed out, or answered something other than a finite number) ends the program
  // and is returned again by every later call.
  absl::StatusOr<double> Score(const Completion& completion) override;

 private:
  ProgramReward(std::string name, double timeout_seconds)
      : name_(std::move(name)), timeout_seconds_(timeout_seconds) {}

  // The next line the program writes, within `deadline_ms` of the monotonic clock.
  absl::StatusOr<std::string> ReadLine(int64_t deadline_ms);
  // Ends the program now (its group killed) and describes how it ended.
  std::string End();
  absl::Status Fail(absl::Status status);

  std::string name_;  // the command, as the errors name it
  double timeout_seconds_;
  pid_t pid_ = -1;
  int socket_ = -1;      // ours; the program's end is its stdin and stdout
  std::string pending_;  // what it wrote after its last line
  absl::Status failed_;
};

}  // namespace plait::rewards

#endif  // PLAIT_REWARDS_PROGRAM_H_
