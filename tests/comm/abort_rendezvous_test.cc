// Abortable rendezvous: AbortSignal, AbortableStore, and
// MakeCollective("gloo") cut short by CollectiveOptions::abort from another
// thread - when a peer never shows up, and when a peer published its address
// and then stopped (as a process killed in its SETUP does). Every abort must
// end the rendezvous within 1 s, far below the 30 s timeouts used here.
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "absl/strings/match.h"
#include "tests/comm/comm_test_util.h"

namespace tandem::comm {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

double Seconds(Clock::time_point since) { return std::chrono::duration<double>(Clock::now() - since).count(); }

// Fires `signal` after `delay` on its own thread; records when.
class DelayedAbort {
 public:
  DelayedAbort(std::shared_ptr<AbortSignal> signal, milliseconds delay)
      : thread_([this, signal, delay] {
          std::this_thread::sleep_for(delay);
          fired_at_ = Clock::now();
          signal->Abort();
        }) {}
  ~DelayedAbort() { Join(); }
  void Join() {
    if (thread_.joinable()) thread_.join();
  }
  // Seconds from the abort to now.
  double SinceAbort() {
    Join();
    return Seconds(fired_at_);
  }

 private:
  Clock::time_point fired_at_;
  std::thread thread_;
};

TEST(AbortSignalTest, CallbacksRunOnceAndNotAfterUnregistering) {
  auto signal = std::make_shared<AbortSignal>();
  int a = 0, b = 0;
  auto ra = AbortSignal::Register(signal, [&] { ++a; });
  auto rb = AbortSignal::Register(signal, [&] { ++b; });
  rb.Reset();
  EXPECT_FALSE(signal->aborted());
  signal->Abort();
  signal->Abort();
  EXPECT_TRUE(signal->aborted());
  EXPECT_EQ(a, 1);
  EXPECT_EQ(b, 0);
  int c = 0;
  auto rc = AbortSignal::Register(signal, [&] { ++c; });  // already aborted: runs now
  EXPECT_EQ(c, 1);
  auto none = AbortSignal::Register(nullptr, [&] { ++c; });
  EXPECT_EQ(c, 1);
}

TEST(AbortableStoreTest, AbortEndsAWaitAndTimeoutsStillApply) {
  InMemoryStore base;
  auto signal = std::make_shared<AbortSignal>();
  AbortableStore store(&base, signal, milliseconds(50));
  // Timeout without abort: DeadlineExceeded, in about the timeout.
  auto t0 = Clock::now();
  absl::Status st = store.Wait({"never"}, milliseconds(300));
  EXPECT_TRUE(absl::IsDeadlineExceeded(st)) << st;
  EXPECT_GE(Seconds(t0), 0.25);
  EXPECT_LT(Seconds(t0), 3.0);
  // Present keys pass through.
  ASSERT_TRUE(store.Set("k", "v").ok());
  auto v = store.Get("k", milliseconds(1000));
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, "v");
  // Abort from another thread ends a long wait at once.
  DelayedAbort abort(signal, milliseconds(200));
  auto got = store.Get("never", milliseconds(30000));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kAborted) << got.status();
  EXPECT_LT(abort.SinceAbort(), 1.0);
  // Every later call fails fast.
  EXPECT_EQ(store.Set("x", "1").code(), absl::StatusCode::kAborted);
}

TEST(AbortRendezvousTest, PeerNeverShowsUp) {
  InMemoryStore store;
  CollectiveOptions o = testing::TestOptions(milliseconds(30000));
  o.abort = std::make_shared<AbortSignal>();
  DelayedAbort abort(o.abort, milliseconds(300));
  auto c = MakeCollective("gloo", store, 0, 2, o);
  const double since_abort = abort.SinceAbort();
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kAborted) << c.status();
  EXPECT_TRUE(absl::StartsWith(c.status().message(), "gloo: rendezvous aborted")) << c.status();
  EXPECT_LT(since_abort, 1.0);
}

