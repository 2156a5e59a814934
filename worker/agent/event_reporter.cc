#include "worker/agent/event_reporter.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace ddp {
namespace {

constexpr char kNoticePrefix[] = "[ddp-worker] ";

// The coordinator could not take this batch as it is: re-sending it unchanged would
// fail the same way forever.
bool IsRejection(const absl::Status& st) {
  return st.code() == absl::StatusCode::kInvalidArgument ||
         st.code() == absl::StatusCode::kInternal ||
         st.code() == absl::StatusCode::kResourceExhausted;
}

bool IsNotice(const v1::ReportedEvent& e) {
  return e.has_log() && e.log().text().rfind(kNoticePrefix, 0) == 0;
}

}  // namespace

EventReporter::EventReporter(Options options, EventBuffer* buffer, CoordinatorClient* client,
                             std::function<void()> on_delivered)
    : options_(std::move(options)),
      buffer_(buffer),
      client_(client),
      on_delivered_(std::move(on_delivered)),
      backoff_(options_.min_backoff, options_.max_backoff) {
  thread_ = std::thread([this] { Loop(); });
}

EventReporter::~EventReporter() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void EventReporter::Resume(absl::Duration deadline) {
  absl::MutexLock lock(&mu_);
  active_ = true;
  deadline_ = deadline;
  backoff_.Reset();
}

void EventReporter::Pause() {
  absl::MutexLock lock(&mu_);
  active_ = false;
}

void EventReporter::Wake() {
  absl::MutexLock lock(&mu_);
  ++wakes_;
}

int64_t EventReporter::InFlightLocked() const {
  int64_t n = 0;
  for (const Batch& b : unsent_) n += b.request.events_size();
  return n;
}

int64_t EventReporter::delivered() const {
  absl::MutexLock lock(&mu_);
  return buffer_->departed() - InFlightLocked();
}

int64_t EventReporter::rejected() const {
  absl::MutexLock lock(&mu_);
  return rejected_;
}

bool EventReporter::Drain(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  const int64_t target = buffer_->pushed();
  const int64_t failures = failures_;
  auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_ || failures_ > failures ||
           buffer_->departed() - InFlightLocked() >= target;
  };
  mu_.AwaitWithTimeout(absl::Condition(&done), timeout);
  return buffer_->departed() - InFlightLocked() >= target;
}

EventReporter::Batch* EventReporter::NextBatchLocked() {
  if (!unsent_.empty()) return &unsent_.front();
  wakes_ = 0;
  int64_t dropped = 0;
  std::vector<v1::ReportedEvent> events =
      buffer_->Take(options_.max_batch_events, options_.max_batch_bytes, &dropped);
  if (buffer_->size() > 0) wakes_ = 1;  // More than one batch's worth: come back.
  dropped_unreported_ += dropped;
  if (events.empty()) return nullptr;
  Batch b;
  b.request.set_worker(options_.worker);
  b.request.set_incarnation(options_.incarnation);
  b.request.set_batch_seq(next_seq_++);
  b.request.set_dropped(dropped_unreported_);
  dropped_unreported_ = 0;
  for (auto& e : events) *b.request.add_events() = std::move(e);
  unsent_.push_back(std::move(b));
  return &unsent_.back();
}

void EventReporter::HandleRejectedLocked(const absl::Status& status) {
  Batch& front = unsent_.front();
  ++front.rejections;
  const int n = front.request.events_size();
  if (n > 1) {
    // Halves, so that the events that are fine still get through and the bad one
    // is isolated in log2(n) more calls.
    DDP_LOG(WARNING) << "the coordinator rejected a batch of " << n << " events ("
                     << status << "): sending it in halves";
    Batch first, second;
    first.request = front.request;
    first.request.clear_events();
    second.request = first.request;
    second.request.set_dropped(0);
    for (int i = 0; i < n; ++i) {
      Batch& half = i < n / 2 ? first : second;
      *half.request.add_events() = std::move(*front.request.mutable_events(i));
    }
    unsent_.pop_front();
    unsent_.push_front(std::move(second));
    unsent_.push_front(std::move(first));
    // None of these was applied: fresh numbers, increasing in sending order.
    for (Batch& b : unsent_) b.request.set_batch_seq(next_seq_++);
    return;
  }
  if (front.rejections < 2) return;  // Once more, unchanged: INTERNAL may be transient.
  const v1::ReportedEvent lost = front.request.events(0);
  dropped_unreported_ += 1 + front.request.dropped();
  ++rejected_;
  unsent_.pop_front();
  DDP_LOG(ERROR) << "the coordinator rejected an event of job " << lost.job_id() << " rank "
                 << lost.rank() << " twice (" << status << "): dropped it";
  if (IsNotice(lost)) return;  // Never a notice about a notice.
  v1::ReportedEvent notice;
  notice.set_job_id(lost.job_id());
  notice.set_attempt(lost.attempt());
  notice.set_rank(lost.rank());
  notice.set_time_ms(lost.time_ms());
  v1::LogLine* log = notice.mutable_log();
  log->set_stream("stderr");
  log->set_rank(lost.rank());
  log->set_attempt(lost.attempt());
  log->set_text(absl::StrCat(kNoticePrefix, "dropped one ",
                             lost.has_event() ? "event" : "output line",
                             " of this rank that the coordinator rejected (",
                             absl::StatusCodeToString(status.code()), ")"));
  buffer_->Push(std::move(notice));
  ++wakes_;
}

void EventReporter::Loop() {
  absl::MutexLock lock(&mu_);
  while (true) {
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stop_ || (active_ && (!unsent_.empty() || wakes_ > 0));
    };
    mu_.Await(absl::Condition(&ready));
    if (stop_) return;
    Batch* batch = NextBatchLocked();
    if (batch == nullptr) continue;
    // Sent without the lock (a copy: delivered() and Drain() read unsent_ meanwhile).
    const v1::ReportEventsRequest request = batch->request;
    const absl::Duration deadline = deadline_;
    mu_.Unlock();
    const absl::Status st = client_->ReportEvents(request, deadline);
    mu_.Lock();
    bool progressed = false;
    if (st.ok()) {
      unsent_.pop_front();
      backoff_.Reset();
      progressed = true;
    } else if (IsRejection(st)) {
      ++failures_;
      const int64_t before = InFlightLocked();
      HandleRejectedLocked(st);
      progressed = InFlightLocked() < before;
    } else {
      if (failures_++ % 20 == 0) {
        DDP_LOG(WARNING) << "cannot report output to the coordinator: " << st.message()
                         << " (kept; retrying)";
      }
      auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; };
      mu_.AwaitWithTimeout(absl::Condition(&stopping), backoff_.Next());
    }
    if (progressed && on_delivered_) {
      mu_.Unlock();
      on_delivered_();
      mu_.Lock();
    }
  }
}

}  // namespace ddp
