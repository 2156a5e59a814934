#include "coordinator/store/store_writer.h"

#include <algorithm>
#include <optional>
#include <set>
#include <utility>

#include "absl/synchronization/notification.h"
#include "common/logging.h"
#include "coordinator/store/store_tables.h"

namespace ddp {
namespace {

constexpr size_t kOutcomesKept = 64;

}  // namespace

StoreWriter::StoreWriter(Store* store, Options options)
    : store_(store), options_(options) {
  thread_ = std::thread([this] { Loop(); });
}

StoreWriter::~StoreWriter() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

StoreWriter::Ticket StoreWriter::StageLocked(size_t rows) {
  stats_.rows_staged += static_cast<int64_t>(rows);
  staged_ += rows;
  return staged_;
}

StoreWriter::Ticket StoreWriter::PutJob(const v1::Job& job, int64_t seq, bool creation) {
  // The job's row: its columns only (store_tables.cc), never its attempts (a
  // 4,096-rank job's row is as cheap to stage as a one-rank job's).
  RowBatch::JobRow row;
  row.seq = seq;
  store::Jobs().Copy(job, row);
  absl::MutexLock lock(&mu_);
  pending_.rows.jobs.push_back(std::move(row));
  pending_.job_is_creation.push_back(creation);
  return StageLocked(1);
}

StoreWriter::Ticket StoreWriter::PutAttempt(const std::string& job_id, const v1::Attempt& attempt) {
  RowBatch::AttemptRow row;
  row.job_id = job_id;
  store::Attempts().Copy(attempt, row);  // Its columns, not its ranks.
  absl::MutexLock lock(&mu_);
  pending_.rows.attempts.push_back(std::move(row));
  return StageLocked(1);
}

StoreWriter::Ticket StoreWriter::PutRank(const std::string& job_id, int attempt,
                                         const v1::RankAssignment& rank) {
  absl::MutexLock lock(&mu_);
  pending_.rows.ranks.push_back({job_id, attempt, rank});
  return StageLocked(1);
}

StoreWriter::Ticket StoreWriter::PutWorker(const v1::Worker& worker) {
  absl::MutexLock lock(&mu_);
  // Deletes run after upserts in a commit: an upsert after a delete cancels it.
  std::vector<std::string>& removed = pending_.rows.removed_workers;
  removed.erase(std::remove(removed.begin(), removed.end(), worker.name()), removed.end());
  pending_.rows.workers.push_back(worker);
  return StageLocked(1);
}

StoreWriter::Ticket StoreWriter::RemoveWorker(const std::string& name) {
  absl::MutexLock lock(&mu_);
  std::vector<v1::Worker>& staged = pending_.rows.workers;
  staged.erase(std::remove_if(staged.begin(), staged.end(),
                              [&](const v1::Worker& w) { return w.name() == name; }),
               staged.end());
  pending_.rows.removed_workers.push_back(name);
  return StageLocked(1);
}

void StoreWriter::EnforceRetention(std::vector<std::string> job_ids, Callback done) {
  absl::MutexLock lock(&mu_);
  const std::set<std::string> ids(job_ids.begin(), job_ids.end());
  RowBatch& rows = pending_.rows;
  std::vector<bool> creation;
  std::vector<RowBatch::JobRow> jobs;
  for (size_t i = 0; i < rows.jobs.size(); ++i) {
    if (ids.count(rows.jobs[i].job.id())) continue;
    jobs.push_back(std::move(rows.jobs[i]));
    creation.push_back(pending_.job_is_creation[i]);
  }
  rows.jobs = std::move(jobs);
  pending_.job_is_creation = std::move(creation);
  rows.attempts.erase(std::remove_if(rows.attempts.begin(), rows.attempts.end(),
                                     [&](const auto& r) { return ids.count(r.job_id) > 0; }),
                      rows.attempts.end());
  rows.ranks.erase(std::remove_if(rows.ranks.begin(), rows.ranks.end(),
                                  [&](const auto& r) { return ids.count(r.job_id) > 0; }),
                   rows.ranks.end());
  pending_.retention = true;
  pending_.delete_ids.insert(pending_.delete_ids.end(), job_ids.begin(), job_ids.end());
  pending_.retention_done.push_back(std::move(done));
}

StoreWriter::Ticket StoreWriter::last_staged() {
  absl::MutexLock lock(&mu_);
  return staged_;
}

std::optional<absl::Status> StoreWriter::OutcomeLocked(Ticket ticket) {
  if (ticket == 0) return absl::OkStatus();  // Nothing to wait for.
  if (ticket > done_) return std::nullopt;
  for (const auto& [last, status] : outcomes_) {
    if (last >= ticket) return status;
  }
  return absl::OkStatus();  // Older than the outcomes kept: long done.
}

void StoreWriter::AfterCommit(Ticket ticket, Callback fn) {
  std::optional<absl::Status> outcome;
  {
    absl::MutexLock lock(&mu_);
    outcome = OutcomeLocked(ticket);
    if (!outcome.has_value()) {
      waiters_.emplace(ticket, std::move(fn));
      return;
    }
  }
  fn(*outcome);
}

absl::Status StoreWriter::Wait(Ticket ticket) {
  absl::Notification done;
  absl::Status result;
  AfterCommit(ticket, [&](const absl::Status& st) {
    result = st;
    done.Notify();
  });
  done.WaitForNotification();
  return result;
}

StoreWriter::Stats StoreWriter::stats() {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void StoreWriter::Loop() {
  absl::Duration backoff = options_.retry_min;
  std::optional<absl::Time> retry_at;  // After a failed commit.
  bool tried_after_stop = false;
  while (true) {
    Pending batch;
    Ticket last;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || !pending_.rows.empty() || pending_.retention;
      };
      mu_.Await(absl::Condition(&ready));
      if (retry_at.has_value() && !stop_) {
        mu_.AwaitWithDeadline(absl::Condition(&stop_), *retry_at);
      }
      const bool idle = pending_.rows.empty() && !pending_.retention;
      if (stop_ && (idle || tried_after_stop)) break;
      tried_after_stop = stop_;
      batch = std::move(pending_);
      pending_ = Pending();
      last = staged_;
    }
    const absl::Status st = store_->Write(batch.rows);
    std::optional<absl::Status> retention;
    if (st.ok() && batch.retention) retention = store_->EnforceRetention(batch.delete_ids);
    if (!st.ok()) {
      DDP_LOG(ERROR) << "STATE STORE WRITE FAILED (" << batch.rows.rows()
                     << " rows): " << st << ": check the --state-dir disk; retrying in "
                     << backoff;
    }
    std::vector<Callback> ready;
    {
      absl::MutexLock lock(&mu_);
      ++stats_.commits;
      stats_.failing = !st.ok();
      if (st.ok()) {
        stats_.rows_written += static_cast<int64_t>(batch.rows.rows());
        backoff = options_.retry_min;
        retry_at.reset();
      } else {
        ++stats_.failed_commits;
        // Retried in front of newer rows (so newer copies still win), except the rows
        // of submissions, which were refused, and of jobs being deleted. Retention
        // that was to follow them is not retried: its caller hears of the failure.
        std::set<std::string> deleted(pending_.delete_ids.begin(), pending_.delete_ids.end());
        RowBatch& retry = batch.rows;
        std::vector<RowBatch::JobRow> jobs;
        for (size_t i = 0; i < retry.jobs.size(); ++i) {
          if (batch.job_is_creation[i] || deleted.count(retry.jobs[i].job.id())) continue;
          jobs.push_back(std::move(retry.jobs[i]));
        }
        auto gone = [&](const auto& r) { return deleted.count(r.job_id) > 0; };
        retry.attempts.erase(std::remove_if(retry.attempts.begin(), retry.attempts.end(), gone),
                             retry.attempts.end());
        retry.ranks.erase(std::remove_if(retry.ranks.begin(), retry.ranks.end(), gone),
                          retry.ranks.end());
        RowBatch& next = pending_.rows;
        jobs.insert(jobs.end(), std::make_move_iterator(next.jobs.begin()),
                    std::make_move_iterator(next.jobs.end()));
        std::vector<bool> creation(jobs.size() - next.jobs.size(), false);
        creation.insert(creation.end(), pending_.job_is_creation.begin(),
                        pending_.job_is_creation.end());
        next.jobs = std::move(jobs);
        pending_.job_is_creation = std::move(creation);
        retry.attempts.insert(retry.attempts.end(), std::make_move_iterator(next.attempts.begin()),
                              std::make_move_iterator(next.attempts.end()));
        next.attempts = std::move(retry.attempts);
        retry.ranks.insert(retry.ranks.end(), std::make_move_iterator(next.ranks.begin()),
                           std::make_move_iterator(next.ranks.end()));
        next.ranks = std::move(retry.ranks);
        // Worker rows: a newer delete drops a retried upsert of the name, and a newer
        // upsert cancels a retried delete (deletes run after upserts in a commit).
        std::set<std::string> newer_puts, newer_deletes(next.removed_workers.begin(),
                                                        next.removed_workers.end());
        for (const v1::Worker& w : next.workers) newer_puts.insert(w.name());
        retry.workers.erase(std::remove_if(retry.workers.begin(), retry.workers.end(),
                                           [&](const v1::Worker& w) {
                                             return newer_deletes.count(w.name()) > 0;
                                           }),
                            retry.workers.end());
        retry.removed_workers.erase(
            std::remove_if(retry.removed_workers.begin(), retry.removed_workers.end(),
                           [&](const std::string& n) { return newer_puts.count(n) > 0; }),
            retry.removed_workers.end());
        retry.workers.insert(retry.workers.end(), std::make_move_iterator(next.workers.begin()),
                             std::make_move_iterator(next.workers.end()));
        next.workers = std::move(retry.workers);
        retry.removed_workers.insert(retry.removed_workers.end(),
                                     next.removed_workers.begin(), next.removed_workers.end());
        next.removed_workers = std::move(retry.removed_workers);
        if (batch.retention) retention = st;
        retry_at = absl::Now() + backoff;
        backoff = std::min(backoff * 2, options_.retry_max);
      }
      outcomes_.emplace_back(last, st);
      if (outcomes_.size() > kOutcomesKept) outcomes_.pop_front();
      done_ = last;
      auto end = waiters_.upper_bound(last);
      for (auto it = waiters_.begin(); it != end; ++it) ready.push_back(std::move(it->second));
      waiters_.erase(waiters_.begin(), end);
    }
    for (Callback& fn : ready) fn(st);
    if (retention.has_value()) {
      for (Callback& fn : batch.retention_done) fn(*retention);
    }
  }
  // Stopped with a commit that failed: answer whoever still waits.
  std::multimap<Ticket, Callback> left;
  std::vector<Callback> retention_left;
  {
    absl::MutexLock lock(&mu_);
    left.swap(waiters_);
    retention_left.swap(pending_.retention_done);
  }
  const absl::Status stopped =
      absl::UnavailableError("the coordinator stopped before these changes could be stored");
  for (auto& [ticket, fn] : left) fn(stopped);
  for (Callback& fn : retention_left) fn(stopped);
}

}  // namespace ddp
