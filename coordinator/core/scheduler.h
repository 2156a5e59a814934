// The job queue and the scheduling pass: which queued job starts next, on which
// nodes. The pure rendezvous rules (eligibility, rank order, last call, the store's
// port) are in rendezvous.h; this file applies them to the queue.
//
// Policy: FIFO with gang scheduling. Jobs are considered in submission order; the
// first one that could run on this cluster but cannot start yet (fewer than `min`
// nodes with enough free slots, or gathering in its last-call window) holds the
// queue, so a large job is never starved by small ones behind it. The exception is a
// job the cluster cannot hold at all (more nodes, or more slots per node, than it has
// alive): that one is marked unschedulable, with its reason, and skipped, until
// the cluster grows.
//
// Event-driven: the Coordinator runs a pass only when something that can change its
// answer happened (a submit, a cancel, slots freed, a worker joined or left, a
// last-call window closed), never per heartbeat. A pass reads counts the registry
// keeps up to date (ClusterView), so deciding that nothing can start costs
// O(queued jobs), whatever the cluster's size; only forming an attempt lists nodes.
#ifndef DDP_COORDINATOR_CORE_SCHEDULER_H_
#define DDP_COORDINATOR_CORE_SCHEDULER_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "coordinator/core/job_lifecycle.h"
#include "coordinator/core/rendezvous.h"

namespace ddp {

// The cluster as the scheduler sees it (WorkerRegistry in production, a fake in
// tests), for one node of a job (NodeNeed: its ranks, 0 for auto; whether each needs
// a GPU of its own).
class ClusterView {
 public:
  virtual ~ClusterView() = default;
  // Alive nodes big enough for one node of the job (slots, and GPUs if it needs
  // them), busy or not.
  virtual int CapableNodes(const NodeNeed& need) const = 0;
  // Nodes that can take one node of the job now: alive, confirmed since the last
  // coordinator start, schedulable, with enough free slots (and free GPUs).
  virtual int EligibleNodes(const NodeNeed& need) const = 0;
  // Those nodes, sorted by worker name.
  virtual std::vector<NodeOffer> Offers(const NodeNeed& need) const = 0;
};

// The queued jobs (Queued(): PENDING, or RENDEZVOUS still gathering) in submission
// order. Holds pointers into the Coordinator's job map, which outlives it.
class JobQueue {
 public:
  // Adds or removes the job to match Queued(job); returns whether that changed.
  bool Sync(JobRecord& job);
  void Remove(const JobRecord& job) { jobs_.erase(job.seq); }
  // 1-based among the PENDING jobs; 0 if the job is not PENDING.
  int64_t Position(const JobRecord& job) const;
  const std::map<int64_t, JobRecord*>& jobs() const { return jobs_; }

 private:
  std::map<int64_t, JobRecord*> jobs_;  // By seq.
};

struct Decision {
  enum class Kind {
    kUnschedulable,  // The cluster cannot hold it: skipped.
    kWait,           // Could run, cannot start yet: holds the queue.
    kLastCall,       // >= min nodes: gathering more until window_end; holds the queue.
    kForm,           // Start it on `nodes` (sorted by name, at most max).
  };
  Kind kind;
  JobRecord* job;
  std::string reason;  // kUnschedulable, kWait.
  absl::Time window_end;
  std::vector<NodeOffer> nodes;
  int eligible = 0;  // Nodes that could take it now.
};

// One pass over the queue, in order: a kUnschedulable decision for each job the
// cluster cannot hold (wherever it is in the queue), and for the first other job a
// kWait, kLastCall (it holds the queue: no job behind it starts) or kForm (the pass
// stops: the cluster changed; apply it and pass again). A job behind the one that
// holds the queue, marked unschedulable before and able to fit now, gets a kWait
// that clears the mark.

std::vector<Decision> SchedulePass(const JobQueue& queue, const ClusterView& cluster,
                                   absl::Time now);

}  // namespace ddp

#endif  // DDP_COORDINATOR_CORE_SCHEDULER_H_
