// Jobs: submission, queries, cancellation, scheduling and attempt outcomes.
// Worker-facing methods are in coordinator_workers.cc.
#include "coordinator/coordinator.h"

#include <algorithm>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "coordinator/rendezvous.h"

namespace ddp {
namespace {

int64_t Millis(absl::Time t) { return absl::ToUnixMillis(t); }

std::string Seconds(absl::Duration d) {
  return absl::StrFormat("%gs", absl::ToDoubleSeconds(d));
}

}  // namespace

absl::Status ValidateTimeouts(const CoordinatorOptions& o) {
  if (o.rpc_deadline <= absl::ZeroDuration() || o.rpc_deadline >= o.heartbeat_interval) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--rpc-deadline (", absl::FormatDuration(o.rpc_deadline),
        ") must be positive and shorter than --heartbeat-interval (",
        absl::FormatDuration(o.heartbeat_interval), ")"));
  }
  if (o.heartbeat_interval >= o.heartbeat_timeout) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--heartbeat-interval (", absl::FormatDuration(o.heartbeat_interval),
        ") must be shorter than --heartbeat-timeout (",
        absl::FormatDuration(o.heartbeat_timeout), ")"));
  }
  return absl::OkStatus();
}

bool IsTerminal(v1::JobState s) {
  return s == v1::SUCCEEDED || s == v1::FAILED || s == v1::CANCELLED;
}

const char* JobStateName(v1::JobState s) {
  return v1::JobState_Name(s).c_str();  // The enum value names, from protoc.
}

Coordinator::TouchList::~TouchList() {
  for (const std::string& id : finished_) hub_->MarkFinished(id);
  for (const std::string& id : ids_) hub_->Touch(id);
}

Coordinator::Coordinator(CoordinatorOptions options, StateStore* store, EventHub* hub,
                         Clock* clock)
    : options_(options), store_(store), hub_(hub), clock_(clock) {
  last_retention_ = clock_->Now();
}

v1::Attempt* Coordinator::ActiveAttempt(JobRecord& job) {
  if (job.job.attempts().empty()) return nullptr;
  v1::Attempt* a = job.job.mutable_attempts(job.job.attempts_size() - 1);
  return a->state() == v1::RENDEZVOUS || a->state() == v1::RUNNING ? a : nullptr;
}

Coordinator::JobRecord* Coordinator::FindLocked(const std::string& job_id) {
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : &it->second;
}

absl::Status Coordinator::WriteLocked(const JobRecord& job) {
  if (job.retiring) return absl::OkStatus();  // Being deleted by retention.
  absl::Status st = store_->SaveJob(job.job, job.seq);
  if (!st.ok()) {
    DDP_LOG(ERROR) << "STATE STORE WRITE FAILED for job " << job.job.id() << " ("
                   << JobStateName(job.job.state()) << "): " << st
                   << ": check the --state-dir disk";
  }
  return st;
}

void Coordinator::PersistLocked(const JobRecord& job, TouchList& touched) {
  touched.Add(job.job.id(), IsTerminal(job.job.state()));
  if (!WriteLocked(job).ok()) {
    DDP_LOG(ERROR) << "job " << job.job.id()
                   << ": the change is live but would be lost if the coordinator restarted";
  }
}

