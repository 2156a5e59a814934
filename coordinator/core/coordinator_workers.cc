// The facade's worker side: registration, heartbeats (liveness, reports, desired
// state), trainer events and the worker listing.
#include <algorithm>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/contract/exit_codes.h"
#include "common/logging.h"
#include "common/utf8.h"
#include "common/version.h"
#include "coordinator/core/coordinator.h"

namespace ddp {
namespace {

constexpr int kDefaultWorkerPage = 1000;
// Peers a worker asks when it loses the coordinator (HeartbeatResponse.witnesses).
constexpr int kWitnesses = 4;
constexpr int kMaxWorkerPage = 5000;

// Longer output lines are cut: the agent cuts at 16 KiB (64 KiB for event lines), so
// only a misbehaving worker sends more.
constexpr size_t kMaxLogLineBytes = 64 << 10;

// Cuts `text` to kMaxLogLineBytes, never inside a UTF-8 character, saying so.
void CutLine(std::string& text) {
  const size_t dropped_from = [&] {
    size_t n = kMaxLogLineBytes;
    while (n > 0 && (static_cast<unsigned char>(text[n]) & 0xC0) == 0x80) --n;
    return n;
  }();
  const size_t cut = text.size() - dropped_from;
  text.resize(dropped_from);
  absl::StrAppend(&text, " [ddp: ", cut, " more bytes of this line were cut]");
}

// Whether the rank table of `job`'s attempt puts `rank` on `worker`. O(1) for the
// usual table (rows in rank order).
bool HostsRank(const JobRecord& job, int attempt, int rank, const std::string& worker) {
  if (attempt < 1 || attempt > job.job.attempts_size()) return false;
  const v1::Attempt& a = job.job.attempts(attempt - 1);
  if (rank >= 0 && rank < a.ranks_size() && a.ranks(rank).rank() == rank) {
    return a.ranks(rank).worker() == worker;
  }
  for (const v1::RankAssignment& r : a.ranks()) {
    if (r.rank() == rank) return r.worker() == worker;
  }
  return false;
}

// Whether `worker` hosted `rank` earlier in `attempt`, before a live recovery moved the
// rank to a spare: its output lines are still the rank's (decision 187).
bool HostedRank(const JobRecord& job, int attempt, int rank, const std::string& worker) {
  auto it = job.former_hosts.find({attempt, rank});
  return it != job.former_hosts.end() &&
         std::find(it->second.begin(), it->second.end(), worker) != it->second.end();
}

}  // namespace

absl::StatusOr<v1::RegisterResponse> Coordinator::Register(const v1::RegisterRequest& req) {
  if (req.worker().empty()) return absl::InvalidArgumentError("worker: a name is required");
  if (req.incarnation().empty()) {
    return absl::InvalidArgumentError("incarnation: required (a random id per agent start)");
  }
  if (req.slots() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("slots: must be >= 1 (got ", req.slots(), ")"));
  }
  if (req.address().empty()) return absl::InvalidArgumentError("address: required");
  if (!req.cluster_id().empty() && req.cluster_id() != cluster_id_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker ", req.worker(), " joined the cluster of store ", req.cluster_id(),
        "; this coordinator serves store ", cluster_id_,
        ": every --coordinator address of a worker must be a coordinator of the same store"));
  }
  if (absl::Status st = CheckLabels(Labels(req.labels().begin(), req.labels().end())); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("labels: ", st.message()));
  }
  if (req.gpu_devices_size() > 0 && req.gpu_devices_size() != req.gpus()) {
    return absl::InvalidArgumentError(absl::StrCat("gpus: ", req.gpus(), " but ",
                                                   req.gpu_devices_size(), " gpu_devices"));
  }
  {
    std::set<std::string> uuids;
    for (const v1::GpuDevice& g : req.gpu_devices()) {
      if (g.uuid().empty() || !uuids.insert(g.uuid()).second) {
        return absl::InvalidArgumentError(absl::StrCat(
            "gpu_devices: every GPU needs a UUID of its own (index ", g.index(), ": '", g.uuid(),
            "')"));
      }
    }
  }
  int stretch = 1;
  {
    TouchList touched(hub_);
    absl::MutexLock lock(&mu_);
    std::string previous;  // (Not a lambda: the thread-safety analysis sees the lock here.)
    if (const WorkerRecord* w = registry_.Find(req.worker())) previous = w->info.incarnation();
    const WorkerRegistry::Registration reg = registry_.Register(req, clock_->Now());
    if (reg.restarted) {
      DDP_LOG(WARNING) << "worker " << req.worker() << " restarted (incarnation " << previous
                       << " -> " << req.incarnation() << ")";
      FailAttemptsOnWorkerLocked(
          req.worker(),
          absl::StrCat("worker ", req.worker(), " restarted: its trainers are gone"), touched);
    }
    if (reg.is_new || reg.restarted) {
      DDP_LOG(INFO) << "worker " << req.worker() << " registered: " << req.slots()
                    << " slots at " << req.address() << " (incarnation " << req.incarnation()
                    << ")";
    }
    // Told the interval of now (decision 162), and held to its timeout: agents older
    // than HeartbeatRequest.heartbeat_interval_ms keep it for good.
    stretch = BeatStretchLocked();
    reg.worker->registered_stretch = stretch;
    reg.worker->beat_stretch = stretch;
    writer_.PutWorker(reg.worker->info);
    schedule_dirty_ = true;  // A worker joined (or came back).
    ScheduleLocked(touched);
  }
  v1::RegisterResponse resp;
  resp.set_heartbeat_interval_ms(absl::ToInt64Milliseconds(options_.heartbeat_interval * stretch));
  resp.set_heartbeat_timeout_ms(absl::ToInt64Milliseconds(options_.heartbeat_timeout * stretch));
  resp.set_rpc_deadline_ms(absl::ToInt64Milliseconds(options_.rpc_deadline));
  resp.set_cluster_id(cluster_id_);
  return resp;
}

