#include "tests/coordinator/memory_store.h"

#include <algorithm>

namespace ddp::testing {

struct MemoryStore::Data {
  const std::string cluster_id = NewClusterId();
  absl::Mutex mu;
  absl::Status fail ABSL_GUARDED_BY(mu);
  absl::Status fail_history ABSL_GUARDED_BY(mu);
  // Rows by their keys, as the SQLite tables' primary keys.
  std::map<std::string, RowBatch::JobRow> jobs ABSL_GUARDED_BY(mu);
  std::map<std::pair<std::string, int>, v1::Attempt> attempts ABSL_GUARDED_BY(mu);
  std::map<std::tuple<std::string, int, int>, v1::RankAssignment> ranks ABSL_GUARDED_BY(mu);
  std::map<std::string, v1::Worker> workers ABSL_GUARDED_BY(mu);
  std::map<std::string, BatchMark> marks ABSL_GUARDED_BY(mu);
  // Output per job: step rows in the order appended; epochs and lines by key.
  std::map<std::string, std::vector<v1::RankMetrics>> metrics ABSL_GUARDED_BY(mu);
  std::map<std::string, std::map<std::pair<int, int64_t>, v1::EpochSummary>> epochs
      ABSL_GUARDED_BY(mu);
  std::map<std::string, std::map<int64_t, v1::LogLine>> logs ABSL_GUARDED_BY(mu);
};

MemoryStore::MemoryStore(RetentionOptions retention, std::shared_ptr<Data> data)
    : retention_(retention), data_(data ? std::move(data) : std::make_shared<Data>()) {}

void MemoryStore::FailWrites(absl::Status status) {
  absl::MutexLock lock(&data_->mu);
  data_->fail = std::move(status);
}

void MemoryStore::FailHistoryReads(absl::Status status) {
  absl::MutexLock lock(&data_->mu);
  data_->fail_history = std::move(status);
}

absl::Status MemoryStore::Write(const RowBatch& batch) {
  Data& d = *data_;
  absl::MutexLock lock(&d.mu);
  if (!d.fail.ok()) return d.fail;
  for (const RowBatch::JobRow& row : batch.jobs) {
    RowBatch::JobRow& stored = d.jobs[row.job.id()] = row;
    stored.job.clear_attempts();  // Attempts are rows of their own.
    stored.job.clear_metrics();
    stored.job.clear_epoch_history();
    stored.job.clear_history();
    stored.job.clear_queue_position();  // The live coordinator's view, never stored.
    stored.job.clear_unschedulable();
  }
  for (const RowBatch::AttemptRow& row : batch.attempts) {
    v1::Attempt& stored = d.attempts[{row.job_id, row.attempt.number()}] = row.attempt;
    stored.clear_ranks();
    stored.clear_live_trainers();
  }
  for (const RowBatch::RankRow& row : batch.ranks) {
    d.ranks[{row.job_id, row.attempt, row.rank.rank()}] = row.rank;
    d.ranks[{row.job_id, row.attempt, row.rank.rank()}].clear_lost();  // Derived, as in SQLite.
  }
  for (const v1::Worker& w : batch.workers) d.workers[w.name()] = w;
  for (const std::string& name : batch.removed_workers) {
    d.workers.erase(name);
    d.marks.erase(name);
  }
  return absl::OkStatus();
}

absl::StatusOr<LoadedState> MemoryStore::Load() {
  Data& d = *data_;
  absl::MutexLock lock(&d.mu);
  LoadedState out;
  out.cluster_id = d.cluster_id;
  std::vector<const RowBatch::JobRow*> jobs;
  for (const auto& [id, row] : d.jobs) jobs.push_back(&row);
  std::sort(jobs.begin(), jobs.end(), [](const auto* a, const auto* b) { return a->seq < b->seq; });
  for (const RowBatch::JobRow* row : jobs) {
    StoredJob& sj = out.jobs.emplace_back();
    sj.job = row->job;
    sj.seq = row->seq;
    for (const auto& [key, attempt] : d.attempts) {
      if (key.first != row->job.id()) continue;
      v1::Attempt* a = sj.job.add_attempts();
      *a = attempt;
      for (const auto& [rkey, rank] : d.ranks) {
        if (std::get<0>(rkey) == key.first && std::get<1>(rkey) == key.second) {
          *a->add_ranks() = rank;
        }
      }
    }
    if (auto lines = d.logs.find(row->job.id()); lines != d.logs.end()) {
      for (const auto& [seq, line] : lines->second) sj.log_bytes += line.text().size();
    }
  }
  for (const auto& [name, w] : d.workers) {
    v1::Worker& stored = out.workers.emplace_back(w);
    stored.clear_jobs();  // Derived from the rank tables, never stored.
    stored.clear_free_slots();
    stored.clear_alive();
    stored.clear_version();
    stored.clear_quarantined_until_ms();
    stored.clear_quarantine_reason();
    for (v1::GpuDevice& g : *stored.mutable_gpu_devices()) {
      g.clear_job_id();
      g.clear_rank();
    }
  }
  for (const auto& [worker, mark] : d.marks) out.batch_marks.push_back(mark);
  return out;
}

absl::Status MemoryStore::AppendAll(const std::vector<JobOutput>& outputs,
                                    const std::vector<BatchMark>& marks) {
  Data& d = *data_;
  absl::MutexLock lock(&d.mu);
  if (!d.fail.ok()) return d.fail;
  for (const JobOutput& o : outputs) {
    auto& metrics = d.metrics[o.job_id];
    metrics.insert(metrics.end(), o.metrics.begin(), o.metrics.end());
    for (const v1::EpochSummary& e : o.epochs) d.epochs[o.job_id][{e.attempt(), e.epoch()}] = e;
    for (const v1::LogLine& l : o.logs) d.logs[o.job_id][l.seq()] = l;
  }
  for (const BatchMark& m : marks) {
    auto [it, added] = d.marks.try_emplace(m.worker, m);
    if (added) continue;
    if (it->second.incarnation == m.incarnation) {
      it->second.batch_seq = std::max(it->second.batch_seq, m.batch_seq);
    } else {
      it->second = m;  // A new incarnation numbers its batches again.
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::LogLine>> MemoryStore::ReadLogs(const std::string& job_id,
                                                               int64_t after_seq,
                                                               std::optional<int> rank,
                                                               int64_t limit, int64_t tail) {
  Data& d = *data_;
  absl::MutexLock lock(&d.mu);
  std::vector<v1::LogLine> matching;
  if (auto lines = d.logs.find(job_id); lines != d.logs.end()) {
    for (auto it = lines->second.upper_bound(after_seq); it != lines->second.end(); ++it) {
      if (!rank.has_value() || it->second.rank() == *rank) matching.push_back(it->second);
    }
  }
  const int64_t n = tail > 0 ? std::min(tail, limit) : limit;
  if (static_cast<int64_t>(matching.size()) <= n) return matching;
  if (tail > 0) return std::vector<v1::LogLine>(matching.end() - n, matching.end());
  return std::vector<v1::LogLine>(matching.begin(), matching.begin() + n);
}

absl::StatusOr<int64_t> MemoryStore::MaxLogSeq(const std::string& job_id) {
  Data& d = *data_;
  absl::MutexLock lock(&d.mu);
  auto lines = d.logs.find(job_id);
  if (lines == d.logs.end() || lines->second.empty()) return 0;
  return lines->second.rbegin()->first;
}

absl::StatusOr<std::vector<v1::RankMetrics>> MemoryStore::LatestMetrics(
    const std::string& job_id, int attempt) {
  Data& d = *data_;
  absl::MutexLock lock(&d.mu);
  std::map<int, v1::RankMetrics> latest;  // By rank.
  if (auto rows = d.metrics.find(job_id); rows != d.metrics.end()) {
    for (const v1::RankMetrics& m : rows->second) {
      if (m.attempt() != attempt) continue;
      auto [it, added] = latest.try_emplace(m.rank(), m);
      if (!added && m.global_step() > it->second.global_step()) it->second = m;
    }
  }
  std::vector<v1::RankMetrics> out;
  for (auto& [rank, m] : latest) out.push_back(m);
  return out;
}

absl::StatusOr<std::vector<v1::RankMetrics>> MemoryStore::MetricHistory(
    const std::string& job_id) {
  Data& d = *data_;
  absl::MutexLock lock(&d.mu);
  if (!d.fail_history.ok()) return d.fail_history;
  std::vector<v1::RankMetrics> out;
  if (auto rows = d.metrics.find(job_id); rows != d.metrics.end()) out = rows->second;
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return std::make_tuple(a.attempt(), a.global_step(), a.rank()) <
           std::make_tuple(b.attempt(), b.global_step(), b.rank());
  });
  return out;
}

absl::StatusOr<std::vector<v1::EpochSummary>> MemoryStore::Epochs(const std::string& job_id) {
  Data& d = *data_;
  absl::MutexLock lock(&d.mu);
  std::vector<v1::EpochSummary> out;
  if (auto rows = d.epochs.find(job_id); rows != d.epochs.end()) {
    for (const auto& [key, e] : rows->second) out.push_back(e);
  }
  return out;
}

absl::Status MemoryStore::EnforceRetention(const std::vector<std::string>& delete_ids) {
  Data& d = *data_;
  absl::MutexLock lock(&d.mu);
  if (!d.fail.ok()) return d.fail;
  for (const std::string& id : delete_ids) {
    d.jobs.erase(id);
    for (auto it = d.attempts.begin(); it != d.attempts.end();) {
      it = it->first.first == id ? d.attempts.erase(it) : std::next(it);
    }
    for (auto it = d.ranks.begin(); it != d.ranks.end();) {
      it = std::get<0>(it->first) == id ? d.ranks.erase(it) : std::next(it);
    }
    d.metrics.erase(id);
    d.epochs.erase(id);
    d.logs.erase(id);
  }
  for (auto& [id, rows] : d.metrics) {
    const int64_t over = static_cast<int64_t>(rows.size()) - retention_.max_metric_rows;
    if (over > 0) rows.erase(rows.begin(), rows.begin() + over);
  }
  for (auto& [id, lines] : d.logs) {
    while (static_cast<int64_t>(lines.size()) > retention_.max_log_lines) {
      lines.erase(lines.begin());
    }
  }
  return absl::OkStatus();
}

}  // namespace ddp::testing
