// A real ddp cluster on loopback for integration tests: one ddp-coordinator process
// (fast heartbeats) on a free port with a temporary state directory, N ddp-worker
// processes, and ddpctl run as users run it.
#ifndef DDP_TESTS_INTEGRATION_LOCAL_CLUSTER_H_
#define DDP_TESTS_INTEGRATION_LOCAL_CLUSTER_H_

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/process.h"
#include "common/rpc/credentials.h"
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
    std::string trainer;  // ddp-worker --trainer; empty: the real ddp-trainer.
    // The coordinator's --heartbeat-timeout: how long a worker may be silent, and how
    // long a restarted coordinator waits for the workers it recovered.
    absl::Duration heartbeat_timeout = absl::Seconds(2);
    // mTLS and tokens (scripts/make_certs.sh into <dir>/certs): the coordinator
    // serves TLS, verifies worker certificates and requires tokens; workers present
    // their certificates; ddpctl and the harness's own stub use the CA and a token.
    bool secure = false;
    std::vector<std::string> worker_flags;  // Extra ddp-worker flags (--allow-root ...).
    // Extra flags of one worker, by name (w1: {"--label", "pool=a"}).
    std::map<std::string, std::vector<std::string>> flags_of;
    std::vector<std::string> coordinator_flags;  // Extra ddp-coordinator flags.
    // Each worker serves Prometheus metrics on a port of its own (worker_metrics_port).
    bool worker_metrics = false;
    // Each ddp-worker runs in its own directory (<dir>/<name>, its --work-dir) rather
    // than the test's: a path under /proc/self/cwd then names a different directory on
    // each "node", so one node can lack what the others have.
    bool worker_cwd_own_dir = false;
    // Coordinators in standby: this many, each on a port of its own, all with --store
    // `store_uri` (a PostgreSQL database) instead of a state directory; workers and
    // ddpctl are given every address. Their stderr is collected (coordinator_log).
    std::string store_uri;
    int coordinators = 1;
  };
  static absl::StatusOr<std::unique_ptr<LocalCluster>> Start(const Options& options);
  ~LocalCluster();

  // HOST:PORT of the coordinator; with standbys, all of them comma-separated.
  std::string address() const;
  const std::string& dir() const { return dir_; }

  // ddpctl ARGS --coordinator <this cluster> (secure: with the CA and the `user` token).
  CtlResult Ctl(std::vector<std::string> args, absl::Duration timeout = absl::Minutes(3));
  // ddpctl as `role` (admin, user, viewer: that token; "" none) on a secure cluster.
  CtlResult CtlAs(const std::string& role, std::vector<std::string> args,
                  absl::Duration timeout = absl::Minutes(3));
  // <dir>/certs, where a secure cluster's certificates and tokens are.
  std::string certs() const { return dir_ + "/certs"; }
  // ddpctl in the background (watch, logs -f); stdout and stderr captured.
  absl::StatusOr<std::unique_ptr<Subprocess>> CtlAsync(std::vector<std::string> args);

  // With `history`, every stored step metric of every rank and attempt.
  absl::StatusOr<v1::Job> GetJob(const std::string& job_id, bool history = false);
  // Follows WatchJob until `pred` holds for an update (or the stream ends).
  absl::StatusOr<v1::Job> WaitFor(const std::string& job_id,
                                  const std::function<bool(const v1::Job&)>& pred,
                                  absl::Duration timeout = absl::Minutes(3));
  // Waits until `n` workers are registered and alive.
  absl::Status WaitForWorkers(int n, absl::Duration timeout = absl::Seconds(30));

  // SIGTERM (or `sig`) to the coordinator, waiting for it to exit.
  ExitStatus StopCoordinator(int sig);
  // Starts a coordinator again on the same port and state directory (with standbys:
  // every one not running), and waits until one serves.
  absl::Status StartCoordinator();

  // Coordinators in standby (Options::store_uri).
  int coordinators() const { return static_cast<int>(coordinators_.size()); }
  Subprocess* coordinator(int i) { return coordinators_[static_cast<size_t>(i)].get(); }
  int coordinator_port(int i) const { return ports_[static_cast<size_t>(i)]; }
  // What coordinator i has written to stderr so far.
  std::string coordinator_log(int i);
  // Waits until coordinator i's log holds `needle`.
  bool WaitForCoordinatorLog(int i, const std::string& needle, absl::Duration timeout);
  // Which coordinator leads: the one that answers calls (the harness's own calls then
  // go to it); polls until one does or `timeout` passes.
  absl::StatusOr<int> Leader(absl::Duration timeout = absl::Seconds(20));
  // Starts coordinator i again (after it exited).
  absl::Status StartCoordinatorAt(int i);
  Subprocess& worker(int i) { return *workers_[static_cast<size_t>(i)]; }
  // Starts one more worker, named `name` (the first ones are w1, w2, ...); it is
  // worker(n) for the n workers before it.
  absl::Status AddWorker(const std::string& name);
  // Waits until worker i's gRPC health service (grpc.health.v1.Health/Check on its
  // --health-listen port) answers SERVING (`serving`) or NOT_SERVING.
  int worker_metrics_port(int i) const { return metrics_ports_[static_cast<size_t>(i)]; }
  absl::Status WaitForWorkerHealth(int i, bool serving,
                                   absl::Duration timeout = absl::Seconds(30));

 private:
  LocalCluster() = default;
  absl::Status StartWorker(const std::string& name, int slots);
  std::vector<std::string> CtlFlags(const std::string& role) const;

  Options options_;
  std::string dir_;
  int port_ = 0;  // ports_[0].
  std::vector<int> ports_;
  std::unique_ptr<Subprocess> coordinator_;  // Without standbys.
  std::vector<std::unique_ptr<Subprocess>> coordinators_;  // With them.
  std::vector<std::unique_ptr<OutputCollector>> coordinator_logs_;
  ChannelSecurity security_;
  std::vector<std::unique_ptr<Subprocess>> workers_;
  std::vector<int> health_ports_;  // Each worker's --health-listen port.
  std::vector<int> metrics_ports_;  // Each worker's --metrics-listen port (0: none).
  std::unique_ptr<v1::JobService::Stub> stub_;
};

// `ddpctl watch`'s plain lines (its stdout a pipe) by rank: each rank's update lines
// (" rank R epoch E ...") and the epochs they name.
struct WatchLines {
  std::map<int, std::vector<std::string>> lines;
  std::map<int, std::set<std::string>> epochs;
};
WatchLines ParseWatch(const std::string& out);

// Copies examples/<name> into a scratch tree (with data/ linked) so its relative
// paths and checkpoints stay out of the source tree; returns the copy's path.
std::string StageExample(const std::string& name, const std::string& dir);

std::string SourceDir();
std::string BinDir();

}  // namespace ddp::testing

#endif  // DDP_TESTS_INTEGRATION_LOCAL_CLUSTER_H_
