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
#include "base/status.h"
#include "generation/sampling_config.h"

namespace plait::trainer {
namespace {

// Points run_dir/latest at `name`, through a rename so that a reader never finds it missing.
absl::Status PointLatestAt(const std::string& run_dir, const std::string& name) {
  const std::string latest = absl::StrCat(run_dir, "/latest");
  const std::string link = absl::StrCat(latest, ".", getpid());
  unlink(link.c_str());
  if (symlink(name.c_str(), link.c_str()) != 0 || rename(link.c_str(), latest.c_str()) != 0) {
    const int error = errno;
    unlink(link.c_str());
    return absl::FailedPreconditionError(absl::StrCat("plan.training.run_dir: \"", latest,
                                                      "\" cannot point at ", name, ": ",
                                                      std::strerror(error)));
  }
  return absl::OkStatus();
}

// OK when run_dir/latest is missing or a link, which Create replaces; a file or folder there is
// someone else's, which it must neither replace nor leave pointing at an older run.
absl::Status CheckLatestIsALink(const std::string& run_dir) {
  const std::string latest = absl::StrCat(run_dir, "/latest");
  struct stat info;
  if (lstat(latest.c_str(), &info) != 0 || S_ISLNK(info.st_mode)) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "plan.training.run_dir: \"", latest, "\" is ", base::FileKind(info.st_mode),
      ", not the link to the newest run that plait keeps there: move it away, or choose "
      "another run_dir"));
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
  PLAIT_RETURN_IF_ERROR(CheckLatestIsALink(folder.parent_path().string()));
  std::error_code error;
  std::filesystem::create_directories(folder.parent_path(), error);
  if (error || mkdir(path.c_str(), 0755) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("plan.training.run_dir: \"", path, "\" cannot be created: ",
                     error ? error.message() : std::strerror(errno)));
  }
  PLAIT_RETURN_IF_ERROR(PointLatestAt(folder.parent_path().string(), folder.filename().string()));
  setenv(kRunFolderVariable, path.c_str(), /*overwrite=*/1);
  return absl::OkStatus();
}

RunFolder TakeRunFolder(plan::Plan& plan, bool starts_run, int restart_count) {
  plan::TrainingConfig& training = *plan.mutable_training();
  if (training.has_samples()) {
    training.mutable_samples()->set_file(generation::SamplesFile(training.samples()));
  }
  std::string* outputs[] = {
      training.mutable_metrics_file(), training.mutable_tensorboard_dir(),
      training.mutable_save_hf_dir(), training.mutable_save_adapter_dir(),
      training.has_samples() ? training.mutable_samples()->mutable_file() : nullptr};
  bool relative = false;
  for (const std::string* path : outputs) {
    relative |= path != nullptr && !path->empty() && (*path)[0] != '/';
  }
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
    if (path != nullptr && !path->empty() && (*path)[0] != '/') {
      *path = absl::StrCat(folder.path, "/", *path);
    }
  }
  return folder;
}

}  // namespace plait::trainer
