#include "worker/agent/task_poller.h"

#include <utility>

#include "common/logging.h"

namespace ddp {

TaskPoller::TaskPoller(Options options, CoordinatorClient* client, std::function<void()> on_news)
    : options_(std::move(options)), client_(client), on_news_(std::move(on_news)) {
  thread_ = std::thread([this] { Loop(); });
}

TaskPoller::~TaskPoller() { Stop(); }

void TaskPoller::Known(uint64_t version) {
  absl::MutexLock lock(&mu_);
  known_ = version;
}

void TaskPoller::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stop_ && !thread_.joinable()) return;
    stop_ = true;
  }
  client_->CancelWaits();
  if (thread_.joinable()) thread_.join();
}

int64_t TaskPoller::polls() const {
  absl::MutexLock lock(&mu_);
  return polls_;
}

bool TaskPoller::waiting_for_version() const {
  absl::MutexLock lock(&mu_);
  return !known_.has_value();
}

bool TaskPoller::gave_up() const {
  absl::MutexLock lock(&mu_);
  return gave_up_;
}

void TaskPoller::Loop() {
  while (true) {
    v1::WaitForTasksRequest req;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || known_.has_value();
      };
      mu_.Await(absl::Condition(&ready));
      if (stop_) return;
      req.set_desired_version(*known_);
      ++polls_;
    }
    req.set_worker(options_.worker);
    req.set_incarnation(options_.incarnation);
    req.set_timeout_ms(absl::ToInt64Milliseconds(options_.poll));
    auto resp = client_->WaitForTasks(req, options_.poll + options_.extra_deadline);
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
      if (resp.ok()) {
        if (resp->desired_version() == req.desired_version()) continue;  // Nothing new.
        // News. The agent's next heartbeat brings the tasks and a new Known(); polling
        // with the old version meanwhile would be answered at once.
        known_.reset();
      } else if (resp.status().code() == absl::StatusCode::kUnimplemented) {
        DDP_LOG(INFO) << "the coordinator has no WaitForTasks: new tasks arrive with "
                         "heartbeats";
        gave_up_ = true;
        return;
      } else {
        // Unreachable, restarted, or this worker not (yet) known: the heartbeats deal
        // with that; poll again in a while.
        auto stopped = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; };
        mu_.AwaitWithTimeout(absl::Condition(&stopped), options_.retry);
        if (stop_) return;
        continue;
      }
    }
    on_news_();
  }
}

}  // namespace ddp
