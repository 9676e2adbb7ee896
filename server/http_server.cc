#include "server/http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "spdlog/spdlog.h"

namespace tandem::server {
namespace {

struct Connection {
  int fd = -1;
  std::string peer;
  absl::Time deadline;
  std::string in;
  std::string out;
  size_t sent = 0;
  bool writing = false;
};

const char* Reason(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 431: return "Request Header Fields Too Large";
    case 503: return "Service Unavailable";
    default: return "Error";
  }
}

std::string Serialize(const HttpResponse& r, bool head) {
  std::string out = absl::StrCat("HTTP/1.1 ", r.status, " ", Reason(r.status), "\r\nContent-Type: ", r.content_type,
                                 "\r\nContent-Length: ", r.body.size(), "\r\nConnection: close\r\n");
  if (r.status == 405) out += "Allow: GET, HEAD\r\n";
  out += "\r\n";
  if (!head) out += r.body;
  return out;
}

HttpResponse Error(int status, const std::string& text) { return HttpResponse{status, "text/plain; charset=utf-8", text + "\n"}; }

std::string PeerAddress(const sockaddr_storage& addr) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (addr.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&addr)->sin_addr, buf, sizeof buf);
  } else if (addr.ss_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_addr, buf, sizeof buf);
  }
  return buf;
}

}  // namespace

HttpServer::HttpServer(HttpServerOptions options) : options_(options) {}

HttpServer::~HttpServer() { Stop(); }

void HttpServer::Get(const std::string& path, Handler handler) { handlers_[path] = std::move(handler); }

absl::Status HttpServer::Start(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &found); rc != 0) {
    return absl::InvalidArgumentError(absl::StrCat("http: cannot resolve '", host, "': ", gai_strerror(rc)));
  }
  std::string error = "no address";
  for (addrinfo* a = found; a != nullptr && listen_fd_ < 0; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 128) != 0) {
      error = std::strerror(errno);
      close(fd);
      continue;
    }
    listen_fd_ = fd;
  }
  freeaddrinfo(found);
  if (listen_fd_ < 0) return absl::UnavailableError(absl::StrCat("http: cannot listen on ", host, ":", port, ": ", error));
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len);
  port_ = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                            : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  if (pipe2(wake_pipe_, O_NONBLOCK | O_CLOEXEC) != 0) {
    close(listen_fd_);
    listen_fd_ = -1;
    return absl::InternalError(absl::StrCat("http: pipe: ", std::strerror(errno)));
  }
  thread_ = std::thread([this] { Loop(); });
  return absl::OkStatus();
}

void HttpServer::Stop() {
  if (!thread_.joinable()) return;
  stop_ = true;
  const char b = 0;
  (void)!write(wake_pipe_[1], &b, 1);
  thread_.join();
  close(listen_fd_);
  close(wake_pipe_[0]);
  close(wake_pipe_[1]);
  listen_fd_ = wake_pipe_[0] = wake_pipe_[1] = -1;
}

void HttpServer::Loop() {
  std::vector<Connection> conns;
  std::vector<pollfd> fds;
  auto close_at = [&](size_t i) {
    close(conns[i].fd);
    conns[i] = std::move(conns.back());
    conns.pop_back();
  };
  auto respond = [&](Connection& c) {
    HttpResponse response;
    bool head = false;
    const size_t end = c.in.find("\r\n");
    std::vector<std::string> parts = absl::StrSplit(c.in.substr(0, end), ' ');
    if (parts.size() != 3 || (parts[2] != "HTTP/1.1" && parts[2] != "HTTP/1.0") || parts[1].empty() ||
        parts[1][0] != '/') {
      response = Error(400, "bad request line");
    } else if (parts[0] != "GET" && parts[0] != "HEAD") {
      response = Error(405, "only GET and HEAD");
    } else {
      head = parts[0] == "HEAD";
      auto it = handlers_.find(parts[1].substr(0, parts[1].find('?')));
      response = it == handlers_.end() ? Error(404, "not found") : it->second();
    }
    c.out = Serialize(response, head);
    c.writing = true;
    c.in.clear();
  };
  while (!stop_.load()) {
    fds.clear();
    fds.push_back({wake_pipe_[0], POLLIN, 0});
    fds.push_back({listen_fd_, POLLIN, 0});
    const absl::Time now = absl::Now();
    absl::Duration wait = absl::Seconds(1);
    for (const Connection& c : conns) {
      fds.push_back({c.fd, static_cast<short>(c.writing ? POLLOUT : POLLIN), 0});
      wait = std::min(wait, std::max(absl::ZeroDuration(), c.deadline - now));
    }
    const int ready = poll(fds.data(), fds.size(), static_cast<int>(absl::ToInt64Milliseconds(wait)) + 1);
    if (ready < 0 && errno != EINTR) {
      spdlog::error("http: poll: {}", std::strerror(errno));
      break;
    }
    if (stop_.load()) break;
    // Connections, back to front so that closing (swap with the last) is safe.
    for (size_t k = conns.size(); k-- > 0;) {
      Connection& c = conns[k];
      const short ev = fds[k + 2].revents;
      bool done = false;
      if (!c.writing && (ev & (POLLIN | POLLHUP | POLLERR))) {
        char buf[4096];
        while (true) {
          const ssize_t n = recv(c.fd, buf, sizeof buf, 0);
          if (n > 0) {
            c.in.append(buf, static_cast<size_t>(n));
            if (c.in.size() > options_.max_request_bytes) break;
            continue;
          }
          if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) done = true;
          if (n < 0 && errno == EINTR) continue;
          break;
        }
        if (!done && c.in.size() > options_.max_request_bytes) {
          c.out = Serialize(Error(431, "request too large"), false);
          c.writing = true;
        } else if (!done && c.in.find("\r\n\r\n") != std::string::npos) {
          respond(c);
        }
      } else if (c.writing && (ev & (POLLOUT | POLLHUP | POLLERR))) {
        while (c.sent < c.out.size()) {
          const ssize_t n = send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
          if (n > 0) {
            c.sent += static_cast<size_t>(n);
            continue;
          }
          if (n < 0 && errno == EINTR) continue;
          if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
          done = true;
          break;
        }
        if (c.sent == c.out.size()) done = true;
      }
      if (done || absl::Now() >= c.deadline) close_at(k);
    }
    // New connections.
    if (fds[1].revents & POLLIN) {
      while (true) {
        sockaddr_storage addr{};
        socklen_t len = sizeof addr;
        const int fd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) break;
        Connection c{fd, PeerAddress(addr), absl::Now() + options_.request_deadline};
        const auto from_peer = std::count_if(conns.begin(), conns.end(), [&](const Connection& o) { return o.peer == c.peer; });
        if (from_peer >= options_.max_connections_per_peer) {
          close(fd);
          continue;
        }
        if (static_cast<int>(conns.size()) >= options_.max_connections) {
          // Full: make room by closing the oldest connection still sending
          // its request (a slow client), else refuse the new one.
          size_t oldest = conns.size();
          for (size_t i = 0; i < conns.size(); ++i) {
            if (!conns[i].writing && (oldest == conns.size() || conns[i].deadline < conns[oldest].deadline)) oldest = i;
          }
          if (oldest == conns.size()) {
            close(fd);
            continue;
          }
          close_at(oldest);
        }
        conns.push_back(std::move(c));
      }
    }
    if (fds[0].revents & POLLIN) {
      char drain[64];
      while (read(wake_pipe_[0], drain, sizeof drain) > 0) {
      }
    }
  }
  for (Connection& c : conns) close(c.fd);
}

}  // namespace tandem::server
