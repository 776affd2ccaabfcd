#include "data/jsonl_lines.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "base/file.h"
#include "base/human.h"
#include "base/status.h"

namespace plait::data {
namespace {

// How much of the file one read takes.
constexpr size_t kChunkBytes = size_t{1} << 20;

}  // namespace

absl::Status CheckJsonlLineLength(absl::string_view path, int64_t number, size_t bytes,
                                  int64_t max_line_bytes) {
  if (bytes <= static_cast<uint64_t>(max_line_bytes)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      path, ":", number, ": longer than ",
      base::HumanBytesAnySize(static_cast<double>(max_line_bytes)),
      ", the most a JSONL line may hold; each line must be one document or example (is the "
      "file JSONL, with a newline after each?)"));
}

absl::Status ForEachJsonlLine(const std::string& path, const JsonlLineFunction& on_line,
                              int64_t max_line_bytes) {
  PLAIT_ASSIGN_OR_RETURN(const int fd, base::OpenForReading(path));
  const absl::Cleanup close_file = [fd] { close(fd); };
  std::string chunk(kChunkBytes, '\0');
  std::string line;
  int64_t number = 1;
  for (;;) {
    const ssize_t count = read(fd, chunk.data(), chunk.size());
    if (count == 0) break;
    if (count < 0) {
      if (errno == EINTR) continue;
      return absl::DataLossError(absl::StrCat(path, ": read failed: ", std::strerror(errno)));
    }
    absl::string_view rest(chunk.data(), static_cast<size_t>(count));
    while (!rest.empty()) {
      const size_t end = rest.find('\n');
      const absl::string_view part = rest.substr(0, end);
      PLAIT_RETURN_IF_ERROR(
          CheckJsonlLineLength(path, number, line.size() + part.size(), max_line_bytes));
      line.append(part.data(), part.size());
      if (end == absl::string_view::npos) break;
      PLAIT_RETURN_IF_ERROR(on_line(line, number));
      line.clear();
      ++number;
      rest.remove_prefix(end + 1);
    }
  }
  if (!line.empty()) PLAIT_RETURN_IF_ERROR(on_line(line, number));
  return absl::OkStatus();
}

}  // namespace plait::data
