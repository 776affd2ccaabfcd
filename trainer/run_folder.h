// The folder of one run's outputs under plan.training.run_dir (plan.proto): a new one named
// for the time the run started, with run_dir/latest pointing at the newest, so that a job
// can be run any number of times and its outputs are found in one place. The plan's relative
// output paths (metrics_file, tensorboard_dir, save_hf_dir, save_adapter_dir) are taken
// inside it:
//
//   const RunFolder folder = TakeRunFolder(plan, /*starts_run=*/true, /*restart_count=*/0);
//   // plan.training().metrics_file(): "runs/llama_fsdp/20261202-053500/metrics.jsonl"
//   ... validate the plan ...
//   PLAIT_RETURN_IF_ERROR(folder.Create());  // the folder, and latest pointing at it
#ifndef PLAIT_TRAINER_RUN_FOLDER_H_
#define PLAIT_TRAINER_RUN_FOLDER_H_

#include <string>

#include "absl/status/status.h"
#include "plan/plan.pb.h"

namespace plait::trainer {

// The variable through which the process that starts a run hands its folder to its ranks and
// their restarts.
inline constexpr char kRunFolderVariable[] = "PLAIT_RUN_FOLDER";

// A run's folder, once chosen.
struct RunFolder {
  std::string path;  // empty: the plan has no run_dir, or no relative output path
  bool is_new = false;

  // Creates a new folder, points run_dir/latest at it and hands it on (kRunFolderVariable)
  // to the processes this one starts; nothing for one that exists.
  absl::Status Create() const;
};

// With plan.training.run_dir set and a relative output path in the plan: the run's folder,
// written into those paths (else none, the plan unchanged). The folder is the one
// kRunFolderVariable hands over; else, when this process starts the run (`starts_run`: no
// launcher started it, or it is rank 0 of a world whose launcher handed no folder), a new
// one; else (a restart, another rank) run_dir/latest. Only rank 0 writes outputs.
RunFolder TakeRunFolder(plan::Plan& plan, bool starts_run, int restart_count);

}  // namespace plait::trainer

#endif  // PLAIT_TRAINER_RUN_FOLDER_H_