void Coordinator::Heartbeat(const v1::HeartbeatRequest& req, HeartbeatDone done) {
  absl::StatusOr<v1::HeartbeatResponse> reply;
  StoreWriter::Ticket commit_first = 0;
  {
    TouchList touched(hub_);
    absl::MutexLock lock(&mu_);
    reply = HeartbeatLocked(req, touched, &commit_first);
  }
  if (commit_first == 0) {
    done(std::move(reply));
    return;
  }
  // A reply that hands out an attempt is sent once the attempt is stored, so that a
  // coordinator that crashes meanwhile never meets trainers of an attempt it has no
  // record of (it could number a new one the same). Usually committed already.
  writer_.AfterCommit(commit_first,
                      [done = std::move(done), reply = std::move(reply)](const absl::Status&) {
                        done(reply);
                      });
}

absl::StatusOr<v1::HeartbeatResponse> Coordinator::Heartbeat(const v1::HeartbeatRequest& req) {
  absl::Notification replied;
  absl::StatusOr<v1::HeartbeatResponse> out;
  Heartbeat(req, [&](absl::StatusOr<v1::HeartbeatResponse> reply) {
    out = std::move(reply);
    replied.Notify();
  });
  replied.WaitForNotification();
  return out;
}

absl::StatusOr<v1::HeartbeatResponse> Coordinator::HeartbeatLocked(
    const v1::HeartbeatRequest& req, TouchList& touched, StoreWriter::Ticket* commit_first) {
  ++heartbeats_;
  auto w = registry_.Check(req.worker(), req.incarnation());
  if (!w.ok()) return w.status();
  WorkerRecord& worker = **w;
  const absl::Time now = clock_->Now();
  const absl::Time previous = worker.last_seen;
  // Heartbeat rate scaling (decision 162): held to the timeout of the longer of the
  // interval it says it beats at and the one this answer tells it, so that neither an
  // agent that has not yet heard of a shorter interval nor one told a longer one is
  // declared lost early.
  const int stretch = BeatStretchLocked();
  int says = worker.registered_stretch;
  if (req.heartbeat_interval_ms() > 0) {
    const int64_t base =
        std::max<int64_t>(1, absl::ToInt64Milliseconds(options_.heartbeat_interval));
    says = static_cast<int>(std::clamp<int64_t>((req.heartbeat_interval_ms() + base - 1) / base, 1,
                                                kMaxHeartbeatStretch));
  }
  worker.beat_stretch = std::max(says, stretch);
  if (registry_.Heartbeat(worker, now)) {
    schedule_dirty_ = true;  // It came back.
  } else {
    heartbeat_lag_.Observe(absl::ToDoubleSeconds(now - previous));
  }
  if (!std::equal(req.free_ports().begin(), req.free_ports().end(), worker.free_ports.begin(),
                  worker.free_ports.end())) {
    worker.free_ports.assign(req.free_ports().begin(), req.free_ports().end());
    if (ports_.WaitsOn(req.worker()) && !worker.free_ports.empty()) schedule_dirty_ = true;
  }
  if (req.gpu_usage_size() > 0 || !worker.gpu_usage.empty()) {
    worker.gpu_usage.assign(req.gpu_usage().begin(), req.gpu_usage().end());
  }
  if (req.stopping_grace_ms() > 0 && !worker.stopping) {
    // Before `leaving` below: the attempts that can move at a checkpoint wait for it.
    worker.stopping = true;
    const std::string why =
        req.leaving().empty() ? std::string("SIGTERM")
                              : req.leaving().substr(0, Utf8SafeCut(req.leaving(), 256));
    DDP_LOG(INFO) << "worker " << req.worker() << " is stopping (" << why << "): its ranks stop "
                  << "within " << req.stopping_grace_ms() << " ms";
    // No new ranks here while it goes (a new incarnation is schedulable again).
    if (registry_.SetLeaving(worker)) schedule_dirty_ = true;
    StoppingWorkerLocked(req.worker(), why, absl::Milliseconds(req.stopping_grace_ms()),
                         touched);
  }
  if (!req.leaving().empty() && !worker.leaving) {
    // Before its exits are applied: the attempts end once, as "leaving", and their
    // retries are not placed here.
    const std::string why = req.leaving().substr(0, Utf8SafeCut(req.leaving(), 256));
    DDP_LOG(INFO) << "worker " << req.worker() << " is leaving: " << why;
    if (registry_.SetLeaving(worker)) schedule_dirty_ = true;
    FailAttemptsOnWorkerLocked(req.worker(),
                               absl::StrCat("worker ", req.worker(), " is leaving (", why, ")"),
                               touched);
  }
  // Only what differs from its last report is applied to jobs, and only what the
  // rank table says is the worker's: a worker cannot fail, start or finish another's
  // ranks (what it reports only moves its own slot count).
  const WorkerRegistry::Reported reported = registry_.Report(worker, req.tasks());
  NoteFlightsLocked(worker, req, now);
  if (reported.counts_changed) schedule_dirty_ = true;
  for (const v1::TaskStatus* status : reported.changed) {
    NoteNodeFaultsLocked(worker, *status, now);  // Before a retry is placed.
    JobRecord* rec = FindLocked(status->job_id());
    if (rec == nullptr) continue;  // Unknown to us (retention, a wiped state dir).
    if (!OwnsReportLocked(worker, *rec, *status)) {
      CountForeignLocked(req.worker(), 1,
                         absl::StrCat("a status of job ", status->job_id(), " attempt ",
                                      status->attempt()));
      continue;
    }
    const v1::Attempt* a = ActiveAttempt(*rec);
    if (a != nullptr && a->number() == status->attempt()) {  // For the stall watchdog.
      for (const v1::LocalRankStatus& r : status->ranks()) {
        rec->stall.SetStopped(r.rank(), a->world_size(), r.stopped() && !r.exited());
      }
    }
    ApplyLocked(*rec, ApplyReport(*rec, req.worker(), *status, now), touched);
  }
  ScheduleLocked(touched);
  absl::StatusOr<v1::HeartbeatResponse> resp = DesiredLocked(worker, commit_first);
  if (resp.ok()) {
    resp->set_heartbeat_interval_ms(
        absl::ToInt64Milliseconds(options_.heartbeat_interval * stretch));
    resp->set_heartbeat_timeout_ms(absl::ToInt64Milliseconds(options_.heartbeat_timeout * stretch));
  }
  return resp;
}

