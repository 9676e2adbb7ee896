// State store schema migration: a coordinator.db written by schema version 2
// (the driver's recovery cursors inside Job.recovery, the phase cursor in
// columns) opens with this coordinator: the cursors move into the driver
// state, the user-facing recovery fields stay, and the Job no longer carries
// the moved fields.
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "server/store/state_store.h"
#include "tandem/v1/driver_state.pb.h"
#include "tandem/v1/job.pb.h"

namespace tandem::server {
namespace {

// The tables and meta rows of schema version 2.
constexpr char kVersion2Schema[] = R"sql(
  CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
  CREATE TABLE jobs (
    id TEXT PRIMARY KEY, seq INTEGER NOT NULL, state INTEGER NOT NULL,
    cursor_unit INTEGER NOT NULL, cursor_sub INTEGER NOT NULL,
    job BLOB NOT NULL, updated_at REAL NOT NULL);
  CREATE TABLE events (
    job_id TEXT NOT NULL, seq INTEGER NOT NULL, time REAL NOT NULL, event BLOB NOT NULL,
    PRIMARY KEY (job_id, seq));
  CREATE TABLE logs (
    job_id TEXT NOT NULL, seq INTEGER NOT NULL, time REAL NOT NULL, source TEXT NOT NULL,
    text TEXT NOT NULL, PRIMARY KEY (job_id, seq));
  CREATE TABLE workers (id TEXT PRIMARY KEY, name TEXT NOT NULL, info BLOB NOT NULL,
    credential TEXT NOT NULL DEFAULT '');
  CREATE TABLE checkpoints (
    job_id TEXT NOT NULL, step INTEGER NOT NULL, generation INTEGER NOT NULL, path TEXT NOT NULL,
    record BLOB NOT NULL, PRIMARY KEY (job_id, step, generation));
  INSERT INTO meta (key, value) VALUES ('schema_version', 2);
  INSERT INTO meta (key, value) VALUES ('job_seq', 1);
)sql";

TEST(StateStoreMigrationTest, Version2DatabaseLoadsWithTheDriverStateMoved) {
  const std::string dir = ::testing::TempDir() + "/tandem_migration_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/coordinator.db";

  // A running job as version 2 stored it: the user-facing Job plus the
  // internal cursors in the same bytes (field 14, the old layout).
  tandem::v1::Job job;
  job.set_id("j-000001");
  job.set_state(tandem::v1::JOB_STATE_RUNNING);
  job.set_step(4);
  job.set_generation(3);
  job.add_worker_ids("w-1");
  job.add_worker_ids("w-2");
  job.mutable_spec()->set_name("old");
  job.mutable_recovery()->set_recoveries(2);
  job.mutable_recovery()->set_reason("worker w-3 rank 1 lost: lease expired");
  job.mutable_recovery()->set_degraded_logical_world(3);
  job.mutable_recovery()->set_steps_redone_total(1);
  const std::string clean = job.SerializeAsString();
  tandem::v1::LegacyJobCursors legacy;
  auto* old = legacy.mutable_recovery();
  old->set_restore_from("/ck/step-00000004");
  old->set_peer_copy_step(4);
  old->set_peer_copy_world(2);
  old->add_bad_checkpoints("/ck/step-00000006");
  old->add_logical_begin(0);
  old->add_logical_begin(2);
  old->add_logical_own(0);
  old->add_logical_own(2);
  old->set_has_last_trained(true);
  old->set_last_trained_step(4);
  old->set_last_trained_next_unit(5);
  const std::string blob = clean + legacy.SerializeAsString();  // concatenated messages merge
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(db, kVersion2Schema, nullptr, nullptr, nullptr), SQLITE_OK) << sqlite3_errmsg(db);
    sqlite3_stmt* stmt = nullptr;
    ASSERT_EQ(sqlite3_prepare_v2(db,
                                 "INSERT INTO jobs (id, seq, state, cursor_unit, cursor_sub, job, updated_at) "
                                 "VALUES ('j-000001', 1, 2, 7, 3, ?, 0)",
                                 -1, &stmt, nullptr),
              SQLITE_OK);
    sqlite3_bind_blob(stmt, 1, blob.data(), static_cast<int>(blob.size()), SQLITE_TRANSIENT);
    EXPECT_EQ(sqlite3_step(stmt), SQLITE_DONE);
    sqlite3_finalize(stmt);
    sqlite3_close(db);
  }

  auto store = StateStore::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  auto jobs = (*store)->LoadJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), 1u);
  const StoredJob& loaded = (*jobs)[0];
  EXPECT_EQ(loaded.seq, 1);
  // The user-facing Job is what it was, without the moved fields.
  EXPECT_EQ(loaded.job.SerializeAsString(), clean);
  EXPECT_EQ(loaded.job.recovery().recoveries(), 2);
  EXPECT_EQ(loaded.job.recovery().degraded_logical_world(), 3);
  // The driver state has the cursor and every moved field.
  const tandem::v1::DriverState& d = loaded.driver;
  EXPECT_EQ(d.cursor_unit(), 7);
  EXPECT_EQ(d.cursor_sub(), 3);
  EXPECT_EQ(d.restore_from(), "/ck/step-00000004");
  EXPECT_EQ(d.peer_copy_step(), 4);
  EXPECT_EQ(d.peer_copy_world(), 2);
  ASSERT_EQ(d.bad_checkpoints_size(), 1);
  EXPECT_EQ(d.bad_checkpoints(0), "/ck/step-00000006");
  ASSERT_EQ(d.logical_begin_size(), 2);
  EXPECT_EQ(d.logical_begin(1), 2);
  EXPECT_EQ(d.logical_own(1), 2);
  EXPECT_TRUE(d.has_last_trained());
  EXPECT_EQ(d.last_trained_step(), 4);
  EXPECT_EQ(d.last_trained_next_unit(), 5);
  EXPECT_EQ(*(*store)->NextJobSeq(), 2);

  // Written back and reopened: version 3 round-trips without migrating again.
  tandem::v1::DriverState next = d;
  next.set_cursor_unit(8);
  ASSERT_TRUE((*store)->PutJob(loaded.job, next, loaded.seq).ok());
  store->reset();
  auto reopened = StateStore::Open(dir);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  auto again = (*reopened)->LoadJobs();
  ASSERT_TRUE(again.ok());
  ASSERT_EQ(again->size(), 1u);
  EXPECT_EQ((*again)[0].driver.cursor_unit(), 8);
  EXPECT_EQ((*again)[0].driver.restore_from(), "/ck/step-00000004");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tandem::server
