#include "coordinator/core/timers.h"

namespace ddp {

void StartDeadlines::Add(absl::Time deadline, const std::string& job_id, int attempt) {
  deadlines_.emplace(deadline, job_id, attempt);
}

std::vector<std::pair<std::string, int>> StartDeadlines::Due(absl::Time now) {
  std::vector<std::pair<std::string, int>> due;
  while (!deadlines_.empty() && std::get<0>(*deadlines_.begin()) <= now) {
    const auto& [deadline, id, attempt] = *deadlines_.begin();
    due.emplace_back(id, attempt);
    deadlines_.erase(deadlines_.begin());
  }
  return due;
}

bool StallChecks::Due(absl::Time now) {
  if (now - last_ < kPeriod) return false;
  last_ = now;
  return true;
}

}  // namespace ddp
