// The state store's writer: a write held inside its transaction (a slow
// disk) leaves reads and queueing open, later writes wait for it (one
// ordered log) and a job's states queued together end as the newest; a
// refused write is reported when queued; closing the store applies
// everything queued; a held checkpoint (the fsyncs) holds no write. Every
// wait is bounded.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "server/store/state_store.h"
#include "tandem/v1/driver_state.pb.h"
#include "tandem/v1/job.pb.h"

namespace tandem::server {
namespace {

std::string FreshDir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / ("tandem_writer_" + name + "_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  return dir.string();
}

tandem::v1::Job JobWithStep(const std::string& id, int64_t step) {
  tandem::v1::Job job;
  job.set_id(id);
  job.set_state(tandem::v1::JOB_STATE_RUNNING);
  job.set_step(step);
  return job;
}

tandem::v1::DriverState Cursor(int64_t unit) {
  tandem::v1::DriverState d;
  d.set_cursor_unit(unit);
  return d;
}

// Holds the commit of batches with `job_id` until released (bounded).
struct Hold {
  std::string job_id;
  absl::Notification held;
  absl::Notification release;
  void OnWrite(const std::string& id) {
    if (id != job_id) return;
    if (!held.HasBeenNotified()) held.Notify();
    release.WaitForNotificationWithTimeout(absl::Seconds(60));
  }
};

int64_t StepOf(StateStore* store, const std::string& id) {
  auto jobs = store->LoadJobs();
  if (!jobs.ok()) return -2;
  for (const auto& j : *jobs) {
    if (j.job.id() == id) return j.job.step();
  }
  return -1;
}

TEST(StateStoreWriterTest, AHeldWriteLeavesReadsOpenAndOrdersTheLog) {
  const std::string dir = FreshDir("held");
  auto opened = StateStore::Open(dir);
  ASSERT_TRUE(opened.ok()) << opened.status();
  std::unique_ptr<StateStore> store = std::move(*opened);
  ASSERT_TRUE(store->PutJob(JobWithStep("j-a", 1), Cursor(1), 1).ok());
  tandem::v1::JobEvent event;
  event.set_job_id("j-a");
  event.set_kind("state");
  ASSERT_TRUE(store->AppendEvent(event).ok());

  Hold hold{.job_id = "j-a"};
  store->SetWriteHookForTest([&hold](const std::string& id) { hold.OnWrite(id); });
  auto held_ticket = store->SubmitPutJob(JobWithStep("j-a", 2), Cursor(2), 1);
  ASSERT_TRUE(held_ticket.ok()) << held_ticket.status();
  ASSERT_TRUE(hold.held.WaitForNotificationWithTimeout(absl::Seconds(20)));

  // Reads answer from the last commit.
  EXPECT_EQ(StepOf(store.get(), "j-a"), 1);
  auto events = store->ListEvents("j-a", 0, 10);
  ASSERT_TRUE(events.ok()) << events.status();
  EXPECT_EQ(events->size(), 1u);
  EXPECT_TRUE(store->ListLogs("j-b", 0, 10).ok());

  // Other writes queue at once; they come after the held one.
  std::vector<WriteTicket> tickets;
  for (int64_t step = 1; step <= 3; ++step) {
    auto t = store->SubmitPutJob(JobWithStep("j-b", step), Cursor(step), 2);
    ASSERT_TRUE(t.ok()) << t.status();
    tickets.push_back(*t);
  }
  tandem::v1::JobEvent b_event;
  b_event.set_job_id("j-b");
  b_event.set_kind("state");
  auto event_ticket = store->SubmitEvent(b_event, 1);
  ASSERT_TRUE(event_ticket.ok()) << event_ticket.status();
  EXPECT_GT(tickets.front(), *held_ticket);
  EXPECT_LT(store->DurableThrough(), *held_ticket);
  EXPECT_TRUE(absl::IsDeadlineExceeded(store->WaitDurable(*event_ticket, absl::Now())));
  EXPECT_EQ(StepOf(store.get(), "j-b"), -1);

  hold.release.Notify();
  for (WriteTicket t : tickets) EXPECT_TRUE(store->WaitDurable(t, absl::Now() + absl::Seconds(20)).ok());
  ASSERT_TRUE(store->WaitDurable(*event_ticket, absl::Now() + absl::Seconds(20)).ok());
  EXPECT_GE(store->DurableThrough(), *event_ticket);
  EXPECT_EQ(StepOf(store.get(), "j-a"), 2);
  EXPECT_EQ(StepOf(store.get(), "j-b"), 3);  // the newest of the three
  EXPECT_EQ(store->ListEvents("j-b", 0, 10)->size(), 1u);
  store->SetWriteHookForTest(nullptr);
  store.reset();
  std::filesystem::remove_all(dir);
}

TEST(StateStoreWriterTest, ARefusedWriteIsReportedAtOnce) {
  const std::string dir = FreshDir("bad");
  auto opened = StateStore::Open(dir);
  ASSERT_TRUE(opened.ok()) << opened.status();
  std::unique_ptr<StateStore> store = std::move(*opened);
  // A store that refuses writes says so when the write is queued; the
  // next one commits.
  store->FailWritesForTest(true);
  auto refused = store->SubmitPutJob(JobWithStep("j-a", 1), Cursor(1), 1);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  store->FailWritesForTest(false);
  auto ok = store->SubmitPutJob(JobWithStep("j-a", 1), Cursor(1), 1);
  ASSERT_TRUE(ok.ok());
  EXPECT_TRUE(store->WaitDurable(*ok).ok());
  EXPECT_TRUE(store->WaitDurable(0).ok());
  store.reset();
  std::filesystem::remove_all(dir);
}

TEST(StateStoreWriterTest, ClosingAppliesEveryQueuedWrite) {
  const std::string dir = FreshDir("close");
  {
    auto store = StateStore::Open(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    for (int64_t i = 1; i <= 50; ++i) {
      tandem::v1::JobEvent e;
      e.set_job_id("j-c");
      e.set_kind("step");
      ASSERT_TRUE((*store)->SubmitEvent(e, i).ok());
      ASSERT_TRUE((*store)->SubmitPutJob(JobWithStep("j-c", i), Cursor(i), 3).ok());
    }
  }
  auto store = StateStore::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ(StepOf(store->get(), "j-c"), 50);
  EXPECT_EQ(*(*store)->LastEventSeq("j-c"), 50);
  store->reset();
  std::filesystem::remove_all(dir);
}

TEST(StateStoreWriterTest, TheCheckpointerRunsApartFromTheWriter) {
  const std::string dir = FreshDir("checkpoint");
  auto opened = StateStore::Open(dir);
  ASSERT_TRUE(opened.ok()) << opened.status();
  std::unique_ptr<StateStore> store = std::move(*opened);
  absl::Notification held, release;
  store->SetCheckpointHookForTest([&] {
    if (!held.HasBeenNotified()) held.Notify();
    release.WaitForNotificationWithTimeout(absl::Seconds(60));
  });
  store->RequestCheckpoint();
  ASSERT_TRUE(held.WaitForNotificationWithTimeout(absl::Seconds(20)));
  // Writes commit while the checkpoint (its fsyncs) is held.
  for (int64_t i = 1; i <= 20; ++i) ASSERT_TRUE(store->PutJob(JobWithStep("j-d", i), Cursor(i), 4).ok());
  EXPECT_EQ(StepOf(store.get(), "j-d"), 20);
  EXPECT_EQ(store->CheckpointsForTest(), 0);
  release.Notify();
  store->SetCheckpointHookForTest(nullptr);
  store.reset();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tandem::server