void Coordinator::NoteFlightsLocked(const WorkerRecord& worker, const v1::HeartbeatRequest& req,
                                    absl::Time now) {
  // Every beat's, changed or not: a rank's flight recorder moves while its status
  // stays the same, and a stall's reason is told from the latest.
  for (const v1::TaskStatus& status : req.tasks()) {
    bool any = false;
    for (const v1::LocalRankStatus& r : status.ranks()) {
      any = any || r.has_flight() || r.has_stack();
    }
    if (!any) continue;
    JobRecord* rec = FindLocked(status.job_id());
    if (rec == nullptr || !OwnsReportLocked(worker, *rec, status)) continue;
    const v1::Attempt* a = ActiveAttempt(*rec);
    if (a == nullptr || a->number() != status.attempt()) continue;
    for (const v1::LocalRankStatus& r : status.ranks()) {
      if (r.has_stack() && !r.exited()) {
        // A restarted coordinator goes on from the workers' seq (its own began at 0).
        if (r.stack().seq() > rec->stacks_seq) {
          rec->stacks_seq = r.stack().seq();
          rec->stacks_attempt = a->number();
        }
        rec->stall.SetStack(r.rank(), a->world_size(), r.stack());
      }
      if (!r.has_flight() || r.exited()) continue;
      RankFlight flight;
      flight.known = true;
      flight.state = r.flight();
      flight.read_at = now;
      rec->stall.SetFlight(r.rank(), a->world_size(), std::move(flight));
    }
  }
}

