#include "coordinator/core/worker_registry.h"

#include <algorithm>
#include <iterator>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace ddp {
namespace {

int64_t Millis(absl::Time t) { return absl::ToUnixMillis(t); }

bool SameStatus(const v1::TaskStatus& a, const v1::TaskStatus& b) {
  if (a.error() != b.error() || a.ranks_size() != b.ranks_size()) return false;
  for (int i = 0; i < a.ranks_size(); ++i) {
    const v1::LocalRankStatus& x = a.ranks(i);
    const v1::LocalRankStatus& y = b.ranks(i);
    if (x.rank() != y.rank() || x.pid() != y.pid() || x.exited() != y.exited() ||
        x.exit_code() != y.exit_code() || x.signal() != y.signal() ||
        x.stopped() != y.stopped()) {
      return false;
    }
  }
  return true;
}

}  // namespace

WorkerRegistry::Registration WorkerRegistry::Register(const v1::RegisterRequest& req,
                                                      absl::Time now) {
  auto [it, inserted] = workers_.try_emplace(req.worker());
  WorkerRecord& w = it->second;
  Registration out{&w, inserted, false};
  if (!inserted && w.info.incarnation() != req.incarnation()) {
    out.restarted = true;
    w.leaving = false;
    w.stopping = false;
    w.reported.clear();
    w.dispatched.clear();
    w.last_batch_seq = 0;
    w.gpu_holders.clear();  // Its trainers are gone; what is still assigned claims again.
  }
  if (inserted || out.restarted) w.info.set_registered_ms(Millis(now));
  if (!inserted) IndexLabels(w.info, /*add=*/false);
  w.info.set_name(req.worker());
  *w.info.mutable_labels() = req.labels();
  IndexLabels(w.info, /*add=*/true);
  w.info.set_incarnation(req.incarnation());
  w.info.set_address(req.address());
  w.info.set_hostname(req.hostname());
  w.info.set_slots(req.slots());
  w.info.set_gpus(req.gpus());
  *w.info.mutable_gpu_devices() = req.gpu_devices();
  w.info.set_version(req.version());
  w.info.set_witness_port(req.witness_port());
  w.info.set_last_heartbeat_ms(Millis(now));
  w.last_seen = now;
  w.alive = true;
  w.confirmed = true;
  Arm(w);
  Recount(w);
  return out;
}

void WorkerRegistry::Restore(const v1::Worker& info, absl::Time now, absl::Duration grace) {
  WorkerRecord& w = workers_[info.name()];
  IndexLabels(w.info, /*add=*/false);
  w.info = info;
  IndexLabels(w.info, /*add=*/true);
  if (info.maintenance() == v1::WORKER_DRAINING &&
      info.drain_policy() == v1::DRAIN_AT_CHECKPOINT) {
    draining_at_checkpoint_.insert(info.name());
  }
  w.last_seen = now;
  w.check_in_by = now + grace;
  w.alive = true;
  w.confirmed = false;
  Arm(w);
  Recount(w);
}

absl::StatusOr<WorkerRecord*> WorkerRegistry::Check(const std::string& name,
                                                    const std::string& incarnation) {
  auto it = workers_.find(name);
  if (it == workers_.end()) {
    return absl::NotFoundError(
        absl::StrCat("worker '", name, "' is not registered: register first"));
  }
  if (it->second.info.incarnation() != incarnation) {
    return absl::FailedPreconditionError(absl::StrCat(
        "stale worker: '", name, "' incarnation ", incarnation,
        " was replaced by incarnation ", it->second.info.incarnation(),
        " (another ddp-worker registered under this name)"));
  }
  return &it->second;
}

WorkerRecord* WorkerRegistry::Find(const std::string& name) {
  auto it = workers_.find(name);
  return it == workers_.end() ? nullptr : &it->second;
}

const WorkerRecord* WorkerRegistry::Find(const std::string& name) const {
  auto it = workers_.find(name);
  return it == workers_.end() ? nullptr : &it->second;
}

void WorkerRegistry::Arm(WorkerRecord& w) {
  if (w.armed) return;
  deadlines_.emplace(std::max(w.last_seen + timeout_ * w.beat_stretch, w.check_in_by),
                     w.info.name());
  w.armed = true;
}

