#include "data/token_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <utility>

#include "ATen/core/Tensor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/file.h"
#include "base/status.h"
#include "torch/csrc/autograd/generated/variable_factories.h"

namespace plait::data {
namespace {

// Tokens Open reads at a time while it checks them all: 1 MiB of uint16.
constexpr int64_t kScanTokens = int64_t{1} << 19;

// Token `i` of tokens `width` bytes wide at `bytes`.
int64_t TokenAt(const char* bytes, int width, int64_t i) {
  if (width == 2) {
    uint16_t token;
    std::memcpy(&token, bytes + i * 2, 2);
    return token;
  }
  uint32_t token;
  std::memcpy(&token, bytes + i * 4, 4);
  return token;
}

// Copies the `count` tokens of type T at `bytes` into `out` as int64; whether all are below
// `vocab_size`. Without an early exit, so that the loop vectorises.
template <typename T>
bool WidenBelow(const char* bytes, int64_t count, int64_t vocab_size, int64_t* out) {
  T largest = 0;
  for (int64_t i = 0; i < count; ++i) {
    T token;
    std::memcpy(&token, bytes + i * sizeof(T), sizeof(T));
    largest = std::max(largest, token);
    out[i] = token;
  }
  return static_cast<int64_t>(largest) < vocab_size;
}

// The index of the first of the `count` tokens, `width` bytes each, at `bytes` that is not
// below `vocab_size`; -1 when all are. Only for the error message.
int64_t FirstOutOfVocab(const char* bytes, int width, int64_t count, int64_t vocab_size) {
  for (int64_t i = 0; i < count; ++i) {
    if (TokenAt(bytes, width, i) >= vocab_size) return i;
  }
  return -1;
}

// Reads `bytes` bytes at byte `start` of `fd` into `buffer`, fewer only where the file ends;
// how many it read.
absl::StatusOr<int64_t> ReadAt(int fd, int64_t start, int64_t bytes, char* buffer) {
  int64_t done = 0;
  while (done < bytes) {
    const ssize_t got = pread(fd, buffer + done, static_cast<size_t>(bytes - done), start + done);
    if (got == 0) break;
    if (got < 0) {
      if (errno == EINTR) continue;
      return absl::DataLossError(
          absl::StrCat("reading byte ", start + done, " failed: ", std::strerror(errno)));
    }
    done += got;
  }
  return done;
}

// The error of a file that is no longer what Open checked.
absl::Status Changed(const std::string& path, absl::string_view what) {
  return absl::DataLossError(absl::StrCat(path, ": the file changed after it was opened: ", what,
                                          "; a token file must not change while a run reads it"));
}

}  // namespace

TokenFile::TokenFile(TokenFile&& other) noexcept { *this = std::move(other); }

TokenFile& TokenFile::operator=(TokenFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
    data_start_ = other.data_start_;
    width_ = other.width_;
    size_ = std::exchange(other.size_, 0);
    vocab_size_ = other.vocab_size_;
    file_bytes_ = other.file_bytes_;
    modified_ = other.modified_;
  }
  return *this;
}

TokenFile::~TokenFile() {
  if (fd_ >= 0) close(fd_);
}

absl::Status TokenFile::ReadTokens(int64_t first, int64_t count, char* buffer) const {
  const int64_t start = data_start_ + first * width_;
  const int64_t bytes = count * width_;
  PLAIT_ASSIGN_OR_RETURN(const int64_t got,
                         base::Annotate(ReadAt(fd_, start, bytes, buffer), path_));
  if (got < bytes) {
    return Changed(path_, absl::StrCat("reading tokens ", first, "..", first + count - 1,
                                       " (bytes ", start, "..", start + bytes - 1,
                                       ") ended at byte ", start + got, ": it was truncated"));
  }
  return absl::OkStatus();
}

absl::Status TokenFile::CheckUnchanged(int64_t first, int64_t count) const {
  struct stat info;
  if (fstat(fd_, &info) != 0) {
    return absl::InternalError(absl::StrCat(path_, ": cannot stat: ", std::strerror(errno)));
  }
  if (info.st_size != file_bytes_) {
    return Changed(path_, absl::StrCat("it held ", size_, " tokens (", file_bytes_,
                                       " bytes) when opened and now has ", info.st_size,
                                       " bytes (it was truncated or written to), reading tokens ",
                                       first, "..", first + count - 1));
  }
  if (info.st_mtim.tv_sec != modified_.tv_sec || info.st_mtim.tv_nsec != modified_.tv_nsec) {
    return Changed(path_, absl::StrCat("it has the size it was opened with but a new "
                                       "modification time (it was rewritten in place), reading "
                                       "tokens ",
                                       first, "..", first + count - 1));
  }
  return absl::OkStatus();
}

