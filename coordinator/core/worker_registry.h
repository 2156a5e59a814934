// The worker registry: registration, incarnations, liveness, slots and the tasks on
// each worker (handed out, reported, desired).
//
// A worker's life: Register (or Restore after a coordinator restart: alive but
// unconfirmed until it checks in) -> heartbeats -> lost when silent past the heartbeat
// timeout (Expire) -> back on its next heartbeat. A new incarnation under a known name
// is a restarted agent: what it ran is gone.
//
// Costs: a heartbeat touches only its worker's record. Liveness expiry pops a
// deadline heap (one entry per worker, re-armed lazily when it is found to have
// heard from its worker since), so a housekeeping tick costs O(workers due), not
// O(workers). Free slots are recomputed from the worker's own tasks whenever they
// change, and the registry keeps counts of nodes by size and by free slots, so the
// scheduler asks "how many nodes could take 4 slots now?" in O(distinct sizes).
//
// Not thread-safe: the Coordinator holds its lock around every call.
#ifndef DDP_COORDINATOR_CORE_WORKER_REGISTRY_H_
#define DDP_COORDINATOR_CORE_WORKER_REGISTRY_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <queue>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/core/scheduler.h"
#include "ddp/v1/job_service.pb.h"
#include "ddp/v1/worker_service.pb.h"
#include "google/protobuf/repeated_field.h"

namespace ddp {

using TaskKey = std::pair<std::string, int>;  // (job id, attempt number)

// One active attempt's ranks on a worker: part of the worker's desired state.
struct AssignedTask {
  std::vector<int32_t> ranks;  // Global ranks of LOCAL_RANK 0, 1, ...
  int32_t group_rank = 0;
  std::vector<std::string> gpu_uuids;  // Per local rank; empty for a CPU task.
};

// A node that could not run trainers (a start error with node_fault, or a rank that
// exited with kExitNodeFault) is kept out of new attempts for a while: 30 s after
// its first fault, doubling with each fault in a row up to 10 min; a trainer that
// exits 0 there ends the streak. Kept apart from cordon/drain (an operator's
// choice): a quarantine lifts by itself. Not persisted: a restarted coordinator
// forgets it (the next fault quarantines the node again).
struct NodeQuarantine {
  absl::Time until = absl::InfinitePast();  // Quarantined while now < until.
  std::string reason;
  int streak = 0;  // Node faults in a row.
  TaskKey last_fault;  // The attempt that caused the last one (counted once).
};

struct WorkerRecord {
  v1::Worker info;  // As registered (name, incarnation, address, slots, gpus, times).
  absl::Time last_seen;
  // Not lost before this (a recovered worker's grace to check in).
  absl::Time check_in_by = absl::InfinitePast();
  bool alive = true;
  bool confirmed = true;  // False after a coordinator restart until it checks in.
  // Heartbeat rate scaling (decision 162): the factor the heartbeat timeout is stretched
  // by for this worker (lost `timeout * beat_stretch` after its last heartbeat): the
  // larger of the interval it says it beats at and the one it was told last, in whole
  // base intervals. `registered_stretch`: what Register told it (assumed for agents
  // that do not say, older than the field).
  int beat_stretch = 1;
  int registered_stretch = 1;
  // Whether new attempts may be placed here is info.maintenance (an operator's cordon
  // or drain, WorkerRegistry::SetMaintenance): a worker that is not schedulable keeps
  // its trainers, takes no new ones and does not count as capacity.
  NodeQuarantine quarantine;  // Set by WorkerRegistry::Quarantine; see there.
  // The agent said it is leaving (HeartbeatRequest.leaving): no capacity any more,
  // until it leaves (or a new incarnation registers).
  bool leaving = false;
  // It got SIGTERM (HeartbeatRequest.stopping_grace_ms): its attempts were told.
  bool stopping = false;
  std::vector<int32_t> free_ports;  // From its last heartbeat.
  std::vector<v1::GpuUsage> gpu_usage;  // Its GPUs per NVML, from its last heartbeat.
  // The sample of GPU `uuid`, or null.
  const v1::GpuUsage* GpuUsageOf(const std::string& uuid) const {
    for (const v1::GpuUsage& u : gpu_usage) {
      if (u.uuid() == uuid) return &u;
    }
    return nullptr;
  }
  std::map<TaskKey, v1::TaskStatus> reported;  // Its last heartbeat's tasks.
  // Tasks handed to it in its last heartbeat reply that it had not reported (with
  // their rank counts): their trainers may be starting whatever became of their
  // attempts, so their slots stay busy until the next heartbeat shows the task
  // (then `reported` accounts for it: busy until every rank exited) or not (the
  // reply was lost). Cleared when the agent restarts (its trainers died with it).
  std::map<TaskKey, int> dispatched;
  std::map<TaskKey, AssignedTask> assigned;  // Its desired state.
  // Bumped whenever `assigned` changes: what a heartbeat that waits for new tasks
  // (a long poll) would wait on.
  uint64_t desired_version = 0;
  int64_t last_batch_seq = 0;  // ReportEvents: the last batch applied (this incarnation).
  int free_slots = 0;          // slots minus busy; kept by the registry.
  // GPUs held per task (as assigned, by local rank) until its trainers are gone, like
  // slots: assigned, handed out, or reported with a rank still running.
  std::map<TaskKey, AssignedTask> gpu_holders;
  std::vector<std::string> free_gpus;  // UUIDs no task holds, in index order.

