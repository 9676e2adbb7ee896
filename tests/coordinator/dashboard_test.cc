// The web dashboard (server/dashboard/): access rules (token, login
// session, peers), static files (no traversal), query checks, the phase
// timeline, and the JSON endpoints of a coordinator running a job with two
// in-process workers. The browser test is tests/integration/dashboard_browser_test.sh.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"
#include "server/clock.h"
#include "server/coordinator.h"
#include "server/dashboard/assets.h"
#include "server/dashboard/dashboard_access.h"
#include "server/dashboard/phase_timeline.h"
#include "server/dashboard/query_params.h"
#include "server/jobs/job_manager.h"
#include "tests/support/coordinator_harness.h"
#include "tests/support/fake_worker.h"
#include "tests/support/http_client.h"

namespace tandem::server {
namespace {

using nlohmann::json;

constexpr char kAdmin[] = "dashboard-admin-token";
constexpr char kJoin[] = "dashboard-join-token";

// ---- pure parts -----------------------------------------------------------

TEST(QueryParamsTest, ParsesAndRejectsWithTheParameterNamed) {
  auto q = QueryParams::Parse("id=job-1&after=5&x=a%20b+c", {"id", "after", "x"});
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->Get("id"), "job-1");
  EXPECT_EQ(q->Get("x"), "a b c");
  EXPECT_EQ(*q->GetInt("after", 0, 10, 0), 5);
  EXPECT_EQ(*q->GetInt("missing", 0, 10, 7), 7);
  auto range = q->GetInt("after", 6, 10, 0);
  ASSERT_FALSE(range.ok());
  EXPECT_EQ(range.status().message(), "after: must be an integer in [6, 10], got '5'");

