#include "coordinator/core/task_waiters.h"

#include <utility>

#include "absl/status/status.h"

namespace ddp {

TaskWaiters::TaskWaiters() {
  thread_ = std::thread([this] { Loop(); });
}

TaskWaiters::~TaskWaiters() {
  Close();
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void TaskWaiters::Close() {
  absl::MutexLock lock(&mu_);
  for (auto& [id, w] : waiters_) {
    answers_.push_back({std::move(w.done),
                        absl::UnavailableError("the coordinator is shutting down")});
  }
  waiters_.clear();
  by_worker_.clear();
  by_deadline_.clear();
  closed_ = true;
}

void TaskWaiters::Add(const std::string& worker, uint64_t version, absl::Time deadline,
                      Done done) {
  absl::MutexLock lock(&mu_);
  if (closed_) {
    answers_.push_back({std::move(done), absl::UnavailableError("shutting down")});
    return;
  }
  const uint64_t id = ++next_id_;
  waiters_.emplace(id, Waiter{worker, version, deadline, std::move(done)});
  by_worker_.emplace(worker, id);
  by_deadline_.emplace(deadline, id);
}

void TaskWaiters::AnswerLocked(uint64_t id, absl::StatusOr<uint64_t> result) {
  auto it = waiters_.find(id);
  if (it == waiters_.end()) return;
  Waiter& w = it->second;
  auto [wb, we] = by_worker_.equal_range(w.worker);
  for (auto i = wb; i != we; ++i) {
    if (i->second == id) {
      by_worker_.erase(i);
      break;
    }
  }
  auto [db, de] = by_deadline_.equal_range(w.deadline);
  for (auto i = db; i != de; ++i) {
    if (i->second == id) {
      by_deadline_.erase(i);
      break;
    }
  }
  answers_.push_back({std::move(w.done), std::move(result)});
  waiters_.erase(it);
}

void TaskWaiters::Changed(const std::string& worker, uint64_t version) {
  absl::MutexLock lock(&mu_);
  std::vector<uint64_t> due;
  auto [begin, end] = by_worker_.equal_range(worker);
  for (auto it = begin; it != end; ++it) {
    if (waiters_.at(it->second).version != version) due.push_back(it->second);
  }
  for (uint64_t id : due) AnswerLocked(id, version);
}

void TaskWaiters::Expire(absl::Time now) {
  absl::MutexLock lock(&mu_);
  while (!by_deadline_.empty() && by_deadline_.begin()->first < now) {
    const uint64_t id = by_deadline_.begin()->second;
    AnswerLocked(id, waiters_.at(id).version);
  }
}

int TaskWaiters::open() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(waiters_.size());
}

void TaskWaiters::Loop() {
  while (true) {
    std::vector<Answer> answers;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || !answers_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (answers_.empty()) return;  // Stopped, everything answered (Close came first).
      answers.swap(answers_);
    }
    for (Answer& a : answers) a.done(std::move(a.result));
  }
}

}  // namespace ddp