  // The registry's own bookkeeping: how the worker is counted right now.
  struct Counted {
    bool alive = false;
    bool capable = false;    // Alive and schedulable: counts as capacity.
    bool eligible = false;   // Capable, confirmed, not quarantined: may take trainers now.
    bool quarantined = false;
    int slots = 0;
    int free = 0;
    int gpus = 0;            // GPUs with UUIDs (what GPU jobs can be given).
    int free_gpus = 0;       // min(free slots, free GPUs): ranks a GPU job can get now.
    bool busy = false;       // Has assigned tasks.
    bool cordoned = false;   // Cordoned or draining (alive or not).
  };
  Counted counted;
  bool armed = false;  // Has an entry in the deadline heap.
};

class WorkerRegistry final : public ClusterView {
 public:
  explicit WorkerRegistry(absl::Duration heartbeat_timeout) : timeout_(heartbeat_timeout) {}

  // Live workers (what heartbeat rate scaling divides by).
  int alive() const { return alive_; }

  struct Registration {
    WorkerRecord* worker;
    bool is_new = false;     // A name never seen.
    bool restarted = false;  // A new incarnation of a known name: its trainers are gone.
  };
  // A validated request (name, incarnation, address, slots >= 1).
  Registration Register(const v1::RegisterRequest& request, absl::Time now);
  // A worker loaded from the store: alive but unconfirmed, with `grace` from `now`
  // to check in (at least one heartbeat timeout).
  void Restore(const v1::Worker& info, absl::Time now, absl::Duration grace);

  // NOT_FOUND (register first), FAILED_PRECONDITION (stale incarnation).
  absl::StatusOr<WorkerRecord*> Check(const std::string& name, const std::string& incarnation);
  WorkerRecord* Find(const std::string& name);
  const WorkerRecord* Find(const std::string& name) const;

  // A heartbeat from `worker`. Returns whether it came back (was lost, or not yet
  // confirmed since a coordinator restart): the cluster grew.
  bool Heartbeat(WorkerRecord& worker, absl::Time now);
  // Workers silent past the heartbeat timeout, now marked lost (their reported tasks
  // forgotten: their trainers died with them, or will be told to stop).
  std::vector<std::string> Expire(absl::Time now);

  struct Reported {
    std::vector<const v1::TaskStatus*> changed;  // New or changed since the last report.
    bool counts_changed = false;                 // Free slots or eligibility moved.
  };
  // The tasks a heartbeat reports: replaces the last report and settles what was
  // dispatched. A report identical to the last one, with nothing dispatched, costs
  // a comparison and changes nothing.
  Reported Report(WorkerRecord& worker,
                  const google::protobuf::RepeatedPtrField<v1::TaskStatus>& tasks);
  // A task handed out in a heartbeat reply that the worker had not reported.
  void Dispatch(WorkerRecord& worker, const TaskKey& key, int ranks);
  // An active attempt's ranks on `worker` join (Assign) or leave (Unassign) its
  // desired state. Both return whether what the scheduler reads changed.
  bool Assign(const std::string& worker, const TaskKey& key, AssignedTask task);
  bool Unassign(const std::string& worker, const TaskKey& key);

  // Whether rank `rank` of `key` on `worker` may still have a live trainer: handed
  // out and not yet reported, or reported and not exited (for a worker not
  // confirmed since a restart: as its rank table last showed).
  bool RankMayLive(const WorkerRecord& worker, const TaskKey& key,
                   const v1::RankAssignment& rank) const;

  // The quarantine's bounds (NodeQuarantine): the first lasts kQuarantineFirst, each
  // fault in a row doubles it, up to kQuarantineMax.
  static constexpr absl::Duration kQuarantineFirst = absl::Seconds(30);
  static constexpr absl::Duration kQuarantineMax = absl::Minutes(10);
  // A node fault on `worker` while running `key`: quarantines it (a quarantined node
  // stays capable, so queued jobs wait rather than turn unschedulable, but is not
  // eligible). Returns how long, or zero when `key` already counted.
  absl::Duration Quarantine(WorkerRecord& worker, const TaskKey& key,
                            const std::string& reason, absl::Time now);
  // A trainer exited 0 on `worker`: its streak of node faults ends.
  void NodeWorked(WorkerRecord& worker) { worker.quarantine.streak = 0; }
  // Quarantines over by `now`, lifted; returns their workers' names.
  std::vector<std::string> LiftQuarantines(absl::Time now);
  bool Quarantined(const WorkerRecord& worker) const { return worker.counted.quarantined; }

