// State store, scheduler, membership and kv store unit tests.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "absl/time/time.h"
#include "server/clock.h"
#include "server/membership/membership.h"
#include "server/scheduler/scheduler.h"
#include "server/store/kv_store.h"
#include "server/store/state_store.h"

namespace tandem::server {
namespace {

std::string FreshDir(const std::string& name) {
  std::string dir = ::testing::TempDir() + "/tandem_" + name + "_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  return dir;
}

TEST(StateStoreTest, RoundTripAndReopen) {
  const std::string dir = FreshDir("store");
  {
    auto store = StateStore::Open(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    auto seq = (*store)->NextJobSeq();
    ASSERT_TRUE(seq.ok());
    EXPECT_EQ(*seq, 1);
    tandem::v1::Job job;
    job.set_id("j-000001");
    job.set_state(tandem::v1::JOB_STATE_RUNNING);
    job.mutable_spec()->set_name("x");
    ASSERT_TRUE((*store)->PutJob(job, {7, 2}, *seq).ok());
    tandem::v1::JobEvent e;
    e.set_job_id("j-000001");
    e.set_kind("state");
    EXPECT_EQ(*(*store)->AppendEvent(e), 1);
    EXPECT_EQ(*(*store)->AppendEvent(e), 2);
    tandem::v1::LogLine l;
    l.set_text("hello");
    EXPECT_EQ(*(*store)->AppendLogs("j-000001", {l, l, l}), 3);
    tandem::v1::WorkerInfo w;
    w.set_id("w-1");
    w.set_name("a");
    ASSERT_TRUE((*store)->PutWorker(w).ok());
    tandem::v1::CheckpointRecord c;
    c.set_job_id("j-000001");
    c.set_step(20);
    c.set_path("/ck/20");
    ASSERT_TRUE((*store)->AddCheckpoint(c).ok());
  }
  auto store = StateStore::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  auto jobs = (*store)->LoadJobs();
  ASSERT_TRUE(jobs.ok());
  ASSERT_EQ(jobs->size(), 1u);
  EXPECT_EQ((*jobs)[0].job.spec().name(), "x");
  EXPECT_EQ((*jobs)[0].driver.cursor_unit(), 7);
  EXPECT_EQ((*jobs)[0].driver.cursor_sub(), 2);
  EXPECT_EQ(*(*store)->NextJobSeq(), 2);
  EXPECT_EQ((*(*store)->ListEvents("j-000001", 1, 10)).size(), 1u);
  EXPECT_EQ((*(*store)->ListLogs("j-000001", 0, 2)).size(), 2u);
  EXPECT_EQ((*(*store)->LoadWorkers())[0].info.name(), "a");
  EXPECT_EQ((*(*store)->ListCheckpoints("j-000001"))[0].path(), "/ck/20");
  EXPECT_EQ(*(*store)->CountLogs("j-000001"), 3);
  EXPECT_TRUE(*(*store)->HasCheckpoint((*(*store)->ListCheckpoints("j-000001"))[0]));
  // Retention deletes a job with everything recorded about it.
  ASSERT_TRUE((*store)->DeleteJob("j-000001").ok());
  EXPECT_TRUE((*store)->LoadJobs()->empty());
  EXPECT_TRUE((*(*store)->ListEvents("j-000001", 0, 10)).empty());
  EXPECT_EQ(*(*store)->CountLogs("j-000001"), 0);
  EXPECT_TRUE((*(*store)->ListCheckpoints("j-000001")).empty());
  ASSERT_TRUE((*store)->DeleteWorker("w-1").ok());
  EXPECT_TRUE((*store)->LoadWorkers()->empty());
  std::filesystem::remove_all(dir);
}

TEST(StateStoreTest, PruneEventsKeepsTheNewestAndTheirNumbers) {
  const std::string dir = FreshDir("events");
  auto store = StateStore::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  tandem::v1::JobEvent e;
  e.set_job_id("j-000001");
  e.set_kind("step");
  for (int i = 1; i <= 5; ++i) ASSERT_EQ(*(*store)->AppendEvent(e), i);
  ASSERT_TRUE((*store)->PruneEvents("j-000001", 3).ok());
  auto left = (*store)->ListEvents("j-000001", 0, 10);
  ASSERT_TRUE(left.ok());
  ASSERT_EQ(left->size(), 2u);
  EXPECT_EQ((*left)[0].seq, 4);
  EXPECT_EQ(*(*store)->AppendEvent(e), 6);  // numbering continues
  EXPECT_EQ(*(*store)->LastEventSeq("j-000001"), 6);
  std::filesystem::remove_all(dir);
}

TEST(StateStoreTest, BadDirIsAStatus) {
  auto store = StateStore::Open("/proc/forbidden/state");
  EXPECT_FALSE(store.ok());
}

tandem::v1::WorkerInfo Idle(const std::string& id, const std::string& name,
                            tandem::v1::DeviceKind d = tandem::v1::DEVICE_KIND_CPU) {
  tandem::v1::WorkerInfo w;
  w.set_id(id);
  w.set_name(name);
  w.set_device(d);
  return w;
}

TEST(SchedulerTest, GangPriorityFifoAndReasons) {
  std::vector<PendingJob> pending = {
      {"a", 0, 1, tandem::v1::DEVICE_KIND_CPU, 4},
      {"b", 0, 2, tandem::v1::DEVICE_KIND_CPU, 1},
      {"c", 0, 3, tandem::v1::DEVICE_KIND_CUDA, 1},
  };
  auto r = Schedule(pending, {Idle("w-2", "n2"), Idle("w-1", "n1")});
  EXPECT_TRUE(r.start.empty());
  EXPECT_EQ(r.reasons["a"], "needs 4 cpu workers, 2 idle");
  EXPECT_EQ(r.reasons["b"], "waiting behind job a (cpu workers are reserved for it)");
  EXPECT_EQ(r.reasons["c"], "needs 1 cuda worker, 0 idle");
  // Priority jumps the queue; workers in name order give ranks.
  pending[1].priority = 5;
  r = Schedule(pending, {Idle("w-2", "n2"), Idle("w-1", "n1")});
  ASSERT_EQ(r.start.size(), 1u);
  EXPECT_EQ(r.start[0].job_id, "b");
  EXPECT_EQ(r.start[0].worker_ids, std::vector<std::string>{"w-1"});
  // Enough for everyone.
  r = Schedule(pending, {Idle("w-1", "n1"), Idle("w-2", "n2"), Idle("w-3", "n3"), Idle("w-4", "n4"), Idle("w-5", "n5"),
                         Idle("g-1", "g1", tandem::v1::DEVICE_KIND_CUDA)});
  ASSERT_EQ(r.start.size(), 3u);
  EXPECT_TRUE(r.reasons.empty());
}

// Retention: a lost worker is forgotten (memory and store) once silent
// for lost_worker_retention_ms; a live one never is.
TEST(MembershipTest, LostWorkersAreForgottenAfterTheRetention) {
  const std::string dir = ::testing::TempDir() + "/tandem_retention_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  auto store = StateStore::Open(dir);
  ASSERT_TRUE(store.ok());
  tandem::v1::CoordinatorConfig config;
  config.set_lease_ms(1000);
  config.set_heartbeat_ms(100);
  config.set_lost_worker_retention_ms(3000);
  ManualClock clock;
  Membership m(config, store->get(), &clock);
  tandem::v1::RegisterWorkerRequest a, b;
  a.set_name("a");
  a.set_device(tandem::v1::DEVICE_KIND_CPU);
  b = a;
  b.set_name("b");
  ASSERT_TRUE(m.Register(a, -1).ok());
  ASSERT_TRUE(m.Register(b, -1).ok());
  tandem::v1::HeartbeatRequest hb;
  hb.set_worker_id("w-2");
  bool lost_seen = false;
  for (int i = 0; i < 30; ++i) {  // 6 s in 200 ms ticks; b keeps heartbeating
    clock.AdvanceMs(200);
    ASSERT_TRUE(m.Heartbeat(hb).ok());
    for (const auto& l : m.ExpireLeases()) lost_seen |= l.worker_id == "w-1";
  }
  EXPECT_TRUE(lost_seen);
  EXPECT_TRUE(absl::IsNotFound(m.Get("w-1").status()));
  EXPECT_TRUE(m.Get("w-2").ok());
  // Membership queues its store writes: read once they are committed.
  ASSERT_TRUE((*store)->WaitForQueuedWrites(absl::Now() + absl::Seconds(20)).ok());
  auto stored = (*store)->LoadWorkers();
  ASSERT_EQ(stored->size(), 1u);
  EXPECT_EQ((*stored)[0].info.id(), "w-2");
  // The name is free: a new worker "a" gets a new id.
  auto again = m.Register(a, -1);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->worker_id, "w-3");
  std::filesystem::remove_all(dir);
}

tandem::v1::RegisterWorkerRequest Reg(const std::string& name) {
  tandem::v1::RegisterWorkerRequest r;
  r.set_name(name);
  r.set_device(tandem::v1::DEVICE_KIND_CPU);
  return r;
}

TEST(MembershipTest, LeasesReRegisterAssignDrain) {
  tandem::v1::CoordinatorConfig config;
  config.set_lease_ms(3000);
  ManualClock clock;
  Membership m(config, nullptr, &clock);
  auto a = m.Register(Reg("a"), -1);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->worker_id, "w-1");
  auto b = m.Register(Reg("b"), -1);
  EXPECT_EQ(b->worker_id, "w-2");
  // A live worker's name goes only to the holder of its credential.
  EXPECT_TRUE(absl::IsAlreadyExists(m.Register(Reg("a"), -1).status()));
  tandem::v1::RegisterWorkerRequest a_again = Reg("a");
  a_again.set_worker_credential(a->credential);
  auto a2 = m.Register(a_again, -1);
  ASSERT_TRUE(a2.ok());
  EXPECT_EQ(a2->worker_id, "w-1");  // same name, same id, same credential
  EXPECT_EQ(a2->credential, a->credential);
  EXPECT_NE(a->credential, b->credential);
  EXPECT_TRUE(m.CheckCredential("w-1", a->credential).ok());
  EXPECT_TRUE(absl::IsPermissionDenied(m.CheckCredential("w-1", b->credential)));
  EXPECT_TRUE(absl::IsUnauthenticated(m.CheckCredential("w-1", "")));
  EXPECT_EQ(*m.WorkerForCredential(b->credential), "w-2");
  EXPECT_TRUE(m.Idle().empty());  // not attached yet
  auto att = m.Attach("w-1");
  ASSERT_TRUE(att.ok());
  uint64_t epoch = att->second;
  ASSERT_TRUE(m.Attach("w-2").ok());
  EXPECT_EQ(m.Idle().size(), 2u);
  // A second attach supersedes the first stream.
  auto att2 = m.Attach("w-1");
  EXPECT_FALSE(m.IsCurrentAttach("w-1", epoch));
  EXPECT_TRUE(m.IsCurrentAttach("w-1", att2->second));

