// A real ddp cluster on loopback for integration tests: one ddp-coordinator process
// (fast heartbeats) on a free port with a temporary state directory, N ddp-worker
// processes, and ddpctl run as users run it.
#ifndef DDP_TESTS_INTEGRATION_LOCAL_CLUSTER_H_
#define DDP_TESTS_INTEGRATION_LOCAL_CLUSTER_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/process.h"
#include "ddp/v1/job_service.grpc.pb.h"

namespace ddp::testing {

struct CtlResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// Runs argv to completion, capturing both streams (killed after `timeout`).
CtlResult RunCapture(const std::vector<std::string>& argv, absl::Duration timeout);

// Reads a background process's output pipe on a thread of its own (so the process
// never blocks on a full pipe) and lets the test wait for text in it.
class OutputCollector {
 public:
  explicit OutputCollector(int fd);
  ~OutputCollector();  // Stops reading (at EOF, or at once if the pipe stays open).

  // Whether `needle` appeared within `timeout`.
  bool WaitFor(const std::string& needle, absl::Duration timeout = absl::Minutes(3));
  // Waits for EOF (the writer exited) up to `timeout`; returns everything read.
  std::string Finish(absl::Duration timeout = absl::Minutes(3));
  std::string text();

 private:
  const int fd_;
  absl::Mutex mu_;
  std::string text_ ABSL_GUARDED_BY(mu_);
  bool eof_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

class LocalCluster {
 public:
  struct Options {
    int workers = 2;
    int slots = 1;
  };
  static absl::StatusOr<std::unique_ptr<LocalCluster>> Start(const Options& options);
  ~LocalCluster();

  std::string address() const;
  const std::string& dir() const { return dir_; }

  // ddpctl ARGS --coordinator <this cluster>.
  CtlResult Ctl(std::vector<std::string> args, absl::Duration timeout = absl::Minutes(3));
  // ddpctl in the background (watch, logs -f); stdout and stderr captured.
  absl::StatusOr<std::unique_ptr<Subprocess>> CtlAsync(std::vector<std::string> args);

  absl::StatusOr<v1::Job> GetJob(const std::string& job_id);
  // Follows WatchJob until `pred` holds for an update (or the stream ends).
  absl::StatusOr<v1::Job> WaitFor(const std::string& job_id,
                                  const std::function<bool(const v1::Job&)>& pred,
                                  absl::Duration timeout = absl::Minutes(3));
  // Waits until `n` workers are registered and alive.
  absl::Status WaitForWorkers(int n, absl::Duration timeout = absl::Seconds(30));

  // SIGTERM (or `sig`) to the coordinator, waiting for it to exit.
  ExitStatus StopCoordinator(int sig);
  // Starts a coordinator again on the same port and state directory.
  absl::Status StartCoordinator();
  Subprocess& worker(int i) { return *workers_[static_cast<size_t>(i)]; }

 private:
  LocalCluster() = default;
  absl::Status StartWorker(int i, int slots);

  std::string dir_;
  int port_ = 0;
  std::unique_ptr<Subprocess> coordinator_;
  std::vector<std::unique_ptr<Subprocess>> workers_;
  std::unique_ptr<v1::JobService::Stub> stub_;
};

// Copies examples/<name> into a scratch tree (with data/ linked) so its relative
// paths and checkpoints stay out of the source tree; returns the copy's path.
std::string StageExample(const std::string& name, const std::string& dir);

std::string SourceDir();
std::string BinDir();

}  // namespace ddp::testing

#endif  // DDP_TESTS_INTEGRATION_LOCAL_CLUSTER_H_
