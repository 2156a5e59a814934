#include "coordinator/tracking/mlflow_tracker.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/jobspec/flatten.h"
#include "common/logging.h"

namespace ddp {
namespace {

std::string EndStatus(v1::JobState s) {
  switch (s) {
    case v1::SUCCEEDED: return "FINISHED";
    case v1::FAILED: return "FAILED";
    case v1::CANCELLED: return "KILLED";
    default: return "";
  }
}

int64_t NowMs() { return absl::ToUnixMillis(absl::Now()); }

// The points of one stored batch, under the tags ddpctl tensorboard writes.
void AddPoints(const JobOutput& o, std::deque<mlflow::Metric>* out) {
  for (const v1::RankMetrics& m : o.metrics) {
    const std::string rank = absl::StrCat("/rank", m.rank());
    const int64_t t = m.update_ms(), step = m.global_step();
    out->push_back({"loss" + rank, m.loss(), t, step});
    out->push_back({"samples_per_s" + rank, m.samples_per_s(), t, step});
    out->push_back({"step_time_ms" + rank, m.step_ms(), t, step});
    out->push_back({"comm_time_ms" + rank, m.comm_ms(), t, step});
  }
  for (const v1::EpochSummary& e : o.epochs) {
    out->push_back({"epoch/train_loss", e.train_loss(), e.time_ms(), e.epoch()});
    if (!std::isnan(e.val_loss())) {
      out->push_back({"epoch/val_loss", e.val_loss(), e.time_ms(), e.epoch()});
    }
    if (!std::isnan(e.val_accuracy())) {
      out->push_back({"epoch/val_accuracy", e.val_accuracy(), e.time_ms(), e.epoch()});
    }
  }
}

int64_t CountPoints(const JobOutput& o) {
  int64_t n = 4 * static_cast<int64_t>(o.metrics.size());
  for (const v1::EpochSummary& e : o.epochs) {
    n += 1 + !std::isnan(e.val_loss()) + !std::isnan(e.val_accuracy());
  }
  return n;
}

}  // namespace

MlflowTracker::MlflowTracker(Options options, JobLookup lookup, Resolve resolve,
                             HistoryLookup history)
    : options_(options),
      lookup_(std::move(lookup)),
      resolve_(std::move(resolve)),
      history_(std::move(history)) {
  thread_ = std::thread([this] { Loop(); });
}

MlflowTracker::~MlflowTracker() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void MlflowTracker::Stored(const std::vector<JobOutput>& outputs) {
  Item item;
  int64_t points = 0;
  for (const JobOutput& o : outputs) {
    if (o.metrics.empty() && o.epochs.empty()) continue;
    points += CountPoints(o);
    item.outputs.push_back({o.job_id, o.metrics, o.epochs, {}});
  }
  if (item.outputs.empty()) return;
  absl::MutexLock lock(&mu_);
  if (points_ + points > static_cast<int64_t>(options_.max_points)) {
    if (stats_.dropped == 0) {
      DDP_LOG(WARNING) << "MLflow: " << points_ << " points wait to be sent; dropping new ones "
                       << "until they are (the store has them)";
    }
    stats_.dropped += points;
    return;
  }
  points_ += points;
  queue_.push_back(std::move(item));
}

void MlflowTracker::Changed(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  for (auto it = queue_.rbegin(); it != queue_.rend(); ++it) {
    if (it->changed == job_id) return;  // One pending look is enough.
  }
  Item item;
  item.changed = job_id;
  queue_.push_back(std::move(item));
}

void MlflowTracker::Resume(const std::vector<std::string>& job_ids) {
  for (const std::string& id : job_ids) Changed(id);
}

MlflowTracker::Stats MlflowTracker::stats() {
  absl::MutexLock lock(&mu_);
  Stats s = stats_;
  s.kept = points_;
  return s;
}

bool MlflowTracker::WaitIdle(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto idle = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return queue_.empty() && !busy_ && points_ == 0;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&idle), timeout);
}