  auto unknown = QueryParams::Parse("id=1&bogus=2", {"id"});
  ASSERT_FALSE(unknown.ok());
  EXPECT_TRUE(absl::StrContains(unknown.status().message(), "unknown query parameter 'bogus'"));
  auto twice = QueryParams::Parse("id=1&id=2", {"id"});
  ASSERT_FALSE(twice.ok());
  EXPECT_EQ(twice.status().message(), "id: given more than once");
  EXPECT_FALSE(QueryParams::Parse("id=%zz", {"id"}).ok());
  EXPECT_FALSE(QueryParams::Parse("id=%4", {"id"}).ok());
  // Empty pairs are skipped, but the count is bounded.
  EXPECT_TRUE(QueryParams::Parse("&id=1&", {"id"}).ok());
  std::string many;
  for (int i = 0; i < 40; ++i) absl::StrAppend(&many, "id=", i, "&");
  EXPECT_FALSE(QueryParams::Parse(many, {"id"}).ok());
  auto word = QueryParams::Parse("after=abc", {"after"});
  ASSERT_TRUE(word.ok());
  EXPECT_FALSE(word->GetInt("after", 0, 10, 0).ok());
}

TEST(DashboardAccessTest, LoopbackAddresses) {
  for (const char* a : {"127.0.0.1", "127.1.2.3", "::1", "::ffff:127.0.0.1"}) EXPECT_TRUE(IsLoopbackAddress(a)) << a;
  for (const char* a : {"10.0.0.5", "192.168.1.1", "::ffff:10.0.0.1", "fe80::1", "", "localhost", "128.0.0.1"}) {
    EXPECT_FALSE(IsLoopbackAddress(a)) << a;
  }
}

HttpRequest From(const std::string& peer, std::map<std::string, std::string> headers = {}) {
  HttpRequest r;
  r.method = "GET";
  r.path = "/dashboard/";
  r.peer = peer;
  r.headers = std::move(headers);
  return r;
}

TEST(DashboardAccessTest, TokenHeaderAndSessions) {
  ManualClock clock;
  DashboardAccess access(kAdmin, /*insecure=*/false, &clock, /*session_lifetime_ms=*/60000, /*max_sessions=*/2);
  using V = DashboardAccess::Verdict;
  EXPECT_EQ(access.Check(From("127.0.0.1")).verdict, V::kUnauthenticated);
  EXPECT_EQ(access.Check(From("127.0.0.1", {{"authorization", absl::StrCat("Bearer ", kAdmin)}})).verdict, V::kAllowed);
  EXPECT_EQ(access.Check(From("::1", {{"authorization", absl::StrCat("bearer  ", kAdmin)}})).verdict, V::kAllowed);
  EXPECT_EQ(access.Check(From("127.0.0.1", {{"authorization", "Bearer wrong"}})).verdict, V::kUnauthenticated);
  EXPECT_EQ(access.Check(From("127.0.0.1", {{"authorization", kAdmin}})).verdict, V::kUnauthenticated);
  EXPECT_EQ(access.Check(From("127.0.0.1", {{"authorization", absl::StrCat("Bearer ", kJoin)}})).verdict,
            V::kUnauthenticated);

  // Login: wrong token refused; the right one gives a session cookie.
  EXPECT_TRUE(absl::IsUnauthenticated(access.Login(From("127.0.0.1"), "wrong").status()));
  EXPECT_TRUE(absl::IsUnauthenticated(access.Login(From("127.0.0.1"), "").status()));
  auto s = access.Login(From("127.0.0.1"), kAdmin);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->size(), 64u);
  const std::string cookie = access.SessionCookie(*s);
  EXPECT_TRUE(absl::StrContains(cookie, "HttpOnly")) << cookie;
  EXPECT_TRUE(absl::StrContains(cookie, "SameSite=Strict")) << cookie;
  const auto with_cookie = From("127.0.0.1", {{"cookie", absl::StrCat("a=b; ", kSessionCookie, "=", *s)}});
  EXPECT_EQ(access.Check(with_cookie).verdict, V::kAllowed);
  EXPECT_EQ(
      access.Check(From("127.0.0.1", {{"cookie", absl::StrCat(kSessionCookie, "=", std::string(64, 'a'))}})).verdict,
      V::kUnauthenticated);
  // Sessions expire...
  clock.AdvanceMs(60001);
  EXPECT_EQ(access.Check(with_cookie).verdict, V::kUnauthenticated);
  // ...end at logout, and at most max_sessions live at once.
  auto a = access.Login(From("127.0.0.1"), kAdmin);
  auto b = access.Login(From("127.0.0.1"), kAdmin);
  clock.AdvanceMs(10);
  auto c = access.Login(From("127.0.0.1"), kAdmin);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  auto cookie_of = [](const std::string& id) {
    return From("127.0.0.1", {{"cookie", absl::StrCat(kSessionCookie, "=", id)}});
  };
  EXPECT_EQ(access.Check(cookie_of(*c)).verdict, V::kAllowed);
  EXPECT_EQ(static_cast<int>(access.Check(cookie_of(*a)).verdict == V::kAllowed) +
                static_cast<int>(access.Check(cookie_of(*b)).verdict == V::kAllowed),
            1);
  access.Logout(cookie_of(*c));
  EXPECT_EQ(access.Check(cookie_of(*c)).verdict, V::kUnauthenticated);
}

TEST(DashboardAccessTest, OtherMachinesNeedTokenAndInsecure) {
  ManualClock clock;
  using V = DashboardAccess::Verdict;
  const auto bearer = std::map<std::string, std::string>{{"authorization", absl::StrCat("Bearer ", kAdmin)}};
  DashboardAccess plain(kAdmin, /*insecure=*/false, &clock);
  const auto refused = plain.Check(From("10.1.2.3", bearer));
  EXPECT_EQ(refused.verdict, V::kForbidden);
  EXPECT_TRUE(absl::StrContains(refused.message, "--insecure")) << refused.message;
  EXPECT_TRUE(absl::IsPermissionDenied(plain.Login(From("10.1.2.3"), kAdmin).status()));

  DashboardAccess trusted(kAdmin, /*insecure=*/true, &clock);
  EXPECT_EQ(trusted.Check(From("10.1.2.3", bearer)).verdict, V::kAllowed);
  EXPECT_EQ(trusted.Check(From("10.1.2.3")).verdict, V::kUnauthenticated);

  // No admin token (auth.allow_unauthenticated): open to loopback only, even with --insecure.
  DashboardAccess open("", /*insecure=*/true, &clock);
  EXPECT_EQ(open.Check(From("127.0.0.1")).verdict, V::kAllowed);
  const auto no_token = open.Check(From("192.168.0.9", bearer));
  EXPECT_EQ(no_token.verdict, V::kForbidden);
  EXPECT_TRUE(absl::StrContains(no_token.message, "SSH tunnel")) << no_token.message;
}