bool WorkerRegistry::Heartbeat(WorkerRecord& w, absl::Time now) {
  w.last_seen = now;
  w.check_in_by = absl::InfinitePast();  // Checked in: the heartbeat timeout rules again.
  w.info.set_last_heartbeat_ms(Millis(now));
  if (w.alive && w.confirmed) return false;  // The common case: nothing else to do.
  if (!w.alive) DDP_LOG(INFO) << "worker " << w.info.name() << " is back";
  w.alive = true;
  w.confirmed = true;
  Arm(w);
  Recount(w);
  return true;
}

std::vector<std::string> WorkerRegistry::Expire(absl::Time now) {
  std::vector<std::string> lost;
  while (!deadlines_.empty() && deadlines_.top().first < now) {
    const std::string name = deadlines_.top().second;
    deadlines_.pop();
    WorkerRecord* w = Find(name);
    if (w == nullptr) continue;
    w->armed = false;
    if (!w->alive) continue;  // Re-armed by the heartbeat that brings it back.
    const absl::Time due = std::max(w->last_seen + timeout_ * w->beat_stretch, w->check_in_by);
    if (due >= now) {  // Heard from since this entry was made.
      Arm(*w);
      continue;
    }
    w->alive = false;
    w->reported.clear();
    ++lost_events_;
    Recount(*w);
    lost.push_back(name);
  }
  return lost;
}

WorkerRegistry::Reported WorkerRegistry::Report(
    WorkerRecord& w, const google::protobuf::RepeatedPtrField<v1::TaskStatus>& tasks) {
  Reported out;
  std::vector<TaskKey> changed;
  for (const v1::TaskStatus& t : tasks) {
    auto it = w.reported.find({t.job_id(), t.attempt()});
    if (it == w.reported.end() || !SameStatus(it->second, t)) {
      changed.emplace_back(t.job_id(), t.attempt());
    }
  }
  if (changed.empty() && static_cast<size_t>(tasks.size()) == w.reported.size() &&
      w.dispatched.empty()) {
    return out;  // Nothing new.
  }
  // What the worker reports now accounts for its trainers: a task handed out earlier
  // is either among them or was never received (a lost reply).
  w.reported.clear();
  for (const v1::TaskStatus& t : tasks) w.reported[{t.job_id(), t.attempt()}] = t;
  w.dispatched.clear();
  for (const TaskKey& key : changed) out.changed.push_back(&w.reported.at(key));
  out.counts_changed = Recount(w);
  return out;
}

void WorkerRegistry::Dispatch(WorkerRecord& w, const TaskKey& key, int ranks) {
  w.dispatched[key] = ranks;
  if (!w.assigned.count(key)) Recount(w);
}

bool WorkerRegistry::Assign(const std::string& worker, const TaskKey& key, AssignedTask task) {
  WorkerRecord* w = Find(worker);
  if (w == nullptr) return false;
  w->assigned[key] = std::move(task);
  ++w->desired_version;
  return Recount(*w);
}

bool WorkerRegistry::Unassign(const std::string& worker, const TaskKey& key) {
  WorkerRecord* w = Find(worker);
  if (w == nullptr || w->assigned.erase(key) == 0) return false;
  ++w->desired_version;
  return Recount(*w);
}

bool WorkerRegistry::RankMayLive(const WorkerRecord& w, const TaskKey& key,
                                 const v1::RankAssignment& r) const {
  if (w.dispatched.count(key)) return true;
  if (!w.confirmed) return r.pid() != 0 && !r.exited();  // Trust the rank table.
  auto it = w.reported.find(key);
  if (it == w.reported.end()) return false;
  for (const v1::LocalRankStatus& s : it->second.ranks()) {
    if (s.rank() == r.rank()) return !s.exited();
  }
  return false;
}

void WorkerRegistry::Count(const WorkerRecord::Counted& c, int sign) {
  alive_ += sign * (c.alive ? 1 : 0);
  if (c.alive) alive_slots_ += sign * c.slots;
  busy_ += sign * (c.alive && c.busy ? 1 : 0);
  cordoned_ += sign * (c.cordoned ? 1 : 0);
  if (c.capable) {
    if ((capable_by_slots_[c.slots] += sign) == 0) capable_by_slots_.erase(c.slots);
    if (c.gpus > 0 && (capable_by_gpus_[c.gpus] += sign) == 0) capable_by_gpus_.erase(c.gpus);
  }
  if (c.eligible) {
    const int free = std::max(0, c.free);
    if ((eligible_by_free_[free] += sign) == 0) eligible_by_free_.erase(free);
    free_slots_ += sign * free;
    if (c.free_gpus > 0 && (eligible_by_free_gpus_[c.free_gpus] += sign) == 0) {
      eligible_by_free_gpus_.erase(c.free_gpus);
    }
  }
}

