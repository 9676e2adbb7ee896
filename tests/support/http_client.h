// Test support: a blocking HTTP/1.1 GET over a raw socket with a deadline
// (no client library), and raw connections from a chosen loopback source
// address (127.0.0.2, ...) to act as other peers. Header-only.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>

namespace tandem::test_support {

// A TCP connection to 127.0.0.1:port from source address `from`; -1 on error.
inline int ConnectLoopback(int port, const char* from = "127.0.0.1") {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in src{};
  src.sin_family = AF_INET;
  inet_pton(AF_INET, from, &src.sin_addr);
  sockaddr_in dst{};
  dst.sin_family = AF_INET;
  dst.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &dst.sin_addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&src), sizeof src) != 0 ||
      connect(fd, reinterpret_cast<sockaddr*>(&dst), sizeof dst) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Sends `request` and reads until the server closes, at most timeout_ms.
// Returns the whole response ("" on timeout or error).
inline std::string RawExchange(int port, const std::string& request, int timeout_ms = 2000,
                               const char* from = "127.0.0.1") {
  const int fd = ConnectLoopback(port, from);
  if (fd < 0) return "";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  std::string out;
  if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(request.size())) {
    close(fd);
    return "";
  }
  while (true) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      out.clear();
      break;
    }
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    char buf[4096];
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return out;
}

struct HttpResult {
  int status = -1;  // -1: no response within the deadline
  std::string body;
};

inline HttpResult HttpGet(int port, const std::string& path, int timeout_ms = 2000, const char* from = "127.0.0.1") {
  const std::string raw = RawExchange(port, "GET " + path + " HTTP/1.1\r\nHost: test\r\n\r\n", timeout_ms, from);
  HttpResult r;
  if (raw.rfind("HTTP/1.1 ", 0) != 0 || raw.size() < 12) return r;
  r.status = std::stoi(raw.substr(9, 3));
  const size_t body = raw.find("\r\n\r\n");
  if (body != std::string::npos) r.body = raw.substr(body + 4);
  return r;
}

}  // namespace tandem::test_support