TEST(PhaseTimelineTest, SpansOpenOnSendCloseOnReport) {
  ManualClock clock;
  PhaseTimeline t(&clock, /*spans_per_job=*/3, /*max_jobs=*/2);
  auto command = [](const std::string& job, const std::string& id, tandem::v1::Phase phase, int64_t step) {
    tandem::v1::WorkerCommand c;
    auto* p = c.mutable_phase();
    p->set_job_id(job);
    p->set_command_id(id);
    p->set_phase(phase);
    p->set_step(step);
    return c;
  };
  auto report = [](const std::string& job, const std::string& worker, const std::string& id, double secs, bool ok) {
    tandem::v1::ReportPhaseRequest r;
    r.set_job_id(job);
    r.set_worker_id(worker);
    r.set_command_id(id);
    r.set_seconds(secs);
    r.set_ok(ok);
    return r;
  };
  const double t0 = clock.WallSeconds();
  t.CommandSent("w1", command("j", "c1", tandem::v1::PHASE_ROLLOUT, 1));
  t.CommandSent("w2", command("j", "c1", tandem::v1::PHASE_ROLLOUT, 1));
  clock.AdvanceMs(2000);
  t.ReportReceived(report("j", "w1", "c1", 0.5, true));
  auto spans = t.Spans("j", 0);
  ASSERT_EQ(spans.size(), 2u);
  EXPECT_EQ(spans[0].worker_id, "w1");
  EXPECT_NEAR(spans[0].start, t0 + 1.5, 1e-6);  // received - reported seconds
  EXPECT_NEAR(spans[0].end, t0 + 2.0, 1e-6);
  EXPECT_EQ(spans[1].end, 0);  // w2 still running
  // A duplicate report changes nothing; the same command re-sent keeps its
  // span, whether it is still open or already reported.
  t.ReportReceived(report("j", "w1", "c1", 0.1, false));
  t.CommandSent("w2", command("j", "c1", tandem::v1::PHASE_ROLLOUT, 1));
  t.CommandSent("w1", command("j", "c1", tandem::v1::PHASE_ROLLOUT, 1));
  spans = t.Spans("j", 0);
  ASSERT_EQ(spans.size(), 2u);
  EXPECT_TRUE(spans[0].ok);
  // An abort (here to w2) ends every open span of the job as not ok: w1's
  // (a lost worker's, say) too.
  t.CommandSent("w1", command("j", "c5", tandem::v1::PHASE_UPDATE, 1));
  tandem::v1::WorkerCommand abort;
  abort.set_abort_job("j");
  clock.AdvanceMs(1000);
  t.CommandSent("w2", abort);
  spans = t.Spans("j", 0);
  ASSERT_EQ(spans.size(), 3u);
  for (int i : {1, 2}) {
    EXPECT_FALSE(spans[i].ok) << i;
    EXPECT_NEAR(spans[i].end, t0 + 3.0, 1e-6) << i;
  }
  // Pings and drains are not phases.
  tandem::v1::WorkerCommand ping;
  ping.set_ping(true);
  t.CommandSent("w1", ping);
  // A report with no sent command (coordinator restarted) still makes a span.
  t.ReportReceived(report("j", "w3", "c9", 1.0, true));
  spans = t.Spans("j", 0);
  ASSERT_EQ(spans.size(), 3u);
  EXPECT_EQ(spans[2].worker_id, "w3");
  // Bounded: the oldest span goes, and the least recently active job.
  t.CommandSent("w1", command("j", "c2", tandem::v1::PHASE_UPDATE, 1));
  EXPECT_EQ(t.Spans("j", 0).size(), 3u);
  EXPECT_EQ(t.Spans("j", 0).front().command_id, "c5");
  EXPECT_EQ(t.Spans("j", t0 + 3.5).size(), 1u);  // those that ended before `since` are left out; open ones stay
  t.CommandSent("w1", command("k", "c1", tandem::v1::PHASE_UPDATE, 1));
  t.CommandSent("w1", command("l", "c1", tandem::v1::PHASE_UPDATE, 1));
  EXPECT_TRUE(t.Spans("j", 0).empty());
  EXPECT_EQ(t.Spans("l", 0).size(), 1u);
  t.MemoryReported("w1", 12345);
  EXPECT_EQ(t.MemoryInUse("w1").value_or(-1), 12345);
  EXPECT_FALSE(t.MemoryInUse("w9").has_value());
}

