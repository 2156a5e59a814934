// The watchers' fan-out thread.
//
// When a job changes, the EventHub notifies every watcher's stream on the thread that
// made the change (a worker's ReportEvents or Heartbeat, the housekeeping Tick). Those
// notifications only queue work here; this one thread then does the pulls (reading
// the job from the coordinator, lines from the hub or SQLite) and starts the writes,
// so ingestion never waits on watchers however many there are.
//
// Lifecycle: the JobService owns it; the thread starts with it and is joined when it
// is destroyed, after the gRPC server has shut down (every stream detached). Closures
// still queued then are dropped: they belong to finished streams.
#ifndef DDP_COORDINATOR_RPC_FANOUT_H_
#define DDP_COORDINATOR_RPC_FANOUT_H_

#include <deque>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace ddp {

class FanOutExecutor {
 public:
  FanOutExecutor();
  ~FanOutExecutor();
  FanOutExecutor(const FanOutExecutor&) = delete;
  FanOutExecutor& operator=(const FanOutExecutor&) = delete;

  // Queues `fn` to run on the fan-out thread, after everything queued before it.
  // Never blocks on the work itself.
  void Post(std::function<void()> fn);
  // Whether the caller is the fan-out thread.
  bool OnFanOutThread() const { return std::this_thread::get_id() == thread_.get_id(); }

 private:
  void Loop();

  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_RPC_FANOUT_H_