bool MlflowTracker::Take(absl::Time wake) {
  std::deque<Item> items;
  bool stopping;
  {
    absl::MutexLock lock(&mu_);
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !queue_.empty(); };
    mu_.AwaitWithDeadline(absl::Condition(&ready), wake);
    items.swap(queue_);
    stopping = stop_;
    if (!items.empty()) busy_ = true;
  }
  for (Item& item : items) {
    if (!item.changed.empty()) {
      runs_[item.changed].look_again = true;
      continue;
    }
    int64_t left_out = 0;
    for (const JobOutput& o : item.outputs) left_out += AddLive(o, runs_[o.job_id]);
    if (left_out > 0) {
      absl::MutexLock lock(&mu_);
      points_ -= left_out;
    }
  }
  return !stopping;
}

int64_t MlflowTracker::AddLive(const JobOutput& o, Run& run) {
  if (run.history_until.empty()) {
    AddPoints(o, &run.points);
    return 0;
  }
  std::deque<mlflow::Metric> points;
  AddPoints(o, &points);
  return KeepNewerThanHistory(std::move(points), run);
}

int64_t MlflowTracker::KeepNewerThanHistory(std::deque<mlflow::Metric> points, Run& run) {
  int64_t left_out = 0;
  for (mlflow::Metric& m : points) {
    auto until = run.history_until.find(m.key);
    if (until != run.history_until.end() &&
        std::make_pair(m.timestamp_ms, m.step) <= until->second) {
      ++left_out;  // Sent from the history.
      continue;
    }
    run.points.push_back(std::move(m));
  }
  return left_out;
}

bool MlflowTracker::CatchUp(const std::string& job_id, Run& run, Server& server) {
  auto history = history_(job_id);
  if (!history.ok()) {
    // Deleted meanwhile, or a store that cannot answer: the live points go on alone.
    if (history.status().code() != absl::StatusCode::kNotFound) {
      DDP_LOG(WARNING) << "MLflow: job " << job_id << ": its stored history cannot be read ("
                       << history.status() << "); its run gets the points stored from now on";
    }
    run.caught_up = true;
    return true;
  }
  std::deque<mlflow::Metric> stored;
  AddPoints(*history, &stored);
  // What the run holds already: a prefix of each metric's history (points go out in the
  // store's order), none in a run made here.
  std::map<std::string, int64_t> held;
  if (run.found) {
    for (const mlflow::Metric& m : stored) held.emplace(m.key, -1);
    for (auto& [key, count] : held) {
      auto n = server.client->MetricCount(run.run_id, key);
      if (!n.ok()) {
        if (!Failed(server, n.status(), job_id)) return false;
        run.caught_up = true;  // Refused: the live points go on alone.
        return true;
      }
      count = *n;
    }
  }
  std::deque<mlflow::Metric> missing;
  std::map<std::string, std::pair<int64_t, int64_t>> until;
  for (mlflow::Metric& m : stored) {
    until[m.key] = {m.timestamp_ms, m.step};
    auto h = held.find(m.key);
    if (h != held.end() && h->second > 0) {
      --h->second;
      continue;
    }
    missing.push_back(std::move(m));
  }
  run.history_until = std::move(until);
  // The live points so far, after what the run lacks: those the history had are left out.
  std::deque<mlflow::Metric> live;
  live.swap(run.points);
  const int64_t live_count = static_cast<int64_t>(live.size());
  run.points = std::move(missing);
  const int64_t left_out = KeepNewerThanHistory(std::move(live), run);
  run.caught_up = true;
  // Points the live path never had (queued when a coordinator stopped, or dropped),
  // first in the run's points; within max_points, the oldest left out past it.
  int64_t added = static_cast<int64_t>(run.points.size()) - (live_count - left_out);
  absl::MutexLock lock(&mu_);
  points_ -= left_out;
  const int64_t room =
      std::max<int64_t>(0, static_cast<int64_t>(options_.max_points) - points_);
  if (added > room) {
    DDP_LOG(WARNING) << "MLflow: job " << job_id << ": " << added - room << " of the "
                     << added << " stored point(s) its run lacks are over max_points: "
                     << "the oldest are left out (the store has them)";
    run.points.erase(run.points.begin(), run.points.begin() + (added - room));
    stats_.dropped += added - room;
    added = room;
  }
  points_ += added;
  if (added > 0) {
    stats_.caught_up += added;
    DDP_LOG(INFO) << "MLflow: job " << job_id << ": " << added << " stored point(s) its run "
                  << "lacked are sent from the store's history";
  }
  return true;
}

