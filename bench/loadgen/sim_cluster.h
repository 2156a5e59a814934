// N simulated node agents speaking WorkerService to a real coordinator, through
// gRPC's callback API so that one process drives thousands of them.
//
// Each agent registers (with its own incarnation), then heartbeats at a fixed rate
// as ddp-worker does: every heartbeat reports its tasks, every reply says what it
// should run. With fake trainers, a task handed out is "started" (pids reported in
// the next heartbeat), runs for `train_time` while reporting a step event per rank
// every `step_every`, and exits 0; a task no longer wanted is reported stopped
// (exit 143) and then dropped, as the real agent does. The first `never_start`
// agents never report their trainers up (a hung start).
//
// Agents share `connections` channels (each its own TCP connection), or have one
// each. Heartbeats are unary calls, or (`stream`) beats on one stream per agent. A heartbeat is never sent while the agent's previous one is in flight: such
// a beat is counted as skipped, so the achieved rate is honest.
//
// Lifecycle: construct, RegisterAll(), Start() the driver threads, measure with
// BeginWindow()/EndWindow(), Stop() (waits for calls in flight) before destruction.
#ifndef DDP_BENCH_LOADGEN_SIM_CLUSTER_H_
#define DDP_BENCH_LOADGEN_SIM_CLUSTER_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <queue>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ddp/v1/worker_service.grpc.pb.h"

namespace ddp::loadgen {

struct SimOptions {
  std::string coordinator = "127.0.0.1:29400";
  int agents = 1000;
  int connections = 0;  // 0: one TCP connection per agent.
  double rate = 0;      // Heartbeats per agent per second; 0: the coordinator's interval.
  int slots = 1;
  std::string prefix = "sim";
  int register_in_flight = 256;
  int threads = 2;  // Driver threads issuing the calls (agents are split between them).
  bool fake_trainers = false;
  absl::Duration train_time = absl::Seconds(10);
  absl::Duration step_every = absl::ZeroDuration();  // Zero: no step events.
  int never_start = 0;
  // Heartbeats over one WorkerService.HeartbeatStream per agent (as ddp-worker sends
  // them) instead of a unary call each (the previous design, and old agents).
  bool stream = false;
  // Quiet heartbeats on the stream (decision 161; with `stream`): the coordinator is
  // asked to answer one beat in this many (answer_now), the first beat of a stream and
  // beats reporting something new; it answers the others only with news. 0: every beat
  // answered, as ddp-workers before quiet beats (and where the timeouts leave k = 1).
  int quiet_beats = 0;
  // The health port each agent names at Register (witness_port): ddp-worker serves one
  // by default, so the coordinator picks each agent's witnesses among the others as it
  // does for real workers (nothing listens there: simulated agents never ask them).
  // 0: none, as workers started without a health service.
  int witness_port = 29500;
};

// What happened in a measurement window.
struct WindowStats {
  double seconds = 0;
  int64_t sent = 0;
  int64_t ok = 0;
  int64_t errors = 0;
  int64_t skipped = 0;  // Beats not sent: the previous heartbeat was still in flight.
  int64_t unanswered = 0;  // Of `ok`: quiet beats written and not answered (no latency).
  int64_t news = 0;        // Answers no beat asked for (a changed desired state).
  std::map<std::string, int64_t> error_codes;
  int64_t reports_ok = 0;      // ReportEvents calls.
  int64_t reports_failed = 0;
  int64_t events = 0;          // Step events reported.
  std::vector<double> latency_ms;  // Of every heartbeat answered, sorted.

  double Percentile(double p) const;
};

// When each agent first held a task and first reported its trainers up.
struct TaskTimes {
  int agents_with_task = 0;
  absl::Time last_task_received = absl::InfinitePast();
  int agents_reported_up = 0;
  absl::Time last_up_sent = absl::InfinitePast();     // The heartbeat that carried it.
  absl::Time last_up_answered = absl::InfinitePast();
};

class SimCluster {
 public:
  explicit SimCluster(SimOptions options);
  ~SimCluster();