bool WorkerRegistry::Recount(WorkerRecord& w) {
  int busy = 0;
  for (const auto& [key, task] : w.assigned) busy += static_cast<int>(task.ranks.size());
  // Handed out and not yet shown gone: the trainers may be starting right now.
  for (const auto& [key, ranks] : w.dispatched) {
    if (!w.assigned.count(key)) busy += ranks;
  }
  // Trainers of attempts no longer active hold their slots until they are gone.
  for (const auto& [key, status] : w.reported) {
    if (w.assigned.count(key) || w.dispatched.count(key)) continue;
    for (const v1::LocalRankStatus& r : status.ranks()) busy += r.exited() ? 0 : 1;
  }
  w.free_slots = w.info.slots() - busy;
  // GPUs: held by what is assigned, and, after that, for as long as the slots are.
  for (const auto& [key, task] : w.assigned) {
    if (!task.gpu_uuids.empty()) w.gpu_holders[key] = task;
  }
  for (auto it = w.gpu_holders.begin(); it != w.gpu_holders.end();) {
    const TaskKey& key = it->first;
    bool held = w.assigned.count(key) || w.dispatched.count(key);
    if (!held) {
      auto rep = w.reported.find(key);
      if (rep != w.reported.end()) {
        for (const v1::LocalRankStatus& r : rep->second.ranks()) held = held || !r.exited();
      }
    }
    it = held ? std::next(it) : w.gpu_holders.erase(it);
  }
  std::set<std::string> held;
  for (const auto& [key, task] : w.gpu_holders) {
    held.insert(task.gpu_uuids.begin(), task.gpu_uuids.end());
  }
  w.free_gpus.clear();
  for (const v1::GpuDevice& g : w.info.gpu_devices()) {
    if (!held.count(g.uuid())) w.free_gpus.push_back(g.uuid());
  }
  WorkerRecord::Counted c;
  c.alive = w.alive;
  c.cordoned = w.info.maintenance() != v1::WORKER_SCHEDULABLE;
  c.capable = w.alive && !c.cordoned && !w.leaving;
  c.quarantined = w.quarantine.until != absl::InfinitePast();
  c.eligible = c.capable && w.confirmed && !c.quarantined;
  c.slots = w.info.slots();
  c.free = w.free_slots;
  c.gpus = std::min(w.info.slots(), w.info.gpu_devices_size());
  c.free_gpus = std::max(0, std::min(w.free_slots, static_cast<int>(w.free_gpus.size())));
  c.busy = !w.assigned.empty();
  const WorkerRecord::Counted& old = w.counted;
  const bool schedulable_change = old.alive != c.alive || old.capable != c.capable ||
                                  old.eligible != c.eligible || old.slots != c.slots ||
                                  old.quarantined != c.quarantined ||
                                  old.free != c.free || old.gpus != c.gpus ||
                                  old.free_gpus != c.free_gpus;
  if (!schedulable_change && old.busy == c.busy && old.cordoned == c.cordoned) return false;
  Count(old, -1);
  Count(c, +1);
  w.counted = c;
  return schedulable_change;
}

int WorkerRegistry::AtLeast(const std::map<int, int>& counts, int n) {
  int sum = 0;
  for (auto it = counts.lower_bound(n); it != counts.end(); ++it) sum += it->second;
  return sum;
}

absl::Duration WorkerRegistry::Quarantine(WorkerRecord& w, const TaskKey& key,
                                          const std::string& reason, absl::Time now) {
  NodeQuarantine& q = w.quarantine;
  if (q.streak > 0 && q.last_fault == key) return absl::ZeroDuration();  // Counted.
  absl::Duration length = kQuarantineFirst;
  for (int i = 0; i < q.streak && length < kQuarantineMax; ++i) length *= 2;
  length = std::min(length, kQuarantineMax);
  ++q.streak;
  q.last_fault = key;
  quarantine_ends_.erase({q.until, w.info.name()});
  q.until = now + length;
  q.reason = reason;
  quarantine_ends_.emplace(q.until, w.info.name());
  Recount(w);
  return length;
}