absl::Status Coordinator::Recover() {
  auto loaded = store_->Load();
  if (!loaded.ok()) return loaded.status();
  TouchList touched(hub_);  // Tells the hub which jobs are finished.
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  for (auto& stored : loaded->jobs) {
    JobRecord rec;
    rec.job = std::move(stored.job);
    rec.seq = stored.seq;
    next_seq_ = std::max(next_seq_, rec.seq + 1);
    auto spec = ParseJobSpec(rec.job.spec_yaml(), rec.job.name());
    if (!spec.ok()) {
      // Written by another version, or edited: shown, not hidden. A finished job keeps
      // its outcome; one in flight cannot be run (or restarted) without its spec.
      const std::string reason =
          absl::StrCat("stored spec no longer parses: ", spec.status().message());
      DDP_LOG(ERROR) << "job " << rec.job.id() << ": " << reason;
      rec.spec.name = rec.job.name();
      if (!IsTerminal(rec.job.state())) {
        if (v1::Attempt* a = ActiveAttempt(rec)) {
          a->set_state(v1::FAILED);
          a->set_reason(reason);
          a->set_end_ms(Millis(now));
        }
        rec.job.set_state(v1::FAILED);
        rec.job.set_reason(reason);
        rec.job.set_end_ms(Millis(now));
        PersistLocked(rec, touched);
      }
      touched.Add(rec.job.id(), /*finished=*/true);
      jobs_[rec.job.id()] = std::move(rec);
      continue;
    }
    rec.spec = *std::move(spec);
    if (rec.job.state() == v1::RENDEZVOUS && ActiveAttempt(rec) == nullptr) {
      rec.job.set_state(v1::PENDING);  // Was gathering: decide again.
    }
    rec.start_deadline = now + absl::Seconds(rec.spec.rdzv.timeout_s);
    if (IsTerminal(rec.job.state())) touched.Add(rec.job.id(), /*finished=*/true);
    jobs_[rec.job.id()] = std::move(rec);
  }
  for (auto& w : loaded->workers) {
    WorkerRecord rec;
    rec.info = std::move(w);
    rec.last_seen = now;  // One heartbeat timeout from now to check in.
    rec.confirmed = false;
    workers_[rec.info.name()] = std::move(rec);
  }
  DDP_LOG(INFO) << "recovered " << jobs_.size() << " jobs and " << workers_.size()
                << " workers from the state store";
  return absl::OkStatus();
}

std::string Coordinator::NewJobIdLocked(const std::string& name) {
  static constexpr char kAlphabet[] = "abcdefghijklmnopqrstuvwxyz0123456789";
  while (true) {
    std::string id = name.substr(0, 50) + "-";
    for (int i = 0; i < 5; ++i) id += kAlphabet[absl::Uniform(rng_, 0, 36)];
    if (jobs_.count(id) == 0) return id;
  }
}

absl::StatusOr<v1::Job> Coordinator::Submit(const v1::SubmitJobRequest& request) {
  const std::string source = request.source_name().empty() ? "job.yaml" : request.source_name();
  auto spec = ParseJobSpec(request.spec_yaml(), source);
  if (!spec.ok()) return spec.status();
  if (absl::Seconds(spec->rdzv.timeout_s) <= options_.heartbeat_timeout) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": rdzv.timeout_s: must be greater than the coordinator's heartbeat timeout (",
        Seconds(options_.heartbeat_timeout), "): timeouts are ordered heartbeat < rendezvous"));
  }
  std::string workdir = !request.workdir().empty() ? request.workdir() : spec->workdir;
  if (!workdir.empty() && workdir[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("workdir: '", workdir, "' must be an absolute path"));
  }

  TouchList touched(hub_);
  absl::MutexLock lock(&mu_);
  JobRecord rec;
  rec.job.set_id(NewJobIdLocked(spec->name));
  const std::string rdzv_id = spec->rdzv_id.empty() ? rec.job.id() : spec->rdzv_id;
  for (const auto& [id, other] : jobs_) {
    if (!IsTerminal(other.job.state()) && other.job.rdzv_id() == rdzv_id) {
      return absl::AlreadyExistsError(absl::StrCat(
          "rdzv_id '", rdzv_id, "' is in use by job ", id, " (",
          JobStateName(other.job.state()),
          "): wait for it to finish, cancel it, or choose another rdzv_id"));
    }
  }
  rec.spec = *std::move(spec);
  rec.seq = next_seq_++;
  v1::Job& job = rec.job;
  job.set_name(rec.spec.name);
  job.set_rdzv_id(rdzv_id);
  job.set_state(v1::PENDING);
  job.set_reason("queued");
  job.set_spec_yaml(request.spec_yaml());
  job.set_workdir(workdir);
  job.set_min_nodes(rec.spec.nodes.min);
  job.set_max_nodes(rec.spec.nodes.max);
  job.set_nproc_per_node(rec.spec.nproc_per_node);
  job.set_max_restarts(rec.spec.max_restarts);
  job.set_epochs(rec.spec.train.epochs);
  job.set_submit_ms(Millis(clock_->Now()));
  const std::string id = job.id();
  // Stored before it is visible: a job the store did not take was never submitted.
  if (absl::Status st = WriteLocked(rec); !st.ok()) {
    return absl::UnavailableError(absl::StrCat(
        "the coordinator could not store the job (", st.message(),
        "); nothing was queued: check the coordinator's --state-dir (disk full? permissions?)"
        " and submit again"));
  }
  jobs_[id] = std::move(rec);
  DDP_LOG(INFO) << "job " << id << " submitted (" << NodeRangeString(jobs_[id].spec.nodes)
                << " nodes)";
  ScheduleLocked(touched);
  return ViewLocked(jobs_[id], false);
}

