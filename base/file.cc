#include "base/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace plait::base {

std::string UserPath(const std::string& path) {
  const char* dir = std::getenv("BUILD_WORKING_DIRECTORY");
  if (path.empty() || path[0] == '/' || dir == nullptr) return path;
  return absl::StrCat(dir, "/", path);
}

std::string FileKind(unsigned int mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISLNK(mode)) return "a symbolic link";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

absl::StatusOr<int> OpenForReading(const std::string& path) {
  // Non-blocking, so that opening a FIFO does not wait for a writer; reads block again below.
  const int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  struct stat info;
  const bool stat_ok = fstat(fd, &info) == 0;
  if (!stat_ok || !S_ISREG(info.st_mode)) {
    const std::string kind = stat_ok ? FileKind(info.st_mode) : "unreadable";
    close(fd);
    return absl::FailedPreconditionError(absl::StrCat(path, ": is ", kind, ", not a regular file"));
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  PLAIT_ASSIGN_OR_RETURN(const int fd, OpenForReading(path));
  std::string bytes;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t count = read(fd, buffer, sizeof(buffer));
    if (count == 0) break;
    if (count < 0) {
      if (errno == EINTR) continue;
      const std::string reason = std::strerror(errno);
      close(fd);
      return absl::DataLossError(absl::StrCat(path, ": read failed: ", reason));
    }
    bytes.append(buffer, static_cast<size_t>(count));
  }
  close(fd);
  return bytes;
}

absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents) {
  const std::string temporary = path + ".tmp";
  {
    std::ofstream file(temporary, std::ios::binary | std::ios::trunc);
    file.write(contents.data(), static_cast<std::streamsize>(contents.size()));
    file.close();
    if (!file) {
      const std::string reason = std::strerror(errno);  // e.g. "No space left on device"
      std::remove(temporary.c_str());
      return absl::InvalidArgumentError(absl::StrCat(temporary, ": cannot write: ", reason));
    }
  }
  PLAIT_RETURN_IF_ERROR(SyncToDisk(temporary));
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    const std::string reason = std::strerror(errno);
    std::remove(temporary.c_str());
    return absl::InvalidArgumentError(absl::StrCat(path, ": cannot replace: ", reason));
  }
  return absl::OkStatus();
}

absl::Status SyncToDisk(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0 || fsync(fd) != 0) {
    const std::string reason = std::strerror(errno);
    if (fd >= 0) close(fd);
    return absl::InternalError(absl::StrCat(path, ": cannot flush to disk: ", reason));
  }
  close(fd);
  return absl::OkStatus();
}

absl::Status CheckFolderIsWritable(const std::string& dir) {
  std::string existing = dir;
  struct stat info;
  while (stat(existing.c_str(), &info) != 0) {
    if (lstat(existing.c_str(), &info) == 0) {
      // A link to nothing: creating the folder neither follows nor replaces it.
      char target[4096] = {};
      const ssize_t length = readlink(existing.c_str(), target, sizeof(target) - 1);
      return absl::FailedPreconditionError(absl::StrCat(
          "\"", dir, "\" cannot be created: \"", existing, "\" is a symbolic link to \"",
          length > 0 ? target : "", "\", which does not exist"));
    }
    if (existing == "/" || existing == ".") {
      return absl::FailedPreconditionError(absl::StrCat("\"", dir, "\" cannot be created"));
    }
    const size_t slash = existing.find_last_of('/', existing.size() - 1);
    existing = slash == std::string::npos ? "." : slash == 0 ? "/" : existing.substr(0, slash);
  }
  if (!S_ISDIR(info.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("\"", dir, "\" cannot be created: \"", existing, "\" is not a folder"));
  }
  if (access(existing.c_str(), W_OK | X_OK) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("\"", dir, "\" cannot be written: \"", existing, "\" is not writable"));
  }
  return absl::OkStatus();
}

}  // namespace plait::base
