#include "coordinator/rpc/fanout.h"

#include <utility>

namespace ddp {

FanOutExecutor::FanOutExecutor() : thread_([this] { Loop(); }) {}

FanOutExecutor::~FanOutExecutor() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void FanOutExecutor::Post(std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  if (!stop_) queue_.push_back(std::move(fn));
}

void FanOutExecutor::Loop() {
  while (true) {
    std::function<void()> fn;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !queue_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (stop_) return;
      fn = std::move(queue_.front());
      queue_.pop_front();
    }
    fn();  // Outside the lock: Post() never waits for a pull.
  }
}

}  // namespace ddp
