// An in-memory Store (coordinator/store/store.h) for the facade's tests: the same
// behaviour as the SQLite StateStore (store_contract_test.cc runs the same checks on
// both), none of its I/O. Its data outlives the object: a new MemoryStore on the same
// Data is a coordinator restart on the same state. FailWrites makes every later
// write fail (a full disk) until cleared.
#ifndef DDP_TESTS_COORDINATOR_MEMORY_STORE_H_
#define DDP_TESTS_COORDINATOR_MEMORY_STORE_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/store/store.h"

namespace ddp::testing {

class MemoryStore final : public Store {
 public:
  struct Data;  // The stored rows, shared by the stores opened on them.

  explicit MemoryStore(RetentionOptions retention = {},
                       std::shared_ptr<Data> data = nullptr);
  std::shared_ptr<Data> data() const { return data_; }

  // Every Write and AppendAll from now on fails with `status` (OK: none does).
  void FailWrites(absl::Status status);
  // Every MetricHistory from now on fails with `status` (OK: none does): a store
  // that cannot be read (PostgreSQL away, a disk error).
  void FailHistoryReads(absl::Status status);

  const RetentionOptions& retention() const override { return retention_; }
  absl::Status Write(const RowBatch& batch) override;
  absl::StatusOr<LoadedState> Load() override;
  absl::Status AppendAll(const std::vector<JobOutput>& outputs,
                         const std::vector<BatchMark>& marks) override;
  absl::StatusOr<std::vector<v1::LogLine>> ReadLogs(const std::string& job_id, int64_t after_seq,
                                                    std::optional<int> rank, int64_t limit,
                                                    int64_t tail = 0) override;
  absl::StatusOr<int64_t> MaxLogSeq(const std::string& job_id) override;
  absl::StatusOr<std::vector<v1::RankMetrics>> LatestMetrics(const std::string& job_id,
                                                              int attempt) override;
  absl::StatusOr<std::vector<v1::RankMetrics>> MetricHistory(const std::string& job_id) override;
  absl::StatusOr<std::vector<v1::EpochSummary>> Epochs(const std::string& job_id) override;
  absl::Status EnforceRetention(const std::vector<std::string>& delete_ids) override;

 private:
  const RetentionOptions retention_;
  std::shared_ptr<Data> data_;
};

}  // namespace ddp::testing

#endif  // DDP_TESTS_COORDINATOR_MEMORY_STORE_H_