// A store through which a rank publishes its address and then hangs: every
// Get/Wait after the Set of a key ending in `freeze_after` blocks until
// Release() (then fails), like a process stopped right after publishing.
class FreezingStore final : public Store {
 public:
  FreezingStore(Store* base, std::string freeze_after) : base_(base), freeze_after_(std::move(freeze_after)) {}
  absl::Status Set(std::string_view key, std::string_view value) override {
    absl::Status st = base_->Set(key, value);
    if (key.ends_with(freeze_after_)) frozen_ = true;
    return st;
  }
  absl::StatusOr<std::string> Get(std::string_view key, milliseconds timeout) override {
    if (frozen_) return Hang();
    return base_->Get(key, timeout);
  }
  absl::StatusOr<int64_t> Add(std::string_view key, int64_t delta) override { return base_->Add(key, delta); }
  absl::Status Wait(const std::vector<std::string>& keys, milliseconds timeout) override {
    if (frozen_) return Hang();
    return base_->Wait(keys, timeout);
  }
  absl::StatusOr<bool> Delete(std::string_view key) override { return base_->Delete(key); }
  bool frozen() const { return frozen_; }
  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
    cv_.notify_all();
  }

 private:
  absl::Status Hang() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(60), [&] { return released_; });
    return absl::UnavailableError("frozen peer released");
  }
  Store* const base_;
  const std::string freeze_after_;
  std::atomic<bool> frozen_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  bool released_ = false;
};

TEST(AbortRendezvousTest, PeerStopsAfterPublishingItsAddress) {
  // Several rounds: which side of the pair listens depends on the ports.
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    InMemoryStore store;
    FreezingStore frozen_peer(&store, "/gloo/1");
    std::thread peer([&] {
      auto c = MakeCollective("gloo", frozen_peer, 1, 2, testing::TestOptions(milliseconds(30000)));
      EXPECT_FALSE(c.ok());
    });
    CollectiveOptions o = testing::TestOptions(milliseconds(30000));
    o.connect_timeout = milliseconds(30000);  // the abort, not a timeout, must end it
    o.abort = std::make_shared<AbortSignal>();
    Clock::time_point fired_at;
    std::thread aborter([&] {
      // Once the peer has published its address, give rank 0 time to block
      // in the connect (or in the barrier after it), then abort.
      const auto until = Clock::now() + std::chrono::seconds(20);
      while (!frozen_peer.frozen() && Clock::now() < until) std::this_thread::sleep_for(milliseconds(5));
      std::this_thread::sleep_for(milliseconds(400));
      fired_at = Clock::now();
      o.abort->Abort();
    });
    const auto t0 = Clock::now();
    auto c = MakeCollective("gloo", store, 0, 2, o);
    aborter.join();
    const double since_abort = Seconds(fired_at);
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), absl::StatusCode::kAborted) << c.status();
    EXPECT_LT(since_abort, 1.0) << "rendezvous took " << Seconds(t0) << " s: " << c.status();
    frozen_peer.Release();
    peer.join();
  }
}

TEST(AbortRendezvousTest, ConnectTimeoutBoundsAPeerStoppedAfterPublishing) {
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    InMemoryStore store;
    FreezingStore frozen_peer(&store, "/gloo/1");
    std::thread peer([&] {
      auto c = MakeCollective("gloo", frozen_peer, 1, 2, testing::TestOptions(milliseconds(30000)));
      EXPECT_FALSE(c.ok());
    });
    CollectiveOptions o = testing::TestOptions(milliseconds(30000));
    o.connect_timeout = milliseconds(1000);
    const auto t0 = Clock::now();
    auto c = MakeCollective("gloo", store, 0, 2, o);
    const double took = Seconds(t0);
    frozen_peer.Release();
    peer.join();
    ASSERT_FALSE(c.ok());
    EXPECT_NE(c.status().code(), absl::StatusCode::kAborted) << c.status();
    EXPECT_LT(took, 5.0) << c.status();
  }
}

TEST(AbortRendezvousTest, SignalAbortsTheCommunicatorItMade) {
  InMemoryStore store;
  auto signal = std::make_shared<AbortSignal>();
  std::unique_ptr<Collective> c[2];
  std::thread t([&] {
    auto c1 = MakeCollective("gloo", store, 1, 2, testing::TestOptions());
    ASSERT_TRUE(c1.ok()) << c1.status();
    c[1] = std::move(*c1);
  });
  CollectiveOptions o = testing::TestOptions();
  o.abort = signal;
  auto c0 = MakeCollective("gloo", store, 0, 2, o);
  t.join();
  ASSERT_TRUE(c0.ok()) << c0.status();
  c[0] = std::move(*c0);
  ASSERT_TRUE(c[1]);
  DelayedAbort abort(signal, milliseconds(200));
  std::vector<float> buf(10);
  absl::Status st = c[0]->recv(buf.data(), 40, 1, 0, milliseconds(30000));
  EXPECT_EQ(st.code(), absl::StatusCode::kAborted) << st;
  EXPECT_LT(abort.SinceAbort(), 1.0);
}

}  // namespace
}  // namespace tandem::comm