absl::StatusOr<TokenFile> TokenFile::Open(const std::string& path, TokenFormat format,
                                          int64_t vocab_size) {
  if (format == TOKEN_FORMAT_UNSPECIFIED) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": no token format given"));
  }
  PLAIT_ASSIGN_OR_RETURN(const int fd, base::OpenForReading(path));
  // From here the descriptor is owned by `file`, closed on every error path.
  TokenFile file(path, fd);
  struct stat info;
  if (fstat(fd, &info) != 0) {
    return absl::InternalError(absl::StrCat(path, ": cannot stat: ", std::strerror(errno)));
  }
  file.file_bytes_ = info.st_size;
  file.modified_ = info.st_mtim;
  file.width_ = format == TOKEN_FORMAT_UINT32 ? 4 : 2;
  file.vocab_size_ = vocab_size;
  const int64_t bytes = info.st_size;
  if (bytes == 0) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": the file is empty"));
  }
  if (format == TOKEN_FORMAT_LLMC) {
    const int64_t header_bytes = kLlmcHeaderInts * sizeof(int32_t);
    if (bytes < header_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": truncated: ", bytes,
                                                     " bytes, shorter than llm.c's ", header_bytes,
                                                     "-byte header"));
    }
    int32_t header[3];
    PLAIT_ASSIGN_OR_RETURN(
        const int64_t got,
        base::Annotate(ReadAt(fd, 0, sizeof(header), reinterpret_cast<char*>(header)), path));
    if (got < static_cast<int64_t>(sizeof(header))) {
      return Changed(path, absl::StrCat("its header ended at byte ", got, ": it was truncated"));
    }
    if (header[0] != kLlmcMagic && header[0] != kLlmcUint32Magic) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": bad magic ", header[0], "; an llm.c token file starts with ",
                       kLlmcMagic, " (uint16 tokens) or ", kLlmcUint32Magic, " (uint32 tokens)"));
    }
    const bool wide = header[0] == kLlmcUint32Magic;
    const int32_t version = wide ? kLlmcUint32Version : kLlmcVersion;
    if (header[1] != version) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": llm.c version ", header[1], " with magic ", header[0], " is not supported (",
          version, ": ", wide ? "uint32" : "uint16", " tokens)"));
    }
    file.width_ = wide ? 4 : 2;
    const int64_t count = header[2];
    if (count <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": the header says ", count, " tokens; an llm.c file holds some"));
    }
    const int64_t want = header_bytes + count * file.width_;
    if (bytes < want) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": truncated: the header says ", count,
                                                     " tokens (", want, " bytes), the file has ",
                                                     bytes, " bytes"));
    }
    if (bytes > want) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": the header says ", count, " tokens (",
                                                     want, " bytes), the file has ", bytes,
                                                     " bytes: trailing data"));
    }
    file.data_start_ = header_bytes;
    file.size_ = count;
  } else {
    if (bytes % file.width_ != 0) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": truncated: ", bytes,
                                                     " bytes is not a whole number of ",
                                                     file.width_, "-byte tokens"));
    }
    file.size_ = bytes / file.width_;
  }
  const std::unique_ptr<char[]> buffer(new char[std::min(file.size_, kScanTokens) * file.width_]);
  for (int64_t first = 0; first < file.size_; first += kScanTokens) {
    const int64_t count = std::min(kScanTokens, file.size_ - first);
    PLAIT_RETURN_IF_ERROR(file.ReadTokens(first, count, buffer.get()));
    const int64_t bad = FirstOutOfVocab(buffer.get(), file.width_, count, vocab_size);
    if (bad >= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": token ", first + bad, " is ", TokenAt(buffer.get(), file.width_, bad),
          ", not below the model's vocab_size ", vocab_size));
    }
  }
  return file;
}

absl::StatusOr<at::Tensor> TokenFile::Read(int64_t offset, int64_t count) const {
  if (offset < 0 || count < 0 || offset > size_ - count) {
    return absl::OutOfRangeError(absl::StrCat(path_, ": tokens ", offset, "..", offset + count - 1,
                                              " are not all in the file's ", size_, " tokens"));
  }
  PLAIT_RETURN_IF_ERROR(CheckUnchanged(offset, count));
  const std::unique_ptr<char[]> buffer(new char[count * width_]);
  if (absl::Status read = ReadTokens(offset, count, buffer.get()); !read.ok()) {
    // A file truncated between the check above and the read: the size it has now says more
    // than the byte the read ended at, and is the same message whichever way the race went.
    PLAIT_RETURN_IF_ERROR(CheckUnchanged(offset, count));
    return read;
  }
  at::Tensor out = torch::empty({count}, at::kLong);
  const bool in_vocab =
      width_ == 2 ? WidenBelow<uint16_t>(buffer.get(), count, vocab_size_, out.data_ptr<int64_t>())
                  : WidenBelow<uint32_t>(buffer.get(), count, vocab_size_, out.data_ptr<int64_t>());
  if (!in_vocab) {
    // Open checked every token, so one out of range here was written since.
    const int64_t bad = FirstOutOfVocab(buffer.get(), width_, count, vocab_size_);
    return Changed(path_,
                   absl::StrCat("token ", offset + bad, " is ", TokenAt(buffer.get(), width_, bad),
                                ", not below the model's vocab_size ", vocab_size_,
                                " (it was rewritten in place)"));
  }
  return out;
}

}  // namespace plait::data