void MlflowTracker::Look(const std::string& job_id, Run& run) {
  auto job = lookup_(job_id);
  if (!job.ok()) {
    if (job.status().code() == absl::StatusCode::kNotFound) run.gone = true;  // Deleted.
    return;  // Otherwise looked at again on the next pass.
  }
  run.look_again = false;
  if (!run.looked_up) {
    run.looked_up = true;
    auto target = resolve_(*job);
    if (!target.ok()) {
      DDP_LOG(WARNING) << "MLflow: job " << job_id << " is not tracked: " << target.status();
    } else {
      run.target = *target;
    }
    run.owner = job->owner();
    run.run_name = job_id;
    run.submit_ms = job->submit_ms();
    if (auto params = FlattenSpec(job->spec_yaml()); params.ok()) run.params = *std::move(params);
  }
  if (job->attempts_size() > 0) {
    run.attempt = job->attempts(job->attempts_size() - 1).number();
  }
  run.end_status = EndStatus(job->state());
  if (!run.end_status.empty()) run.end_ms = job->end_ms() > 0 ? job->end_ms() : NowMs();
}

MlflowTracker::Server& MlflowTracker::ServerFor(const std::string& uri) {
  Server& s = servers_[uri];
  if (s.client == nullptr) s.client = std::make_unique<mlflow::Client>(uri, options_.timeout);
  return s;
}

bool MlflowTracker::Failed(Server& server, const absl::Status& status,
                           const std::string& job_id) {
  {
    absl::MutexLock lock(&mu_);
    ++stats_.errors;
  }
  if (status.code() == absl::StatusCode::kUnavailable) {
    server.backoff = std::clamp(server.backoff * 2, options_.min_backoff, options_.max_backoff);
    server.next_try = absl::Now() + server.backoff;
    if (!server.away) {
      DDP_LOG(WARNING) << "MLflow at " << server.client->uri() << " is away ("
                       << status.message() << "): keeping its points and retrying (after "
                       << absl::FormatDuration(options_.min_backoff) << ", doubling to "
                       << absl::FormatDuration(options_.max_backoff) << ")";
      server.away = true;
    }
    return false;
  }
  DDP_LOG(ERROR) << "MLflow refused a call for job " << job_id << ": " << status
                 << " (what it carried is dropped)";
  return true;
}

