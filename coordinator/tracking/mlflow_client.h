// A client of an MLflow tracking server's REST API (/api/2.0/mlflow/...), over
// libcurl: the calls a job's run needs, nothing more. Not thread-safe: one owner
// (the tracker's thread) per client.
//
// Errors: UNAVAILABLE for what a retry may cure (no connection, a timeout, HTTP 429
// and 5xx); the server's own refusals by its error_code (RESOURCE_DOES_NOT_EXIST:
// NOT_FOUND, RESOURCE_ALREADY_EXISTS: ALREADY_EXISTS, others: INVALID_ARGUMENT), with
// its message. Every message names the server.
#ifndef DDP_COORDINATOR_TRACKING_MLFLOW_CLIENT_H_
#define DDP_COORDINATOR_TRACKING_MLFLOW_CLIENT_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "google/protobuf/struct.pb.h"

namespace ddp::mlflow {

struct Metric {
  std::string key;
  double value = 0;
  int64_t timestamp_ms = 0;
  int64_t step = 0;
};
using KeyValues = std::vector<std::pair<std::string, std::string>>;

// MLflow's limits on one log-batch call.
inline constexpr size_t kMaxBatchMetrics = 1000;
inline constexpr size_t kMaxBatchParams = 100;
inline constexpr size_t kMaxBatchTags = 100;

class Client {
 public:
  // `base_uri`: http(s)://HOST:PORT[/PATH], the tracking server's address.
  Client(std::string base_uri, absl::Duration timeout);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // The experiment's id, made if there is none by that name.
  absl::StatusOr<std::string> ExperimentId(const std::string& name);
  struct FoundRun {
    std::string run_id;  // "" when there is none.
    std::string status;  // RUNNING, FINISHED, FAILED, KILLED (SCHEDULED).
  };
  // The newest run of the experiment tagged `key` = `value`.
  absl::StatusOr<FoundRun> FindRun(const std::string& experiment_id, const std::string& key,
                                   const std::string& value);
  // How many points the run holds under metric `key` (metrics/get-history, page by page).
  absl::StatusOr<int64_t> MetricCount(const std::string& run_id, const std::string& key);
  absl::StatusOr<std::string> CreateRun(const std::string& experiment_id,
                                        const std::string& run_name, int64_t start_ms,
                                        const KeyValues& tags);
  // At most kMaxBatch* of each.
  absl::Status LogBatch(const std::string& run_id, const std::vector<Metric>& metrics,
                        const KeyValues& params, const KeyValues& tags);
  // status: FINISHED, FAILED or KILLED.
  absl::Status EndRun(const std::string& run_id, const std::string& status, int64_t end_ms);

  const std::string& uri() const { return base_; }

 private:
  // `text` escaped for a URL's query (libcurl's).
  absl::StatusOr<std::string> Escape(const std::string& text);
  // `body` empty: GET. The answer's JSON object.
  absl::StatusOr<google::protobuf::Struct> Call(const std::string& path, const std::string& body);

  const std::string base_;
  const absl::Duration timeout_;
  void* curl_ = nullptr;  // CURL*, reused so its connection is kept alive.
};

}  // namespace ddp::mlflow

#endif  // DDP_COORDINATOR_TRACKING_MLFLOW_CLIENT_H_
