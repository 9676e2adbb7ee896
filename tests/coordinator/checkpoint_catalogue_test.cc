// CheckpointCatalogue over a real state store in a temporary directory:
// publishing (once per record, retention by steps), the newest step, the
// restore choice (newest usable, resume_from, scratch) and bad sources.
#include "server/recovery/checkpoint_catalogue.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

namespace tandem::server {
namespace {

tandem::v1::CheckpointRecord Record(int64_t step, int64_t generation = 1, int64_t bytes = 100) {
  tandem::v1::CheckpointRecord r;
  r.set_job_id("j-000001");
  r.set_step(step);
  r.set_generation(generation);
  r.set_path("/nonexistent/ck/step-" + std::to_string(step));
  r.set_world_size(2);
  r.set_bytes(bytes);
  return r;
}

class CheckpointCatalogueTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/tandem_catalogue_" + std::to_string(getpid());
    std::filesystem::remove_all(dir_);
    auto store = StateStore::Open(dir_);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
  }
  void TearDown() override {
    store_.reset();
    std::filesystem::remove_all(dir_);
  }
  std::string dir_;
  std::unique_ptr<StateStore> store_;
  tandem::v1::DriverState state_;
};

TEST_F(CheckpointCatalogueTest, PublishesOnceAndKeepsTheNewestSteps) {
  CheckpointCatalogue catalogue(store_.get(), "j-000001", &state_);
  EXPECT_EQ(catalogue.NewestStep(), -1);
  EXPECT_TRUE(*catalogue.Publish(Record(2), 2));
  EXPECT_FALSE(*catalogue.Publish(Record(2), 2));  // the same record again
  EXPECT_TRUE(*catalogue.Publish(Record(4, 1, 300), 2));
  EXPECT_TRUE(*catalogue.Publish(Record(6), 2));
  auto list = catalogue.List();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 2u);  // step 2 pruned
  EXPECT_EQ((*list)[0].step(), 4);
  EXPECT_EQ((*list)[0].bytes(), 300);
  EXPECT_EQ(catalogue.NewestStep(), 6);
}

TEST_F(CheckpointCatalogueTest, RestoreChoiceSkipsBadSourcesUntilPublishedAgain) {
  CheckpointCatalogue catalogue(store_.get(), "j-000001", &state_);
  // Nothing recorded: resume_from, else scratch.
  EXPECT_EQ(catalogue.ChooseRestore("/init/ck").path, "/init/ck");
  EXPECT_EQ(catalogue.ChooseRestore("/init/ck").step, -1);
  EXPECT_EQ(catalogue.ChooseRestore("").path, "");
  ASSERT_TRUE(catalogue.Publish(Record(2), 0).ok());
  ASSERT_TRUE(catalogue.Publish(Record(4), 0).ok());
  RestoreSource newest = catalogue.ChooseRestore("/init/ck");
  EXPECT_EQ(newest.step, 4);
  EXPECT_EQ(newest.path, Record(4).path());
  // A bad newest falls back to the one before; the mark is in the driver state.
  EXPECT_TRUE(catalogue.MarkBad(newest.path));
  EXPECT_FALSE(catalogue.MarkBad(newest.path));
  EXPECT_TRUE(catalogue.IsBad(newest.path));
  ASSERT_EQ(state_.bad_checkpoints_size(), 1);
  EXPECT_EQ(catalogue.ChooseRestore("").step, 2);
  EXPECT_EQ(catalogue.NewestUsable()->step(), 2);
  // Every recorded one bad: resume_from unless that is bad too.
  catalogue.MarkBad(Record(2).path());
  EXPECT_EQ(catalogue.ChooseRestore("/init/ck").path, "/init/ck");
  catalogue.MarkBad("/init/ck");
  EXPECT_EQ(catalogue.ChooseRestore("/init/ck").path, "");
  // Published again (a redo rewrote it): usable again.
  ASSERT_TRUE(*catalogue.Publish(Record(4, 2), 0));
  EXPECT_FALSE(catalogue.IsBad(Record(4).path()));
  EXPECT_EQ(catalogue.ChooseRestore("").step, 4);
}

}  // namespace
}  // namespace tandem::server