std::vector<std::string> WorkerRegistry::LiftQuarantines(absl::Time now) {
  std::vector<std::string> lifted;
  while (!quarantine_ends_.empty() && quarantine_ends_.begin()->first <= now) {
    const std::string name = quarantine_ends_.begin()->second;
    quarantine_ends_.erase(quarantine_ends_.begin());
    WorkerRecord* w = Find(name);
    if (w == nullptr) continue;
    w->quarantine.until = absl::InfinitePast();
    w->quarantine.reason.clear();
    Recount(*w);
    lifted.push_back(name);
  }
  return lifted;
}

bool WorkerRegistry::SetMaintenance(WorkerRecord& w, v1::WorkerMaintenance maintenance,
                                    v1::DrainPolicy policy, const std::string& by,
                                    absl::Time now) {
  const std::string& name = w.info.name();
  if (maintenance != w.info.maintenance() ||
      (maintenance == v1::WORKER_DRAINING && policy != w.info.drain_policy())) {
    w.info.set_maintenance_since_ms(maintenance == v1::WORKER_SCHEDULABLE ? 0 : Millis(now));
    w.info.set_maintenance_by(maintenance == v1::WORKER_SCHEDULABLE ? "" : by);
  }
  w.info.set_maintenance(maintenance);
  w.info.set_drain_policy(maintenance == v1::WORKER_DRAINING ? policy : v1::DRAIN_AT_CHECKPOINT);
  if (maintenance == v1::WORKER_DRAINING && policy == v1::DRAIN_AT_CHECKPOINT) {
    draining_at_checkpoint_.insert(name);
  } else {
    draining_at_checkpoint_.erase(name);
  }
  return Recount(w);
}

bool WorkerRegistry::SetLeaving(WorkerRecord& w) {
  if (w.leaving) return false;
  w.leaving = true;
  return Recount(w);
}

void WorkerRegistry::Remove(const std::string& name) {
  auto it = workers_.find(name);
  if (it == workers_.end()) return;
  Count(it->second.counted, -1);
  IndexLabels(it->second.info, /*add=*/false);
  quarantine_ends_.erase({it->second.quarantine.until, name});
  draining_at_checkpoint_.erase(name);
  workers_.erase(it);  // Its deadline heap entry, if any, is skipped when it comes due.
}

void WorkerRegistry::IndexLabels(const v1::Worker& info, bool add) {
  for (const auto& [key, value] : info.labels()) {
    const std::pair<std::string, std::string> label{key, value};
    if (add) {
      by_label_[label].insert(info.name());
      continue;
    }
    auto it = by_label_.find(label);
    if (it == by_label_.end()) continue;
    it->second.erase(info.name());
    if (it->second.empty()) by_label_.erase(it);
  }
}

const std::set<std::string>* WorkerRegistry::SelectorCandidates(const NodeNeed& need) const {
  if (!need.selective()) return nullptr;
  static const std::set<std::string>* const kNone = new std::set<std::string>();
  const std::set<std::string>* rarest = nullptr;
  for (const auto& label : *need.selector) {
    auto it = by_label_.find(label);
    if (it == by_label_.end()) return kNone;
    if (rarest == nullptr || it->second.size() < rarest->size()) rarest = &it->second;
  }
  return rarest;
}

bool WorkerRegistry::Fits(const WorkerRecord& w, const NodeNeed& need, bool now) const {
  if (need.selective()) {
    for (const auto& [key, value] : *need.selector) {
      auto it = w.info.labels().find(key);
      if (it == w.info.labels().end() || it->second != value) return false;
    }
  }
  const WorkerRecord::Counted& c = w.counted;
  if (need.gpu_node && (now ? c.free_gpus : c.gpus) < 1) return false;
  if (!now) return c.capable && (need.gpus ? c.gpus : c.slots) >= need.MinRanks();
  return c.eligible && (need.gpus ? c.free_gpus : c.free) >= need.MinRanks();
}

int WorkerRegistry::CountFitting(const NodeNeed& need, bool now) const {
  int n = 0;
  if (const std::set<std::string>* candidates = SelectorCandidates(need)) {
    for (const std::string& name : *candidates) n += Fits(*Find(name), need, now);
  } else {
    for (const auto& [name, w] : workers_) n += Fits(w, need, now);
  }
  return n;
}