int Coordinator::BeatStretchLocked() const {
  return HeartbeatStretch(registry_.alive(), options_.max_heartbeats_per_second,
                          options_.heartbeat_interval);
}

bool Coordinator::OwnsReportLocked(const WorkerRecord& worker, const JobRecord& rec,
                                   const v1::TaskStatus& status) {
  const int n = status.attempt();
  if (n < 1 || n > rec.job.attempts_size()) return true;  // Unknown: ApplyReport drops it.
  const v1::Attempt& a = rec.job.attempts(n - 1);
  const std::string& name = worker.info.name();
  // The active attempt's tasks are in their workers' desired state; a task of an
  // ended attempt still reports its (stopping) trainers, checked rank by rank.
  if (&a == ActiveAttempt(rec) && !worker.assigned.count({rec.job.id(), n})) return false;
  for (const v1::LocalRankStatus& s : status.ranks()) {
    if (!HostsRank(rec, n, s.rank(), name)) return false;
  }
  return true;
}

bool Coordinator::AdmitOutputLocked(JobRecord& rec, const v1::ReportedEvent& ev,
                                    std::vector<v1::ReportedEvent>& known) {
  const int64_t limit = limits_.log_bytes_per_job;
  if (rec.log_bytes >= limit) return false;  // Said so already (below).
  rec.log_bytes += static_cast<int64_t>(
      std::min(ev.log().text().size(), static_cast<size_t>(kMaxLogLineBytes)));
  if (rec.log_bytes < limit) return true;
  // This line reaches the limit: it is the last one kept, then a notice.
  known.push_back(ev);
  v1::ReportedEvent& notice = known.emplace_back(ev);
  notice.mutable_log()->set_stream("stderr");
  notice.mutable_log()->set_text(absl::StrCat(
      "[ddp] this job's output reached the coordinator's --max-log-bytes-per-job (", limit,
      " bytes): what it prints from now on is not kept"));
  DDP_LOG(WARNING) << "job " << rec.job.id() << " reached --max-log-bytes-per-job (" << limit
                   << " bytes): further output is dropped";
  rec.log_bytes = limit;
  if (known[known.size() - 2].log().text().size() > kMaxLogLineBytes) {
    CutLine(*known[known.size() - 2].mutable_log()->mutable_text());
  }
  return false;
}

void Coordinator::CountForeignLocked(const std::string& worker, int64_t n,
                                     const std::string& what) {
  foreign_total_ += n;
  int64_t& count = foreign_reports_[worker];
  const bool first = count == 0;
  count += n;
  if (first) {  // Once per worker: a hostile one cannot flood the log.
    DDP_LOG(WARNING) << "worker " << worker << " reported " << what
                     << " for ranks the rank table does not give it: ignored (further such "
                        "reports of this worker are counted, not logged)";
  }
}

