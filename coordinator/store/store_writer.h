// Group commit of the coordinator's row changes, off the coordinator's lock.
//
// The coordinator stages the rows a change touched (PutJob, PutAttempt, PutRank,
// PutWorker: cheap copies, made under its lock) and goes on; one writer thread takes
// everything staged so far and writes it in one transaction, while new rows gather
// for the next. So a burst of a thousand rank changes costs one commit, and nothing
// waits on SQLite while holding the lock that heartbeats take.
//
// Every Put returns a ticket (staged rows are numbered 1, 2, 3, ...). A caller that
// must not answer before its rows are durable waits for its ticket: Wait() blocks
// (Submit, Cancel), AfterCommit() runs a callback on the writer thread once the
// commit is done (a heartbeat reply that hands out a new attempt's tasks). Rows are
// written in the order they were staged, so a later copy of a row wins.
//
// A failed commit is logged and retried (with backoff, the rows merged back in front
// of newer ones) until it succeeds, except rows staged with `creation` set: those
// belong to a Submit that gets the error and drops the job, so they are discarded.
// Waiters get the failed commit's status, retried rows or not.
//
// Retention runs here too (EnforceRetention after the rows staged before it), so a
// deleted job's last rows can never land after its deletion. If those rows fail to
// commit, retention does not run and its callback gets their error.
//
// Lifecycle: the thread starts in the constructor; the destructor writes what is
// staged (one attempt), answers every waiter and joins.
#ifndef DDP_COORDINATOR_STORE_STORE_WRITER_H_
#define DDP_COORDINATOR_STORE_STORE_WRITER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/store/store.h"

namespace ddp {

class StoreWriter {
 public:
  using Ticket = uint64_t;
  using Callback = std::function<void(const absl::Status&)>;

  struct Options {
    absl::Duration retry_min = absl::Milliseconds(100);  // After a failed commit,
    absl::Duration retry_max = absl::Seconds(5);         // doubling up to this.
  };

  // What the writer has done (monitoring and tests).
  struct Stats {
    int64_t rows_staged = 0;
    int64_t rows_written = 0;  // Committed (a retried row counts once per commit).
    int64_t commits = 0;
    int64_t failed_commits = 0;
    // The last commit failed and its rows wait for a retry: the store cannot write
    // (the coordinator's health turns NOT_SERVING).
    bool failing = false;
  };

  explicit StoreWriter(Store* store) : StoreWriter(store, Options()) {}
  StoreWriter(Store* store, Options options);
  ~StoreWriter();
  StoreWriter(const StoreWriter&) = delete;
  StoreWriter& operator=(const StoreWriter&) = delete;

  // The job's row (not its attempts). `creation`: the job is being submitted and
  // exists only if this commit succeeds.
  Ticket PutJob(const v1::Job& job, int64_t seq, bool creation = false);
  // The attempt's row (not its ranks).
  Ticket PutAttempt(const std::string& job_id, const v1::Attempt& attempt);
  Ticket PutRank(const std::string& job_id, int attempt, const v1::RankAssignment& rank);
  Ticket PutWorker(const v1::Worker& worker);
  // Deletes the worker's row (RemoveWorker), dropping any upsert of it still staged.
  Ticket RemoveWorker(const std::string& name);
  // Deletes `job_ids` whole and trims every job's output to its bounds, after the
  // rows staged before; `done` gets the outcome on the writer thread. Rows of these
  // jobs still staged are dropped.
  void EnforceRetention(std::vector<std::string> job_ids, Callback done);

  // The ticket of the last row staged (0: none yet).
  Ticket last_staged();
  // Runs `fn` with the status of the commit that covered `ticket`, once it is done:
  // on the writer thread, or at once on the caller's if it is done already.
  void AfterCommit(Ticket ticket, Callback fn);
  // Blocks until `ticket` is committed; the commit's status.
  absl::Status Wait(Ticket ticket);
  // Wait(last_staged()).
  absl::Status Flush() { return Wait(last_staged()); }

  Stats stats();

 private:
  struct Pending {
    RowBatch rows;
    std::vector<bool> job_is_creation;  // Parallel to rows.jobs.
    std::vector<std::string> delete_ids;
    std::vector<Callback> retention_done;
    bool retention = false;
  };

  void Loop();
  Ticket StageLocked(size_t rows) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The status of the commit that covered `ticket`, if it is done.
  std::optional<absl::Status> OutcomeLocked(Ticket ticket) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Store* const store_;
  const Options options_;
  absl::Mutex mu_;
  Pending pending_ ABSL_GUARDED_BY(mu_);
  Ticket staged_ ABSL_GUARDED_BY(mu_) = 0;     // Last ticket handed out.
  Ticket done_ ABSL_GUARDED_BY(mu_) = 0;       // Every ticket <= done_ has an outcome.
  // Outcomes of recent commits: (last ticket covered, status), oldest first.
  std::deque<std::pair<Ticket, absl::Status>> outcomes_ ABSL_GUARDED_BY(mu_);
  std::multimap<Ticket, Callback> waiters_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  Stats stats_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_STORE_STORE_WRITER_H_
