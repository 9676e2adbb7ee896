// A small HTTP/1.1 server for the coordinator's HTTP port (/metrics,
// /healthz, /readyz, the dashboard): GET and HEAD, POST with a
// Content-Length body where a route allows it, one response per
// connection. Built so that slow or hostile clients cannot keep the probes
// from being answered:
// - one poll() loop reads and writes every connection without blocking: a
//   client trickling bytes holds a connection slot, never a thread;
// - each connection has an absolute deadline (request_deadline from accept
//   to the last byte of the response), however it trickles;
// - at most max_connections are open; when full, a new connection evicts
//   the oldest one still sending its request (a slow client's), so probes
//   get in; at most max_connections_per_peer from one address;
// - requests over max_request_bytes get 431 (413 when the body is too
//   large), malformed ones 400.
// Handlers run on the loop thread: keep them fast. HttpServer owns the
// thread; Stop() (or the destructor) joins it. Thread-safe.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace tandem::server {

struct HttpRequest {
  std::string method;                          // GET, HEAD or POST
  std::string path;                            // without the query
  std::string query;                           // after '?', still percent-encoded
  std::string peer;                            // the client's address (127.0.0.1, ::1, ...)
  std::map<std::string, std::string> headers;  // lower-case names; first one wins
  std::string body;                            // POST only

  // The header's value, "" when absent (`name` in lower case).
  std::string Header(const std::string& name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers = {};  // extra ones (Set-Cookie, Location, ...)
};

struct HttpServerOptions {
  int max_connections = 256;
  int max_connections_per_peer = 32;
  absl::Duration request_deadline = absl::Seconds(5);
  size_t max_request_bytes = 16 * 1024;
};

class HttpServer {
 public:
  using Handler = std::function<HttpResponse()>;
  using RequestHandler = std::function<HttpResponse(const HttpRequest&)>;

  explicit HttpServer(HttpServerOptions options = {});
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Before Start: serves GET/HEAD `path` (exact match; the query is ignored).
  void Get(const std::string& path, Handler handler);
  // Before Start: serves GET/HEAD `path` (exact match), and POST too when
  // `allow_post`.
  void Handle(const std::string& path, RequestHandler handler, bool allow_post = false);
  // Before Start: serves GET/HEAD of every path under `prefix` (which ends
  // in '/') that has no exact route; the longest prefix wins.
  void HandlePrefix(const std::string& prefix, RequestHandler handler);
  // Binds host:port (port 0 = ephemeral; host may be an IPv6 literal) and
  // starts the loop thread.
  absl::Status Start(const std::string& host, int port);
  int port() const { return port_; }
  void Stop();

 private:
  void Loop();

  struct Route {
    RequestHandler handler;
    bool allow_post = false;
  };
  // The response to one complete request (`raw`: request line, headers, body).
  HttpResponse Respond(const std::string& raw, const std::string& peer, bool* head) const;

  const HttpServerOptions options_;
  std::map<std::string, Route> routes_;
  std::map<std::string, RequestHandler> prefixes_;
  int listen_fd_ = -1;
  int wake_pipe_[2] = {-1, -1};
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace tandem::server
