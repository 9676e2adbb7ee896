// HttpServer (the coordinator's metrics/health port) against well-formed,
// malformed and hostile clients: slow clients that trickle bytes, more
// connections than the limit, one peer opening many. Probes from another
// address must be answered throughout.
#include "server/http_server.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/http_client.h"

namespace tandem::server {
namespace {

using test_support::ConnectLoopback;
using test_support::HttpGet;
using test_support::RawExchange;

class HttpServerTest : public ::testing::Test {
 protected:
  void Start(HttpServerOptions options) {
    server_ = std::make_unique<HttpServer>(options);
    server_->Get("/readyz", [] { return HttpResponse{200, "text/plain", "ready\n"}; });
    server_->Get("/metrics", [] { return HttpResponse{200, "text/plain; version=0.0.4", "tandem_up 1\n"}; });
    ASSERT_TRUE(server_->Start("127.0.0.1", 0).ok());
  }
  void TearDown() override {
    for (int fd : open_) close(fd);
    server_.reset();
  }
  // Slow clients from `from`: each sends a partial request line.
  void OpenSlowClients(int n, const char* from) {
    for (int i = 0; i < n; ++i) {
      const int fd = ConnectLoopback(server_->port(), from);
      ASSERT_GE(fd, 0);
      ASSERT_EQ(send(fd, "GE", 2, MSG_NOSIGNAL), 2);
      open_.push_back(fd);
    }
  }
  void Trickle() {
    for (int fd : open_) (void)send(fd, "T", 1, MSG_NOSIGNAL);
  }
  // Connections the server has closed (a read returns 0 or an error).
  int ClosedByServer() {
    int closed = 0;
    for (int fd : open_) {
      char b;
      const ssize_t n = recv(fd, &b, 1, MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) ++closed;
    }
    return closed;
  }
  // Until at least n connections are closed by the server (5 s at most).
  void WaitClosedByServer(int n) {
    for (int i = 0; i < 500 && ClosedByServer() < n; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  std::unique_ptr<HttpServer> server_;
  std::vector<int> open_;
};

TEST_F(HttpServerTest, AnswersAndRefusesClearly) {
  Start({});
  auto r = HttpGet(server_->port(), "/readyz");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "ready\n");
  EXPECT_EQ(HttpGet(server_->port(), "/metrics?x=1").body, "tandem_up 1\n");
  EXPECT_EQ(HttpGet(server_->port(), "/nope").status, 404);
  const std::string head = RawExchange(server_->port(), "HEAD /readyz HTTP/1.1\r\n\r\n");
  EXPECT_EQ(head.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << head;
  EXPECT_NE(head.find("Content-Length: 6\r\n"), std::string::npos);
  EXPECT_EQ(head.find("ready"), std::string::npos);  // no body
  EXPECT_EQ(RawExchange(server_->port(), "POST /readyz HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 405", 0), 0u);
  EXPECT_EQ(RawExchange(server_->port(), "garbage\r\n\r\n").rfind("HTTP/1.1 400", 0), 0u);
  EXPECT_EQ(RawExchange(server_->port(), "GET readyz HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 400", 0), 0u);
  EXPECT_EQ(RawExchange(server_->port(), "GET /readyz HTTP/9.9\r\n\r\n").rfind("HTTP/1.1 400", 0), 0u);
  const std::string huge = "GET /readyz HTTP/1.1\r\nX: " + std::string(64 * 1024, 'a') + "\r\n\r\n";
  EXPECT_EQ(RawExchange(server_->port(), huge).rfind("HTTP/1.1 431", 0), 0u);
  EXPECT_EQ(HttpGet(server_->port(), "/readyz").status, 200);
}

// Routes that see the request: method, query, headers (lower-case names),
// peer and a POST body (with Content-Length); extra response headers;
// prefix routes, the longest prefix winning over shorter ones.
TEST_F(HttpServerTest, RequestsReachHandlersWithHeadersAndBodies) {
  server_ = std::make_unique<HttpServer>(HttpServerOptions{.max_request_bytes = 4096});
  server_->Handle(
      "/echo",
      [](const HttpRequest& r) {
        return HttpResponse{
            200,
            "text/plain",
            r.method + "|" + r.path + "|" + r.query + "|" + r.Header("x-thing") + "|" + r.peer + "|" + r.body,
            {{"Set-Cookie", "a=b; HttpOnly"}}};
      },
      /*allow_post=*/true);
  server_->HandlePrefix("/files/", [](const HttpRequest& r) {
    return HttpResponse{200, "text/plain", "files:" + r.path};
  });
  server_->HandlePrefix("/files/deep/", [](const HttpRequest& r) { return HttpResponse{200, "text/plain", "deep"}; });
  ASSERT_TRUE(server_->Start("127.0.0.1", 0).ok());
  const int port = server_->port();
  const std::string get = RawExchange(port, "GET /echo?a=1 HTTP/1.1\r\nX-Thing:  v1 \r\nx-thing: v2\r\n\r\n");
  EXPECT_NE(get.find("\r\nSet-Cookie: a=b; HttpOnly\r\n"), std::string::npos) << get;
  EXPECT_NE(get.find("\r\n\r\nGET|/echo|a=1|v1|127.0.0.1|"), std::string::npos) << get;
  const std::string post = RawExchange(port, "POST /echo HTTP/1.1\r\nContent-Length: 7\r\n\r\ntoken=x");
  EXPECT_NE(post.find("\r\n\r\nPOST|/echo|||127.0.0.1|token=x"), std::string::npos) << post;
  // A body that arrives in pieces is waited for.
  const int fd = test_support::ConnectLoopback(port);
  ASSERT_GE(fd, 0);
  const std::string part1 = "POST /echo HTTP/1.1\r\nContent-Length: 10\r\n\r\n01234";
  ASSERT_EQ(send(fd, part1.data(), part1.size(), MSG_NOSIGNAL), static_cast<ssize_t>(part1.size()));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the pause is what is tested
  ASSERT_EQ(send(fd, "56789", 5, MSG_NOSIGNAL), 5);
  std::string got;
  char buf[1024];
  for (int i = 0; i < 50; ++i) {
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  EXPECT_NE(got.find("POST|/echo|||127.0.0.1|0123456789"), std::string::npos) << got;
  EXPECT_EQ(RawExchange(port, "POST /echo HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 411", 0), 0u);
  EXPECT_EQ(RawExchange(port, "POST /echo HTTP/1.1\r\nContent-Length: 5000\r\n\r\nx").rfind("HTTP/1.1 413", 0), 0u);
  EXPECT_EQ(HttpGet(port, "/files/a/b").body, "files:/files/a/b");
  EXPECT_EQ(HttpGet(port, "/files/deep/x").body, "deep");
  EXPECT_EQ(HttpGet(port, "/files").status, 404);
  EXPECT_EQ(RawExchange(port, "POST /files/a HTTP/1.1\r\nContent-Length: 0\r\n\r\n").rfind("HTTP/1.1 405", 0), 0u);
}

// Slow clients hold slots, never the server: probes are answered at once,
// and every slow connection ends by the absolute deadline however it trickles.
TEST_F(HttpServerTest, SlowClientsCannotStarveProbes) {
  Start({.max_connections = 256, .max_connections_per_peer = 64, .request_deadline = absl::Seconds(2)});
  OpenSlowClients(60, "127.0.0.2");
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 10; ++i) {
    Trickle();
    const auto t0 = std::chrono::steady_clock::now();
    auto r = HttpGet(server_->port(), "/readyz", 1000);
    EXPECT_EQ(r.status, 200) << "probe " << i;
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(500)) << "probe " << i;
    std::this_thread::sleep_for(std::chrono::milliseconds(150));  // the clients' slowness is what is tested
  }
  // Trickling until well past the deadline: every one was closed.
  while (std::chrono::steady_clock::now() - start < std::chrono::milliseconds(3000)) {
    Trickle();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // as above
  }
  EXPECT_EQ(ClosedByServer(), 60);
}

// More connections than the limit: a new one evicts the oldest slow
// client, so probes still get in; one peer is capped on its own.
TEST_F(HttpServerTest, ConnectionLimitsEvictSlowClientsAndCapOnePeer) {
  Start({.max_connections = 16, .max_connections_per_peer = 12, .request_deadline = absl::Seconds(30)});
  OpenSlowClients(12, "127.0.0.2");
  OpenSlowClients(4, "127.0.0.3");
  OpenSlowClients(4, "127.0.0.2");  // over the per-peer cap: closed at once
  WaitClosedByServer(4);
  EXPECT_EQ(ClosedByServer(), 4);
  for (int i = 0; i < 5; ++i) {
    auto r = HttpGet(server_->port(), "/readyz", 1000);
    EXPECT_EQ(r.status, 200) << "probe " << i;
  }
  // The first probe found the server full and evicted the oldest slow
  // client; the later ones found the slot it left when it finished.
  WaitClosedByServer(4 + 1);
  EXPECT_EQ(ClosedByServer(), 4 + 1);
}

}  // namespace
}  // namespace tandem::server