v1::HeartbeatResponse Coordinator::DesiredLocked(WorkerRecord& worker,
                                                 StoreWriter::Ticket* commit_first) {
  v1::HeartbeatResponse resp;
  resp.set_desired_version(worker.desired_version);
  resp.set_cluster_id(cluster_id_);
  for (std::string& w : registry_.Witnesses(worker.info.name(), kWitnesses)) {
    resp.add_witnesses(std::move(w));
  }
  for (const auto& [key, assigned] : worker.assigned) {
    JobRecord* rec = FindLocked(key.first);
    if (rec == nullptr || key.second > rec->job.attempts_size()) continue;
    const v1::Attempt& a = rec->job.attempts(key.second - 1);
    v1::Task* task = resp.add_tasks();
    task->set_job_id(key.first);
    task->set_attempt(key.second);
    task->set_spec_yaml(rec->job.spec_yaml());
    task->set_workdir(rec->job.workdir());
    task->mutable_ranks()->Add(assigned.ranks.begin(), assigned.ranks.end());
    for (const std::string& uuid : assigned.gpu_uuids) task->add_gpu_uuids(uuid);
    task->set_group_rank(assigned.group_rank);
    task->set_world_size(a.world_size());
    task->set_master_addr(a.master_addr());
    task->set_master_port(a.master_port());
    // Ranks are in node order, so the last rank's node index counts the nodes.
    task->set_group_world_size(a.ranks().empty() ? 1 : a.ranks(a.ranks_size() - 1).group_rank() + 1);
    task->set_restart_count(rec->job.restarts());
    task->set_generation(a.generation());
    if (rec->notice_attempt == key.second) {
      task->set_notice_seq(rec->notice_seq);
      task->set_notice(rec->notice);
      if (rec->notice_deadline != absl::InfinitePast()) {
        task->set_notice_deadline_ms(absl::ToUnixMillis(rec->notice_deadline));
      }
    }
    if (rec->stacks_attempt == key.second) task->set_stacks_seq(rec->stacks_seq);
    task->set_rdzv_id(rec->job.rdzv_id());
    for (const auto& [k, v] : rec->spec.env) (*task->mutable_env())[k] = v;
    *commit_first = std::max<StoreWriter::Ticket>(*commit_first, rec->formed_ticket);
    if (!worker.reported.count(key)) {
      registry_.Dispatch(worker, key, static_cast<int>(assigned.ranks.size()));
    }
  }
  return resp;
}

bool Coordinator::TrainerExitCodesLocked(const v1::TaskStatus& status) {
  // Exit code 3 blames the node only when ddp-trainer says it: a user's program (a
  // command job) may exit 3 for its own reasons.
  const JobRecord* rec = FindLocked(status.job_id());
  return rec != nullptr && !rec->spec.is_command();
}

void Coordinator::NoteNodeFaultsLocked(WorkerRecord& worker, const v1::TaskStatus& status,
                                       absl::Time now) {
  std::string reason;
  if (!status.error().empty()) {
    if (!status.node_fault()) return;  // Would recur anywhere: not this node's fault.
    reason = absl::StrCat("could not start trainers of ", status.job_id(), " attempt ",
                          status.attempt(), ": ", status.error());
  }
  for (const v1::LocalRankStatus& r : status.ranks()) {
    if (!r.exited() || r.signal() != 0) continue;
    if (r.exit_code() == 0) registry_.NodeWorked(worker);
    if (r.exit_code() == kExitNodeFault && reason.empty() && TrainerExitCodesLocked(status)) {
      reason = absl::StrCat("rank ", r.rank(), " of ", status.job_id(), " attempt ",
                            status.attempt(), " exited with code ", kExitNodeFault,
                            " (node fault)");
    }
  }
  if (reason.empty()) return;
  constexpr size_t kMaxReason = 300;  // `ddpctl workers` shows it on one line.
  if (reason.size() > kMaxReason) reason = absl::StrCat(reason.substr(0, kMaxReason), "...");
  const absl::Duration length =
      registry_.Quarantine(worker, {status.job_id(), status.attempt()}, reason, now);
  if (length > absl::ZeroDuration()) {
    DDP_LOG(WARNING) << "worker " << worker.info.name() << " quarantined for "
                     << absl::FormatDuration(length) << ": " << reason;
  }
}

std::vector<std::pair<JobRecord*, int>> Coordinator::ActiveJobsOnWorkerLocked(
    const std::string& worker) {
  std::vector<std::pair<JobRecord*, int>> out;
  const WorkerRecord* w = registry_.Find(worker);
  if (w == nullptr) return out;
  for (const auto& [key, task] : w->assigned) {
    JobRecord* rec = FindLocked(key.first);
    const v1::Attempt* a = rec == nullptr ? nullptr : ActiveAttempt(*rec);
    if (a != nullptr && a->number() == key.second) out.emplace_back(rec, key.second);
  }
  return out;
}

