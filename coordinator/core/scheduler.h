// The job queue and the scheduling pass: which queued job starts next, on which
// nodes. The pure rendezvous rules (eligibility, rank order, last call, the store's
// port) are in rendezvous.h; this file applies them to the queue.
//
// Policy (docs/scheduling.md): priorities, then FIFO, with gang scheduling. Jobs are
// considered by priority (higher first), in submission order within one. The first
// one that could run on this cluster but cannot start yet (fewer than `min` nodes
// with enough free slots, or gathering in its last-call window) holds the queue for
// the nodes it may use: no job behind it whose node_selector could share a node with
// it starts (jobs bound for disjoint pools go on), so a large job is never starved by
// small ones behind it. Two exceptions that cost the queue nothing: a job the cluster
// cannot hold at all (more nodes, or more slots per node, than it has alive) is
// marked unschedulable, with its reason, until the cluster grows; and a job whose
// owner is at its slot quota (--quota) waits with the quota as its reason.
//
// Preemption: a job that holds the queue and outranks running jobs takes their nodes
// when that lets it start: the lowest priorities first; within one, the job that would
// lose the least training (PreemptionLoss: the time since the checkpoint it would
// resume from), then the most recently started; as few as needed. Each victim moves
// as its `preemption` says (at its next checkpoint, or at once), back to the queue
// without spending a restart.
// Jobs that are never preempted, and jobs that would have to lose work (no periodic
// checkpoints, not `preemption: kill`), are not candidates.
//
// Event-driven: the Coordinator runs a pass only when something that can change its
// answer happened (a submit, a cancel, slots freed, a worker joined or left, a
// last-call window closed), never per heartbeat. A pass reads counts the registry
// keeps up to date (ClusterView), so deciding that nothing can start costs
// O(queued jobs), whatever the cluster's size; only forming an attempt lists nodes.
// The running jobs (for quotas and preemption) are listed at most once per pass, and
// only in a pass where quotas are set or a job waits for nodes: O(jobs) then.
#ifndef DDP_COORDINATOR_CORE_SCHEDULER_H_
#define DDP_COORDINATOR_CORE_SCHEDULER_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/core/job_lifecycle.h"
#include "coordinator/core/rendezvous.h"

namespace ddp {

// Free slots and free GPUs of a node.
struct NodeRoom {
  int slots = 0;
  int gpus = 0;
  // Ranks of `need` it could take: slots, or for a GPU need slots with a GPU each.
  int RanksFor(const NodeNeed& need) const { return need.gpus ? std::min(slots, gpus) : slots; }
};

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
  // `worker`'s free slots and free GPUs now, if it is a node the job may use at all
  // (alive, confirmed, schedulable, not quarantined, matching the selector, big
  // enough); nullopt otherwise. What preemption asks of the nodes lower-priority jobs
  // hold.
  virtual std::optional<NodeRoom> Room(const std::string& worker, const NodeNeed& need) const = 0;
};

// The queued jobs (Queued(): PENDING, or RENDEZVOUS still gathering) in the order
// they are served: priority (higher first), then submission. Holds pointers into the
// Coordinator's job map, which outlives it.
class JobQueue {
 public:
  using Key = std::pair<int64_t, int64_t>;  // (-priority, seq)
  static Key KeyOf(const JobRecord& job) { return {-int64_t{job.spec.priority}, job.seq}; }

  // Adds or removes the job to match Queued(job); returns whether that changed.
  bool Sync(JobRecord& job);
  void Remove(const JobRecord& job) { jobs_.erase(KeyOf(job)); }
  // 1-based among the PENDING jobs, in serving order; 0 if the job is not PENDING.
  int64_t Position(const JobRecord& job) const;
  const std::map<Key, JobRecord*>& jobs() const { return jobs_; }

 private:
  std::map<Key, JobRecord*> jobs_;
};

// Per-owner slot quotas (--quota OWNER=SLOTS, --quota-file): at most that many slots
// held at once by the active attempts of one owner's jobs. "*" is every owner not
// named. Owners are token names; an anonymous submitter ("") has no quota.
struct Quotas {
  std::map<std::string, int64_t> slots;
  bool empty() const { return slots.empty(); }
  // The owner's limit, or -1 for none.
  int64_t Limit(const std::string& owner) const;
};
// "alice=8", "*=4" (repeatable flag values, or a file's lines): INVALID_ARGUMENT naming
// the entry that is wrong.
absl::StatusOr<Quotas> ParseQuotas(const std::vector<std::string>& entries);

// A job holding nodes (an active attempt), as the pass sees it for quotas and
// preemption.
struct RunningJob {
  JobRecord* job;
  std::map<std::string, int> ranks_by_worker;  // Its ranks on each worker.
  int ranks = 0;
  // Already chosen to be preempted (at its next checkpoint): its nodes are counted
  // as coming free by the jobs that outrank it.
  bool preempting = false;
  // Its attempt was preempted and has ended; its trainers are stopping. Its nodes
  // are coming free, for any job.
  bool ended = false;
  std::map<std::string, int> gpus_by_worker;  // The GPUs its ranks hold (each once).
  // The training a preemption now would throw away (PreemptionLoss; zero for a job not
  // RUNNING yet): among equal priorities, the least is taken first.
  absl::Duration loss = absl::ZeroDuration();
};

// What the pass may ask of the facade beyond the queue and the cluster.
struct PassContext {
  const Quotas* quotas = nullptr;
  // Lists the jobs holding nodes; called at most once per pass, and only when quotas
  // are set or a job waits for nodes.
  std::function<std::vector<RunningJob>()> running;
};

struct Decision {
  enum class Kind {
    kUnschedulable,  // The cluster cannot hold it: skipped.
    kWait,           // Could run, cannot start yet: holds the queue.
    kLastCall,       // >= min nodes: gathering more until window_end; holds the queue.
    kForm,           // Start it on `nodes` (sorted by name, at most max).
    kPreempt,        // A running job to move off its nodes for `for_job` (see below).
  };
  Kind kind;
  JobRecord* job;
  std::string reason;  // kUnschedulable, kWait.
  absl::Time window_end;
  std::vector<NodeOffer> nodes;
  int eligible = 0;  // Nodes that could take it now.
  JobRecord* for_job = nullptr;  // kPreempt: the job that takes its nodes.
};

// One pass over the queue, in order: a kUnschedulable decision for each job the
// cluster cannot hold (wherever it is in the queue), a kWait for each job whose owner
// is at quota, and for the first other job a kWait, kLastCall (it holds the queue: no
// job behind it that could share its nodes starts) or kForm (the pass stops: the
// cluster changed; apply it and pass again). A job behind one that holds the queue,
// marked unschedulable before and able to fit now, gets a kWait that clears the mark.
// A waiting job that outranks running ones adds a kPreempt for each job whose nodes
// it needs and that is not already being preempted; a pass that forms nothing lists
// every job that should be preempted (`preempting` ones included, as kPreempt), so
// the facade can drop a mark no longer needed.
std::vector<Decision> SchedulePass(const JobQueue& queue, const ClusterView& cluster,
                                   absl::Time now, const PassContext& context = {});

}  // namespace ddp

#endif  // DDP_COORDINATOR_CORE_SCHEDULER_H_
