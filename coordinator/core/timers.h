// The facade's time-driven work, as plain records: which formed attempts must have
// every trainer up by when (StartDeadlines), and which attempts the stall watchdog
// looks at and how often (StallChecks). Tick() asks them what is due; what being due
// means (TimeOutRendezvous, a StallWatch's verdict) is job_lifecycle's and
// stall_watchdog's. Costs: a tick pays for what is due, not for every job.
#ifndef DDP_COORDINATOR_CORE_TIMERS_H_
#define DDP_COORDINATOR_CORE_TIMERS_H_

#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/time/time.h"

namespace ddp {

class StartDeadlines {
 public:
  // Attempt `attempt` of `job_id` must be RUNNING by `deadline`.
  void Add(absl::Time deadline, const std::string& job_id, int attempt);
  // Takes out and returns the attempts due at `now`, earliest first. The caller
  // checks each is still the job's active attempt (one that ended is not removed).
  std::vector<std::pair<std::string, int>> Due(absl::Time now);
  size_t size() const { return deadlines_.size(); }

 private:
  std::set<std::tuple<absl::Time, std::string, int>> deadlines_;
};

class StallChecks {
 public:
  static constexpr absl::Duration kPeriod = absl::Seconds(1);

  // `job_id`'s stall watch is armed: look at it from now on.
  void Watch(const std::string& job_id) { watched_.insert(job_id); }
  // Its attempt ended (a new attempt is watched again once its watch arms).
  void Unwatch(const std::string& job_id) { watched_.erase(job_id); }
  // Whether a check is due at `now` (at most once per kPeriod); starts the period.
  bool Due(absl::Time now);
  // The watched jobs, in id order (a copy: the check unwatches as it goes).
  std::vector<std::string> watched() const { return {watched_.begin(), watched_.end()}; }

 private:
  std::set<std::string> watched_;
  absl::Time last_ = absl::InfinitePast();
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_CORE_TIMERS_H_