  ASSERT_TRUE(m.Assign("j-1", {"w-1", "w-2"}).ok());
  EXPECT_FALSE(m.Assign("j-2", {"w-1"}).ok());
  // A restarted worker (no job state) is dropped from its job.
  tandem::v1::RegisterWorkerRequest again = Reg("b");
  again.set_worker_id("w-2");
  again.set_worker_credential(b->credential);
  auto r = m.Register(again, 1);
  EXPECT_FALSE(r->keep_job);
  EXPECT_EQ(r->dropped_job, "j-1");
  // A worker that still holds the job keeps it.
  tandem::v1::RegisterWorkerRequest keep = Reg("a");
  keep.set_worker_id("w-1");
  keep.set_worker_credential(a->credential);
  keep.set_job_id("j-1");
  keep.set_generation(1);
  r = m.Register(keep, 1);
  EXPECT_TRUE(r->keep_job);
  EXPECT_EQ(r->rank, 0);

  // Heartbeats renew; silence expires the lease and reports the job.
  clock.AdvanceMs(2000);
  tandem::v1::HeartbeatRequest hb;
  hb.set_worker_id("w-2");
  EXPECT_TRUE(m.Heartbeat(hb).ok());
  clock.AdvanceMs(1500);
  auto lost = m.ExpireLeases();
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].worker_id, "w-1");
  EXPECT_EQ(lost[0].job_id, "j-1");
  EXPECT_EQ(m.Get("w-1")->state(), tandem::v1::WORKER_STATE_LOST);
  hb.set_worker_id("w-1");
  EXPECT_TRUE(absl::IsNotFound(m.Heartbeat(hb)));  // must re-register
  // Once its lease ran out the name is free: a new process (no credential)
  // takes it over and the old credential stops working.
  auto taken = m.Register(Reg("a"), -1);
  ASSERT_TRUE(taken.ok());
  EXPECT_EQ(taken->worker_id, "w-1");
  EXPECT_NE(taken->credential, a->credential);
  EXPECT_TRUE(absl::IsPermissionDenied(m.CheckCredential("w-1", a->credential)));

  // Drain: an idle worker drains now and is told so.
  ASSERT_TRUE(m.Attach("w-2").ok());
  auto drained = m.Drain("b");
  ASSERT_TRUE(drained.ok());
  EXPECT_EQ(drained->state(), tandem::v1::WORKER_STATE_DRAINING);
  EXPECT_TRUE(m.Idle().empty());
  EXPECT_TRUE(absl::IsNotFound(m.Drain("nobody").status()));
}

