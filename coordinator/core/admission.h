// Admission: whether a submission may enter the queue. A manager over plain records
// (the jobs' records and its own reservations), as job_lifecycle is: it decides and
// keeps its reservations; the facade holds the lock and stores the job.
//
// What it checks, in this order: the spec against the coordinator's timing and its
// --command-jobs policy (CheckSubmission, before the lock); then, under the lock, that the
// rdzv_id is not in use by a live job or by a submission being stored, and the queue
// limits, counting submissions being stored as queued so a burst cannot overshoot
// them (Admit). An admitted submission is reserved (its id, rdzv_id and owner) until
// the store has taken it or refused it (Release).
#ifndef DDP_COORDINATOR_CORE_ADMISSION_H_
#define DDP_COORDINATOR_CORE_ADMISSION_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/jobspec/job_spec.h"
#include "coordinator/core/job_lifecycle.h"
#include "coordinator/core/scheduler.h"
#include "ddp/v1/types.pb.h"

namespace ddp {

// Bounds on what clients and jobs may make the coordinator keep. A submission past a
// queue limit is refused with RESOURCE_EXHAUSTED naming the flag; a job's output past
// its byte limit is dropped, after one line in its log saying so.
struct UsageLimits {
  int64_t queued_jobs = 10000;          // --max-queued-jobs: PENDING or gathering.
  int64_t queued_jobs_per_user = 1000;  // --max-queued-jobs-per-user: of one named caller.
  // --max-log-bytes-per-job: output text accepted per job (lines over 64 KiB are cut
  // first). Counted from the stored lines at recovery.
  int64_t log_bytes_per_job = 128 << 20;
  // --command-jobs: who may submit a job that runs its own program (`command:`),
  // which runs as the workers' user (docs/security.md): any caller that may submit
  // (users: an open coordinator's anonymous caller too), admins only, or no one.
  // Workers bound what such a job may start with --allow-exec.
  enum class CommandJobs { kUsers, kAdmins, kOff };
  CommandJobs command_jobs = CommandJobs::kUsers;
  // --max-user-priority: the highest job priority a caller that is not an admin may
  // submit (docs/scheduling.md). Admins, and the anonymous caller of a coordinator
  // that authenticates no one, may submit any.
  int max_user_priority = 0;
  // --quota, --quota-file: slots per owner (scheduler.h).
  Quotas quotas;
};

// Who calls JobService, as the Authorizer established it (auth.h). The default is
// the caller of a coordinator that authenticates no one (the loopback quickstart):
// anonymous, and trusted with every job.
struct Caller {
  std::string name;    // Recorded as the owner of the jobs it submits; "" anonymous.
  bool admin = true;   // May cancel, and read the env of, every job.
  // Whether `job` may be cancelled (and its env read) by this caller.
  bool Owns(const v1::Job& job) const { return admin || (!name.empty() && job.owner() == name); }
};

// INVALID_ARGUMENT: rdzv.timeout_s not above the heartbeat timeout workers are held to
// (`heartbeat_timeout` times `heartbeat_stretch`; timeouts are
// ordered heartbeat < rendezvous), or a relative `workdir`. PERMISSION_DENIED: a
// command job that `limits.command_jobs` does not let `caller` submit, or a priority
// above `limits.max_user_priority` from a caller that is not an admin. `source` names
// the file in messages. Needs no lock: it reads the submission and constants only.
// `heartbeat_timeout` is the configured one; `heartbeat_stretch` the factor heartbeat rate
// scaling holds workers to now (decision 162), which the rendezvous timeout must exceed
// too.
absl::Status CheckSubmission(const JobSpec& spec, const std::string& source,
                             const std::string& workdir, const Caller& caller,
                             const UsageLimits& limits, absl::Duration heartbeat_timeout,
                             int heartbeat_stretch = 1);

class Admission {
 public:
  explicit Admission(UsageLimits limits) : limits_(limits) {}

  // ALREADY_EXISTS: `rdzv_id` is in use by a job that has not ended (named) or by a
  // submission being stored. RESOURCE_EXHAUSTED: the queue (--max-queued-jobs) or
  // the named owner's share of it (--max-queued-jobs-per-user) is full. O(jobs).
  absl::Status Admit(const std::map<std::string, JobRecord>& jobs, const std::string& rdzv_id,
                     const std::string& owner) const;

  // An admitted submission, until the store has taken or refused it.
  void Reserve(const std::string& id, const std::string& rdzv_id, const std::string& owner);
  void Release(const std::string& id, const std::string& rdzv_id, const std::string& owner);
  // Whether `id` belongs to a submission being stored (job ids are never reused).
  bool Reserved(const std::string& id) const { return ids_.count(id) > 0; }

 private:
  const UsageLimits limits_;
  std::set<std::string> ids_;
  std::set<std::string> rdzv_ids_;
  std::multiset<std::string> owners_;
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_CORE_ADMISSION_H_
