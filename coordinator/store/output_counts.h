// What a store knows of each job's output rows, counted as they are appended, so that
// retention trims by job id and row order without scanning whole tables (the SQLite
// and the PostgreSQL store both). Not thread-safe: the store's write lock guards it.
#ifndef DDP_COORDINATOR_STORE_OUTPUT_COUNTS_H_
#define DDP_COORDINATOR_STORE_OUTPUT_COUNTS_H_

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "coordinator/store/store.h"

namespace ddp::store {

class OutputCounts {
 public:
  struct Count {
    int64_t metric_rows = 0;  // Rows in `metrics`.
    int64_t log_floor = 0;    // Lines with seq <= log_floor are gone.
    int64_t log_top = 0;      // The highest seq stored.
  };
  // What to delete of one job's output to bring it within the bounds.
  struct Trim {
    std::string job_id;
    int64_t oldest_metric_rows = 0;  // Delete this many of its oldest step rows.
    int64_t log_floor = 0;           // Delete its lines with seq <= this (0: none).
    Count after;
  };

  // The job's count, or nullptr when the store has not read it from the database yet.
  Count* Find(const std::string& job_id) {
    auto it = counts_.find(job_id);
    return it == counts_.end() ? nullptr : &it->second;
  }
  Count* Add(const std::string& job_id, Count count) {
    return &counts_.insert_or_assign(job_id, count).first->second;
  }
  // After `output` was committed.
  static void Appended(Count* count, const JobOutput& output) {
    count->metric_rows += static_cast<int64_t>(output.metrics.size());
    for (const v1::LogLine& x : output.logs) count->log_top = std::max(count->log_top, x.seq());
  }

  // The jobs over a bound (those in `delete_ids` aside: they go whole).
  std::vector<Trim> Plan(const std::vector<std::string>& delete_ids,
                         const RetentionOptions& retention) const {
    std::vector<Trim> out;
    for (const auto& [id, c] : counts_) {
      if (std::find(delete_ids.begin(), delete_ids.end(), id) != delete_ids.end()) continue;
      Trim t{id, 0, 0, c};
      if (c.metric_rows > retention.max_metric_rows) {
        t.oldest_metric_rows = c.metric_rows - retention.max_metric_rows;
        t.after.metric_rows = retention.max_metric_rows;
      }
      if (c.log_top - c.log_floor > retention.max_log_lines) {
        t.log_floor = c.log_top - retention.max_log_lines;
        t.after.log_floor = t.log_floor;
      }
      if (t.oldest_metric_rows > 0 || t.log_floor > 0) out.push_back(std::move(t));
    }
    return out;
  }
  // After the plan's deletions (and `delete_ids`') were committed.
  void Done(const std::vector<std::string>& delete_ids, const std::vector<Trim>& trims) {
    for (const std::string& id : delete_ids) counts_.erase(id);
    for (const Trim& t : trims) counts_[t.job_id] = t.after;
  }

 private:
  std::map<std::string, Count> counts_;
};

}  // namespace ddp::store

#endif  // DDP_COORDINATOR_STORE_OUTPUT_COUNTS_H_