void Coordinator::FailAttemptsOnWorkerLocked(const std::string& worker, const std::string& reason,
                                             TouchList& touched, bool lost) {
  for (auto [rec, attempt] : ActiveJobsOnWorkerLocked(worker)) {
    const v1::Attempt* a = ActiveAttempt(*rec);
    if (a == nullptr || a->number() != attempt) continue;  // Since decided.
    // Leaving after SIGTERM: it moves after the checkpoint its notice asked for (or
    // fails when the worker's grace runs out and its ranks exit).
    if (!lost && rec->stopping_worker == worker) continue;
    if (lost && ReplaceNodeLocked(*rec, worker, reason, touched)) continue;
    if (lost && Recovering(*a)) {
      ApplyLocked(*rec, FailRecovery(*rec, absl::StrCat("a second fault during it: ", reason),
                                     clock_->Now()),
                  touched);
      continue;
    }
    ApplyLocked(*rec, FailAttempt(*rec, reason, /*retryable=*/true, clock_->Now()), touched);
  }
}

bool Coordinator::ReplaceNodeLocked(JobRecord& rec, const std::string& lost,
                                    const std::string& reason, TouchList& touched) {
  if (!NodeRecoveryRefusal(rec, lost).empty()) return false;
  v1::Attempt* a = ActiveAttempt(rec);
  const TaskKey key{rec.job.id(), a->number()};
  std::vector<int> moved;
  bool gpus = false;
  std::set<std::string> hosts;
  for (const v1::RankAssignment& r : a->ranks()) {
    hosts.insert(r.worker());
    if (r.worker() != lost) continue;
    moved.push_back(r.rank());
    gpus = gpus || !r.gpu_uuid().empty();
  }
  if (moved.empty()) return false;
  const absl::Time now = clock_->Now();
  if (gpus) {
    ApplyLocked(rec, FailRecovery(rec, absl::StrCat(reason, ": GPU ranks move with a restart"), now),
                touched);
    return true;
  }
  // A spare: eligible now, room for all of the lost node's ranks, not in the job yet.
  NodeNeed need = NeedOf(rec.spec);
  need.nproc_per_node = static_cast<int>(moved.size());
  std::optional<NodeOffer> spare;
  for (NodeOffer& o : registry_.Offers(need)) {
    if (o.worker == lost || hosts.count(o.worker) || o.free_slots < need.nproc_per_node) continue;
    spare = std::move(o);
    break;
  }
  if (!spare.has_value()) {
    ApplyLocked(rec,
                FailRecovery(rec, absl::StrCat(reason, "; no spare worker has room for its ",
                                               moved.size(), " rank(s)"),
                             now),
                touched);
    return true;
  }
  AssignedTask task;
  for (v1::RankAssignment& r : *a->mutable_ranks()) {
    if (r.worker() != lost) continue;
    rec.former_hosts[{a->number(), r.rank()}].push_back(lost);
    r.set_worker(spare->worker);
    r.set_address(spare->address);
    task.ranks.push_back(r.rank());
    task.group_rank = r.group_rank();
  }
  registry_.Unassign(lost, key);
  registry_.Assign(spare->worker, key, std::move(task));
  schedule_dirty_ = true;
  DDP_LOG(WARNING) << "job " << rec.job.id() << ": " << reason << "; its " << moved.size()
                   << " rank(s) move to spare worker " << spare->worker;
  StartRecoveryLocked(rec, moved,
                      absl::StrCat(reason, "; rank(s) moved to spare worker ", spare->worker),
                      touched);
  return true;
}

absl::Status Coordinator::ReportEvents(const v1::ReportEventsRequest& req) {
  absl::Notification stored;
  absl::Status out;
  ReportEvents(req, [&](absl::Status st) {
    out = std::move(st);
    stored.Notify();
  });
  stored.WaitForNotification();
  return out;
}

