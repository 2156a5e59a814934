#include "coordinator/core/job_lifecycle.h"

#include <signal.h>
#include <string.h>

#include <algorithm>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/contract/exit_codes.h"
#include "common/logging.h"
#include "coordinator/core/drain_policy.h"

namespace ddp {
namespace {

int64_t Millis(absl::Time t) { return absl::ToUnixMillis(t); }

// How a rank's exit is read: the built-in trainer's codes (common/contract/
// exit_codes.h: 2 is permanent, the rest retryable), or torchrun's for a user's
// program (a command job), where any nonzero exit or signal is worth a restart while
// max_restarts allows: a program's codes mean nothing to us.
struct ExitRules {
  bool command = false;
};

ExitRules RulesOf(const JobRecord& rec) { return {rec.spec.is_command()}; }

std::string DescribeExit(const v1::RankAssignment& r, ExitRules rules) {
  if (r.signal() != 0) {
    const char* name = sigabbrev_np(r.signal());
    return absl::StrCat("was killed by SIG", name ? name : std::to_string(r.signal()));
  }
  return absl::StrCat("exited with code ", r.exit_code(),
                      !rules.command && r.exit_code() == kExitPermanent ? " (permanent error)"
                                                                        : "");
}

bool Failed(const v1::RankAssignment& r) {
  return r.exited() && (r.exit_code() != 0 || r.signal() != 0);
}

bool FailedPermanently(const v1::RankAssignment& r, ExitRules rules) {
  return !rules.command && Failed(r) && r.signal() == 0 && !IsRetryableExit(r.exit_code());
}

// The failed rank that decides an attempt's fate: a permanent failure anywhere (a
// restart cannot cure it, whichever rank failed first), else the first in rank order.
const v1::RankAssignment* DecidingFailure(const v1::Attempt& a, ExitRules rules) {
  const v1::RankAssignment* decider = nullptr;
  for (const v1::RankAssignment& r : a.ranks()) {
    if (!Failed(r)) continue;
    if (decider == nullptr ||
        (FailedPermanently(r, rules) && !FailedPermanently(*decider, rules))) {
      decider = &r;
    }
  }
  return decider;
}

std::string FailureReason(const v1::RankAssignment& r, ExitRules rules) {
  std::string reason =
      absl::StrCat("rank ", r.rank(), " on ", r.worker(), " ", DescribeExit(r, rules));
  if (!r.error().empty()) absl::StrAppend(&reason, ": ", r.error());
  return reason;
}

// Rank `rank` of the attempt: the table is in rank order (AssignRanks and the store
// both keep it so), so this is an index, not a search.
v1::RankAssignment* RankRow(v1::Attempt& a, int rank) {
  if (rank >= 0 && rank < a.ranks_size() && a.ranks(rank).rank() == rank) {
    return a.mutable_ranks(rank);
  }
  for (v1::RankAssignment& r : *a.mutable_ranks()) {
    if (r.rank() == rank) return &r;
  }
  return nullptr;
}

void CountRank(JobRecord& job, const v1::RankAssignment& r, int sign) {
  job.ranks_up += sign * (r.pid() != 0 ? 1 : 0);
  job.ranks_exited += sign * (r.exited() ? 1 : 0);
  job.ranks_failed += sign * (Failed(r) ? 1 : 0);
}

void RecountRanks(JobRecord& job) {
  job.ranks_up = job.ranks_exited = job.ranks_failed = 0;
  if (const v1::Attempt* a = ActiveAttempt(job)) {
    for (const v1::RankAssignment& r : a->ranks()) CountRank(job, r, +1);
  }
}

// Sets the job's state and reason; returns whether either changed.
bool SetState(JobRecord& job, v1::JobState state, const std::string& reason) {
  if (job.job.state() == state && job.job.reason() == reason) return false;
  job.job.set_state(state);
  job.job.set_reason(reason);
  return true;
}

}  // namespace

bool IsTerminal(v1::JobState s) {
  return s == v1::SUCCEEDED || s == v1::FAILED || s == v1::CANCELLED;
}

const char* JobStateName(v1::JobState s) {
  return v1::JobState_Name(s).c_str();  // The enum value names, from protoc.
}

std::string ListSome(const std::vector<std::string>& names, size_t shown) {
  if (names.size() <= shown) return absl::StrJoin(names, ", ");
  std::vector<std::string> head(names.begin(), names.begin() + static_cast<long>(shown));
  return absl::StrCat(absl::StrJoin(head, ", "), " and ", names.size() - shown, " more");
}

void JobDelta::Merge(const JobDelta& o) {
  job_row = job_row || o.job_row;
  attempt_rows.insert(attempt_rows.end(), o.attempt_rows.begin(), o.attempt_rows.end());
  rank_rows.insert(rank_rows.end(), o.rank_rows.begin(), o.rank_rows.end());
  formed = formed || o.formed;
  if (o.ended_attempt != 0) ended_attempt = o.ended_attempt;
  finished = finished || o.finished;
}

v1::Attempt* ActiveAttempt(JobRecord& job) {
  if (job.job.attempts().empty()) return nullptr;
  v1::Attempt* a = job.job.mutable_attempts(job.job.attempts_size() - 1);
  return a->state() == v1::RENDEZVOUS || a->state() == v1::RUNNING ? a : nullptr;
}

const v1::Attempt* ActiveAttempt(const JobRecord& job) {
  return ActiveAttempt(const_cast<JobRecord&>(job));
}

bool Queued(const JobRecord& job) {
  return job.job.state() == v1::PENDING || (job.job.state() == v1::RENDEZVOUS && job.gathering);
}

JobRecord NewJob(std::string id, int64_t seq, JobSpec spec, std::string rdzv_id,
                 std::string spec_yaml, std::string workdir, absl::Time now) {
  JobRecord rec;
  rec.spec = std::move(spec);
  rec.seq = seq;
  v1::Job& job = rec.job;
  job.set_id(std::move(id));
  job.set_name(rec.spec.name);
  job.set_rdzv_id(std::move(rdzv_id));
  job.set_state(v1::PENDING);
  job.set_reason("queued");
  job.set_spec_yaml(std::move(spec_yaml));
  job.set_workdir(std::move(workdir));
  job.set_submit_ms(Millis(now));
  ShowSpec(rec);
  rec.stall = StallWatch(/*reporting_ranks_only=*/rec.spec.is_command());
  return rec;
}

void ShowSpec(JobRecord& rec) {
  v1::Job& job = rec.job;
  job.set_min_nodes(rec.spec.nodes.min);
  job.set_max_nodes(rec.spec.nodes.max);
  job.set_nproc_per_node(rec.spec.nproc_per_node);
  job.set_max_restarts(rec.spec.max_restarts);
  job.set_max_recoveries(rec.spec.max_recoveries);
  job.set_epochs(rec.spec.is_command() ? 0 : rec.spec.train.epochs);  // 0: unknown
  job.set_priority(rec.spec.priority);
  job.mutable_node_selector()->clear();
  for (const auto& [key, value] : rec.spec.node_selector) {
    (*job.mutable_node_selector())[key] = value;
  }
  switch (rec.spec.preemption) {
    case PreemptionPolicy::kAtCheckpoint: job.set_preemption(v1::PREEMPT_AT_CHECKPOINT); break;
    case PreemptionPolicy::kKill: job.set_preemption(v1::PREEMPT_KILL); break;
    case PreemptionPolicy::kNever: job.set_preemption(v1::PREEMPT_NEVER); break;
  }
}

JobDelta RestoreJob(JobRecord& rec, absl::Time now) {
  JobDelta delta;
  auto spec = ParseJobSpec(rec.job.spec_yaml(), rec.job.name());
  if (!spec.ok()) {
    // Written by another version, or edited. A finished job keeps its outcome; one in
    // flight cannot be run (or restarted) without its spec.
    const std::string reason =
        absl::StrCat("stored spec no longer parses: ", spec.status().message());
    DDP_LOG(ERROR) << "job " << rec.job.id() << ": " << reason;
    rec.spec.name = rec.job.name();
    if (!IsTerminal(rec.job.state())) {
      if (v1::Attempt* a = ActiveAttempt(rec)) {
        a->set_state(v1::FAILED);
        a->set_reason(reason);
        a->set_end_ms(Millis(now));
        delta.attempt_rows.push_back(a->number());
      }
      SetState(rec, v1::FAILED, reason);
      rec.job.set_end_ms(Millis(now));
      delta.job_row = true;
      delta.finished = true;
    }
    return delta;
  }
  rec.spec = *std::move(spec);
  ShowSpec(rec);  // The spec's facts from the spec; the counters are the row's.
  // A restarted coordinator re-arms the watch with the next step events, in the mode
  // of the job's kind (a command job watches only the ranks that report).
  rec.stall = StallWatch(/*reporting_ranks_only=*/rec.spec.is_command());
  if (rec.job.state() == v1::RENDEZVOUS && ActiveAttempt(rec) == nullptr) {
    rec.job.set_state(v1::PENDING);  // Was gathering: decide again.
  }
  rec.start_timeout = absl::Seconds(rec.spec.rdzv.timeout_s);
  rec.start_deadline = now + rec.start_timeout;
  if (const v1::Attempt* a = ActiveAttempt(rec); a != nullptr && Recovering(*a)) {
    rec.recovery_deadline = now + absl::Seconds(rec.spec.recovery_timeout_s);
  }
  RecountRanks(rec);
  return delta;
}

JobDelta Wait(JobRecord& rec, const std::string& reason) {
  JobDelta delta;
  rec.gathering = false;
  rec.job.set_unschedulable(false);
  delta.job_row = SetState(rec, v1::PENDING, reason);
  return delta;
}

JobDelta MarkUnschedulable(JobRecord& rec, const std::string& reason) {
  JobDelta delta = Wait(rec, reason);
  rec.job.set_unschedulable(true);
  return delta;
}

JobDelta OpenLastCall(JobRecord& rec, absl::Time window_end, int nodes) {
  JobDelta delta;
  if (rec.gathering) return delta;
  rec.gathering = true;
  rec.window_end = window_end;
  rec.job.set_unschedulable(false);
  SetState(rec, v1::RENDEZVOUS,
           absl::StrCat("rendezvous: ", nodes, " of up to ", rec.spec.nodes.max,
                        " nodes; last call ends in ", rec.spec.rdzv.last_call_s, "s"));
  delta.job_row = true;
  return delta;
}

JobDelta WaitForPort(JobRecord& rec, const std::string& worker) {
  JobDelta delta;
  const std::string reason = absl::StrCat("waiting for worker ", worker,
                                          " to report a free port for the rendezvous store");
  if (rec.job.reason() != reason) {
    rec.job.set_reason(reason);
    delta.job_row = true;
  }
  return delta;
}

JobDelta FormAttempt(JobRecord& rec, const std::vector<NodeOffer>& nodes, int port,
                     absl::Time now, absl::Duration start_timeout) {
  JobDelta delta;
  v1::Attempt* a = rec.job.add_attempts();
  a->set_number(rec.job.attempts_size());
  a->set_state(v1::RENDEZVOUS);
  a->set_master_addr(nodes[0].address);
  a->set_master_port(port);
  const bool gpus = UseGpus(rec.spec, nodes);
  const bool shared = ShareGpus(rec.spec, gpus);
  for (auto& r : AssignRanks(nodes, rec.spec.nproc_per_node, gpus, shared)) {
    *a->add_ranks() = std::move(r);
  }
  a->set_world_size(a->ranks_size());
  a->set_start_ms(Millis(now));
  std::vector<std::string> names;
  names.reserve(nodes.size());
  for (const NodeOffer& n : nodes) names.push_back(n.worker);
  std::sort(names.begin(), names.end());
  rec.gathering = false;
  rec.job.set_unschedulable(false);
  rec.start_deadline = now + start_timeout;
  rec.start_timeout = start_timeout;
  rec.stall = StallWatch(/*reporting_ranks_only=*/rec.spec.is_command());
  SetState(rec, v1::RENDEZVOUS,
           absl::StrCat("attempt ", a->number(), ": starting ", a->world_size(), " trainers on ",
                        ListSome(names)));
  RecountRanks(rec);
  delta.job_row = true;
  delta.attempt_rows.push_back(a->number());
  for (const v1::RankAssignment& r : a->ranks()) delta.rank_rows.emplace_back(a->number(), r.rank());
  delta.formed = true;
  DDP_LOG(INFO) << "job " << rec.job.id() << " attempt " << a->number() << " formed: world "
                << a->world_size()
                << (gpus ? " (a GPU per rank)" : shared ? " (ranks sharing their node's GPUs)" : "")
                << " on " << nodes.size()
                << " node(s) (" << ListSome(names) << "), store " << a->master_addr() << ":" << port;
  return delta;
}

JobDelta FailAttempt(JobRecord& rec, const std::string& reason, bool retryable, absl::Time now) {
  JobDelta delta;
  v1::Attempt* a = ActiveAttempt(rec);
  if (a == nullptr) return delta;
  a->set_state(v1::FAILED);
  a->set_reason(reason);
  a->set_end_ms(Millis(now));
  if (Recovering(*a)) {  // Ended with its attempt.
    v1::Recovery* recovery = a->mutable_recoveries(a->recoveries_size() - 1);
    recovery->set_end_ms(Millis(now));
    recovery->set_outcome(absl::StrCat("failed: ", reason));
  }
  rec.recovery_deadline = absl::InfiniteFuture();
  delta.attempt_rows.push_back(a->number());
  delta.ended_attempt = a->number();
  if (retryable && rec.job.restarts() < rec.spec.max_restarts) {
    rec.job.set_restarts(rec.job.restarts() + 1);
    SetState(rec, v1::PENDING,
             absl::StrCat("restarting (", rec.job.restarts(), " of ", rec.spec.max_restarts,
                          ") after attempt ", a->number(), " failed: ", reason));
  } else {
    SetState(rec, v1::FAILED,
             retryable && rec.spec.max_restarts > 0
                 ? absl::StrCat(reason, " (no restarts left of ", rec.spec.max_restarts, ")")
                 : reason);
    rec.job.set_end_ms(Millis(now));
    delta.finished = true;
  }
  rec.gathering = false;
  delta.job_row = true;
  DDP_LOG(WARNING) << "job " << rec.job.id() << " attempt " << a->number() << " failed: "
                   << reason << " -> " << JobStateName(rec.job.state());
  return delta;
}

bool Preempted(const v1::Attempt& attempt) {
  return attempt.state() == v1::FAILED && attempt.preempted();
}

JobDelta PreemptAttempt(JobRecord& rec, const std::string& reason, absl::Time now) {
  JobDelta delta;
  v1::Attempt* a = ActiveAttempt(rec);
  if (a == nullptr) return delta;
  a->set_state(v1::FAILED);
  a->set_preempted(true);
  a->set_reason(absl::StrCat(kPreemptedPrefix, reason));
  a->set_end_ms(Millis(now));
  delta.attempt_rows.push_back(a->number());
  delta.ended_attempt = a->number();
  SetState(rec, v1::PENDING,
           absl::StrCat("moving after attempt ", a->number(), " was preempted: ", reason,
                        " (not counted against max_restarts)"));
  rec.gathering = false;
  delta.job_row = true;
  DDP_LOG(INFO) << "job " << rec.job.id() << " attempt " << a->number() << " preempted: "
                << reason;
  return delta;
}

JobDelta ApplyReport(JobRecord& rec, const std::string& worker, const v1::TaskStatus& status,
                     absl::Time now) {
  JobDelta delta;
  if (status.attempt() < 1 || status.attempt() > rec.job.attempts_size()) {
    return delta;  // Unknown to us (a wiped state dir, say): the worker will drop it.
  }
  v1::Attempt* a = rec.job.mutable_attempts(status.attempt() - 1);
  const bool active = a == ActiveAttempt(rec);
  for (const v1::LocalRankStatus& s : status.ranks()) {
    v1::RankAssignment* r = RankRow(*a, s.rank());
    if (r == nullptr || r->worker() != worker) continue;
    // A process of an earlier generation (the one a recovery replaced): its exit
    // was seen and acted on.
    if (s.generation() < r->generation()) continue;
    if (r->pid() == s.pid() && r->exited() == s.exited() && r->exit_code() == s.exit_code() &&
        r->signal() == s.signal()) {
      continue;
    }
    if (active) CountRank(rec, *r, -1);
    r->set_pid(s.pid());
    r->set_exited(s.exited());
    r->set_exit_code(s.exit_code());
    r->set_signal(s.signal());
    if (active) CountRank(rec, *r, +1);
    delta.rank_rows.emplace_back(a->number(), r->rank());
  }
  if (active && !status.error().empty()) {
    // A node fault (its workdir or binary missing, its disk unwritable) is retried on
    // other nodes; anything else would recur anywhere.
    delta.Merge(FailAttempt(
        rec, absl::StrCat("worker ", worker, " could not start trainers: ", status.error()),
        /*retryable=*/status.node_fault(), now));
    return delta;
  }
  if (!active) {
    if (delta.rank_rows.empty()) return delta;
    // The job is waiting to restart after this attempt failed, and one of its ranks
    // now turns out to have failed permanently: no restart can cure that.
    if (a->number() != rec.job.attempts_size() || IsTerminal(rec.job.state()) ||
        ActiveAttempt(rec) != nullptr) {
      return delta;  // Shows the stopped trainers' exits, nothing more.
    }
    const v1::RankAssignment* decider = DecidingFailure(*a, RulesOf(rec));
    if (decider != nullptr && FailedPermanently(*decider, RulesOf(rec))) {
      rec.gathering = false;
      rec.job.set_unschedulable(false);
      if (!Preempted(*a)) {  // It never happened (a preemption was not counted).
        rec.job.set_restarts(std::max(0, rec.job.restarts() - 1));
      }
      SetState(rec, v1::FAILED, FailureReason(*decider, RulesOf(rec)));
      rec.job.set_end_ms(Millis(now));
      delta.job_row = true;
      delta.finished = true;
      DDP_LOG(WARNING) << "job " << rec.job.id() << " failed: " << rec.job.reason()
                       << " (no restart after a permanent error)";
    }
    return delta;
  }
  // A failed rank fails the attempt (unless it can be replaced live); a permanent
  // failure decides whether to restart.
  if (rec.ranks_failed > 0) {
    const ExitRules rules = RulesOf(rec);
    const v1::RankAssignment* r = DecidingFailure(*a, rules);
    if (Recovering(*a) && !FailedPermanently(*r, rules)) {
      delta.Merge(FailRecovery(
          rec, absl::StrCat("a second fault during it: ", FailureReason(*r, rules)), now));
      return delta;
    }
    if (LiveRecoveryRefusal(rec).empty()) {
      delta.recover = true;
      return delta;
    }
    delta.Merge(FailAttempt(rec, FailureReason(*r, rules),
                            /*retryable=*/!FailedPermanently(*r, rules), now));
    return delta;
  }
  const int64_t now_ms = Millis(now);
  if (rec.ranks_exited == a->world_size()) {
    a->set_state(v1::SUCCEEDED);
    a->set_reason(absl::StrCat("all ", a->world_size(), " ranks exited 0"));
    a->set_end_ms(now_ms);
    SetState(rec, v1::SUCCEEDED, a->reason());
    if (rec.job.start_ms() == 0) rec.job.set_start_ms(now_ms);  // Never seen RUNNING.
    rec.job.set_end_ms(now_ms);
    delta.job_row = true;
    delta.attempt_rows.push_back(a->number());
    delta.ended_attempt = a->number();
    delta.finished = true;
    DDP_LOG(INFO) << "job " << rec.job.id() << " succeeded";
  } else if (rec.ranks_up == a->world_size() && a->state() == v1::RENDEZVOUS) {
    a->set_state(v1::RUNNING);
    SetState(rec, v1::RUNNING,
             absl::StrCat("attempt ", a->number(), ": ", a->world_size(), " ranks running"));
    if (rec.job.start_ms() == 0) rec.job.set_start_ms(now_ms);
    delta.job_row = true;
    delta.attempt_rows.push_back(a->number());
  }
  return delta;
}

bool Recovering(const v1::Attempt& a) {
  return a.recoveries_size() > 0 && a.recoveries(a.recoveries_size() - 1).end_ms() == 0;
}

namespace {
// Why the active attempt cannot recover live when the ranks `lost` says are gone.
template <typename Lost>
std::string Refusal(const JobRecord& rec, Lost lost) {
  const v1::Attempt* a = ActiveAttempt(rec);
  if (a == nullptr) return "no active attempt";
  if (rec.spec.max_recoveries == 0) return "max_recoveries is 0";
  if (rec.job.recoveries() >= rec.spec.max_recoveries) {
    return absl::StrCat("no recoveries left of max_recoveries ", rec.spec.max_recoveries);
  }
  if (a->state() != v1::RUNNING) return "the attempt was not running yet";
  if (Recovering(*a)) return "a recovery is under way";
  const ExitRules rules = RulesOf(rec);
  int survivors = 0;
  for (const v1::RankAssignment& r : a->ranks()) {
    if (FailedPermanently(r, rules)) return FailureReason(r, rules);
    if (!r.exited() && !lost(r)) ++survivors;
  }
  if (survivors == 0) return "no rank survived to hand its state over";
  return "";
}
}  // namespace

std::string LiveRecoveryRefusal(const JobRecord& rec) {
  return Refusal(rec, [](const v1::RankAssignment&) { return false; });
}

std::string NodeRecoveryRefusal(const JobRecord& rec, const std::string& worker) {
  return Refusal(rec, [&](const v1::RankAssignment& r) { return r.worker() == worker; });
}

JobDelta BeginRecovery(JobRecord& rec, const std::string& master_addr, int port,
                       absl::Time now, const std::vector<int>& moved,
                       const std::string& cause) {
  JobDelta delta;
  v1::Attempt* a = ActiveAttempt(rec);
  if (a == nullptr) return delta;
  const ExitRules rules = RulesOf(rec);
  v1::Recovery* recovery = a->add_recoveries();
  a->set_generation(a->generation() + 1);
  recovery->set_generation(a->generation());
  recovery->set_start_ms(Millis(now));
  recovery->set_outcome("recovering");
  std::vector<std::string> causes;
  if (!cause.empty()) causes.push_back(cause);
  for (v1::RankAssignment& r : *a->mutable_ranks()) {
    const bool was_moved = std::find(moved.begin(), moved.end(), r.rank()) != moved.end();
    if (!Failed(r) && !was_moved) continue;
    if (!was_moved) causes.push_back(absl::StrCat(FailureReason(r, rules), " (pid ", r.pid(), ")"));
    recovery->add_ranks(r.rank());
    CountRank(rec, r, -1);
    r.set_pid(0);
    r.set_exited(false);
    r.set_exit_code(0);
    r.set_signal(0);
    r.clear_error();
    r.set_lost(false);
    r.set_generation(a->generation());
    CountRank(rec, r, +1);
    delta.rank_rows.emplace_back(a->number(), r.rank());
  }
  recovery->set_cause(absl::StrJoin(causes, "; "));
  a->set_master_addr(master_addr);
  a->set_master_port(port);
  rec.job.set_recoveries(rec.job.recoveries() + 1);
  rec.recovery_deadline = now + absl::Seconds(rec.spec.recovery_timeout_s);
  SetState(rec, v1::RUNNING,
           absl::StrCat("attempt ", a->number(), ": live recovery ", a->generation(), " (",
                        rec.job.recoveries(), " of ", rec.spec.max_recoveries, "): replacing ",
                        recovery->cause()));
  delta.job_row = true;
  delta.attempt_rows.push_back(a->number());
  DDP_LOG(WARNING) << "job " << rec.job.id() << ": " << rec.job.reason() << "; store "
                   << master_addr << ":" << port;
  return delta;
}

JobDelta FinishRecovery(JobRecord& rec, int attempt, int generation, int source_rank,
                        int64_t global_step, absl::Time now) {
  JobDelta delta;
  v1::Attempt* a = ActiveAttempt(rec);
  if (a == nullptr || a->number() != attempt || !Recovering(*a)) return delta;
  v1::Recovery* recovery = a->mutable_recoveries(a->recoveries_size() - 1);
  if (recovery->generation() != generation) return delta;
  recovery->set_end_ms(Millis(now));
  recovery->set_outcome("recovered");
  recovery->set_source_rank(source_rank);
  recovery->set_global_step(global_step);
  rec.recovery_deadline = absl::InfiniteFuture();
  SetState(rec, v1::RUNNING,
           absl::StrCat("attempt ", a->number(), ": ", a->world_size(),
                        " ranks running (live recovery ", generation, " took ",
                        recovery->end_ms() - recovery->start_ms(), " ms, from rank ",
                        source_rank, "'s state at step ", global_step, ")"));
  delta.job_row = true;
  delta.attempt_rows.push_back(a->number());
  DDP_LOG(INFO) << "job " << rec.job.id() << ": " << rec.job.reason();
  return delta;
}

JobDelta FailRecovery(JobRecord& rec, const std::string& why, absl::Time now) {
  v1::Attempt* a = ActiveAttempt(rec);
  if (a == nullptr) return {};
  // The one under way (FailAttempt ends it), or the one refused before it began.
  const int generation = a->generation() + (Recovering(*a) ? 0 : 1);
  return FailAttempt(rec,
                     absl::StrCat("live recovery ", generation, " failed: ", why,
                                  "; falling back to a restart from the last checkpoint"),
                     /*retryable=*/true, now);
}

JobDelta RecordRankError(JobRecord& rec, int attempt, int rank, const std::string& message) {
  JobDelta delta;
  if (attempt < 1 || attempt > rec.job.attempts_size()) return delta;
  v1::RankAssignment* r = RankRow(*rec.job.mutable_attempts(attempt - 1), rank);
  if (r == nullptr || r->error() == message) return delta;
  r->set_error(message);
  delta.rank_rows.emplace_back(attempt, rank);
  return delta;
}

JobDelta RecordCheckpoint(JobRecord& rec, int attempt, int64_t global_step, absl::Time now) {
  JobDelta delta;
  if (attempt < 1 || attempt > rec.job.attempts_size() ||
      attempt < rec.job.last_checkpoint_attempt()) {
    return delta;  // Not an attempt of this job, or older than the newest one's.
  }
  rec.job.set_last_checkpoint_attempt(attempt);
  rec.job.set_last_checkpoint_step(global_step);
  rec.job.set_last_checkpoint_ms(Millis(now));
  delta.job_row = true;
  return delta;
}

std::optional<absl::Duration> PreemptionLoss(const JobRecord& rec, absl::Time now) {
  const v1::Attempt* a = ActiveAttempt(rec);
  if (a == nullptr || a->state() != v1::RUNNING || rec.job.state() != v1::RUNNING) {
    return std::nullopt;
  }
  switch (rec.spec.preemption) {
    case PreemptionPolicy::kNever:
      return std::nullopt;
    case PreemptionPolicy::kAtCheckpoint:
      if (!ResumesFromPeriodicCheckpoints(rec.spec)) return std::nullopt;
      return absl::ZeroDuration();
    case PreemptionPolicy::kKill:
      break;
  }
  int64_t since_ms = a->start_ms();
  if (ResumesFromCheckpoints(rec.spec) && rec.job.last_checkpoint_attempt() == a->number()) {
    since_ms = std::max(since_ms, rec.job.last_checkpoint_ms());
  }
  return std::max(absl::ZeroDuration(), now - absl::FromUnixMillis(since_ms));
}

JobDelta TimeOutRendezvous(JobRecord& rec, absl::Time now) {
  const v1::Attempt* a = ActiveAttempt(rec);
  if (a == nullptr || a->state() != v1::RENDEZVOUS || now < rec.start_deadline) return {};
  std::set<std::string> late;
  for (const v1::RankAssignment& r : a->ranks()) {
    if (r.pid() == 0) late.insert(r.worker());
  }
  return FailAttempt(rec,
                     absl::StrCat("rendezvous timed out: trainers on ",
                                  ListSome({late.begin(), late.end()}),
                                  " not running within ",
                                  absl::FormatDuration(rec.start_timeout),
                                  " (the start timeout)"),
                     /*retryable=*/true, now);
}

absl::StatusOr<JobDelta> Cancel(JobRecord& rec, absl::Time now) {
  if (IsTerminal(rec.job.state())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", rec.job.id(), " already finished (", JobStateName(rec.job.state()), ")"));
  }
  JobDelta delta;
  const int64_t now_ms = Millis(now);
  if (v1::Attempt* a = ActiveAttempt(rec)) {
    a->set_state(v1::CANCELLED);
    a->set_reason("cancelled by user");
    a->set_end_ms(now_ms);
    delta.attempt_rows.push_back(a->number());
    delta.ended_attempt = a->number();
  }
  rec.gathering = false;
  rec.job.set_unschedulable(false);
  SetState(rec, v1::CANCELLED, "cancelled by user");
  rec.job.set_end_ms(now_ms);
  delta.job_row = true;
  delta.finished = true;
  return delta;
}

}  // namespace ddp