tandem::v1::WorkerCommand PhaseCommandWithId(const std::string& id) {
  tandem::v1::WorkerCommand c;
  c.mutable_phase()->set_command_id(id);
  return c;
}

// A worker re-registers and re-attaches while its old Attach stream still
// waits on the queue; the driver then queues the next generation's SETUP.
// The old stream must not take it: the new stream gets it.
TEST(MembershipTest, SupersededStreamLeavesCommandsForTheNewStream) {
  tandem::v1::CoordinatorConfig config;
  config.set_lease_ms(2000);
  config.set_heartbeat_ms(250);
  ManualClock clock;
  Membership m(config, nullptr, &clock);
  auto first = m.Register(Reg("a"), -1);
  ASSERT_TRUE(first.ok());
  auto old_attach = m.Attach("w-1");
  ASSERT_TRUE(old_attach.ok());
  auto [queue, old_epoch] = *old_attach;

  CommandQueue::PopResult old_result = CommandQueue::PopResult::kTimeout;
  tandem::v1::WorkerCommand old_got;
  std::thread old_stream([&] { old_result = queue->Pop(old_epoch, 10000, &old_got); });
  // The old stream waits in Pop (nothing observable says so; the new attach
  // must end that wait whether it started or not).
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  tandem::v1::RegisterWorkerRequest again = Reg("a");
  again.set_worker_id("w-1");
  again.set_worker_credential(first->credential);
  ASSERT_TRUE(m.Register(again, -1).ok());
  auto new_attach = m.Attach("w-1");
  ASSERT_TRUE(new_attach.ok());
  EXPECT_EQ(new_attach->first, queue);  // one queue per worker
  ASSERT_TRUE(m.Send("w-1", PhaseCommandWithId("j-1/g2/u0/p0")).ok());
  old_stream.join();
  EXPECT_EQ(old_result, CommandQueue::PopResult::kSuperseded);
  EXPECT_FALSE(old_got.has_phase());

  // A stale epoch never pops, even with a command waiting.
  tandem::v1::WorkerCommand got;
  EXPECT_EQ(queue->Pop(old_epoch, 0, &got), CommandQueue::PopResult::kSuperseded);
  EXPECT_EQ(queue->size(), 1u);
  uint64_t clears = 0;
  ASSERT_EQ(queue->Pop(new_attach->second, 0, &got, &clears), CommandQueue::PopResult::kCommand);
  EXPECT_EQ(got.phase().command_id(), "j-1/g2/u0/p0");

  // The stream could not write it (the worker went away and attaches again):
  // it goes back to the front, and the next stream gets it.
  ASSERT_TRUE(m.Send("w-1", PhaseCommandWithId("j-1/g2/u1/p0")).ok());
  queue->Unpop(got, clears);
  auto third = m.Attach("w-1");
  ASSERT_TRUE(third.ok());
  ASSERT_EQ(queue->Pop(third->second, 0, &got, &clears), CommandQueue::PopResult::kCommand);
  EXPECT_EQ(got.phase().command_id(), "j-1/g2/u0/p0");
  // ... unless the queue was cleared since (the worker dropped its job).
  ASSERT_TRUE(m.Register(again, -1).ok());  // clears: not in a job
  queue->Unpop(got, clears);
  EXPECT_EQ(queue->size(), 0u);
}