  // An operator's cordon, drain or uncordon (v1::WorkerMaintenance): recorded in the
  // worker's info (with `policy` while draining, who and when), which the store keeps.
  // Returns whether what the scheduler reads changed.
  bool SetMaintenance(WorkerRecord& worker, v1::WorkerMaintenance maintenance,
                      v1::DrainPolicy policy, const std::string& by, absl::Time now);
  // Workers draining with DRAIN_AT_CHECKPOINT: whose jobs move after a checkpoint.
  const std::set<std::string>& draining_at_checkpoint() const { return draining_at_checkpoint_; }
  // The agent is leaving (HeartbeatRequest.leaving): takes no new ranks. Returns
  // whether what the scheduler reads changed.
  bool SetLeaving(WorkerRecord& worker);
  // Forgets `name` (RemoveWorker). Its tasks must be unassigned first.
  void Remove(const std::string& name);

  // ClusterView. A need with a node_selector counts only the workers whose labels
  // match it, found through an index by label: O(workers carrying the rarest label of
  // the selector), not O(workers).
  int CapableNodes(const NodeNeed& need) const override;
  int EligibleNodes(const NodeNeed& need) const override;
  std::vector<NodeOffer> Offers(const NodeNeed& need) const override;
  std::optional<NodeRoom> Room(const std::string& worker, const NodeNeed& need) const override;

  // Fills `view`'s gpu_devices (the worker's GPUs) with the job and rank holding each.
  void ShowGpuHolders(const WorkerRecord& worker, v1::Worker* view) const;

  v1::WorkerSummary Summary() const;
  const std::map<std::string, WorkerRecord>& workers() const { return workers_; }

  // HOST:PORT of the health services of up to `n` other live workers that serve one
  // (witness_port), the next ones after `worker` in name order, wrapping around: each
  // worker asks different peers, and each peer is asked by about n workers, so a
  // cluster of 10,000 costs none of them more than a few answers. It looks at most
  // kWitnessScan neighbours (every heartbeat asks): where most workers serve no health
  // service, fewer than n are named rather than the whole registry walked.
  static constexpr size_t kWitnessScan = 64;
  std::vector<std::string> Witnesses(const std::string& worker, int n) const;

 private:
  // Recomputes the worker's free slots and its place in the counts; returns whether
  // what the scheduler reads changed (capacity, eligibility, free slots).
  bool Recount(WorkerRecord& worker);
  void Count(const WorkerRecord::Counted& c, int sign);
  void Arm(WorkerRecord& worker);
  // The label index: (key, value) -> names of the workers carrying it.
  void IndexLabels(const v1::Worker& info, bool add);
  // The workers that may match `need`'s selector (null: no selector, every worker).
  const std::set<std::string>* SelectorCandidates(const NodeNeed& need) const;
  bool Fits(const WorkerRecord& worker, const NodeNeed& need, bool now) const;
  // The workers that Fit `need` (among its selector's candidates, if any).
  int CountFitting(const NodeNeed& need, bool now) const;

  const absl::Duration timeout_;
  std::map<std::string, WorkerRecord> workers_;
  using Deadline = std::pair<absl::Time, std::string>;
  std::priority_queue<Deadline, std::vector<Deadline>, std::greater<Deadline>> deadlines_;
  // Sums over a map from the first key >= n.
  static int AtLeast(const std::map<int, int>& counts, int n);

  std::map<std::pair<std::string, std::string>, std::set<std::string>> by_label_;
  std::set<Deadline> quarantine_ends_;  // (until, worker) of quarantined workers.
  std::set<std::string> draining_at_checkpoint_;
  int cordoned_ = 0;  // Registered workers cordoned or draining.
  std::map<int, int> capable_by_slots_;  // Slots -> capable workers with that many.
  std::map<int, int> eligible_by_free_;  // Free slots -> eligible workers.
  std::map<int, int> capable_by_gpus_;   // GPUs -> capable workers (with >= 1 GPU).
  std::map<int, int> eligible_by_free_gpus_;  // Counted::free_gpus -> eligible workers.
  int alive_ = 0;
  int64_t alive_slots_ = 0;
  int64_t free_slots_ = 0;  // Of eligible workers (never negative per worker).
  int busy_ = 0;
  int64_t lost_events_ = 0;
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_CORE_WORKER_REGISTRY_H_
