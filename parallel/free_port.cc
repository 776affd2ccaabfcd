#include "parallel/free_port.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace plait::parallel {
namespace {

// Where ports are drawn from: below the kernel's ephemeral range, from kLowestPort, which no
// system service of a usual machine listens on.
constexpr int kLowestPort = 20000;
constexpr int kTries = 64;

// The first port of the kernel's ephemeral range (ip_local_port_range), 32768 where unreadable.
int FirstEphemeralPort() {
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  int first = 0;
  return range >> first && first > kLowestPort ? first : 32768;
}

}  // namespace

absl::StatusOr<int> PickFreeLoopbackPort() {
  auto failed = [](const char* call) {
    return absl::InternalError(
        absl::StrCat(call, " failed while picking a free port: ", std::strerror(errno)));
  };
  // A port free now, bound once to check; `port` 0 lets the kernel choose one.
  auto try_port = [&](int port) -> absl::StatusOr<int> {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return failed("socket");
    const absl::Cleanup close_socket = [fd] { close(fd); };
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(static_cast<uint16_t>(port));
    if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
      if (port != 0 && errno == EADDRINUSE) return 0;
      return failed(port == 0 ? "bind to 127.0.0.1:0" : "bind");
    }
    socklen_t length = sizeof(address);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
      return failed("getsockname");
    }
    return ntohs(address.sin_port);
  };
  std::random_device seed;
  std::mt19937 draw(seed());
  std::uniform_int_distribution<int> ports(kLowestPort, FirstEphemeralPort() - 1);
  for (int i = 0; i < kTries; ++i) {
    absl::StatusOr<int> port = try_port(ports(draw));
    if (!port.ok() || *port != 0) return port;
  }
  return try_port(0);
}

}  // namespace plait::parallel
