#include "metrics/tensorboard_log.h"

#include <fcntl.h>
#include <limits.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/status.h"
#include "metrics/record_file.h"

namespace plait::metrics {
namespace {

// The version TensorBoard's writers put in a file's first event
// (tensorboard/summary/writer/event_file_writer.py).
constexpr char kFileVersion[] = "brain.Event:2";
// The text plugin's name (tensorboard/plugins/text/metadata.py).
constexpr char kTextPlugin[] = "text";

std::string HostName() {
  char name[HOST_NAME_MAX + 1] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

// `text` fenced by more backticks than any run of them in it (at least three), so markdown
// shows it as it is.
std::string FencedCodeBlock(absl::string_view text) {
  size_t longest = 0, run = 0;
  for (const char c : text) {
    run = c == '`' ? run + 1 : 0;
    longest = std::max(longest, run);
  }
  const std::string fence(std::max<size_t>(3, longest + 1), '`');
  const bool ends_line = !text.empty() && text.back() == '\n';
  return absl::StrCat(fence, "\n", text, ends_line ? "" : "\n", fence, "\n");
}

}  // namespace

absl::StatusOr<TensorBoardLog> TensorBoardLog::Open(const std::string& dir, int64_t resume_step) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error || !std::filesystem::is_directory(dir)) {
    return absl::FailedPreconditionError(
        absl::StrCat("\"", dir, "\" is not a folder TensorBoard's event files can go in",
                     error ? absl::StrCat(": ", error.message()) : ""));
  }
  // The pid and a count of the files this process opened, as TensorBoard's Python writer
  // names them, tell apart runs that start in the same second.
  static std::atomic<int> opened{0};
  const std::string path =
      absl::StrFormat("%s/events.out.tfevents.%010d.%s.%d.%d", dir,
                      absl::ToUnixSeconds(absl::Now()), HostName(), getpid(), opened++);
  // Created here, exclusively: a file of another run is never written over.
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND, 0644);
  std::unique_ptr<std::FILE, CloseFile> file(fd < 0 ? nullptr : fdopen(fd, "ab"));
  if (file == nullptr) {
    const int failure = errno;
    if (fd >= 0) close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create \"", path, "\": ", std::strerror(failure)));
  }
  TensorBoardLog log(path, std::move(file));
  tensorboard::Event version;
  version.set_file_version(kFileVersion);
  PLAIT_RETURN_IF_ERROR(log.Write(version));
  tensorboard::Event start;
  start.set_step(resume_step + 1);
  start.mutable_session_log()->set_status(tensorboard::SessionLog::START);
  PLAIT_RETURN_IF_ERROR(log.Write(start));
  return log;
}

absl::Status TensorBoardLog::AppendText(const std::string& tag, absl::string_view text,
                                        int64_t step) {
  tensorboard::Event event;
  event.set_step(step);
  tensorboard::Summary::Value& value = *event.mutable_summary()->add_value();
  value.set_tag(tag);
  value.mutable_metadata()->mutable_plugin_data()->set_plugin_name(kTextPlugin);
  tensorboard::TensorProto& tensor = *value.mutable_tensor();
  tensor.set_dtype(tensorboard::DT_STRING);
  tensor.mutable_tensor_shape();  // a scalar: no dimensions
  tensor.add_string_val(FencedCodeBlock(text));
  return Write(std::move(event));
}

absl::Status TensorBoardLog::Append(const StepMetrics& metrics) {
  tensorboard::Event event;
  event.set_step(metrics.step);
  for (const auto& [name, number] : Scalars(metrics)) {
    tensorboard::Summary::Value& value = *event.mutable_summary()->add_value();
    value.set_tag(name);
    value.set_simple_value(static_cast<float>(number));
  }
  return Write(std::move(event));
}

absl::Status TensorBoardLog::Write(tensorboard::Event event) {
  event.set_wall_time(absl::ToUnixMicros(absl::Now()) * 1e-6);
  const std::string record = FrameRecord(event.SerializeAsString());
  if (std::fwrite(record.data(), 1, record.size(), file_.get()) != record.size() ||
      std::fflush(file_.get()) != 0) {
    return absl::DataLossError(absl::StrCat(path_, ": cannot write the event of step ",
                                            event.step(), ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace plait::metrics
