#include "trainer/run_folder.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/file.h"

namespace plait::trainer {
namespace {

// Points run_dir/latest at `name`, through a rename so that a reader never finds it missing;
// a `latest` that is not a link is someone else's file, left as it is.
void PointLatestAt(const std::string& run_dir, const std::string& name) {
  const std::string latest = absl::StrCat(run_dir, "/latest");
  struct stat info;
  if (lstat(latest.c_str(), &info) == 0 && !S_ISLNK(info.st_mode)) return;
  const std::string link = absl::StrCat(latest, ".", getpid());
  unlink(link.c_str());
  if (symlink(name.c_str(), link.c_str()) != 0 || rename(link.c_str(), latest.c_str()) != 0) {
    unlink(link.c_str());
  }
}

// A name for a new folder under `run_dir`: now, as 20261202-053500, or -2, -3, ... when taken.
std::string NewFolderName(const std::string& run_dir) {
  const std::string stamp = absl::FormatTime("%Y%m%d-%H%M%S", absl::Now(), absl::LocalTimeZone());
  for (int taken = 1;; ++taken) {
    const std::string name = taken == 1 ? stamp : absl::StrCat(stamp, "-", taken);
    std::error_code error;
    if (!std::filesystem::exists(absl::StrCat(run_dir, "/", name), error)) return name;
  }
}

}  // namespace

absl::Status RunFolder::Create() const {
  if (!is_new) return absl::OkStatus();
  const std::filesystem::path folder(path);
  std::error_code error;
  std::filesystem::create_directories(folder.parent_path(), error);
  if (error || mkdir(path.c_str(), 0755) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("plan.training.run_dir: \"", path, "\" cannot be created: ",
                     error ? error.message() : std::strerror(errno)));
  }
  PointLatestAt(folder.parent_path().string(), folder.filename().string());
  setenv(kRunFolderVariable, path.c_str(), /*overwrite=*/1);
  return absl::OkStatus();
}

RunFolder TakeRunFolder(plan::Plan& plan, bool starts_run, int restart_count) {
  plan::TrainingConfig& training = *plan.mutable_training();
  std::string* outputs[] = {training.mutable_metrics_file(), training.mutable_tensorboard_dir(),
                            training.mutable_save_hf_dir(), training.mutable_save_adapter_dir()};
  bool relative = false;
  for (const std::string* path : outputs) relative |= !path->empty() && (*path)[0] != '/';
  if (training.run_dir().empty() || !relative) return RunFolder();

  const std::string run_dir = base::UserPath(training.run_dir());
  RunFolder folder;
  if (const char* handed = std::getenv(kRunFolderVariable); handed != nullptr && *handed != 0) {
    folder.path = handed;
  } else if (starts_run && restart_count == 0) {
    folder.path = absl::StrCat(run_dir, "/", NewFolderName(run_dir));
    folder.is_new = true;
  } else {
    folder.path = absl::StrCat(run_dir, "/latest");
  }
  for (std::string* path : outputs) {
    if (!path->empty() && (*path)[0] != '/') *path = absl::StrCat(folder.path, "/", *path);
  }
  return folder;
}

}  // namespace plait::trainer