TEST(DashboardAssetsTest, EmbeddedFiles) {
  for (const char* name : {"index.html", "login.html", "dashboard.js", "dashboard.css"}) {
    const EmbeddedAsset* a = FindAsset(name);
    ASSERT_NE(a, nullptr) << name;
    EXPECT_GT(a->data.size(), 100u) << name;
  }
  EXPECT_EQ(FindAsset("../index.html"), nullptr);
  EXPECT_EQ(AssetContentType("dashboard.js"), "text/javascript; charset=utf-8");
  // No CDN: every script and stylesheet comes from the coordinator.
  for (const auto& a : EmbeddedAssets()) {
    const std::string data(a.data);
    EXPECT_FALSE(absl::StrContains(absl::StrReplaceAll(data, {{"http://www.w3.org/2000/svg", ""}}), "http://"))
        << a.name;
    EXPECT_FALSE(absl::StrContains(data, "https://")) << a.name;
  }
}

// ---- over HTTP, with a coordinator and two in-process workers --------------

struct Reply {
  int status = -1;
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;
  json Json() const { return json::parse(body, nullptr, /*allow_exceptions=*/false); }
};

Reply Exchange(int port, const std::string& request) {
  const std::string raw = test_support::RawExchange(port, request, 5000);
  Reply r;
  if (raw.rfind("HTTP/1.1 ", 0) != 0 || raw.size() < 12) return r;
  r.status = std::stoi(raw.substr(9, 3));
  const size_t end = raw.find("\r\n\r\n");
  if (end == std::string::npos) return r;
  for (absl::string_view line : absl::StrSplit(absl::string_view(raw).substr(0, end), "\r\n")) {
    const size_t colon = line.find(':');
    if (colon != absl::string_view::npos) {
      r.headers[absl::AsciiStrToLower(line.substr(0, colon))] =
          std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
    }
  }
  r.body = raw.substr(end + 4);
  return r;
}

// A non-loopback IPv4 address of this machine ("" when it has none).
std::string NonLoopbackAddress() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "";
  std::string found;
  for (ifaddrs* a = list; a != nullptr && found.empty(); a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    char buf[INET_ADDRSTRLEN] = {0};
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, buf, sizeof buf);
    if (!IsLoopbackAddress(buf)) found = buf;
  }
  freeifaddrs(list);
  return found;
}

// One request to address:port from that same address (so the server sees
// a non-loopback peer); the response, "" on error or after 5 s.
std::string ExchangeWith(const std::string& address, int port, const std::string& request) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in dst{};
  dst.sin_family = AF_INET;
  dst.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, address.c_str(), &dst.sin_addr);
  std::string out;
  if (fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&dst), sizeof dst) == 0 &&
      send(fd, request.data(), request.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(request.size())) {
    for (int i = 0; i < 50; ++i) {  // 50 x 100 ms
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, 100) <= 0) continue;
      char buf[4096];
      const ssize_t n = recv(fd, buf, sizeof buf, 0);
      if (n <= 0) break;
      out.append(buf, static_cast<size_t>(n));
    }
  }
  if (fd >= 0) close(fd);
  return out;
}

class DashboardHttpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test_support::FreshTestDir("tandem_dashboard");
    config_ = test_support::TestCoordinatorConfig(dir_, kAdmin, kJoin);
    config_.set_metrics_listen("127.0.0.1:0");
    config_.set_heartbeat_ms(100);
    coordinator_ = std::make_unique<Coordinator>(config_);
    ASSERT_TRUE(coordinator_->Start().ok());
    port_ = coordinator_->metrics_port();
  }
  void TearDown() override {
    workers_.clear();
    coordinator_.reset();
    std::filesystem::remove_all(dir_);
  }
  Reply Get(const std::string& path, const std::string& headers = "") {
    return Exchange(port_, absl::StrCat("GET ", path, " HTTP/1.1\r\nHost: t\r\n", headers, "\r\n"));
  }
  Reply GetAdmin(const std::string& path) { return Get(path, absl::StrCat("Authorization: Bearer ", kAdmin, "\r\n")); }
  Reply Post(const std::string& path, const std::string& body, const std::string& headers = "") {
    return Exchange(port_, absl::StrCat("POST ", path, " HTTP/1.1\r\nHost: t\r\nContent-Length: ", body.size(), "\r\n",
                                        headers, "\r\n", body));
  }

  std::string dir_;
  tandem::v1::CoordinatorConfig config_;
  std::unique_ptr<Coordinator> coordinator_;
  std::vector<std::unique_ptr<test_support::FakeWorker>> workers_;
  int port_ = 0;
};

TEST_F(DashboardHttpTest, NoTokenGetsTheLoginPageAndJsonRefuses) {
  Reply page = Get("/dashboard/");
  EXPECT_EQ(page.status, 401);
  EXPECT_TRUE(absl::StrContains(page.body, "<form method=\"post\" action=\"/dashboard/login\"")) << page.body;
  EXPECT_TRUE(absl::StrContains(page.headers["content-security-policy"], "script-src 'self'"));
  EXPECT_EQ(Get("/dashboard").status, 302);
  for (const char* api :
       {"/dashboard/api/cluster", "/dashboard/api/jobs", "/dashboard/api/job?id=x", "/dashboard/api/events?id=x"}) {
    Reply r = Get(api);
    EXPECT_EQ(r.status, 401) << api;
    EXPECT_EQ(r.headers["content-type"], "application/json") << api;
    EXPECT_TRUE(r.Json().contains("error")) << api << ": " << r.body;
    EXPECT_EQ(Get(api, "Authorization: Bearer wrong-token\r\n").status, 401) << api;
    EXPECT_EQ(Get(api, absl::StrCat("Authorization: Bearer ", kJoin, "\r\n")).status, 401) << api;
    EXPECT_EQ(Get(api, absl::StrCat("Cookie: ", kSessionCookie, "=forged\r\n")).status, 401) << api;
  }
  // The probes and metrics stay open.
  EXPECT_EQ(Get("/healthz").status, 200);
  EXPECT_EQ(Get("/metrics").status, 200);
}

