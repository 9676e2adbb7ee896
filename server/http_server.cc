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

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
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
    case 200:
      return "OK";
    case 302:
      return "Found";
    case 303:
      return "See Other";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 411:
      return "Length Required";
    case 413:
      return "Content Too Large";
    case 415:
      return "Unsupported Media Type";
    case 431:
      return "Request Header Fields Too Large";
    case 503:
      return "Service Unavailable";
    default:
      return "Error";
  }
}

std::string Serialize(const HttpResponse& r, bool head) {
  std::string out = absl::StrCat("HTTP/1.1 ", r.status, " ", Reason(r.status), "\r\nContent-Type: ", r.content_type,
                                 "\r\nContent-Length: ", r.body.size(), "\r\nConnection: close\r\n");
  bool allow = false;
  for (const auto& [name, value] : r.headers) {
    absl::StrAppend(&out, name, ": ", value, "\r\n");
    allow = allow || absl::EqualsIgnoreCase(name, "Allow");
  }
  if (r.status == 405 && !allow) out += "Allow: GET, HEAD\r\n";
  out += "\r\n";
  if (!head) out += r.body;
  return out;
}

HttpResponse Error(int status, const std::string& text) {
  return HttpResponse{status, "text/plain; charset=utf-8", text + "\n"};
}

// Where a request ends: 0 while incomplete, else its size in bytes; sets
// *error (an error response status) for a request that cannot be served.
// A POST to a path that takes none ends at its headers (and gets 405).
size_t RequestEnd(const std::string& in, size_t max_bytes, const std::function<bool(const std::string&)>& takes_post,
                  int* error) {
  const size_t header_end = in.find("\r\n\r\n");
  if (header_end == std::string::npos || header_end + 4 > max_bytes) {
    if (in.size() > max_bytes) *error = 431;
    return 0;
  }
  if (in.rfind("POST ", 0) != 0) return header_end + 4;
  const size_t path_end = in.find_first_of(" ?\r", 5);
  if (!takes_post(in.substr(5, path_end - 5))) return header_end + 4;
  std::string length;
  bool chunked = false;
  for (absl::string_view line : absl::StrSplit(absl::string_view(in).substr(0, header_end), "\r\n")) {
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos) continue;
    const absl::string_view name = line.substr(0, colon);
    if (absl::EqualsIgnoreCase(name, "content-length"))
      length = std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
    if (absl::EqualsIgnoreCase(name, "transfer-encoding")) chunked = true;
  }
  size_t body = 0;
  if (chunked || length.empty()) {
    *error = 411;
    return 0;
  }
  if (!absl::SimpleAtoi(length, &body)) {
    *error = 400;
    return 0;
  }
  if (body > max_bytes || header_end + 4 + body > max_bytes) {
    *error = 413;
    return 0;
  }
  return in.size() >= header_end + 4 + body ? header_end + 4 + body : 0;
}

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

std::string HttpRequest::Header(const std::string& name) const {
  auto it = headers.find(name);
  return it == headers.end() ? "" : it->second;
}

void HttpServer::Get(const std::string& path, Handler handler) {
  routes_[path] = Route{[handler = std::move(handler)](const HttpRequest&) { return handler(); }, false};
}

void HttpServer::Handle(const std::string& path, RequestHandler handler, bool allow_post) {
  routes_[path] = Route{std::move(handler), allow_post};
}

void HttpServer::HandlePrefix(const std::string& prefix, RequestHandler handler) {
  prefixes_[prefix] = std::move(handler);
}

HttpResponse HttpServer::Respond(const std::string& raw, const std::string& peer, bool* head) const {
  *head = false;
  const size_t line_end = raw.find("\r\n");
  std::vector<std::string> parts = absl::StrSplit(raw.substr(0, line_end), ' ');
  if (parts.size() != 3 || (parts[2] != "HTTP/1.1" && parts[2] != "HTTP/1.0") || parts[1].empty() ||
      parts[1][0] != '/') {
    return Error(400, "bad request line");
  }
  if (parts[0] != "GET" && parts[0] != "HEAD" && parts[0] != "POST") return Error(405, "only GET, HEAD and POST");
  *head = parts[0] == "HEAD";
  HttpRequest request;
  request.method = parts[0];
  const size_t q = parts[1].find('?');
  request.path = parts[1].substr(0, q);
  if (q != std::string::npos) request.query = parts[1].substr(q + 1);
  request.peer = peer;
  const size_t header_end = raw.find("\r\n\r\n");
  for (absl::string_view line :
       absl::StrSplit(absl::string_view(raw).substr(line_end + 2, header_end - line_end - 2), "\r\n")) {
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos || colon == 0) continue;
    request.headers.emplace(absl::AsciiStrToLower(line.substr(0, colon)),
                            std::string(absl::StripAsciiWhitespace(line.substr(colon + 1))));
  }
  if (request.method == "POST") request.body = raw.substr(header_end + 4);
  const RequestHandler* handler = nullptr;
  if (auto it = routes_.find(request.path); it != routes_.end()) {
    if (request.method == "POST" && !it->second.allow_post) return Error(405, "only GET and HEAD");
    handler = &it->second.handler;
  } else {
    // The longest prefix of the path that has a handler.
    for (auto it = prefixes_.begin(); it != prefixes_.end(); ++it) {
      if (request.path.rfind(it->first, 0) == 0) handler = &it->second;
    }
    if (handler != nullptr && request.method == "POST") return Error(405, "only GET and HEAD");
  }
  if (handler == nullptr) return Error(404, "not found");
  return (*handler)(request);
}

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
  if (listen_fd_ < 0)
    return absl::UnavailableError(absl::StrCat("http: cannot listen on ", host, ":", port, ": ", error));
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
  const auto takes_post = [this](const std::string& path) {
    auto it = routes_.find(path);
    return it != routes_.end() && it->second.allow_post;
  };
  auto respond = [&](Connection& c, size_t end) {
    bool head = false;
    const HttpResponse response = Respond(c.in.substr(0, end), c.peer, &head);
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
        int error = 0;
        const size_t end = done ? 0 : RequestEnd(c.in, options_.max_request_bytes, takes_post, &error);
        if (!done && error != 0) {
          c.out = Serialize(Error(error, error == 411   ? "POST needs a Content-Length body (no chunked encoding)"
                                         : error == 400 ? "bad Content-Length"
                                                        : "request too large"),
                            false);
          c.writing = true;
        } else if (!done && end > 0) {
          respond(c, end);
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
        Connection c;
        c.fd = fd;
        c.peer = PeerAddress(addr);
        c.deadline = absl::Now() + options_.request_deadline;
        const auto from_peer =
            std::count_if(conns.begin(), conns.end(), [&](const Connection& o) { return o.peer == c.peer; });
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
