#include "data/token_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/file.h"
#include "base/status.h"

namespace plait::data {

TokenFile::TokenFile(std::string path, void* map, size_t map_bytes, const void* tokens, int width,
                     int64_t size)
    : path_(std::move(path)),
      map_(map),
      map_bytes_(map_bytes),
      tokens_(tokens),
      width_(width),
      size_(size) {}

TokenFile::TokenFile(TokenFile&& other) noexcept { *this = std::move(other); }

TokenFile& TokenFile::operator=(TokenFile&& other) noexcept {
  if (this != &other) {
    if (map_ != nullptr) munmap(map_, map_bytes_);
    path_ = std::move(other.path_);
    map_ = std::exchange(other.map_, nullptr);
    map_bytes_ = std::exchange(other.map_bytes_, 0);
    tokens_ = std::exchange(other.tokens_, nullptr);
    width_ = other.width_;
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

TokenFile::~TokenFile() {
  if (map_ != nullptr) munmap(map_, map_bytes_);
}

int64_t TokenFile::Token(int64_t i) const {
  return width_ == 2 ? static_cast<const uint16_t*>(tokens_)[i]
                     : static_cast<const uint32_t*>(tokens_)[i];
}

absl::StatusOr<TokenFile> TokenFile::Open(const std::string& path, TokenFormat format,
                                          int64_t vocab_size) {
  if (format == TOKEN_FORMAT_UNSPECIFIED) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": no token format given"));
  }
  PLAIT_ASSIGN_OR_RETURN(const int fd, base::OpenForReading(path));
  struct stat info;
  if (fstat(fd, &info) != 0) {
    close(fd);
    return absl::InternalError(absl::StrCat(path, ": cannot stat: ", std::strerror(errno)));
  }
  const size_t bytes = static_cast<size_t>(info.st_size);
  if (bytes == 0) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": the file is empty"));
  }
  void* map = mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (map == MAP_FAILED) {
    return absl::InternalError(absl::StrCat(path, ": cannot map: ", std::strerror(errno)));
  }
  // From here the mapping is owned by `file`, released on every error path.
  TokenFile file(path, map, bytes, map, format == TOKEN_FORMAT_UINT32 ? 4 : 2, 0);
  if (format == TOKEN_FORMAT_LLMC) {
    const size_t header_bytes = kLlmcHeaderInts * sizeof(int32_t);
    if (bytes < header_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": truncated: ", bytes,
                                                     " bytes, shorter than llm.c's ", header_bytes,
                                                     "-byte header"));
    }
    int32_t header[3];
    std::memcpy(header, map, sizeof(header));
    if (header[0] != kLlmcMagic) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": bad magic ", header[0], "; an llm.c token file starts with ", kLlmcMagic));
    }
    if (header[1] != kLlmcVersion) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": llm.c version ", header[1],
                                                     " is not supported (", kLlmcVersion,
                                                     ": uint16 tokens)"));
    }
    const int64_t count = header[2];
    const size_t want = header_bytes + static_cast<size_t>(count) * 2;
    if (count < 0 || bytes < want) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": truncated: the header says ", count,
                                                     " tokens (", want, " bytes), the file has ",
                                                     bytes, " bytes"));
    }
    if (bytes > want) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": the header says ", count, " tokens (",
                                                     want, " bytes), the file has ", bytes,
                                                     " bytes: trailing data"));
    }
    file.tokens_ = static_cast<const char*>(map) + header_bytes;
    file.size_ = count;
  } else {
    if (bytes % file.width_ != 0) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": truncated: ", bytes,
                                                     " bytes is not a whole number of ",
                                                     file.width_, "-byte tokens"));
    }
    file.size_ = static_cast<int64_t>(bytes / file.width_);
  }
  for (int64_t i = 0; i < file.size_; ++i) {
    const int64_t token = file.Token(i);
    if (token >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": token ", i, " is ", token, ", not below the model's vocab_size ", vocab_size));
    }
  }
  return file;
}

torch::Tensor TokenFile::Read(int64_t offset, int64_t count) const {
  torch::Tensor out = torch::empty({count}, torch::kInt64);
  int64_t* data = out.data_ptr<int64_t>();
  for (int64_t i = 0; i < count; ++i) data[i] = Token(offset + i);
  return out;
}

}  // namespace plait::data
