#include "coordinator/core/admission.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ddp {

absl::Status CheckSubmission(const JobSpec& spec, const std::string& source,
                             const std::string& workdir, const Caller& caller,
                             const UsageLimits& limits, absl::Duration heartbeat_timeout,
                             int heartbeat_stretch) {
  const absl::Duration held_to = heartbeat_timeout * std::max(1, heartbeat_stretch);
  if (absl::Seconds(spec.rdzv.timeout_s) <= held_to) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": rdzv.timeout_s: must be greater than the coordinator's heartbeat timeout (",
        absl::StrFormat("%gs", absl::ToDoubleSeconds(held_to)),
        heartbeat_stretch > 1
            ? absl::StrFormat(": %gs stretched %dx for this cluster's size, decision 162",
                              absl::ToDoubleSeconds(heartbeat_timeout), heartbeat_stretch)
            : "",
        "): timeouts are ordered heartbeat < rendezvous"));
  }
  if (spec.is_command() && limits.command_jobs == UsageLimits::CommandJobs::kOff) {
    return absl::PermissionDeniedError(absl::StrCat(
        source, ": command: this coordinator runs no command jobs (--command-jobs=off); use "
        "the built-in trainer (model, data, train) or ask its operator"));
  }
  if (spec.is_command() && limits.command_jobs == UsageLimits::CommandJobs::kAdmins &&
      !caller.admin) {
    return absl::PermissionDeniedError(absl::StrCat(
        source, ": command: on this coordinator only role admin may submit a job that runs "
        "its own program (--command-jobs=admins); ", caller.name.empty() ? "you" : caller.name,
        " may submit built-in trainer jobs"));
  }
  if (spec.priority > limits.max_user_priority && !caller.admin) {
    return absl::PermissionDeniedError(absl::StrCat(
        source, ": priority: ", spec.priority, " is above this coordinator's --max-user-priority (",
        limits.max_user_priority, "): only role admin may submit it; ",
        caller.name.empty() ? "you" : caller.name, " may use priorities up to ",
        limits.max_user_priority));
  }
  if (!workdir.empty() && workdir[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("workdir: '", workdir, "' must be an absolute path"));
  }
  return absl::OkStatus();
}

absl::Status Admission::Admit(const std::map<std::string, JobRecord>& jobs,
                              const std::string& rdzv_id, const std::string& owner) const {
  // Submissions being stored count as queued: a burst cannot overshoot the limits.
  int64_t queued = static_cast<int64_t>(ids_.size());
  int64_t queued_by_owner = static_cast<int64_t>(owners_.count(owner));
  for (const auto& [other_id, other] : jobs) {
    if (Queued(other)) {
      ++queued;
      if (other.job.owner() == owner) ++queued_by_owner;
    }
    if (!IsTerminal(other.job.state()) && other.job.rdzv_id() == rdzv_id) {
      return absl::AlreadyExistsError(absl::StrCat(
          "rdzv_id '", rdzv_id, "' is in use by job ", other_id, " (",
          JobStateName(other.job.state()),
          "): wait for it to finish, cancel it, or choose another rdzv_id"));
    }
  }
  if (queued >= limits_.queued_jobs) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the queue is full: ", queued, " jobs are waiting, the coordinator's "
        "--max-queued-jobs is ", limits_.queued_jobs,
        ": wait for some to start, or cancel some"));
  }
  // Per user: only named callers (an open coordinator's callers are one anonymous
  // caller, bounded by the total alone).
  if (!owner.empty() && queued_by_owner >= limits_.queued_jobs_per_user) {
    return absl::ResourceExhaustedError(absl::StrCat(
        owner, " has ", queued_by_owner, " jobs waiting in the queue, the "
        "coordinator's --max-queued-jobs-per-user is ", limits_.queued_jobs_per_user,
        ": wait for some to start, or cancel some"));
  }
  if (rdzv_ids_.count(rdzv_id)) {
    return absl::AlreadyExistsError(absl::StrCat(
        "rdzv_id '", rdzv_id, "' is in use by a job being submitted right now: choose "
        "another rdzv_id"));
  }
  return absl::OkStatus();
}

void Admission::Reserve(const std::string& id, const std::string& rdzv_id,
                        const std::string& owner) {
  ids_.insert(id);
  rdzv_ids_.insert(rdzv_id);
  owners_.insert(owner);
}

void Admission::Release(const std::string& id, const std::string& rdzv_id,
                        const std::string& owner) {
  ids_.erase(id);
  rdzv_ids_.erase(rdzv_id);
  if (auto it = owners_.find(owner); it != owners_.end()) owners_.erase(it);
}

}  // namespace ddp
