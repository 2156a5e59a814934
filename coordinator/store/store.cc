#include "coordinator/store/store.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ddp {

absl::Status CheckSchemaVersion(int64_t stored, const std::string& where) {
  if (stored <= kSchemaVersion) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      where, " has schema version ", stored, ", newer than this ddp-coordinator's (",
      kSchemaVersion, "): a newer release wrote it; run that release (or restore the backup "
      "taken before the upgrade). Nothing was changed"));
}

std::string NewClusterId() {
  absl::BitGen gen;
  return absl::StrFormat("%016x%016x", absl::Uniform<uint64_t>(gen),
                         absl::Uniform<uint64_t>(gen));
}

absl::Status ValidateRetention(const RetentionOptions& r) {
  for (auto [flag, value] : {std::pair{"--retain-jobs", r.retain_jobs},
                             std::pair{"--max-log-lines", r.max_log_lines},
                             std::pair{"--max-metric-rows", r.max_metric_rows}}) {
    if (value < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": must be >= 1 (got ", value, "); it bounds what is kept"));
    }
  }
  return absl::OkStatus();
}

std::vector<std::string> JobsPastRetention(std::vector<FinishedJob> finished,
                                           int64_t retain_jobs) {
  std::sort(finished.begin(), finished.end(), [](const FinishedJob& a, const FinishedJob& b) {
    return std::tie(a.end_ms, a.seq) < std::tie(b.end_ms, b.seq);
  });
  std::vector<std::string> out;
  const int64_t drop = static_cast<int64_t>(finished.size()) - std::max<int64_t>(retain_jobs, 0);
  for (int64_t i = 0; i < drop; ++i) out.push_back(finished[static_cast<size_t>(i)].id);
  return out;
}

bool NothingToAppend(const std::vector<JobOutput>& outputs, const std::vector<BatchMark>& marks) {
  if (!marks.empty()) return false;
  for (const JobOutput& o : outputs) {
    if (!o.metrics.empty() || !o.epochs.empty() || !o.logs.empty()) return false;
  }
  return true;
}

std::vector<StoredJob> AssembleJobs(std::vector<RowBatch::JobRow> jobs,
                                    std::vector<RowBatch::AttemptRow> attempts,
                                    std::vector<RowBatch::RankRow> ranks) {
  std::vector<StoredJob> out;
  std::map<std::string, size_t> index;
  for (RowBatch::JobRow& row : jobs) {
    index[row.job.id()] = out.size();
    StoredJob& sj = out.emplace_back();
    sj.job = std::move(row.job);
    sj.seq = row.seq;
  }
  for (RowBatch::AttemptRow& row : attempts) {
    auto it = index.find(row.job_id);
    if (it != index.end()) *out[it->second].job.add_attempts() = std::move(row.attempt);
  }
  for (RowBatch::RankRow& row : ranks) {
    auto it = index.find(row.job_id);
    if (it == index.end()) continue;
    for (v1::Attempt& at : *out[it->second].job.mutable_attempts()) {
      if (at.number() == row.attempt) *at.add_ranks() = std::move(row.rank);
    }
  }
  return out;
}

absl::Status Store::SaveJob(const v1::Job& job, int64_t seq) {
  RowBatch batch;
  batch.jobs.push_back({job, seq});
  for (const v1::Attempt& at : job.attempts()) {
    batch.attempts.push_back({job.id(), at});
    for (const v1::RankAssignment& rk : at.ranks()) {
      batch.ranks.push_back({job.id(), at.number(), rk});
    }
  }
  return Write(batch);
}

absl::Status Store::SaveWorker(const v1::Worker& w) {
  RowBatch batch;
  batch.workers.push_back(w);
  return Write(batch);
}

absl::Status Store::Append(const std::string& job_id,
                                const std::vector<v1::RankMetrics>& metrics,
                                const std::vector<v1::EpochSummary>& epochs,
                                const std::vector<v1::LogLine>& logs) {
  return AppendAll({JobOutput{job_id, metrics, epochs, logs}}, {});
}

}  // namespace ddp
