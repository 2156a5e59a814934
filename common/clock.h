// Time as a dependency: services take a Clock so tests drive timeouts with FakeClock
// instead of sleeping (as Ray's GCS health checks and TSL's coordination service do).
#ifndef DDP_COMMON_CLOCK_H_
#define DDP_COMMON_CLOCK_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace ddp {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
};

// The wall clock. Process-wide singleton, never destroyed.
Clock* RealClock();

// A clock that moves only when told to. Thread-safe.
class FakeClock : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::UnixEpoch() + absl::Hours(24 * 365 * 56))
      : now_(start) {}
  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ddp

#endif  // DDP_COMMON_CLOCK_H_
