#include "server/recovery/checkpoint_catalogue.h"

#include <algorithm>

#include "common/status_util.h"
#include "server/recovery/policy.h"

namespace tandem::server {

CheckpointCatalogue::CheckpointCatalogue(StateStore* store, std::string job_id, tandem::v1::DriverState* state)
    : store_(store), job_id_(std::move(job_id)), state_(state) {}

absl::StatusOr<bool> CheckpointCatalogue::Publish(const tandem::v1::CheckpointRecord& record, int64_t keep) {
  ASSIGN_OR_RETURN(WriteTicket ticket, Record(record, keep));
  if (ticket == 0) return false;
  RETURN_IF_ERROR(store_->WaitDurable(ticket));
  return true;
}

absl::StatusOr<WriteTicket> CheckpointCatalogue::Record(const tandem::v1::CheckpointRecord& record, int64_t keep) {
  auto existing = store_->HasCheckpoint(record);
  if (existing.ok() && *existing) return 0;
  RETURN_IF_ERROR(store_->SubmitCheckpoint(record).status());
  // Rank 0 applies checkpoint.keep right after publishing
  // (ckpt::ApplyRetention): list only what is still on disk.
  ASSIGN_OR_RETURN(WriteTicket ticket,
                   store_->SubmitPruneCheckpoints(
                       job_id_, keep > 0 ? std::min(keep, kMaxCheckpointRecordsPerJob) : kMaxCheckpointRecordsPerJob));
  auto* bad = state_->mutable_bad_checkpoints();
  bad->erase(std::remove(bad->begin(), bad->end(), record.path()), bad->end());
  return ticket;
}

absl::StatusOr<std::vector<tandem::v1::CheckpointRecord>> CheckpointCatalogue::List() const {
  return store_->ListCheckpoints(job_id_);
}

int64_t CheckpointCatalogue::NewestStep() const {
  int64_t newest = -1;
  auto records = List();
  if (!records.ok()) return newest;
  for (const auto& c : *records) newest = std::max(newest, c.step());
  return newest;
}

std::optional<tandem::v1::CheckpointRecord> CheckpointCatalogue::NewestUsable() const {
  auto records = List();
  if (!records.ok()) return std::nullopt;
  return ChooseCheckpoint(*records, Bad());
}

RestoreSource CheckpointCatalogue::ChooseRestore(const std::string& resume_from) const {
  if (auto disk = NewestUsable()) return {disk->path(), disk->step()};
  if (!resume_from.empty() && !IsBad(resume_from)) return {resume_from, -1};
  return {};
}

bool CheckpointCatalogue::MarkBad(const std::string& path) {
  if (IsBad(path)) return false;
  state_->add_bad_checkpoints(path);
  return true;
}

bool CheckpointCatalogue::IsBad(const std::string& path) const {
  const auto& bad = state_->bad_checkpoints();
  return std::find(bad.begin(), bad.end(), path) != bad.end();
}

std::set<std::string> CheckpointCatalogue::Bad() const {
  return {state_->bad_checkpoints().begin(), state_->bad_checkpoints().end()};
}

}  // namespace tandem::server