// A lease checker that runs late (the coordinator stalled) does not declare
// workers lost whose heartbeats waited meanwhile; a silent worker is still
// lost once the checker has watched it for a lease.
TEST(MembershipTest, CoordinatorStallDoesNotExpireLeases) {
  tandem::v1::CoordinatorConfig config;
  config.set_lease_ms(2000);
  config.set_heartbeat_ms(250);
  ManualClock clock;
  Membership m(config, nullptr, &clock);
  ASSERT_TRUE(m.Register(Reg("a"), -1).ok());
  ASSERT_TRUE(m.Register(Reg("b"), -1).ok());
  ASSERT_TRUE(m.Attach("w-1").ok());
  ASSERT_TRUE(m.Attach("w-2").ok());
  tandem::v1::HeartbeatRequest hb_a;
  hb_a.set_worker_id("w-1");
  EXPECT_TRUE(m.ExpireLeases().empty());
  clock.AdvanceMs(2500);  // nothing ran: no heartbeat handled, no check
  EXPECT_TRUE(m.ExpireLeases().empty());
  ASSERT_TRUE(m.Heartbeat(hb_a).ok());  // the waiting heartbeat of a lands; b is silent
  std::vector<LostWorker> lost;
  int64_t watched_ms = 0;
  while (lost.empty() && watched_ms < 5000) {
    clock.AdvanceMs(250);
    watched_ms += 250;
    ASSERT_TRUE(m.Heartbeat(hb_a).ok());
    lost = m.ExpireLeases();
  }
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].worker_id, "w-2");
  EXPECT_GE(watched_ms, 1500);
  EXPECT_LE(watched_ms, 2000);
  EXPECT_EQ(m.Get("w-1")->state(), tandem::v1::WORKER_STATE_IDLE);
}