bool MlflowTracker::Send(const std::string& job_id, Run& run, Server& server) {
  mlflow::Client& client = *server.client;
  auto answered = [&] {
    if (server.away) {
      DDP_LOG(INFO) << "MLflow at " << client.uri() << " answers again";
      server.away = false;
    }
    server.backoff = absl::ZeroDuration();
  };
  auto drop_all = [&] {
    absl::MutexLock lock(&mu_);
    stats_.dropped += static_cast<int64_t>(run.points.size());
    points_ -= static_cast<int64_t>(run.points.size());
    run.points.clear();
  };
  if (run.run_id.empty()) {
    const std::string& name = run.target.experiment;
    auto cached = server.experiments.find(name);
    std::string experiment_id;
    if (cached != server.experiments.end()) {
      experiment_id = cached->second;
    } else {
      auto id = client.ExperimentId(name);
      if (!id.ok()) {
        if (!Failed(server, id.status(), job_id)) return false;
        run.target.uri.clear();  // Cannot be tracked: the experiment is unusable.
        drop_all();
        return true;
      }
      answered();
      experiment_id = server.experiments[name] = *id;
    }
    // A coordinator that led before (restarted, or taken over) may have made it.
    auto found = client.FindRun(experiment_id, "ddp.job_id", job_id);
    if (!found.ok()) {
      if (!Failed(server, found.status(), job_id)) return false;
      found = mlflow::Client::FoundRun{};  // A search it refuses: make the run.
    } else {
      answered();
    }
    if (!found->run_id.empty() && found->status != "RUNNING" &&
        found->status != "SCHEDULED") {
      // Ended by a coordinator before, once every point was in: nothing left to send.
      absl::MutexLock lock(&mu_);
      points_ -= static_cast<int64_t>(run.points.size());
      run.points.clear();
      run.gone = true;
      return true;
    }
    if (!found->run_id.empty()) {
      run.run_id = found->run_id;
      run.found = true;
    } else {
      auto made = client.CreateRun(experiment_id, run.run_name, run.submit_ms,
                                   {{"ddp.job_id", job_id},
                                    {"ddp.owner", run.owner},
                                    {"mlflow.user", run.owner}});
      if (!made.ok()) {
        if (!Failed(server, made.status(), job_id)) return false;
        run.target.uri.clear();
        drop_all();
        return true;
      }
      answered();
      run.run_id = *made;
    }
  }
  if (!run.caught_up && !CatchUp(job_id, run, server)) return false;
  // Parameters: logging the same value again is allowed, so a run found again gets
  // them again (its first coordinator may have stopped before sending them).
  while (!run.params_sent) {
    const size_t n = std::min(run.params.size(), mlflow::kMaxBatchParams);
    mlflow::KeyValues chunk(run.params.begin(), run.params.begin() + n);
    if (absl::Status st = client.LogBatch(run.run_id, {}, chunk, {}); !st.ok()) {
      if (!Failed(server, st, job_id)) return false;
    } else {
      answered();
    }
    run.params.erase(run.params.begin(), run.params.begin() + n);
    run.params_sent = run.params.empty();
  }
  if (run.attempt != run.attempt_tagged) {
    absl::Status st =
        client.LogBatch(run.run_id, {}, {}, {{"ddp.attempt", absl::StrCat(run.attempt)}});
    if (!st.ok() && !Failed(server, st, job_id)) return false;
    if (st.ok()) answered();
    run.attempt_tagged = run.attempt;
  }
  while (!run.points.empty()) {
    const size_t n = std::min(run.points.size(), mlflow::kMaxBatchMetrics);
    std::vector<mlflow::Metric> batch(run.points.begin(), run.points.begin() + n);
    absl::Status st = client.LogBatch(run.run_id, batch, {}, {});
    if (!st.ok() && !Failed(server, st, job_id)) return false;
    if (st.ok()) answered();
    run.points.erase(run.points.begin(), run.points.begin() + n);
    absl::MutexLock lock(&mu_);
    points_ -= static_cast<int64_t>(n);
    (st.ok() ? stats_.sent : stats_.dropped) += static_cast<int64_t>(n);
  }
  if (!run.end_status.empty()) {
    absl::Status st = client.EndRun(run.run_id, run.end_status, run.end_ms);
    if (!st.ok() && !Failed(server, st, job_id)) return false;
    if (st.ok()) {
      answered();
      absl::MutexLock lock(&mu_);
      ++stats_.runs_ended;
    }
    run.gone = true;
  }
  return true;
}

void MlflowTracker::Loop() {
  absl::Time wake = absl::InfiniteFuture();
  while (true) {
    const bool stopping = !Take(wake);
    wake = absl::InfiniteFuture();
    const absl::Time now = absl::Now();
    bool busy = false;
    for (auto it = runs_.begin(); it != runs_.end();) {
      const std::string& job_id = it->first;
      Run& run = it->second;
      if (run.look_again) Look(job_id, run);
      if (run.looked_up && run.target.uri.empty()) {
        // Not tracked: its points go nowhere; forgotten once it ended.
        absl::MutexLock lock(&mu_);
        points_ -= static_cast<int64_t>(run.points.size());
        run.points.clear();
        if (!run.end_status.empty()) run.gone = true;
      }
      if (!run.gone && run.looked_up && !run.target.uri.empty()) {
        Server& server = ServerFor(run.target.uri);
        // Stopping: one last try, only where the server was answering.
        if (stopping ? !server.away : server.next_try <= now) Send(job_id, run, server);
        if (!run.gone) wake = std::min(wake, server.next_try);
      }
      if (run.gone) {
        absl::MutexLock lock(&mu_);
        points_ -= static_cast<int64_t>(run.points.size());
        it = runs_.erase(it);
        continue;
      }
      // Still to do: points, parameters, its end, or a look that failed.
      busy = busy || !run.points.empty() || !run.end_status.empty() || run.look_again ||
             (!run.target.uri.empty() && (!run.params_sent || run.attempt != run.attempt_tagged ||
                                          run.run_id.empty()));
      if (run.look_again) wake = std::min(wake, now + options_.min_backoff);
      ++it;
    }
    absl::MutexLock lock(&mu_);
    busy_ = busy;
    if (stopping) {
      if (points_ > 0) {
        DDP_LOG(WARNING) << "MLflow: stopping with " << points_
                         << " points not sent (the store has them)";
      }
      return;
    }
  }
}

}  // namespace ddp
