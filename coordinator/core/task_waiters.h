// Long polls for new tasks (WorkerService.WaitForTasks): a worker's agent keeps one
// call open, naming the version of its desired state that its last heartbeat reply
// carried; the call is answered as soon as that worker's desired state changes (an
// attempt formed on it, or ended), or at its deadline with the same version. The
// agent then heartbeats at once, and the heartbeat reply carries the tasks: the
// declarative protocol is unchanged, and a lost answer costs at most one heartbeat
// interval. Without it a new job waits for its workers' next heartbeats (0.5 s on
// average at the 1 s default).
//
// Threading: Add, Changed and Expire are called under the Coordinator's lock (lock
// order: the coordinator's, then this one's); every `done` runs on this class's own
// thread, outside both locks (Close and Add after it may be called without the
// coordinator's lock). Time is the caller's: Expire (from the coordinator's
// Tick) answers calls past their deadline. The destructor answers every open call
// (UNAVAILABLE) and joins.
#ifndef DDP_COORDINATOR_CORE_TASK_WAITERS_H_
#define DDP_COORDINATOR_CORE_TASK_WAITERS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ddp {

class TaskWaiters {
 public:
  // The version to answer with, or an error.
  using Done = std::function<void(absl::StatusOr<uint64_t>)>;

  TaskWaiters();
  ~TaskWaiters();
  TaskWaiters(const TaskWaiters&) = delete;
  TaskWaiters& operator=(const TaskWaiters&) = delete;

  // A call from `worker` whose desired state is at `version` now (the caller checked
  // that the agent does not know a newer one): answered on the next Changed for that
  // worker, or with `version` at `deadline`.
  void Add(const std::string& worker, uint64_t version, absl::Time deadline, Done done);
  // `worker`'s desired state is at `version` now: its open calls are answered.
  void Changed(const std::string& worker, uint64_t version);
  // Answers the calls whose deadline is before `now` with the version they named.
  void Expire(absl::Time now);

  // Answers every open call UNAVAILABLE, and any later one at once (the server is
  // shutting down: it waits for every call to be answered).
  void Close();

  int open() const;  // Calls not answered yet (tests, metrics).

 private:
  struct Waiter {
    std::string worker;
    uint64_t version;
    absl::Time deadline;
    Done done;
  };
  struct Answer {
    Done done;
    absl::StatusOr<uint64_t> result;
  };
  void Loop();
  // Moves waiter `id` to the answers with `result`.
  void AnswerLocked(uint64_t id, absl::StatusOr<uint64_t> result)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uint64_t, Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  // Indexes into waiters_: a change costs that worker's calls, a tick the calls due.
  std::multimap<std::string, uint64_t> by_worker_ ABSL_GUARDED_BY(mu_);
  std::multimap<absl::Time, uint64_t> by_deadline_ ABSL_GUARDED_BY(mu_);
  std::vector<Answer> answers_ ABSL_GUARDED_BY(mu_);  // To run on the thread.
  bool closed_ ABSL_GUARDED_BY(mu_) = false;  // Close(): answer new calls at once.
  bool stop_ ABSL_GUARDED_BY(mu_) = false;    // The destructor: the thread ends.
  std::thread thread_;
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_CORE_TASK_WAITERS_H_
