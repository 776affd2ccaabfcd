#include "parallel/free_port.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace plait::parallel {

absl::StatusOr<int> PickFreeLoopbackPort() {
  auto failed = [](const char* call) {
    return absl::InternalError(
        absl::StrCat(call, " failed while picking a free port: ", std::strerror(errno)));
  };
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return failed("socket");
  const absl::Cleanup close_socket = [fd] { close(fd); };
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    return failed("bind to 127.0.0.1:0");
  }
  socklen_t length = sizeof(address);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    return failed("getsockname");
  }
  return ntohs(address.sin_port);
}

}  // namespace plait::parallel