v1::Job Coordinator::SummaryLocked(const JobRecord& rec) {
  v1::Job view = rec.job;
  for (v1::Attempt& a : *view.mutable_attempts()) {
    a.set_live_trainers(LiveTrainersLocked(rec.job.id(), a));
  }
  if (rec.job.state() == v1::PENDING) {
    int64_t position = 1;
    for (const auto& [id, other] : jobs_) {
      if (other.job.state() == v1::PENDING && other.seq < rec.seq) ++position;
    }
    view.set_queue_position(position);
  }
  return view;
}

v1::Job Coordinator::ViewLocked(const JobRecord& rec, bool metric_history) {
  v1::Job view = SummaryLocked(rec);
  const int attempt = rec.job.attempts().empty()
                          ? 0
                          : rec.job.attempts(rec.job.attempts_size() - 1).number();
  hub_->Fill(rec.job.id(), attempt, &view);
  if (metric_history) {
    auto history = store_->MetricHistory(rec.job.id());
    if (history.ok()) {
      for (auto& m : *history) *view.add_history() = std::move(m);
    }
  }
  return view;
}

absl::StatusOr<v1::Job> Coordinator::GetJob(const std::string& job_id, bool metric_history) {
  absl::MutexLock lock(&mu_);
  JobRecord* rec = FindLocked(job_id);
  if (rec == nullptr) {
    return absl::NotFoundError(absl::StrCat("job '", job_id, "' not found"));
  }
  return ViewLocked(*rec, metric_history);
}

std::vector<v1::Job> Coordinator::ListJobs(int limit) {
  absl::MutexLock lock(&mu_);
  std::vector<const JobRecord*> recs;
  for (const auto& [id, rec] : jobs_) recs.push_back(&rec);
  std::sort(recs.begin(), recs.end(),
            [](const JobRecord* a, const JobRecord* b) { return a->seq > b->seq; });
  if (limit <= 0) limit = 100;
  std::vector<v1::Job> out;
  for (const JobRecord* rec : recs) {
    if (static_cast<int>(out.size()) >= limit) break;
    v1::Job view = SummaryLocked(*rec);  // No metrics: no hub (or SQLite) reads per job.
    view.clear_spec_yaml();
    out.push_back(std::move(view));
  }
  return out;
}

absl::StatusOr<v1::Job> Coordinator::Cancel(const std::string& job_id) {
  TouchList touched(hub_);
  absl::MutexLock lock(&mu_);
  JobRecord* rec = FindLocked(job_id);
  if (rec == nullptr) {
    return absl::NotFoundError(absl::StrCat("job '", job_id, "' not found"));
  }
  if (IsTerminal(rec->job.state())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", job_id, " already finished (", JobStateName(rec->job.state()), ")"));
  }
  const int64_t now = Millis(clock_->Now());
  if (v1::Attempt* a = ActiveAttempt(*rec)) {
    a->set_state(v1::CANCELLED);
    a->set_reason("cancelled by user");
    a->set_end_ms(now);
  }
  rec->gathering = false;
  rec->job.set_state(v1::CANCELLED);
  rec->job.set_reason("cancelled by user");
  rec->job.set_end_ms(now);
  PersistLocked(*rec, touched);
  DDP_LOG(INFO) << "job " << job_id << " cancelled";
  ScheduleLocked(touched);  // Its slots free up once its trainers are gone.
  return ViewLocked(*rec, false);
}