TEST(KvStoreTest, Semantics) {
  KvStore kv(KvLimits{.max_key_bytes = 16, .max_value_bytes = 8, .max_entries_per_scope = 3});
  const std::string s = KvStore::ScopeName("j-1", 1);
  EXPECT_TRUE(kv.Set(s, "a", "1").ok());
  EXPECT_EQ(*kv.Get(s, "a", 0), "1");
  EXPECT_EQ(*kv.Add(s, "n", 2), 2);
  EXPECT_EQ(*kv.Add(s, "n", 3), 5);
  EXPECT_EQ(*kv.Get(s, "n", 0), "5");
  EXPECT_TRUE(absl::IsFailedPrecondition(kv.Add(s, "a", 1).status()) == false);  // "1" is a counter
  {
    // A counter never wraps: the add is refused and the value stays.
    KvStore big(KvLimits{.max_key_bytes = 16, .max_value_bytes = 32, .max_entries_per_scope = 3});
    ASSERT_EQ(big.Add(s, "n", INT64_MAX - 2).value_or(0), INT64_MAX - 2);
    EXPECT_EQ(big.Add(s, "n", 2).value_or(0), INT64_MAX);
    EXPECT_TRUE(absl::IsOutOfRange(big.Add(s, "n", 1).status()));
    EXPECT_TRUE(absl::IsOutOfRange(big.Add(s, "m", INT64_MIN).status()) == false);
    EXPECT_TRUE(absl::IsOutOfRange(big.Add(s, "m", -1).status()));
    EXPECT_EQ(big.Get(s, "n", 0).value_or(""), absl::StrCat(INT64_MAX));
  }
  EXPECT_TRUE(absl::IsInvalidArgument(kv.Set(s, std::string(17, 'k'), "v")));
  EXPECT_TRUE(absl::IsInvalidArgument(kv.Set(s, "b", "123456789")));
  EXPECT_TRUE(kv.Set(s, "c", "x").ok());
  EXPECT_TRUE(absl::IsResourceExhausted(kv.Set(s, "d", "x")));
  // Waits: timeout names the missing key; a writer wakes a waiter.
  auto t0 = std::chrono::steady_clock::now();
  auto miss = kv.Get(s, "zz", 100);
  EXPECT_TRUE(absl::IsDeadlineExceeded(miss.status()));
  EXPECT_NE(miss.status().message().find("zz"), std::string::npos);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(100));
  EXPECT_TRUE(*kv.Delete(s, "c"));
  EXPECT_FALSE(*kv.Delete(s, "c"));
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    kv.Set(s, "late", "v").IgnoreError();
  });
  EXPECT_TRUE(kv.Wait(s, {"a", "late"}, 5000).ok());
  writer.join();
  EXPECT_TRUE(absl::IsInvalidArgument(kv.Wait(s, {"a"}, -1)));
  // Cancellation ends a wait early; dropping the job empties its scopes.
  EXPECT_TRUE(absl::IsCancelled(kv.Get(s, "never", 10000, [] { return true; }).status()));
  kv.DropJob("j-1");
  EXPECT_EQ(kv.scope_count(), 0u);
  kv.Shutdown();
  EXPECT_TRUE(absl::IsUnavailable(kv.Get(s, "x", 10000).status()));
}

}  // namespace
}  // namespace tandem::server
