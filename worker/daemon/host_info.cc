#include "worker/daemon/host_info.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>

namespace tandem::worker {

std::string HostName() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
  return buf;
}

int64_t UsableMemoryBytes() {
  int64_t bytes = PhysicalMemoryBytes();
  auto lower = [&](int64_t limit) {
    if (limit > 0 && (bytes <= 0 || limit < bytes)) bytes = limit;
  };
  struct rlimit rl;
  if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) lower(static_cast<int64_t>(rl.rlim_cur));
  // The container's limit: cgroup v2, else v1 ("max" / huge values = none).
  for (const char* path : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    std::ifstream in(path);
    int64_t limit = 0;
    if (in >> limit && limit < (int64_t{1} << 60)) lower(limit);
  }
  return bytes;
}

int64_t PhysicalMemoryBytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit) {
    if (key == "MemTotal:") return kib * 1024;
  }
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : 0;
}

int64_t ResidentMemoryBytes() {
  std::ifstream in("/proc/self/statm");
  int64_t size = 0, resident = 0;
  if (!(in >> size >> resident)) return 0;
  return resident * sysconf(_SC_PAGESIZE);
}

std::string LocalAddressTowards(const std::string& host_port) {
  std::string host = host_port, port = "7070";
  if (auto colon = host_port.rfind(':'); colon != std::string::npos) {
    host = host_port.substr(0, colon);
    port = host_port.substr(colon + 1);
  }
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &res) != 0 || res == nullptr) {
    return "127.0.0.1";
  }
  std::string result = "127.0.0.1";
  const int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    if (connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
      sockaddr_in local{};
      socklen_t len = sizeof(local);
      if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
        char text[INET_ADDRSTRLEN] = {0};
        if (inet_ntop(AF_INET, &local.sin_addr, text, sizeof(text)) != nullptr) result = text;
      }
    }
    close(fd);
  }
  freeaddrinfo(res);
  return result;
}

}  // namespace tandem::worker