int Coordinator::FreeSlotsLocked(const WorkerRecord& worker) {
  int busy = 0;
  std::set<TaskKey> counted;
  for (auto& [id, rec] : jobs_) {
    v1::Attempt* a = ActiveAttempt(rec);
    if (a == nullptr) continue;
    for (const auto& r : a->ranks()) {
      if (r.worker() == worker.info.name()) {
        ++busy;
        counted.insert({id, a->number()});
      }
    }
  }
  // Handed out and not yet shown gone: the trainers may be starting right now.
  for (const auto& [key, ranks] : worker.dispatched) {
    if (counted.insert(key).second) busy += ranks;
  }
  // Trainers of finished attempts hold their slots until they are gone.
  for (const v1::TaskStatus& t : worker.reported) {
    if (counted.count({t.job_id(), t.attempt()})) continue;
    for (const auto& r : t.ranks()) busy += r.exited() ? 0 : 1;
  }
  return worker.info.slots() - busy;
}

int Coordinator::LiveTrainersLocked(const std::string& job_id, const v1::Attempt& attempt) {
  const TaskKey key{job_id, attempt.number()};
  int live = 0;
  for (const v1::RankAssignment& r : attempt.ranks()) {
    auto w = workers_.find(r.worker());
    if (w == workers_.end()) continue;
    const WorkerRecord& worker = w->second;
    if (worker.dispatched.count(key)) {
      ++live;
      continue;
    }
    if (!worker.confirmed) {  // Recovered, not checked in yet: trust the rank table.
      live += r.pid() != 0 && !r.exited() ? 1 : 0;
      continue;
    }
    for (const v1::TaskStatus& t : worker.reported) {
      if (t.job_id() != job_id || t.attempt() != attempt.number()) continue;
      for (const v1::LocalRankStatus& s : t.ranks()) {
        if (s.rank() == r.rank() && !s.exited()) ++live;
      }
    }
  }
  return live;
}

std::vector<v1::Task> Coordinator::DesiredTasksLocked(const std::string& worker) {
  std::vector<v1::Task> tasks;
  for (auto& [id, rec] : jobs_) {
    v1::Attempt* a = ActiveAttempt(rec);
    if (a == nullptr) continue;
    v1::Task task;
    for (const auto& r : a->ranks()) {
      if (r.worker() != worker) continue;
      task.add_ranks(r.rank());
      task.set_group_rank(r.group_rank());
    }
    if (task.ranks().empty()) continue;
    task.set_job_id(id);
    task.set_attempt(a->number());
    task.set_spec_yaml(rec.job.spec_yaml());
    task.set_workdir(rec.job.workdir());
    task.set_world_size(a->world_size());
    task.set_master_addr(a->master_addr());
    task.set_master_port(a->master_port());
    for (const auto& [k, v] : rec.spec.env) (*task.mutable_env())[k] = v;
    tasks.push_back(std::move(task));
  }
  return tasks;
}

