#include "worker/agent/agent.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "common/net.h"
#include "common/rpc/health_client.h"
#include "common/version.h"
#include "common/status_macros.h"
#include "worker/agent/proto_utf8.h"

namespace ddp {
namespace {

constexpr int kFreePorts = 3;  // Candidate MASTER_PORTs per heartbeat.

}  // namespace

absl::Duration ReconnectBound(absl::Duration heartbeat_interval, absl::Duration max_backoff,
                              absl::Duration rpc_deadline) {
  return kMaxConnectDelay + std::max(heartbeat_interval, max_backoff) + rpc_deadline;
}

std::string NewIncarnation() {
  absl::BitGen gen;
  return absl::StrFormat("%016x", absl::Uniform<uint64_t>(gen));
}

Agent::Agent(AgentOptions options, std::unique_ptr<CoordinatorClient> client, Clock* clock)
    : options_(std::move(options)),
      client_(std::move(client)),
      clock_(clock),
      incarnation_(NewIncarnation()),
      backoff_(absl::Milliseconds(100), options_.max_backoff) {
  EventReporter::Options ro;
  ro.worker = options_.name;
  ro.incarnation = incarnation_;
  reporter_ = std::make_unique<EventReporter>(ro, &buffer_, client_.get(), [this] { Wake(); });
  pump_ = std::make_unique<OutputPump>(&buffer_, clock, [this] { reporter_->Wake(); });
  client_->SetOnAnswer([this] {
    answer_waiting_.store(true);
    Wake();
  });
  if (options_.long_poll) {
    TaskPoller::Options po;
    po.worker = options_.name;
    po.incarnation = incarnation_;
    poller_ = std::make_unique<TaskPoller>(po, client_.get(), [this] {
      news_.store(true);
      Wake();
    });
  }
}

Agent::~Agent() {
  client_->SetOnAnswer(nullptr);  // Wakes nothing of ours from now on.
  poller_.reset();    // Cancels its open call before the client goes.
  reporter_.reset();  // Stops sending before the client goes.
  tasks_.clear();     // Kills leftovers before the pump goes.
  pump_.reset();
}

Agent::Stats Agent::stats() const {
  Stats s;
  s.trainers_running = trainers_running_;
  s.tasks_started = tasks_started_;
  s.restarted_tasks = restarted_tasks_;
  s.trainers_started = trainers_started_;
  s.start_failures = start_failures_;
  s.heartbeat_failures = heartbeat_failures_;
  s.events_dropped = buffer_.dropped_total();
  s.malformed_event_lines = pump_->malformed_event_lines();
  s.fences = fences_;
  s.quiet_beats = quiet_beats_;
  return s;
}

void Agent::Stop(const std::string& reason) {
  {
    absl::MutexLock lock(&stop_mu_);
    if (stop_reason_.empty()) stop_reason_ = reason;
  }
  if (!stop_.HasBeenNotified()) stop_.Notify();
  if (poller_) poller_->Stop();
  Wake();
}

absl::Duration Agent::AwaitMoves() {
  int running = 0;
  for (auto& [key, task] : tasks_) running += task->running();
  if (running == 0) {
    (void)HeartbeatOnce();  // `leaving`, if it leaves.
    return options_.stop_grace;
  }
  // The coordinator gives the jobs here the checkpoint-now notice and moves them after
  // that checkpoint (or ends them at once when they take none); their tasks then drop
  // out of the desired state and Reconcile stops them. Whatever still runs when the
  // grace is over is stopped below, with what is left of it.
  stopping_grace_ = options_.stop_grace;
  const absl::Time until = clock_->Now() + options_.stop_grace;
  DDP_LOG(INFO) << "stopping: " << running << " rank(s) still run; their jobs are told to "
                << "checkpoint now and move (up to " << options_.stop_grace << ")";
  absl::Time next_heartbeat = clock_->Now();
  while (clock_->Now() < until) {
    bool changed = false;
    bool busy = false;
    for (auto& [key, task] : tasks_) {
      changed |= task->Poll(clock_->Now());
      busy = busy || !task->Finished();
    }
    const int64_t pushed = buffer_.pushed();
    for (auto& [key, task] : tasks_) task->StampExits(pushed);
    if (!busy) break;
    if (changed || news_.exchange(false) || clock_->Now() >= next_heartbeat) {
      if (!HeartbeatOnce().ok()) break;  // Nobody to move them: stop them now.
      next_heartbeat = clock_->Now() + std::min(heartbeat_interval_, absl::Milliseconds(200));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  // The ranks had their notice: what is left of the grace, at least a second.
  return std::max(until - clock_->Now(), absl::Seconds(1));
}

std::string Agent::LeaveReason() {
  absl::MutexLock lock(&stop_mu_);
  return stop_reason_.empty() ? std::string("the agent stopped") : stop_reason_;
}

void Agent::Wake() {
  absl::MutexLock lock(&wake_mu_);
  woken_ = true;
}

void Agent::WaitForWork(absl::Duration timeout) {
  absl::MutexLock lock(&wake_mu_);
  auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(wake_mu_) { return woken_; };
  wake_mu_.AwaitWithTimeout(absl::Condition(&woken), timeout);
  woken_ = false;
}

void Agent::SetReachable(bool reachable) {
  if (reachable_ == reachable) return;
  if (!reachable) {
    unreachable_since_ = clock_->Now();
  } else if (reachable_.has_value()) {  // Back, not the first contact.
    DDP_LOG(INFO) << "coordinator reachable again after "
                  << absl::FormatDuration(absl::Trunc(clock_->Now() - unreachable_since_,
                                                      absl::Milliseconds(100)));
  }
  reachable_ = reachable;
  if (on_reachable_) on_reachable_(reachable);
}

bool Agent::FencePending() const {
  return registered_ && !fence_asked_ && !reachable_.value_or(true);
}

void Agent::MaybeFence(absl::Time now) {
  if (!FencePending() || now - last_ok_sent_ < fence_.ask_after) return;
  fence_asked_ = true;
  int running = 0;
  for (const auto& [key, task] : tasks_) running += task->running();
  if (running == 0) return;
  const std::vector<absl::StatusOr<bool>> answers =
      options_.ask_witnesses ? options_.ask_witnesses(witnesses_, fence_.ask_deadline)
                             : CheckHealthAll(witnesses_, kWitnessService, fence_.ask_deadline);
  const FenceVerdict verdict = DecideFence(witnesses_, answers);
  const absl::Duration silent = absl::Trunc(clock_->Now() - last_ok_sent_, absl::Milliseconds(10));
  if (!verdict.fence) {
    DDP_LOG(WARNING) << "no heartbeat through for " << silent << ": " << verdict.why;
    return;
  }
  // A witness may reach a coordinator we have not tried since ours went away: one
  // that restarted, or a standby that took over, which answered the witness first. One
  // more heartbeat, short enough to keep the fence ahead of the coordinator's verdict
  // (at most two calls: to ours, and to the leader a standby names), tells; on fresh
  // connections, not ones waiting out a reconnect backoff from the outage.
  client_->Reconnect();
  if (HeartbeatOnce(std::max(absl::Milliseconds(20), rpc_deadline_ / 6)).ok()) {
    SetReachable(true);
    DDP_LOG(WARNING) << "no heartbeat through for " << silent << ", but one got through now: "
                     << "not fencing (" << verdict.why << ")";
    return;
  }
  ++fences_;
  DDP_LOG(WARNING) << "no heartbeat through for " << silent << ": " << verdict.why << " ("
                   << running << " rank(s) of " << tasks_.size() << " task(s) killed)";
  for (auto& [key, task] : tasks_) task->Kill();
}

absl::Status Agent::RegisterOnce() {
  v1::RegisterRequest req;
  req.set_worker(options_.name);
  req.set_incarnation(incarnation_);
  req.set_address(options_.advertise_addr);
  req.set_hostname(LocalHostname());
  req.set_slots(options_.slots);
  req.set_gpus(static_cast<int32_t>(options_.gpus.size()));
  for (const GpuDevice& g : options_.gpus) {
    v1::GpuDevice* d = req.add_gpu_devices();
    d->set_index(g.index);
    d->set_uuid(g.uuid);
    d->set_model(g.model);
    d->set_memory_bytes(g.memory_bytes);
  }
  req.set_version(VersionString());
  for (const auto& [key, value] : options_.labels) (*req.mutable_labels())[key] = value;
  req.set_witness_port(options_.witness_port);
  RepairUtf8(&req);  // The host name or a flag may hold anything.
  const absl::Time sent = clock_->Now();
  auto resp = client_->Register(req, rpc_deadline_);
  if (!resp.ok()) return resp.status();
  heartbeat_interval_ = absl::Milliseconds(resp->heartbeat_interval_ms());
  rpc_deadline_ = absl::Milliseconds(resp->rpc_deadline_ms());
  if (rpc_deadline_ <= absl::ZeroDuration() || rpc_deadline_ >= heartbeat_interval_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the coordinator's timeouts are out of order: rpc deadline ",
        absl::FormatDuration(rpc_deadline_), " must be shorter than the heartbeat interval ",
        absl::FormatDuration(heartbeat_interval_)));
  }
  PlanBeats(heartbeat_interval_, absl::Milliseconds(resp->heartbeat_timeout_ms()));
  last_ok_sent_ = sent;
  last_told_.clear();
  fence_asked_ = false;
  registered_ = true;
  backoff_.Reset();
  reporter_->Resume(rpc_deadline_);
  DDP_LOG(INFO) << "registered as " << options_.name << " (incarnation " << incarnation_ << ", "
                << options_.slots << " slots, " << options_.advertise_addr << "), heartbeat every "
                << heartbeat_interval_;
  return absl::OkStatus();
}

void Agent::PlanBeats(absl::Duration interval, absl::Duration timeout) {
  heartbeat_interval_ = interval;
  heartbeat_timeout_ = timeout;
  const int beats_per_ack = options_.quiet_heartbeats && client_->QuietCapable()
                                ? QuietBeatsPerAck(heartbeat_interval_, timeout, rpc_deadline_)
                                : 1;
  if (beats_per_ack != beats_per_ack_) {
    DDP_LOG(INFO) << "quiet heartbeats: the coordinator is asked to answer one beat in "
                  << beats_per_ack << " (fence.h)";
  }
  beats_per_ack_ = beats_per_ack;
  const FencePlan fence = PlanFencing(heartbeat_interval_, timeout, rpc_deadline_, beats_per_ack_);
  if (fence.tight && !fence_.tight) {
    DDP_LOG(WARNING) << "the coordinator's heartbeat timeout of " << timeout
                     << " leaves too little time for other workers to notice a coordinator "
                        "outage before this one must decide whether it is cut off: an outage "
                        "may fence its ranks (a timeout of at least "
                     << 2 * (heartbeat_interval_ + rpc_deadline_) + rpc_deadline_
                     << " avoids it)";
  }
  fence_ = fence;
}

void Agent::FollowInterval(const v1::HeartbeatResponse& resp) {
  const absl::Duration interval = absl::Milliseconds(resp.heartbeat_interval_ms());
  const absl::Duration timeout = absl::Milliseconds(resp.heartbeat_timeout_ms());
  // 0: a coordinator older than the fields. Out of order: not a coordinator's answer
  // (it checked its own at start), kept as it was.
  if (resp.heartbeat_interval_ms() <= 0 || resp.heartbeat_timeout_ms() <= 0) return;
  if (interval == heartbeat_interval_ && timeout == heartbeat_timeout_) return;
  if (rpc_deadline_ >= interval || interval >= timeout) return;
  DDP_LOG(INFO) << "the coordinator asks for a heartbeat every " << interval << " (was "
                << heartbeat_interval_ << "), timeout " << timeout << " (decision 162)";
  PlanBeats(interval, timeout);
}

int64_t Agent::Delivered() const { return reporter_->delivered(); }

bool Agent::HoldsExits() const {
  const int64_t delivered = Delivered();
  for (const auto& [key, task] : tasks_) {
    if (task->HoldsExits(delivered)) return true;
  }
  return false;
}

absl::Status Agent::HeartbeatOnce(absl::Duration deadline) {
  v1::HeartbeatRequest req;
  req.set_worker(options_.name);
  req.set_incarnation(incarnation_);
  req.set_heartbeat_interval_ms(absl::ToInt64Milliseconds(heartbeat_interval_));
  if (!leaving_.empty()) req.set_leaving(leaving_);
  if (stopping_grace_ > absl::ZeroDuration()) {
    req.set_stopping_grace_ms(absl::ToInt64Milliseconds(stopping_grace_));
  }
  std::set<TaskKey> sent_finished;
  const int64_t delivered = Delivered();
  held_exits_ = false;
  for (auto& [key, task] : tasks_) {
    *req.add_tasks() = task->Status(delivered);
    const bool holds = task->HoldsExits(delivered);
    held_exits_ = held_exits_ || holds;
    if (task->Finished() && !holds) sent_finished.insert(key);
  }
  if (options_.gpu_inventory != nullptr && !options_.gpus.empty()) {
    // A failed sample is left out (the coordinator keeps none rather than a stale one);
    // NVML's own message is logged once.
    auto usage = options_.gpu_inventory->Usage();
    if (usage.ok()) {
      for (const GpuUsage& u : *usage) {
        const bool offered = std::any_of(options_.gpus.begin(), options_.gpus.end(),
                                         [&](const GpuDevice& g) { return g.uuid == u.uuid; });
        if (!offered) continue;
        v1::GpuUsage* g = req.add_gpu_usage();
        g->set_uuid(u.uuid);
        g->set_memory_used_bytes(u.memory_used_bytes);
        g->set_utilization_percent(u.utilization_percent);
      }
    } else if (!gpu_usage_warned_) {
      gpu_usage_warned_ = true;
      DDP_LOG(WARNING) << "GPU use not sent with heartbeats: " << usage.status().message();
    }
  }
  if (options_.store_ports.first > 0) {
    // The range's free ports in turn, so that successive beats offer others.
    const PortRange& range = options_.store_ports;
    for (int n = 0; n < range.size() && req.free_ports_size() < kFreePorts; ++n) {
      const int port = range.first + store_port_cursor_;
      store_port_cursor_ = (store_port_cursor_ + 1) % range.size();
      if (PortIsBindable(port)) req.add_free_ports(port);
    }
  } else {
    for (int i = 0; i < kFreePorts; ++i) {
      auto port = PickFreePort("0.0.0.0");
      if (port.ok()) req.add_free_ports(*port);
    }
  }
  RepairUtf8(&req);  // Task errors carry paths and OS messages.
  const absl::Time sent = clock_->Now();
  // Quiet heartbeats (fence.h): a beat asks for its answer when one is due (one beat in
  // k), when the agent is not sure it is heard (after a failure, when it probes before
  // fencing), and when it says something new (an exit, a pid, an error, leaving):
  // what it tells must not rest on a beat that may have been lost.
  std::string told;
  if (beats_per_ack_ > 1) {
    v1::HeartbeatRequest what = req;
    what.clear_free_ports();
    what.clear_gpu_usage();
    told = what.SerializeAsString();
    req.set_beat_seq(++beat_seq_);
    req.set_quiet(true);
    const bool due = sent - last_ok_sent_ >= (beats_per_ack_ - 0.5) * heartbeat_interval_;
    req.set_answer_now(due || !reachable_.value_or(false) || deadline > absl::ZeroDuration() ||
                       told != last_told_ || !leaving_.empty() ||
                       stopping_grace_ > absl::ZeroDuration());
    beats_sent_[beat_seq_] = sent;
    if (beats_sent_.size() > 1024) beats_sent_.erase(beats_sent_.begin());  // A long outage.
  }
  auto resp = client_->Heartbeat(req, deadline > absl::ZeroDuration() ? deadline : rpc_deadline_);
  if (!resp.ok()) return resp.status();
  if (req.quiet()) {
    if (resp->acked_seq() == 0) {  // Written, nothing said back: not (yet) heard.
      ++quiet_beats_;
      return absl::OkStatus();
    }
    // Heard: the beat answered was sent then (a later one may have been heard too).
    auto answered = beats_sent_.find(resp->acked_seq());
    last_ok_sent_ = answered != beats_sent_.end() ? answered->second : last_ok_sent_;
    beats_sent_.erase(beats_sent_.begin(), beats_sent_.upper_bound(resp->acked_seq()));
    if (resp->acked_seq() != req.beat_seq()) {
      // An answer to an earlier beat (news that beat brought): this one's exits are
      // told again, and answered, at the next.
      sent_finished.clear();
    } else {
      last_told_ = told;
    }
  } else {
    last_ok_sent_ = sent;
  }
  fence_asked_ = false;
  FollowInterval(*resp);
  witnesses_.assign(resp->witnesses().begin(), resp->witnesses().end());
  for (const TaskKey& key : sent_finished) reported_finished_[key] = true;
  Reconcile(*resp);
  if (poller_) poller_->Known(resp->desired_version());
  return absl::OkStatus();
}

void Agent::Reconcile(const v1::HeartbeatResponse& desired) {
  const absl::Time now = clock_->Now();
  std::set<TaskKey> wanted;
  for (const v1::Task& t : desired.tasks()) {
    TaskKey key{t.job_id(), t.attempt()};
    wanted.insert(key);
    if (auto it = tasks_.find(key); it != tasks_.end()) {
      if (t.generation() > it->second->generation() && !stop_.HasBeenNotified()) {
        if (it->second->Recover(t)) heartbeat_now_ = true;  // The new pids, at once.
      }
      it->second->Notice(t);
      it->second->Stacks(t);
      continue;
    }
    if (stop_.HasBeenNotified()) continue;
    TrainerTaskOptions o;
    o.trainer_path = options_.trainer_path;
    o.work_dir = options_.work_dir;
    o.node = options_.name;
    o.threads_per_rank = std::max(1, options_.cpus / std::max(1, options_.slots));
    o.stop_grace = options_.stop_grace;
    o.allowed_roots = options_.allowed_roots;
    o.base_env = options_.trainer_env;
    o.node_has_gpus = !options_.gpus.empty();
    o.exec = options_.exec;
    o.python_path = options_.python_path;
    o.gloo_socket_ifname = options_.gloo_socket_ifname;
    o.ledger = options_.ledger;
    o.stacks = options_.stacks;
    auto task = TrainerTask::Start(t, o, pump_.get());
    ++tasks_started_;
    if (t.attempt() > 1) ++restarted_tasks_;
    trainers_started_ += task->running();
    if (!task->error().empty()) {
      ++start_failures_;
      DDP_LOG(ERROR) << "cannot start " << t.job_id() << " attempt " << t.attempt() << ": "
                     << task->error();
      heartbeat_now_ = true;  // The coordinator hears why at once, not a beat later.
    }
    tasks_[key] = std::move(task);
  }
  for (auto it = tasks_.begin(); it != tasks_.end();) {
    TrainerTask& task = *it->second;
    if (wanted.count(it->first)) {
      ++it;
      continue;
    }
    if (!task.Finished() && !task.stopping()) {
      DDP_LOG(INFO) << "stopping " << it->first.first << " attempt " << it->first.second
                    << " (no longer wanted)";
      task.Stop(now);
    }
    // Gone once finished and its final state has reached the coordinator.
    if (task.Finished() && reported_finished_.count(it->first)) {
      reported_finished_.erase(it->first);
      it = tasks_.erase(it);
    } else {
      ++it;
    }
  }
}

absl::Status Agent::Run() {
  absl::Time next_heartbeat = clock_->Now();
  absl::Status fatal;
  while (!stop_.HasBeenNotified()) {
    const absl::Time now = clock_->Now();
    bool changed = false;
    int64_t running = 0;
    for (auto& [key, task] : tasks_) {
      changed |= task->Poll(now);
      running += task->running();
    }
    trainers_running_ = running;
    const int64_t pushed = buffer_.pushed();  // Read after Poll(): see StampExits.
    for (auto& [key, task] : tasks_) task->StampExits(pushed);

    if (!registered_) {
      absl::Status st = RegisterOnce();
      if (st.code() == absl::StatusCode::kFailedPrecondition) {
        fatal = st;
        break;
      }
      if (!st.ok()) {
        SetReachable(false);
        if (failures_++ % 20 == 0) {
          DDP_LOG(WARNING) << "cannot register with the coordinator: " << st.message()
                           << " (retrying)";
        }
        WaitForWork(backoff_.Next());
        continue;
      }
      failures_ = 0;
      next_heartbeat = now;
    }

    // Heartbeats go out on time whatever the output does (the reporter sends it from
    // its own thread); an exit held back for its output is reported as soon as the
    // reporter has delivered that output.
    // News from the long poll: a task for us (or one gone); the reply brings it. Or an
    // answer no beat waited for (quiet beats). Both flags are cleared, whichever is set.
    const bool long_poll_news = news_.exchange(false);
    const bool unasked_answer = answer_waiting_.exchange(false);
    const bool news = long_poll_news || unasked_answer;
    // Cut off? Asked on time (fence.h): a heartbeat that could still be in flight then
    // waits until the witnesses have answered.
    const absl::Time fence_due = last_ok_sent_ + fence_.ask_after;
    MaybeFence(now);
    bool heartbeat_due = changed || heartbeat_now_ || news || now >= next_heartbeat ||
                         (held_exits_ && !HoldsExits());
    if (FencePending() && now + rpc_deadline_ > fence_due) heartbeat_due = false;
    if (heartbeat_due) {
      heartbeat_now_ = false;
      const absl::Status st = HeartbeatOnce();
      if (!st.ok()) ++heartbeat_failures_;
      if (st.ok()) {
        next_heartbeat = now + heartbeat_interval_;
        failures_ = 0;
        backoff_.Reset();
        SetReachable(true);
      } else if (st.code() == absl::StatusCode::kNotFound) {
        DDP_LOG(WARNING) << "the coordinator does not know this worker (" << st.message()
                         << "): registering again";
        registered_ = false;
        reporter_->Pause();
        SetReachable(false);
        continue;
      } else if (st.code() == absl::StatusCode::kFailedPrecondition) {
        fatal = st;
        break;
      } else {
        SetReachable(false);
        if (failures_++ % 20 == 0) {
          DDP_LOG(WARNING) << "coordinator unreachable: " << st.message()
                           << " (trainers keep running; retrying)";
        }
        next_heartbeat = now + std::min(backoff_.Next(), heartbeat_interval_);
      }
    }
    if (heartbeat_now_ && !FencePending()) continue;
    absl::Time wake = std::min(clock_->Now() + options_.tick, next_heartbeat);
    if (FencePending()) wake = std::min(wake, fence_due);
    WaitForWork(std::max(absl::ZeroDuration(), wake - clock_->Now()));
  }

  // Shutting down: stop every trainer and tell the coordinator how they ended. A
  // worker leaving for good says so first, so their jobs restart elsewhere once, and
  // not on this node (HeartbeatRequest.leaving).
  absl::Duration final_grace = options_.stop_grace;
  if (registered_ && fatal.ok()) {
    if (options_.leave_on_exit) leaving_ = LeaveReason();
    final_grace = AwaitMoves();
  }
  if (!tasks_.empty()) DDP_LOG(INFO) << "stopping " << tasks_.size() << " task(s)";
  const absl::Time begin = clock_->Now();
  for (auto& [key, task] : tasks_) task->Stop(begin, final_grace);
  while (true) {
    bool all = true;
    for (auto& [key, task] : tasks_) {
      task->Poll(clock_->Now());
      all = all && task->Finished();
    }
    const int64_t pushed = buffer_.pushed();
    for (auto& [key, task] : tasks_) task->StampExits(pushed);
    if (all || clock_->Now() - begin > options_.stop_grace + absl::Seconds(5)) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  if (registered_ && fatal.ok()) {
    // Their last output first (a failed send or a few deadlines end the wait), then
    // their exits.
    reporter_->Drain(rpc_deadline_ * 4);
    (void)HeartbeatOnce();
    if (options_.leave_on_exit) {
      v1::LeaveRequest leave;
      leave.set_worker(options_.name);
      leave.set_incarnation(incarnation_);
      leave.set_reason(LeaveReason());
      const absl::Status st = client_->Leave(leave, rpc_deadline_ * 4);
      if (st.ok()) {
        DDP_LOG(INFO) << "left the cluster (--leave-on-exit)";
      } else {
        DDP_LOG(WARNING) << "could not leave the cluster: " << st.message()
                         << " (the coordinator will list this worker lost)";
      }
    }
  }
  reporter_->Pause();
  SetReachable(false);
  return fatal;
}

}  // namespace ddp