// Over a real non-loopback connection: refused whatever it presents,
// unless the coordinator runs with --insecure; the probes stay open.
TEST(DashboardPeerTest, OtherMachinesAreRefusedWithoutInsecure) {
  const std::string address = NonLoopbackAddress();
  ASSERT_FALSE(address.empty()) << "this test needs a non-loopback IPv4 address on some interface of the machine";
  for (bool insecure : {false, true}) {
    const std::string dir =
        test_support::FreshTestDir(insecure ? "tandem_dashboard_insecure" : "tandem_dashboard_peer");
    auto config = test_support::TestCoordinatorConfig(dir, kAdmin, kJoin);
    config.set_metrics_listen("0.0.0.0:0");
    config.set_insecure(insecure);
    Coordinator coordinator(config);
    ASSERT_TRUE(coordinator.Start().ok());
    const int port = coordinator.metrics_port();
    const std::string bearer = absl::StrCat("Authorization: Bearer ", kAdmin, "\r\n");
    const std::string api = ExchangeWith(address, port, "GET /dashboard/api/jobs HTTP/1.1\r\n" + bearer + "\r\n");
    const std::string page = ExchangeWith(address, port, "GET /dashboard/ HTTP/1.1\r\n" + bearer + "\r\n");
    const std::string login = ExchangeWith(address, port, "GET /dashboard/login HTTP/1.1\r\n\r\n");
    if (insecure) {
      EXPECT_EQ(api.rfind("HTTP/1.1 200", 0), 0u) << api.substr(0, 200);
      EXPECT_EQ(page.rfind("HTTP/1.1 200", 0), 0u) << page.substr(0, 200);
      EXPECT_EQ(login.rfind("HTTP/1.1 200", 0), 0u) << login.substr(0, 200);
    } else {
      EXPECT_EQ(api.rfind("HTTP/1.1 403", 0), 0u) << api.substr(0, 200);
      EXPECT_TRUE(absl::StrContains(api, "--insecure")) << api;
      EXPECT_EQ(page.rfind("HTTP/1.1 403", 0), 0u) << page.substr(0, 200);
      EXPECT_EQ(login.rfind("HTTP/1.1 403", 0), 0u) << login.substr(0, 200);
      // The same from loopback is served.
      EXPECT_EQ(Exchange(port, "GET /dashboard/api/jobs HTTP/1.1\r\n" + bearer + "\r\n").status, 200);
    }
    EXPECT_EQ(ExchangeWith(address, port, "GET /healthz HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 200", 0), 0u);
    coordinator.Shutdown();
    std::filesystem::remove_all(dir);
  }
}

TEST_F(DashboardHttpTest, LoginFormSetsAnHttpOnlyCookie) {
  EXPECT_EQ(Get("/dashboard/login").status, 200);
  const std::string form = "Content-Type: application/x-www-form-urlencoded\r\n";
  Reply wrong = Post("/dashboard/login", "token=nope", form);
  EXPECT_EQ(wrong.status, 401);
  EXPECT_TRUE(absl::StrContains(wrong.body, "wrong token")) << wrong.body;
  EXPECT_EQ(wrong.headers.count("set-cookie"), 0u);
  EXPECT_EQ(Post("/dashboard/login", absl::StrCat("token=", kAdmin), "Content-Type: text/plain\r\n").status, 415);
  EXPECT_EQ(Post("/dashboard/login", "token=a&token=b", form).status, 400);
  Reply ok = Post("/dashboard/login", absl::StrCat("token=", kAdmin), form);
  ASSERT_EQ(ok.status, 303) << ok.body;
  EXPECT_EQ(ok.headers["location"], "/dashboard/");
  const std::string set = ok.headers["set-cookie"];
  EXPECT_TRUE(absl::StrContains(set, "HttpOnly")) << set;
  EXPECT_TRUE(absl::StrContains(set, "SameSite=Strict")) << set;
  const std::string cookie = set.substr(0, set.find(';'));
  EXPECT_FALSE(absl::StrContains(cookie, kAdmin));  // a session id, not the token
  Reply page = Get("/dashboard/", "Cookie: " + cookie + "\r\n");
  EXPECT_EQ(page.status, 200);
  EXPECT_TRUE(absl::StrContains(page.body, "/dashboard/static/dashboard.js"));
  EXPECT_EQ(Get("/dashboard/api/jobs", "Cookie: " + cookie + "\r\n").status, 200);
  // Logging out ends the session.
  EXPECT_EQ(Get("/dashboard/logout").status, 405);
  Reply out = Post("/dashboard/logout", "", "Cookie: " + cookie + "\r\n");
  EXPECT_EQ(out.status, 303);
  EXPECT_TRUE(absl::StrContains(out.headers["set-cookie"], "Max-Age=0"));
  EXPECT_EQ(Get("/dashboard/api/jobs", "Cookie: " + cookie + "\r\n").status, 401);
}