void Coordinator::ScheduleLocked(TouchList& touched) {
  const absl::Time now = clock_->Now();
  std::vector<JobRecord*> queue;
  for (auto& [id, rec] : jobs_) {
    if (rec.job.state() == v1::PENDING || (rec.job.state() == v1::RENDEZVOUS && rec.gathering)) {
      queue.push_back(&rec);
    }
  }
  std::sort(queue.begin(), queue.end(),
            [](const JobRecord* a, const JobRecord* b) { return a->seq < b->seq; });
  for (JobRecord* rec : queue) {
    std::vector<NodeOffer> offers;
    for (auto& [name, w] : workers_) {
      if (!w.alive || !w.confirmed) continue;
      offers.push_back({name, w.info.address(), FreeSlotsLocked(w), w.info.gpus()});
    }
    std::vector<NodeOffer> eligible = EligibleNodes(offers, rec->spec.nproc_per_node);
    const NodeRange& range = rec->spec.nodes;
    const absl::Time window_end =
        rec->gathering ? rec->window_end : now + absl::Seconds(rec->spec.rdzv.last_call_s);
    switch (DecideRendezvous(static_cast<int>(eligible.size()), range, now, window_end)) {
      case RendezvousStep::kWait: {
        std::string reason = absl::StrCat(
            "waiting for ", range.min, " node(s) with ",
            rec->spec.nproc_per_node > 0 ? absl::StrCat(rec->spec.nproc_per_node) : "auto",
            " free slot(s); ", eligible.size(), " available");
        if (rec->job.state() != v1::PENDING || rec->job.reason() != reason) {
          rec->job.set_state(v1::PENDING);
          rec->job.set_reason(reason);
          rec->gathering = false;
          PersistLocked(*rec, touched);
        }
        return;  // Strict FIFO: nothing behind the head may start.
      }
      case RendezvousStep::kLastCall:
        if (!rec->gathering) {
          rec->gathering = true;
          rec->window_end = window_end;
          rec->job.set_state(v1::RENDEZVOUS);
          rec->job.set_reason(absl::StrCat("rendezvous: ", eligible.size(), " of up to ",
                                           range.max, " nodes; last call ends in ",
                                           rec->spec.rdzv.last_call_s, "s"));
          PersistLocked(*rec, touched);
        }
        return;
      case RendezvousStep::kForm:
        eligible.resize(std::min<size_t>(eligible.size(), static_cast<size_t>(range.max)));
        if (!FormLocked(*rec, eligible, touched)) return;
        break;
    }
  }
}

bool Coordinator::FormLocked(JobRecord& rec, const std::vector<NodeOffer>& nodes,
                             TouchList& touched) {
  WorkerRecord& head = workers_.at(nodes[0].worker);
  // MASTER_PORT: a port the rank-0 node found free, not taken by another live attempt.
  std::set<int> taken;
  for (auto& [id, other] : jobs_) {
    if (v1::Attempt* a = ActiveAttempt(other); a && a->master_addr() == nodes[0].address) {
      taken.insert(a->master_port());
    }
  }
  int port = 0;
  for (auto it = head.free_ports.begin(); it != head.free_ports.end(); ++it) {
    if (!taken.count(*it)) {
      port = *it;
      head.free_ports.erase(it);
      break;
    }
  }
  if (port == 0) {
    const std::string reason = absl::StrCat("waiting for worker ", head.info.name(),
                                            " to report a free port for the rendezvous store");
    if (rec.job.reason() != reason) {
      rec.job.set_reason(reason);
      PersistLocked(rec, touched);
    }
    return false;
  }
  const absl::Time now = clock_->Now();
  v1::Attempt* a = rec.job.add_attempts();
  a->set_number(rec.job.attempts_size());
  a->set_state(v1::RENDEZVOUS);
  a->set_master_addr(nodes[0].address);
  a->set_master_port(port);
  for (auto& r : AssignRanks(nodes, rec.spec.nproc_per_node)) *a->add_ranks() = std::move(r);
  a->set_world_size(a->ranks_size());
  a->set_start_ms(Millis(now));
  std::vector<std::string> names;
  for (const NodeOffer& n : nodes) names.push_back(n.worker);
  rec.gathering = false;
  rec.start_deadline = now + absl::Seconds(rec.spec.rdzv.timeout_s);
  rec.job.set_state(v1::RENDEZVOUS);
  rec.job.set_reason(absl::StrCat("attempt ", a->number(), ": starting ", a->world_size(),
                                  " trainers on ", absl::StrJoin(names, ", ")));
  PersistLocked(rec, touched);
  DDP_LOG(INFO) << "job " << rec.job.id() << " attempt " << a->number() << " formed: world "
                << a->world_size() << " on " << absl::StrJoin(names, ", ") << ", store "
                << a->master_addr() << ":" << port;
  return true;
}