  // Registers every agent (at most register_in_flight at a time); each starts
  // heartbeating as soon as it is registered if the driver runs. Returns when all are
  // registered; `*last_join` is when the last one was answered.
  absl::Status RegisterAll(absl::Time* last_join);
  void Start();
  void Stop();

  void BeginWindow();
  WindowStats EndWindow();
  TaskTimes task_times();
  absl::Duration interval() const { return interval_; }
  int64_t reregistrations() const { return reregistrations_.load(); }

 private:
  struct FakeTask {
    enum class State { kStarting, kRunning, kExited };
    std::vector<int32_t> ranks;
    State state = State::kStarting;
    absl::Time started;
    int exit_code = 0;
    bool exit_reported = false;
    int64_t global_step = 0;
  };
  using TaskKey = std::pair<std::string, int>;
  class BeatStream;
  // What a beat in flight carries, for its answer.
  struct Beat {
    v1::HeartbeatRequest req;
    absl::Time sent;
    bool reports_up = false;
    std::vector<TaskKey> exits;
  };
  struct Agent {
    int index = 0;
    std::string name;
    std::string incarnation;
    v1::WorkerService::Stub* stub = nullptr;
    absl::Mutex mu;
    bool registered ABSL_GUARDED_BY(mu) = false;
    bool heartbeat_in_flight ABSL_GUARDED_BY(mu) = false;
    bool report_in_flight ABSL_GUARDED_BY(mu) = false;
    std::map<TaskKey, FakeTask> tasks ABSL_GUARDED_BY(mu);
    BeatStream* stream ABSL_GUARDED_BY(mu) = nullptr;  // Open (SimOptions::stream).
    uint64_t beat_seq ABSL_GUARDED_BY(mu) = 0;  // Quiet beats: the last one's.
    int64_t batch_seq ABSL_GUARDED_BY(mu) = 0;
    absl::Time first_task ABSL_GUARDED_BY(mu) = absl::InfinitePast();
    absl::Time up_sent ABSL_GUARDED_BY(mu) = absl::InfinitePast();
    absl::Time up_answered ABSL_GUARDED_BY(mu) = absl::InfinitePast();
  };
  using Due = std::pair<absl::Time, int>;  // (when, agent index)

  void Register(Agent& agent, std::function<void(grpc::Status)> done);
  void Loop(int shard);
  void SendHeartbeat(Agent& agent, absl::Time now);
  void SendReport(Agent& agent);
  // How a beat ended: answered (or failed), written and left unanswered (a quiet beat),
  // or not a beat at all but an answer no beat asked for (its desired state applies).
  enum class Outcome { kAnswered, kUnanswered, kNews };
  void OnHeartbeat(Agent& agent, const grpc::Status& status, const v1::HeartbeatResponse& resp,
                   absl::Time sent, bool reported_up, std::vector<TaskKey> exits_sent,
                   Outcome outcome = Outcome::kAnswered);
  void CallStarted();
  void CallDone();
  // The beat's answer arrived (or the call failed with `status`).
  void Answered(Agent& agent, const grpc::Status& status, const v1::HeartbeatResponse& resp,
                Beat beat, Outcome outcome = Outcome::kAnswered);

  const SimOptions options_;
  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  std::vector<std::unique_ptr<v1::WorkerService::Stub>> stubs_;
  std::vector<std::unique_ptr<Agent>> agents_;
  absl::Duration interval_ = absl::Seconds(1);
  absl::Duration rpc_deadline_ = absl::Milliseconds(500);

  absl::Mutex mu_;  // The driver's inbox and the window.
  // Per driver thread: agents registered, not yet scheduled.
  std::vector<std::vector<int>> joined_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool in_window_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time window_start_ ABSL_GUARDED_BY(mu_);
  WindowStats window_ ABSL_GUARDED_BY(mu_);
  int64_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t open_streams_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<int64_t> reregistrations_{0};
  std::vector<std::thread> drivers_;
};

}  // namespace ddp::loadgen

#endif  // DDP_BENCH_LOADGEN_SIM_CLUSTER_H_