TEST_F(DashboardHttpTest, StaticFilesByExactNameOnly) {
  Reply js = Get("/dashboard/static/dashboard.js");
  EXPECT_EQ(js.status, 200);
  EXPECT_EQ(js.headers["content-type"], "text/javascript; charset=utf-8");
  EXPECT_EQ(js.body, std::string(FindAsset("dashboard.js")->data));
  EXPECT_EQ(Get("/dashboard/static/dashboard.css").status, 200);
  for (const char* path :
       {"/dashboard/static/../../../../etc/passwd", "/dashboard/static/..%2f..%2fetc%2fpasswd",
        "/dashboard/static/%2e%2e/%2e%2e/etc/passwd", "/dashboard/static/", "/dashboard/static/./dashboard.js",
        "/dashboard/static//dashboard.js", "/dashboard/static/dashboard.js/", "/dashboard/static/index.html",
        "/dashboard/static/login.html", "/dashboard/../metrics", "/dashboard/static/DASHBOARD.JS",
        "/dashboard/static/dashboard.js%00.png", "/dashboard/nothing"}) {
    Reply r = Get(path);
    EXPECT_EQ(r.status, 404) << path << ": " << r.body.substr(0, 80);
    EXPECT_FALSE(absl::StrContains(r.body, "root:")) << path;
  }
  EXPECT_EQ(Post("/dashboard/static/dashboard.js", "").status, 405);
}

TEST_F(DashboardHttpTest, BadQueryParametersGetClearErrors) {
  struct Case {
    const char* path;
    int status;
    const char* error;
  };
  for (const Case& c : std::vector<Case>{
           {"/dashboard/api/job", 400, "id: required"},
           {"/dashboard/api/job?id=", 400, "id: required"},
           {"/dashboard/api/job?id=a%20b", 400, "id: invalid character"},
           {"/dashboard/api/job?id=nosuchjob", 404, "no job 'nosuchjob'"},
           {"/dashboard/api/job?id=x&window=0", 400, "window: must be an integer in [1, 604800], got '0'"},
           {"/dashboard/api/job?id=x&window=soon", 400, "window: must be an integer"},
           {"/dashboard/api/job?id=x&colour=red", 400, "unknown query parameter 'colour' (allowed: id, window)"},
           {"/dashboard/api/events?id=x&after=-1", 400, "after: must be an integer in [0, "},
           {"/dashboard/api/events?id=x&id=y", 400, "id: given more than once"},
           {"/dashboard/api/events?id=%zz", 400, "bad percent-encoding"},
           {"/dashboard/api/jobs?limit=0", 400, "limit: must be an integer in [1, 500]"},
           {"/dashboard/api/jobs?limit=99999999999999999999", 400, "limit: must be an integer"},
           {"/dashboard/api/cluster?x=1", 400, "unknown query parameter 'x'"},
       }) {
    Reply r = GetAdmin(c.path);
    EXPECT_EQ(r.status, c.status) << c.path << ": " << r.body;
    const json j = r.Json();
    ASSERT_TRUE(j.is_object() && j.contains("error")) << c.path << ": " << r.body;
    EXPECT_TRUE(absl::StrContains(j["error"].get<std::string>(), c.error)) << c.path << ": " << r.body;
  }
}

TEST_F(DashboardHttpTest, HttpServerRejectsBadPosts) {
  // No length, chunked, too large: refused before any handler runs.
  EXPECT_EQ(Exchange(port_, "POST /dashboard/login HTTP/1.1\r\nHost: t\r\n\r\n").status, 411);
  EXPECT_EQ(Exchange(port_, "POST /dashboard/login HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n").status,
            411);
  EXPECT_EQ(Exchange(port_, "POST /dashboard/login HTTP/1.1\r\nContent-Length: 99999999\r\n\r\nx").status, 413);
  EXPECT_EQ(Exchange(port_, "POST /dashboard/login HTTP/1.1\r\nContent-Length: -1\r\n\r\n").status, 400);
  EXPECT_EQ(Exchange(port_, "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n").status, 405);
  EXPECT_EQ(Exchange(port_, "DELETE /dashboard/ HTTP/1.1\r\n\r\n").status, 405);
}

