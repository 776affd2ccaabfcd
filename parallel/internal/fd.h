// Small pieces the socket and process code of parallel/ shares: Fd owns a file descriptor
// and closes it once; ErrnoText names a failed system call with errno's text; and integers
// travel on the wire little-endian.
//
//   Fd listener(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
//   if (!listener.valid()) return absl::UnavailableError(ErrnoText("socket"));
#ifndef PLAIT_PARALLEL_INTERNAL_FD_H_
#define PLAIT_PARALLEL_INTERNAL_FD_H_

#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace plait::parallel::internal {

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    Reset();
    fd_ = std::exchange(other.fd_, -1);
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { Reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Gives up ownership: the caller closes what it returns.
  int release() { return std::exchange(fd_, -1); }
  void Reset() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

// "call: <errno's text>", for the system call that just failed.
inline std::string ErrnoText(absl::string_view call) {
  return absl::StrCat(call, ": ", std::strerror(errno));
}

inline void PutLittleEndian(char* out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out[i] = static_cast<char>(value >> (8 * i));
}

inline void AppendLittleEndian(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>(value >> (8 * i)));
}

inline uint64_t GetLittleEndian(const char* in, int bytes) {
  uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) value |= uint64_t{static_cast<unsigned char>(in[i])} << (8 * i);
  return value;
}

}  // namespace plait::parallel::internal

#endif  // PLAIT_PARALLEL_INTERNAL_FD_H_