void Coordinator::ApplyEventLocked(JobRecord& rec, const v1::ReportedEvent& ev,
                                   TouchList& touched) {
  const v1::TrainerEvent& e = ev.event();
  const v1::Attempt* active = ActiveAttempt(rec);
  const bool current = active != nullptr && active->number() == ev.attempt();
  switch (e.body_case()) {
    case v1::TrainerEvent::kError:
      // A trainer's `error` event explains its exit: keep it in the rank table.
      ApplyLocked(rec, RecordRankError(rec, ev.attempt(), ev.rank(), e.error().message()),
                  touched);
      return;
    case v1::TrainerEvent::kDone:
      if (current) rec.stall.Done(ev.rank());
      return;
    case v1::TrainerEvent::kRecovered:
      ApplyLocked(rec,
                  FinishRecovery(rec, ev.attempt(), e.recovered().generation(),
                                 e.recovered().source_rank(), e.recovered().global_step(),
                                 clock_->Now()),
                  touched);
      return;
    case v1::TrainerEvent::kStep:
    case v1::TrainerEvent::kStart:
    case v1::TrainerEvent::kEpoch:
    case v1::TrainerEvent::kCheckpoint:
      if (!current) return;
      rec.stall.Progress(ev.rank(), active->world_size(), e.has_step(), clock_->Now());
      if (rec.stall.armed()) stall_checks_.Watch(rec.job.id());
      if (e.has_checkpoint()) {
        ApplyLocked(rec, RecordCheckpoint(rec, ev.attempt(), e.checkpoint().global_step(),
                                          clock_->Now()),
                    touched);
      }
      if (e.has_checkpoint() &&
          (!registry_.draining_at_checkpoint().empty() || !rec.preempt_for.empty() ||
           !rec.stopping_worker.empty())) {
        MoveAfterCheckpointLocked(rec, e.checkpoint(), touched);
      }
      return;
    case v1::TrainerEvent::BODY_NOT_SET:
      return;
  }
}

void Coordinator::ReportEvents(const v1::ReportEventsRequest& req, ReportDone done) {
  std::vector<v1::ReportedEvent> known;  // Events of jobs we have (not being deleted).
  {
    TouchList touched(hub_);
    absl::MutexLock lock(&mu_);
    auto w = registry_.Check(req.worker(), req.incarnation());
    if (!w.ok()) {
      done(w.status());
      return;
    }
    WorkerRecord& worker = **w;
    if (req.batch_seq() > 0) {
      if (req.batch_seq() <= worker.last_batch_seq &&
          !unstored_->Take(req.worker(), req.incarnation(), req.batch_seq())) {
        DDP_LOG(INFO) << "worker " << req.worker() << " re-sent batch " << req.batch_seq()
                      << ", already applied: dropped";
        done(absl::OkStatus());
        return;
      }
      worker.last_batch_seq = std::max(worker.last_batch_seq, req.batch_seq());
    }
    if (req.dropped() > 0) {
      DDP_LOG(WARNING) << "worker " << req.worker() << " dropped " << req.dropped()
                       << " events it could not deliver";
    }
    int unknown = 0;
    int untyped = 0;
    int64_t foreign = 0;
    std::string first_foreign;
    known.reserve(static_cast<size_t>(req.events_size()));
    for (const v1::ReportedEvent& ev : req.events()) {
      JobRecord* rec = FindLocked(ev.job_id());
      if (rec == nullptr || rec->retiring) {
        ++unknown;  // Deleted (retention) or never ours: nowhere to keep it.
        continue;
      }
      // Only the ranks the rank table puts on this worker: nobody injects another
      // node's output, metrics or errors. A rank's former host (before a live recovery
      // moved it) may still deliver the lines the rank printed there, nothing else.
      if (!HostsRank(*rec, ev.attempt(), ev.rank(), req.worker()) &&
          !(ev.has_log() && HostedRank(*rec, ev.attempt(), ev.rank(), req.worker()))) {
        if (foreign++ == 0) {
          first_foreign = absl::StrCat("events of job ", ev.job_id(), " attempt ",
                                       ev.attempt(), " rank ", ev.rank());
        }
        continue;
      }
      if (ev.has_event() && ev.event().body_case() == v1::TrainerEvent::BODY_NOT_SET) {
        ++untyped;  // The flat events of an agent older than the typed ones.
        continue;
      }
      if (ev.has_log() && !AdmitOutputLocked(*rec, ev, known)) continue;
      known.push_back(ev);
      if (known.back().has_log() && known.back().log().text().size() > kMaxLogLineBytes) {
        CutLine(*known.back().mutable_log()->mutable_text());
      }
      if (ev.has_event()) ApplyEventLocked(*rec, ev, touched);
    }
    if (untyped > 0) {
      DDP_LOG(WARNING) << "worker " << req.worker() << " reported " << untyped
                       << " event(s) without a typed body: dropped (its agent, version '"
                       << worker.info.version()
                       << "', predates typed events; upgrade it to this coordinator's)";
    }
    if (unknown > 0) {
      DDP_LOG(INFO) << "worker " << req.worker() << " reported " << unknown
                    << " event(s) of unknown jobs: dropped";
    }
    if (foreign > 0) CountForeignLocked(req.worker(), foreign, first_foreign);
  }
  if (known.empty()) {
    done(absl::OkStatus());
    return;
  }
  // The batch's number is stored with its events: a batch re-sent after a crash is
  // dropped by the restarted coordinator too (Recover loads the numbers).
  BatchMark mark;
  if (req.batch_seq() > 0) mark = {req.worker(), req.incarnation(), req.batch_seq()};
  ingest_.Post(
      std::move(known),
      [unstored = unstored_, done = std::move(done), worker = req.worker(),
       incarnation = req.incarnation(), seq = req.batch_seq()](absl::Status stored) {
        if (!stored.ok()) {
          // Not stored: the worker keeps the batch and sends it again (here, or to the
          // coordinator that leads next), and here it is taken again.
          if (seq > 0) unstored->Add(worker, incarnation, seq);
          // ABORTED, not UNAVAILABLE: the leader answered (a client of several
          // coordinators must not look for another), and agents keep and resend.
          done(absl::AbortedError(absl::StrCat(
              "the coordinator could not store the events (", stored.message(),
              "); send them again")));
          return;
        }
        done(absl::OkStatus());
      },
      std::move(mark));
}

