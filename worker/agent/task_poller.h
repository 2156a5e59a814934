// The agent's long poll for new tasks: one WaitForTasks call open at a time, naming
// the desired-state version of the last heartbeat reply. When the coordinator answers
// with another version (a job was placed on this worker, or ended), `on_news` runs and
// the agent heartbeats at once; the heartbeat reply carries the tasks. So a job starts
// within milliseconds of being placed instead of at the workers' next heartbeats,
// while the declarative protocol (repair by the next heartbeat) stays as it was.
//
// Lifecycle: the thread starts in the constructor and polls once the agent has told
// it a version (Known); it backs off 1 s after an error, and stops polling for good
// on UNIMPLEMENTED (a coordinator without long polls). Stop() (or the destructor)
// cancels the open call and joins.
#ifndef DDP_WORKER_AGENT_TASK_POLLER_H_
#define DDP_WORKER_AGENT_TASK_POLLER_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/agent/coordinator_client.h"

namespace ddp {

class TaskPoller {
 public:
  struct Options {
    std::string worker;
    std::string incarnation;
    absl::Duration poll = absl::Seconds(30);         // How long the coordinator may hold it.
    absl::Duration extra_deadline = absl::Seconds(2);  // On top, for the call's deadline.
    absl::Duration retry = absl::Seconds(1);         // After an error.
  };
  // `client` must outlive the poller and allow calls from another thread.
  TaskPoller(Options options, CoordinatorClient* client, std::function<void()> on_news);
  ~TaskPoller();
  TaskPoller(const TaskPoller&) = delete;
  TaskPoller& operator=(const TaskPoller&) = delete;

  // The version the last heartbeat reply carried.
  void Known(uint64_t version);
  void Stop();

  int64_t polls() const;  // Calls made (tests).
  // No call is open or will be until the next Known(): the last answer was news.
  bool waiting_for_version() const;
  // It stopped polling for good: the coordinator has no WaitForTasks.
  bool gave_up() const;

 private:
  void Loop();

  const Options options_;
  CoordinatorClient* const client_;
  const std::function<void()> on_news_;
  mutable absl::Mutex mu_;
  std::optional<uint64_t> known_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  int64_t polls_ ABSL_GUARDED_BY(mu_) = 0;
  bool gave_up_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace ddp

#endif  // DDP_WORKER_AGENT_TASK_POLLER_H_
