#include "coordinator/core/event_hub.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"

namespace ddp {
namespace {

int64_t ToMillis(absl::Time t) { return absl::ToUnixMillis(t); }

}  // namespace

std::string DescribeEvent(const v1::TrainerEvent& e) {
  switch (e.body_case()) {
    case v1::TrainerEvent::kStart:
      return absl::StrCat("started: ", e.start().model(), ", world size ", e.start().world_size());
    case v1::TrainerEvent::kCheckpoint: {
      const v1::TrainerEvent::Checkpoint& c = e.checkpoint();
      return absl::StrCat("checkpoint saved: ", c.path(), " (epoch ", c.epoch(), ", step ",
                          c.step(), ")");
    }
    case v1::TrainerEvent::kEpoch: {
      const v1::TrainerEvent::Epoch& ep = e.epoch();
      std::string line = absl::StrFormat("epoch %d: train_loss %.4f", ep.epoch(), ep.train_loss());
      if (ep.has_val_loss()) absl::StrAppendFormat(&line, " val_loss %.4f", ep.val_loss());
      if (ep.has_val_accuracy()) {
        absl::StrAppendFormat(&line, " val_accuracy %.4f", ep.val_accuracy());
      }
      return line;
    }
    case v1::TrainerEvent::kDone:
      return absl::StrCat("done after ", e.done().global_step(), " steps (parameters ",
                          e.done().params_fingerprint(), ")");
    case v1::TrainerEvent::kError:
      return absl::StrCat("error (", e.error().retryable() ? "retryable" : "permanent",
                          "): ", e.error().message());
    case v1::TrainerEvent::kRecovered: {
      const v1::TrainerEvent::Recovered& r = e.recovered();
      return absl::StrFormat(
          "recovered: generation %d formed, every rank took rank %d's state at step %d "
          "(waited %.0f ms for the replacement, %.0f ms to reconnect and transfer)",
          r.generation(), r.source_rank(), r.global_step(), r.wait_ms(), r.sync_ms());
    }
    case v1::TrainerEvent::kStep:  // Metrics, not a log line.
    case v1::TrainerEvent::BODY_NOT_SET:
      break;
  }
  return "";
}

EventHub::EventHub(Store* store, Clock* clock, Options options)
    : store_(store), clock_(clock), options_(options) {}

EventHub::Feed& EventHub::FeedLocked(const std::string& job_id) {
  Feed& feed = feeds_[job_id];
  if (!feed.loaded) {
    feed.loaded = true;
    auto seq = store_->MaxLogSeq(job_id);
    if (seq.ok()) feed.last_seq = *seq;
    auto epochs = store_->Epochs(job_id);
    if (epochs.ok()) feed.epochs = std::move(*epochs);
  }
  return feed;
}

void EventHub::ReleaseIfIdleLocked(const std::string& job_id) {
  if (finished_.count(job_id) && !listeners_.count(job_id)) feeds_.erase(job_id);
}

std::vector<std::shared_ptr<EventHub::Listener>> EventHub::ListenersLocked(
    const std::string& job_id) {
  auto it = listeners_.find(job_id);
  if (it == listeners_.end()) return {};
  return it->second;
}

void EventHub::Subscribe(const std::string& job_id, std::shared_ptr<Listener> listener) {
  absl::MutexLock lock(&mu_);
  listeners_[job_id].push_back(std::move(listener));
}

void EventHub::Unsubscribe(const std::string& job_id, const Listener* listener) {
  absl::MutexLock lock(&mu_);
  auto it = listeners_.find(job_id);
  if (it == listeners_.end()) return;
  auto& ls = it->second;
  ls.erase(std::remove_if(ls.begin(), ls.end(),
                          [&](const std::shared_ptr<Listener>& l) { return l.get() == listener; }),
           ls.end());
  if (ls.empty()) {
    listeners_.erase(it);
    ReleaseIfIdleLocked(job_id);
  }
}

void EventHub::AddSink(Sink* sink) {
  absl::MutexLock lock(&sinks_mu_);
  sinks_.push_back(sink);
}

void EventHub::RemoveSink(Sink* sink) {
  absl::MutexLock lock(&sinks_mu_);
  sinks_.erase(std::remove(sinks_.begin(), sinks_.end(), sink), sinks_.end());
}

absl::Status EventHub::Ingest(const std::vector<v1::ReportedEvent>& events,
                              const std::vector<BatchMark>& marks) {
  std::vector<std::shared_ptr<Listener>> to_notify;
  absl::Status stored;
  std::vector<JobOutput> outputs;
  {
    absl::MutexLock lock(&mu_);
    struct Batch {
      std::vector<v1::RankMetrics> metrics;
      std::vector<v1::EpochSummary> epochs;
      std::vector<v1::LogLine> logs;
    };
    std::map<std::string, Batch> batches;
    const int64_t now_ms = ToMillis(clock_->Now());
    for (const v1::ReportedEvent& ev : events) {
      Feed& feed = FeedLocked(ev.job_id());
      Batch& batch = batches[ev.job_id()];
      auto add_line = [&](const std::string& stream, const std::string& text) {
        v1::LogLine line;
        line.set_seq(++feed.last_seq);
        line.set_attempt(ev.attempt());
        line.set_rank(ev.rank());
        line.set_stream(stream);
        line.set_text(text);
        line.set_time_ms(ev.time_ms() ? ev.time_ms() : now_ms);
        feed.ring.push_back(line);
        if (feed.ring.size() > options_.live_log_lines) feed.ring.pop_front();
        batch.logs.push_back(std::move(line));
      };
      if (ev.has_log()) {
        add_line(ev.log().stream(), ev.log().text());
        continue;
      }
      if (!ev.has_event()) continue;
      const v1::TrainerEvent& e = ev.event();
      if (e.has_step()) {
        const v1::TrainerEvent::Step& step = e.step();
        v1::RankMetrics m;
        m.set_rank(ev.rank());
        m.set_attempt(ev.attempt());
        m.set_epoch(step.epoch());
        m.set_step(step.step());
        m.set_steps(step.steps());
        m.set_global_step(step.global_step());
        m.set_loss(step.loss());
        m.set_samples_per_s(step.samples_per_s());
        m.set_step_ms(step.step_ms());
        m.set_comm_ms(step.comm_ms());
        if (step.has_gpu_memory_allocated_mib()) {
          m.set_gpu_memory_allocated_mib(step.gpu_memory_allocated_mib());
        }
        if (step.has_gpu_memory_reserved_mib()) {
          m.set_gpu_memory_reserved_mib(step.gpu_memory_reserved_mib());
        }
        if (step.has_gpu_memory_peak_mib()) m.set_gpu_memory_peak_mib(step.gpu_memory_peak_mib());
        if (step.has_data_ms()) m.set_data_ms(step.data_ms());
        if (step.has_compute_ms()) m.set_compute_ms(step.compute_ms());
        if (step.has_optimizer_ms()) m.set_optimizer_ms(step.optimizer_ms());
        m.set_update_ms(now_ms);
        if (ev.attempt() > feed.metrics_attempt) {
          feed.metrics_attempt = ev.attempt();
          feed.latest.clear();
        }
        if (ev.attempt() == feed.metrics_attempt) feed.latest[ev.rank()] = m;
        batch.metrics.push_back(std::move(m));
        continue;
      }
      if (e.has_epoch()) {
        const v1::TrainerEvent::Epoch& epoch = e.epoch();
        v1::EpochSummary s;
        s.set_attempt(ev.attempt());
        s.set_epoch(epoch.epoch());
        s.set_train_loss(epoch.train_loss());
        s.set_val_loss(epoch.has_val_loss() ? epoch.val_loss() : std::nan(""));
        s.set_val_accuracy(epoch.has_val_accuracy() ? epoch.val_accuracy() : std::nan(""));
        s.set_time_ms(now_ms);
        // An epoch re-sent (its batch was not stored the first time) replaces itself.
        auto same = std::find_if(feed.epochs.begin(), feed.epochs.end(),
                                 [&](const v1::EpochSummary& x) {
                                   return x.attempt() == s.attempt() && x.epoch() == s.epoch();
                                 });
        if (same != feed.epochs.end()) {
          *same = s;
        } else {
          feed.epochs.push_back(s);
        }
        batch.epochs.push_back(std::move(s));
      }
      std::string text = DescribeEvent(e);
      if (!text.empty()) add_line("event", text);
    }
    outputs.reserve(batches.size());
    for (auto& [job_id, batch] : batches) {
      outputs.push_back({job_id, std::move(batch.metrics), std::move(batch.epochs),
                         std::move(batch.logs)});
    }
    stored = store_->AppendAll(outputs, marks);
    if (!stored.ok()) {
      DDP_LOG(ERROR) << "storing events of " << batches.size() << " job(s): " << stored
                     << " (their workers send them again)";
    }
    for (auto& [job_id, batch] : batches) {
      auto ls = ListenersLocked(job_id);
      to_notify.insert(to_notify.end(), ls.begin(), ls.end());
      ReleaseIfIdleLocked(job_id);  // A finished job's late output: stored, not kept.
    }
  }
  for (const auto& l : to_notify) l->Notify();
  if (stored.ok()) {
    absl::MutexLock lock(&sinks_mu_);
    for (Sink* sink : sinks_) sink->Stored(outputs);
  }
  return stored;
}

void EventHub::Touch(const std::string& job_id) {
  std::vector<std::shared_ptr<Listener>> to_notify;
  {
    absl::MutexLock lock(&mu_);
    to_notify = ListenersLocked(job_id);
  }
  for (const auto& l : to_notify) l->Notify();
  absl::MutexLock lock(&sinks_mu_);
  for (Sink* sink : sinks_) sink->Changed(job_id);
}

void EventHub::Fill(const std::string& job_id, int attempt, v1::Job* job) {
  absl::MutexLock lock(&mu_);
  Feed& feed = FeedLocked(job_id);
  if (feed.metrics_attempt != attempt && attempt > 0) {
    // Not seen live since this coordinator started: the store has them.
    auto latest = store_->LatestMetrics(job_id, attempt);
    if (latest.ok() && !latest->empty()) {
      feed.metrics_attempt = attempt;
      feed.latest.clear();
      for (auto& m : *latest) feed.latest[m.rank()] = m;
    }
  }
  if (feed.metrics_attempt == attempt) {
    for (const auto& [rank, m] : feed.latest) *job->add_metrics() = m;
  }
  for (const auto& e : feed.epochs) *job->add_epoch_history() = e;
  ReleaseIfIdleLocked(job_id);
}

std::vector<v1::LogLine> EventHub::Logs(const std::string& job_id, int64_t after_seq,
                                        std::optional<int> rank, int64_t limit) {
  absl::MutexLock lock(&mu_);
  std::vector<v1::LogLine> out;
  auto it = feeds_.find(job_id);  // No feed: the lines are in the store.
  if (it != feeds_.end() && !it->second.ring.empty() &&
      after_seq + 1 >= it->second.ring.front().seq()) {
    for (const v1::LogLine& l : it->second.ring) {
      if (l.seq() <= after_seq || (rank.has_value() && l.rank() != *rank)) continue;
      out.push_back(l);
      if (static_cast<int64_t>(out.size()) >= limit) break;
    }
    return out;
  }
  auto stored = store_->ReadLogs(job_id, after_seq, rank, limit);
  if (!stored.ok()) {
    DDP_LOG(ERROR) << "reading logs of " << job_id << ": " << stored.status();
    return out;
  }
  return *std::move(stored);
}

int64_t EventHub::TailStart(const std::string& job_id, std::optional<int> rank, int64_t tail) {
  auto last = store_->ReadLogs(job_id, 0, rank, tail, tail);
  if (!last.ok() || last->empty()) return 0;
  return last->front().seq() - 1;
}

void EventHub::MarkFinished(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  finished_.insert(job_id);
  ReleaseIfIdleLocked(job_id);
}

void EventHub::Forget(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  feeds_.erase(job_id);
  finished_.erase(job_id);
}

EventHub::Stats EventHub::stats() {
  absl::MutexLock lock(&mu_);
  return {feeds_.size(), listeners_.size()};
}

}  // namespace ddp