void Coordinator::WaitForTasks(const v1::WaitForTasksRequest& req, TaskWaiters::Done done) {
  absl::StatusOr<uint64_t> now_version;
  {
    absl::MutexLock lock(&mu_);
    auto w = registry_.Check(req.worker(), req.incarnation());
    if (!w.ok()) {
      now_version = w.status();
    } else if ((*w)->desired_version != req.desired_version()) {
      now_version = (*w)->desired_version;  // It is behind already: answer at once.
    } else {
      const int64_t ms =
          req.timeout_ms() <= 0 ? 30000 : std::clamp<int64_t>(req.timeout_ms(), 1000, 60000);
      task_waiters_.Add(req.worker(), req.desired_version(),
                        clock_->Now() + absl::Milliseconds(ms), std::move(done));
      return;
    }
  }
  done(std::move(now_version));
}

absl::StatusOr<v1::ListWorkersResponse> Coordinator::ListWorkers(
    const v1::ListWorkersRequest& req) {
  if (req.limit() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("limit: must be >= 0 (got ", req.limit(), "); 0 means ",
                     kDefaultWorkerPage));
  }
  const int limit = req.limit() == 0 ? kDefaultWorkerPage : std::min(req.limit(), kMaxWorkerPage);
  v1::ListWorkersResponse resp;
  resp.set_coordinator_version(VersionString());
  absl::MutexLock lock(&mu_);
  *resp.mutable_summary() = registry_.Summary();
  if (req.summary_only()) return resp;
  const auto& workers = registry_.workers();
  auto it = req.page_token().empty() ? workers.begin() : workers.upper_bound(req.page_token());
  for (; it != workers.end() && resp.workers_size() < limit; ++it) {
    *resp.add_workers() = WorkerViewLocked(it->second);
  }
  if (it != workers.end()) resp.set_next_page_token(resp.workers().rbegin()->name());
  return resp;
}

v1::Worker Coordinator::WorkerViewLocked(const WorkerRecord& w) {
  v1::Worker info = w.info;
  info.set_alive(w.alive);
  info.set_free_slots(w.alive ? std::max(0, w.free_slots) : 0);
  registry_.ShowGpuHolders(w, &info);
  if (registry_.Quarantined(w)) {
    info.set_quarantined_until_ms(absl::ToUnixMillis(w.quarantine.until));
    info.set_quarantine_reason(w.quarantine.reason);
  }
  for (const auto& [key, task] : w.assigned) {
    if (info.jobs().empty() || info.jobs(info.jobs_size() - 1) != key.first) {
      info.add_jobs(key.first);
    }
  }
  return info;
}

}  // namespace ddp