int WorkerRegistry::CapableNodes(const NodeNeed& need) const {
  // The counts by size answer a need of slots or GPUs alone; a selector or a node that
  // must have a GPU (shared by its ranks) looks at the workers themselves.
  if (!need.selective() && !need.gpu_node) {
    return AtLeast(need.gpus ? capable_by_gpus_ : capable_by_slots_, need.MinRanks());
  }
  return CountFitting(need, /*now=*/false);
}

int WorkerRegistry::EligibleNodes(const NodeNeed& need) const {
  if (!need.selective() && !need.gpu_node) {
    return AtLeast(need.gpus ? eligible_by_free_gpus_ : eligible_by_free_, need.MinRanks());
  }
  return CountFitting(need, /*now=*/true);
}

std::optional<NodeRoom> WorkerRegistry::Room(const std::string& name, const NodeNeed& need) const {
  const WorkerRecord* w = Find(name);
  if (w == nullptr || !w->counted.eligible || !Fits(*w, need, /*now=*/false)) return std::nullopt;
  return NodeRoom{std::max(0, w->free_slots), static_cast<int>(w->free_gpus.size())};
}

std::vector<NodeOffer> WorkerRegistry::Offers(const NodeNeed& need) const {
  std::vector<NodeOffer> offers;
  const std::set<std::string>* candidates = SelectorCandidates(need);
  std::vector<const WorkerRecord*> pool;
  if (candidates == nullptr) {
    for (const auto& [name, w] : workers_) pool.push_back(&w);
  } else {
    for (const std::string& name : *candidates) pool.push_back(Find(name));
  }
  for (const WorkerRecord* wp : pool) {
    const WorkerRecord& w = *wp;
    const std::string& name = w.info.name();
    if (!Fits(w, need, /*now=*/true)) continue;
    NodeOffer o{name, w.info.address(), w.free_slots, w.info.gpus(), w.free_gpus};
    // A GPU rank takes a slot too: never offer more GPUs than free slots.
    if (static_cast<int>(o.free_gpus.size()) > std::max(0, w.free_slots)) {
      o.free_gpus.resize(static_cast<size_t>(std::max(0, w.free_slots)));
    }
    offers.push_back(std::move(o));
  }
  return offers;  // In name order: the maps' and the sets'.
}

void WorkerRegistry::ShowGpuHolders(const WorkerRecord& w, v1::Worker* view) const {
  for (v1::GpuDevice& g : *view->mutable_gpu_devices()) {
    g.clear_job_id();
    g.clear_rank();
    if (const v1::GpuUsage* u = w.GpuUsageOf(g.uuid())) {
      g.set_utilization_percent(u->utilization_percent());
      g.set_memory_used_bytes(u->memory_used_bytes());
    }
    for (const auto& [key, task] : w.gpu_holders) {
      for (size_t l = 0; l < task.gpu_uuids.size() && l < task.ranks.size(); ++l) {
        if (task.gpu_uuids[l] != g.uuid()) continue;
        g.set_job_id(key.first);
        g.set_rank(task.ranks[l]);
        break;  // Ranks sharing it (Gloo's CUDA path): the first.
      }
    }
  }
}

v1::WorkerSummary WorkerRegistry::Summary() const {
  v1::WorkerSummary s;
  s.set_workers(static_cast<int32_t>(workers_.size()));
  s.set_alive(alive_);
  s.set_lost(static_cast<int32_t>(workers_.size()) - alive_);
  s.set_slots(static_cast<int32_t>(alive_slots_));
  s.set_free_slots(static_cast<int32_t>(free_slots_));
  s.set_busy_workers(busy_);
  s.set_lost_events(lost_events_);
  s.set_cordoned(cordoned_);
  return s;
}

std::vector<std::string> WorkerRegistry::Witnesses(const std::string& worker, int n) const {
  std::vector<std::string> out;
  if (workers_.size() < 2) return out;
  auto it = workers_.upper_bound(worker);
  const size_t scan = std::min(workers_.size(), kWitnessScan);
  for (size_t seen = 0; seen < scan && static_cast<int>(out.size()) < n; ++seen, ++it) {
    if (it == workers_.end()) it = workers_.begin();
    const WorkerRecord& w = it->second;
    if (it->first == worker || !w.alive || w.info.witness_port() <= 0) continue;
    const std::string& host = w.info.address();
    out.push_back(absl::StrCat(absl::StrContains(host, ':') ? absl::StrCat("[", host, "]") : host,
                               ":", w.info.witness_port()));
  }
  return out;
}

}  // namespace ddp