void Coordinator::FailAttemptLocked(JobRecord& rec, const std::string& reason, bool retryable,
                                    TouchList& touched) {
  v1::Attempt* a = ActiveAttempt(rec);
  if (a == nullptr) return;
  const int64_t now = Millis(clock_->Now());
  a->set_state(v1::FAILED);
  a->set_reason(reason);
  a->set_end_ms(now);
  if (retryable && rec.job.restarts() < rec.job.max_restarts()) {
    rec.job.set_restarts(rec.job.restarts() + 1);
    rec.job.set_state(v1::PENDING);
    rec.job.set_reason(absl::StrCat("restarting (", rec.job.restarts(), " of ",
                                    rec.job.max_restarts(), ") after attempt ", a->number(),
                                    " failed: ", reason));
  } else {
    rec.job.set_state(v1::FAILED);
    rec.job.set_reason(retryable && rec.job.max_restarts() > 0
                           ? absl::StrCat(reason, " (no restarts left of ",
                                          rec.job.max_restarts(), ")")
                           : reason);
    rec.job.set_end_ms(now);
  }
  DDP_LOG(WARNING) << "job " << rec.job.id() << " attempt " << a->number() << " failed: "
                   << reason << " -> " << JobStateName(rec.job.state());
  PersistLocked(rec, touched);
}

std::optional<std::vector<std::string>> Coordinator::Housekeep() {
  TouchList touched(hub_);
  absl::MutexLock lock(&mu_);
  ExpireLocked(touched);
  const absl::Time now = clock_->Now();
  for (auto& [id, rec] : jobs_) {
    v1::Attempt* a = ActiveAttempt(rec);
    if (a == nullptr || a->state() != v1::RENDEZVOUS || now < rec.start_deadline) continue;
    std::set<std::string> late;
    for (const auto& r : a->ranks()) {
      if (r.pid() == 0) late.insert(r.worker());
    }
    FailAttemptLocked(rec,
                      absl::StrCat("rendezvous timed out: trainers on ",
                                   absl::StrJoin(late, ", "), " not running within rdzv.timeout_s (",
                                   rec.spec.rdzv.timeout_s, "s)"),
                      /*retryable=*/true, touched);
  }
  ScheduleLocked(touched);
  if (now - last_retention_ < absl::Minutes(1)) return std::nullopt;
  last_retention_ = now;
  // Jobs past retention stop being written (PersistLocked skips them, their events
  // are dropped) until the store has deleted them and they are erased below.
  std::vector<FinishedJob> finished;
  for (const auto& [id, rec] : jobs_) {
    if (IsTerminal(rec.job.state()) && !rec.retiring) {
      finished.push_back({id, rec.job.end_ms(), rec.seq});
    }
  }
  std::vector<std::string> retired =
      JobsPastRetention(std::move(finished), store_->retention().retain_jobs);
  for (const std::string& id : retired) jobs_[id].retiring = true;
  return retired;
}

void Coordinator::Tick() {
  std::optional<std::vector<std::string>> due = Housekeep();
  if (!due.has_value()) return;
  const std::vector<std::string>& retired = *due;
  // The big deletes run without the coordinator's lock: heartbeats and watchers
  // carry on meanwhile.
  const absl::Status st = store_->EnforceRetention(retired);
  if (!st.ok()) DDP_LOG(ERROR) << "retention: " << st << " (retrying in a minute)";
  {
    absl::MutexLock lock(&mu_);
    for (const std::string& id : retired) {
      if (st.ok()) {
        jobs_.erase(id);
      } else if (JobRecord* rec = FindLocked(id)) {
        rec->retiring = false;
      }
    }
  }
  if (!st.ok()) return;
  for (const std::string& id : retired) hub_->Forget(id);
  if (!retired.empty()) {
    DDP_LOG(INFO) << "retention: deleted " << retired.size() << " finished job(s)";
  }
}

}  // namespace ddp