TEST_F(DashboardHttpTest, JsonEndpointsShowARunningJob) {
  for (const char* name : {"alpha", "beta"}) {
    workers_.push_back(std::make_unique<test_support::FakeWorker>(test_support::FakeWorker::Options{
        .name = name, .address = [this] { return coordinator_->grpc_address(); }, .token = kJoin}));
  }
  auto channel = grpc::CreateChannel(coordinator_->grpc_address(), grpc::InsecureChannelCredentials());
  auto control = tandem::v1::Control::NewStub(channel);
  tandem::v1::JobSpec spec;
  spec.set_name("dash");
  spec.set_kind(tandem::v1::JOB_KIND_SFT);
  spec.mutable_model()->set_from("/models/none");
  spec.mutable_cluster()->set_workers(2);
  spec.mutable_train()->set_steps(3);
  spec.mutable_train()->set_global_batch(8);
  spec.mutable_train()->set_micro_batch(4);
  const std::string id = test_support::SubmitJob(control.get(), kAdmin, spec);
  ASSERT_FALSE(id.empty());
  const auto job = test_support::WaitForJob(
      control.get(), kAdmin, id, [](const tandem::v1::Job& j) { return IsTerminal(j.state()); }, 20000, 50);
  ASSERT_EQ(job.state(), tandem::v1::JOB_STATE_SUCCEEDED) << job.reason();

  const json cluster = GetAdmin("/dashboard/api/cluster").Json();
  ASSERT_TRUE(cluster.contains("workers")) << cluster.dump();
  ASSERT_EQ(cluster["workers"].size(), 2u);
  for (const auto& w : cluster["workers"]) {
    EXPECT_EQ(w["device"], "cpu");
    EXPECT_TRUE(w["state"] == "idle" || w["state"] == "busy") << w.dump();
  }
  EXPECT_EQ(cluster["jobs_by_state"]["succeeded"], 1);

  const json jobs = GetAdmin("/dashboard/api/jobs").Json();
  ASSERT_EQ(jobs["jobs"].size(), 1u);
  EXPECT_EQ(jobs["jobs"][0]["id"], id);
  EXPECT_EQ(jobs["jobs"][0]["state"], "succeeded");
  EXPECT_EQ(jobs["jobs"][0]["step"], 3);

  const json detail = GetAdmin("/dashboard/api/job?id=" + id + "&window=3600").Json();
  ASSERT_TRUE(detail.contains("job")) << detail.dump();
  const json& j = detail["job"];
  ASSERT_EQ(j["members"].size(), 2u);
  // Every member ran setup and the three SFT steps, in spans that ended.
  for (const auto& m : j["members"]) {
    int sft = 0, setup = 0;
    for (const auto& s : j["spans"]) {
      if (s["worker"] != m["id"]) continue;
      ASSERT_FALSE(s["end"].is_null()) << s.dump();
      EXPECT_LE(s["start"].get<double>(), s["end"].get<double>());
      sft += s["phase"] == "sft_step";
      setup += s["phase"] == "setup";
    }
    EXPECT_EQ(sft, 3) << m.dump();
    EXPECT_EQ(setup, 1) << m.dump();
  }

  const json events = GetAdmin("/dashboard/api/events?id=" + id).Json();
  int steps = 0;
  for (const auto& e : events["events"]) {
    if (e["kind"] == "step") {
      ++steps;
      EXPECT_TRUE(e["metrics"].contains("loss"));
    }
  }
  EXPECT_EQ(steps, 3);
  EXPECT_TRUE(events["finished"].get<bool>());
  const int64_t next = events["next"];
  const json after = GetAdmin("/dashboard/api/events?id=" + id + "&after=" + std::to_string(next)).Json();
  EXPECT_TRUE(after["events"].empty());
}

}  // namespace
}  // namespace tandem::server
