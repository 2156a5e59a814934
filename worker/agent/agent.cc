#include "worker/agent/agent.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "common/net.h"
#include "common/status_macros.h"

namespace ddp {
namespace {

constexpr size_t kMaxBatch = 2000;     // Events per ReportEvents call.
constexpr int kMaxBatchesPerTurn = 4;  // Then the heartbeat's turn: never starved.
constexpr int kFreePorts = 3;          // Candidate MASTER_PORTs per heartbeat.

}  // namespace

std::string NewIncarnation() {
  absl::BitGen gen;
  return absl::StrFormat("%016x", absl::Uniform<uint64_t>(gen));
}

Agent::Agent(AgentOptions options, std::unique_ptr<CoordinatorClient> client, Clock* clock)
    : options_(std::move(options)),
      client_(std::move(client)),
      clock_(clock),
      incarnation_(NewIncarnation()),
      pump_(std::make_unique<OutputPump>(&buffer_, clock)) {}

Agent::~Agent() {
  tasks_.clear();  // Kills leftovers before the pump goes.
  pump_.reset();
}

void Agent::Stop() {
  if (!stop_.HasBeenNotified()) stop_.Notify();
}

absl::Duration Agent::Backoff() {
  // Exponential with full jitter, capped: reconnecting agents do not stampede.
  absl::Duration d = backoff_;
  backoff_ = std::min(backoff_ * 2, options_.max_backoff);
  return absl::Milliseconds(absl::Uniform(rng_, 0.5, 1.0) * absl::ToDoubleMilliseconds(d));
}

absl::Status Agent::RegisterOnce() {
  v1::RegisterRequest req;
  req.set_worker(options_.name);
  req.set_incarnation(incarnation_);
  req.set_address(options_.advertise_addr);
  req.set_hostname(LocalHostname());
  req.set_slots(options_.slots);
  req.set_gpus(options_.gpus);
  req.set_version("ddp 0.1.0");
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
  registered_ = true;
  backoff_ = absl::Milliseconds(100);
  DDP_LOG(INFO) << "registered as " << options_.name << " (incarnation " << incarnation_ << ", "
                << options_.slots << " slots, " << options_.advertise_addr << "), heartbeat every "
                << heartbeat_interval_;
  if (on_registered_) on_registered_(true);
  return absl::OkStatus();
}

int64_t Agent::Delivered() const {
  return buffer_.departed() - (unsent_.has_value() ? unsent_->events_size() : 0);
}

bool Agent::HoldsExits() const {
  const int64_t delivered = Delivered();
  for (const auto& [key, task] : tasks_) {
    if (task->HoldsExits(delivered)) return true;
  }
  return false;
}

absl::Status Agent::Flush() {
  for (int i = 0; i < kMaxBatchesPerTurn; ++i) {
    if (!unsent_.has_value()) {
      if (buffer_.size() == 0) break;
      int64_t dropped = 0;
      std::vector<v1::ReportedEvent> batch = buffer_.Take(kMaxBatch, &dropped);
      v1::ReportEventsRequest req;
      req.set_worker(options_.name);
      req.set_incarnation(incarnation_);
      req.set_dropped(dropped);
      req.set_batch_seq(next_batch_seq_++);
      for (auto& e : batch) *req.add_events() = std::move(e);
      unsent_ = std::move(req);
    }
    // A failed batch is re-sent unchanged, number included: if the coordinator did
    // store it (a deadline that hit after it had), it drops the repeat.
    absl::Status st = client_->ReportEvents(*unsent_, rpc_deadline_);
    if (!st.ok()) return st;
    unsent_.reset();
  }
  return absl::OkStatus();
}

absl::Status Agent::HeartbeatOnce() {
  v1::HeartbeatRequest req;
  req.set_worker(options_.name);
  req.set_incarnation(incarnation_);
  std::set<TaskKey> sent_finished;
  const int64_t delivered = Delivered();
  held_exits_ = false;
  for (auto& [key, task] : tasks_) {
    *req.add_tasks() = task->Status(delivered);
    const bool holds = task->HoldsExits(delivered);
    held_exits_ = held_exits_ || holds;
    if (task->Finished() && !holds) sent_finished.insert(key);
  }
  for (int i = 0; i < kFreePorts; ++i) {
    auto port = PickFreePort("0.0.0.0");
    if (port.ok()) req.add_free_ports(*port);
  }
  auto resp = client_->Heartbeat(req, rpc_deadline_);
  if (!resp.ok()) return resp.status();
  for (const TaskKey& key : sent_finished) reported_finished_[key] = true;
  Reconcile(*resp);
  return absl::OkStatus();
}

void Agent::Reconcile(const v1::HeartbeatResponse& desired) {
  const absl::Time now = clock_->Now();
  std::set<TaskKey> wanted;
  for (const v1::Task& t : desired.tasks()) {
    TaskKey key{t.job_id(), t.attempt()};
    wanted.insert(key);
    if (tasks_.count(key) || stop_.HasBeenNotified()) continue;
    TrainerTaskOptions o;
    o.trainer_path = options_.trainer_path;
    o.work_dir = options_.work_dir;
    o.threads_per_rank = std::max(1, options_.cpus / std::max(1, options_.slots));
    o.stop_grace = options_.stop_grace;
    auto task = TrainerTask::Start(t, o, pump_.get());
    if (!task->error().empty()) {
      DDP_LOG(ERROR) << "cannot start " << t.job_id() << " attempt " << t.attempt() << ": "
                     << task->error();
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
    for (auto& [key, task] : tasks_) changed |= task->Poll(now);
    const int64_t pushed = buffer_.pushed();  // Read after Poll(): see StampExits.
    for (auto& [key, task] : tasks_) task->StampExits(pushed);

    if (!registered_) {
      absl::Status st = RegisterOnce();
      if (st.code() == absl::StatusCode::kFailedPrecondition) {
        fatal = st;
        break;
      }
      if (!st.ok()) {
        if (failures_++ % 20 == 0) {
          DDP_LOG(WARNING) << "cannot register with the coordinator: " << st.message()
                           << " (retrying)";
        }
        stop_.WaitForNotificationWithTimeout(Backoff());
        continue;
      }
      failures_ = 0;
      next_heartbeat = now;
    }

    // Output first (a few batches; the rest waits for the next turn, so a chatty
    // trainer cannot starve heartbeats). A failure's `error` event still precedes the
    // exit it explains: exits wait for the output before them (StampExits).
    absl::Status st = Flush();
    // The time after the flush, which may have taken a while. Also heartbeat when
    // exits held back by the last heartbeat may now be reported.
    const absl::Time flushed = clock_->Now();
    const bool heartbeat_due = changed || flushed >= next_heartbeat ||
                               (st.ok() && held_exits_ && !HoldsExits());
    if (st.ok() && heartbeat_due) st = HeartbeatOnce();
    if (st.ok()) {
      if (heartbeat_due) {
        next_heartbeat = flushed + heartbeat_interval_;
        failures_ = 0;
      }
    } else if (st.code() == absl::StatusCode::kNotFound) {
      DDP_LOG(WARNING) << "the coordinator does not know this worker (" << st.message()
                       << "): registering again";
      registered_ = false;
      if (on_registered_) on_registered_(false);
      continue;
    } else if (st.code() == absl::StatusCode::kFailedPrecondition) {
      fatal = st;
      break;
    } else {
      if (failures_++ % 20 == 0) {
        DDP_LOG(WARNING) << "coordinator unreachable: " << st.message()
                         << " (trainers keep running; retrying)";
      }
      next_heartbeat = now + std::min(Backoff(), heartbeat_interval_);
    }
    // A backlog of output is sent on the next turn at once.
    const bool backlog = st.ok() && (unsent_.has_value() || buffer_.size() > 0);
    const absl::Duration wait =
        backlog ? absl::ZeroDuration()
                : std::max(absl::ZeroDuration(),
                           std::min(options_.tick, next_heartbeat - clock_->Now()));
    stop_.WaitForNotificationWithTimeout(wait);
  }

  // Shutting down: stop every trainer and tell the coordinator how they ended.
  if (!tasks_.empty()) DDP_LOG(INFO) << "stopping " << tasks_.size() << " task(s)";
  const absl::Time begin = clock_->Now();
  for (auto& [key, task] : tasks_) task->Stop(begin);
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
    absl::Status st;
    while (st.ok() && (unsent_.has_value() || buffer_.size() > 0)) st = Flush();
    (void)HeartbeatOnce();
  }
  return fatal;
}

}  // namespace ddp
