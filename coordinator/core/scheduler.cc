#include "coordinator/core/scheduler.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "coordinator/core/drain_policy.h"

namespace ddp {
namespace {

std::string SlotsPerNode(const NodeNeed& need) {
  if (need.gpus) {
    return need.nproc_per_node > 0
               ? absl::StrCat(need.nproc_per_node, " GPU(s) (backend nccl)")
               : "at least 1 GPU (backend nccl, nproc_per_node auto)";
  }
  if (need.gpu_node) {
    return absl::StrCat(need.MinRanks(), " slot(s) and a GPU to share (train.device cuda)");
  }
  return need.nproc_per_node > 0 ? absl::StrCat(need.nproc_per_node, " slot(s)")
                                 : "auto slot(s) (one per free GPU, 1 on CPU)";
}

// " with pool=team-a" for a job with a node_selector, "" without.
std::string Selected(const NodeNeed& need) {
  return need.selective() ? absl::StrCat(" with ", FormatLabels(*need.selector)) : "";
}

const Labels& SelectorOf(const JobRecord& job) { return job.spec.node_selector; }

// Ranks an attempt formed on `nodes` would have: what it costs its owner's quota.
int64_t RanksOn(const JobSpec& spec, const std::vector<NodeOffer>& nodes) {
  const bool gpus = UseGpus(spec, nodes);
  int64_t ranks = 0;
  for (const NodeOffer& n : nodes) ranks += LocalRanksFor(spec.nproc_per_node, n, gpus);
  return ranks;
}

// Whether a higher-priority job may take `job`'s nodes: never for PREEMPT_NEVER,
// and without losing work (at a checkpoint it resumes from) unless it said `kill`.
bool Preemptible(const JobSpec& spec) {
  switch (spec.preemption) {
    case PreemptionPolicy::kKill: return true;
    case PreemptionPolicy::kAtCheckpoint: return ResumesFromPeriodicCheckpoints(spec);
    case PreemptionPolicy::kNever: return false;
  }
  return false;
}

// Chooses the running jobs whose nodes let `job` start (it has `eligible` nodes now,
// needs range.min): jobs already stopping, and those already marked for a job it
// outranks, count first; then as few new victims as needed, lowest priority first,
// then the least training lost, then the most recently started. Marked or new
// victims that turn out not to be needed are left out again (the higher priorities
// first). Returns the victims to mark (not the stopping ones), or nothing when even
// every candidate would not make room (nothing is preempted for nothing).
class VictimChooser {
 public:
  VictimChooser(const JobRecord& job, const NodeNeed& need, int eligible,
                const ClusterView& cluster)
      : job_(job), need_(need), eligible_(eligible), cluster_(cluster) {}

  std::vector<const RunningJob*> Choose(const std::vector<RunningJob>& running) {
    std::vector<const RunningJob*> set;  // Counted as coming free.
    std::vector<const RunningJob*> pool;  // Candidates, in the order to take them.
    for (const RunningJob& r : running) {
      if (r.job == &job_ || !Useful(r)) continue;
      if (r.ended) {
        set.push_back(&r);
      } else if (r.job->spec.priority < job_.spec.priority &&
                 (r.preempting || Preemptible(r.job->spec))) {
        pool.push_back(&r);
      }
    }
    std::stable_sort(pool.begin(), pool.end(), [](const RunningJob* a, const RunningJob* b) {
      if (a->preempting != b->preempting) return a->preempting;  // Marked ones cost nothing new.
      if (a->job->spec.priority != b->job->spec.priority) {
        return a->job->spec.priority < b->job->spec.priority;
      }
      if (a->loss != b->loss) return a->loss < b->loss;  // The least work lost.
      if (a->job->job.start_ms() != b->job->job.start_ms()) {
        return a->job->job.start_ms() > b->job->job.start_ms();
      }
      return a->job->seq > b->job->seq;
    });
    size_t taken = 0;
    while (!Enough(set) && taken < pool.size()) set.push_back(pool[taken++]);
    if (!Enough(set)) return {};
    // Drop those not needed, trying the last taken (highest priority) first.
    for (size_t i = set.size(); i-- > 0;) {
      if (set[i]->ended) continue;
      std::vector<const RunningJob*> without = set;
      without.erase(without.begin() + static_cast<std::ptrdiff_t>(i));
      if (Enough(without)) set = std::move(without);
    }
    std::vector<const RunningJob*> victims;
    for (const RunningJob* r : set) {
      if (!r->ended) victims.push_back(r);
    }
    return victims;
  }

 private:
  std::optional<NodeRoom> RoomOf(const std::string& worker) {
    auto [it, inserted] = rooms_.try_emplace(worker);
    if (inserted) it->second = cluster_.Room(worker, need_);
    return it->second;
  }
  bool Useful(const RunningJob& r) {
    for (const auto& [worker, ranks] : r.ranks_by_worker) {
      if (RoomOf(worker).has_value()) return true;
    }
    return false;
  }
  // Whether the nodes `set` frees, with those free now, make room for `job_`.
  bool Enough(const std::vector<const RunningJob*>& set) {
    std::map<std::string, NodeRoom> vacated;
    for (const RunningJob* r : set) {
      for (const auto& [worker, ranks] : r->ranks_by_worker) vacated[worker].slots += ranks;
      for (const auto& [worker, gpus] : r->gpus_by_worker) vacated[worker].gpus += gpus;
    }
    int gained = 0;
    for (const auto& [worker, v] : vacated) {
      const std::optional<NodeRoom> room = RoomOf(worker);
      if (!room.has_value()) continue;
      const NodeRoom after{room->slots + v.slots, room->gpus + v.gpus};
      if (room->RanksFor(need_) < need_.MinRanks() && after.RanksFor(need_) >= need_.MinRanks()) {
        ++gained;
      }
    }
    return eligible_ + gained >= job_.spec.nodes.min;
  }

  const JobRecord& job_;
  const NodeNeed& need_;
  const int eligible_;
  const ClusterView& cluster_;
  std::map<std::string, std::optional<NodeRoom>> rooms_;  // Asked once per worker.
};

std::string VictimList(const std::vector<const RunningJob*>& victims) {
  std::string out;
  for (const RunningJob* r : victims) {
    absl::StrAppend(&out, out.empty() ? "" : ", ", r->job->job.id(), " (priority ",
                    r->job->spec.priority,
                    r->job->spec.preemption == PreemptionPolicy::kKill ? ", at once)"
                                                                        : ", at its next checkpoint)");
  }
  return out;
}

}  // namespace

int64_t Quotas::Limit(const std::string& owner) const {
  if (owner.empty() || slots.empty()) return -1;
  auto it = slots.find(owner);
  if (it != slots.end()) return it->second;
  it = slots.find("*");
  return it == slots.end() ? -1 : it->second;
}

absl::StatusOr<Quotas> ParseQuotas(const std::vector<std::string>& entries) {
  Quotas quotas;
  for (const std::string& raw : entries) {
    absl::string_view entry = absl::StripAsciiWhitespace(raw);
    const size_t eq = entry.find('=');
    int64_t slots = 0;
    const std::string owner(absl::StripAsciiWhitespace(entry.substr(0, eq)));
    if (eq == absl::string_view::npos || owner.empty() ||
        !absl::SimpleAtoi(entry.substr(eq + 1), &slots) || slots < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "quota '", raw, "': expected OWNER=SLOTS (a token name, or * for every other "
          "owner, and a number of slots >= 0), e.g. alice=8"));
    }
    if (!quotas.slots.emplace(owner, slots).second) {
      return absl::InvalidArgumentError(absl::StrCat("quota for '", owner, "' given twice"));
    }
  }
  return quotas;
}

bool JobQueue::Sync(JobRecord& job) {
  if (Queued(job)) return jobs_.emplace(KeyOf(job), &job).second;
  return jobs_.erase(KeyOf(job)) > 0;
}

int64_t JobQueue::Position(const JobRecord& job) const {
  if (job.job.state() != v1::PENDING) return 0;
  int64_t position = 1;
  const Key key = KeyOf(job);
  for (const auto& [other_key, other] : jobs_) {
    if (other_key >= key) break;
    if (other->job.state() == v1::PENDING) ++position;
  }
  return position;
}

std::vector<Decision> SchedulePass(const JobQueue& queue, const ClusterView& cluster,
                                   absl::Time now, const PassContext& context) {
  std::vector<Decision> out;
  // The jobs that hold the queue, by node_selector: a job behind one of them that
  // could share its nodes waits for it.
  std::vector<const Labels*> holders;
  auto held = [&holders](const JobRecord& job) {
    for (const Labels* h : holders) {
      if (!SelectorsDisjoint(*h, SelectorOf(job))) return true;
    }
    return false;
  };
  // Listed on first use: quotas and preemption only.
  std::optional<std::vector<RunningJob>> running;
  std::map<std::string, int64_t> used;  // Slots held per owner.
  auto list_running = [&]() -> const std::vector<RunningJob>& {
    if (!running.has_value()) {
      running = context.running ? context.running() : std::vector<RunningJob>{};
      for (const RunningJob& r : *running) used[r.job->job.owner()] += r.ranks;
    }
    return *running;
  };
  const bool quotas = context.quotas != nullptr && !context.quotas->empty();

  for (const auto& [key, job] : queue.jobs()) {
    const NodeRange& range = job->spec.nodes;
    const NodeNeed need = NeedOf(job->spec);
    const int capable = cluster.CapableNodes(need);
    if (capable < range.min) {
      out.push_back({Decision::Kind::kUnschedulable, job,
                     absl::StrCat("unschedulable: needs ", range.min, " node(s)", Selected(need),
                                  " with ", SlotsPerNode(need), " each; the cluster has ",
                                  capable, " such node(s) alive (skipped until it can hold it)"),
                     {}, {}, 0});
      continue;  // Costs the queue nothing: the jobs behind it get their turn.
    }
    if (held(*job)) {
      if (job->job.unschedulable()) {  // The cluster grew: it fits again, in its turn.
        out.push_back({Decision::Kind::kWait, job,
                       "queued: waiting for the jobs ahead of it to start", {}, {}, 0});
      }
      continue;
    }
    const int64_t limit = quotas ? context.quotas->Limit(job->job.owner()) : -1;
    const int64_t least = int64_t{range.min} * need.MinRanks();
    if (limit >= 0) {
      list_running();
      const int64_t in_use = used[job->job.owner()];
      if (in_use + least > limit) {
        out.push_back({Decision::Kind::kWait, job,
                       absl::StrCat("waiting for quota: owner ", job->job.owner(), " holds ",
                                    in_use, " of its ", limit, " slot(s) (--quota); this job "
                                    "needs at least ", least),
                       {}, {}, 0});
        continue;  // Other owners' jobs go on.
      }
    }
    const int eligible = cluster.EligibleNodes(need);
    const absl::Time window_end =
        job->gathering ? job->window_end : now + absl::Seconds(job->spec.rdzv.last_call_s);
    switch (DecideRendezvous(eligible, range, now, window_end)) {
      case RendezvousStep::kWait: {
        std::string reason = absl::StrCat(
            "waiting for ", range.min, " node(s)", Selected(need), " with ",
            need.nproc_per_node > 0 ? absl::StrCat(need.nproc_per_node) : std::string("auto"),
            need.gpus       ? " free GPU(s); "
            : need.gpu_node ? " free slot(s) on a node with a GPU (train.device cuda); "
                            : " free slot(s); ",
            eligible, " available");
        // Outranks a running job, or some are stopping: see whose nodes help. Not for
        // a job with auto ranks per node and a quota: what it would take is known only
        // once nodes are offered, and preempting for a job its quota then holds back
        // would hand the nodes straight back to the victim, again and again.
        std::vector<const RunningJob*> victims;
        if (limit < 0 || need.nproc_per_node > 0) {
          const std::vector<RunningJob>& all = list_running();
          bool worth = false;
          for (const RunningJob& r : all) {
            worth = worth || r.ended || r.job->spec.priority < job->spec.priority;
          }
          if (worth) victims = VictimChooser(*job, need, eligible, cluster).Choose(all);
        }
        if (!victims.empty()) absl::StrAppend(&reason, "; preempting ", VictimList(victims));
        out.push_back({Decision::Kind::kWait, job, std::move(reason), {}, {}, eligible});
        for (const RunningJob* r : victims) {
          Decision d{Decision::Kind::kPreempt, r->job,
                     absl::StrCat("job ", job->job.id(), " (priority ", job->spec.priority,
                                  ") needs its nodes"),
                     {}, {}, 0};
          d.for_job = job;
          out.push_back(std::move(d));
        }
        holders.push_back(&SelectorOf(*job));  // Nothing behind it may take its nodes.
        break;
      }
      case RendezvousStep::kLastCall:
        out.push_back({Decision::Kind::kLastCall, job, "", window_end, {}, eligible});
        holders.push_back(&SelectorOf(*job));
        break;
      case RendezvousStep::kForm: {
        std::vector<NodeOffer> nodes = cluster.Offers(need);
        if (nodes.size() < static_cast<size_t>(range.min)) {  // Counts and list disagree.
          out.push_back({Decision::Kind::kWait, job,
                         absl::StrCat("waiting for ", range.min, " node(s)", Selected(need),
                                      "; ", nodes.size(), " available"),
                         {}, {}, static_cast<int>(nodes.size())});
          holders.push_back(&SelectorOf(*job));
          break;
        }
        nodes.resize(std::min(nodes.size(), static_cast<size_t>(range.max)));
        if (limit >= 0) {  // An elastic job takes only the nodes its quota allows.
          const int64_t room = limit - used[job->job.owner()];
          while (nodes.size() > static_cast<size_t>(range.min) && RanksOn(job->spec, nodes) > room) {
            nodes.pop_back();
          }
          if (RanksOn(job->spec, nodes) > room) {  // Auto ranks per node: more than least.
            out.push_back({Decision::Kind::kWait, job,
                           absl::StrCat("waiting for quota: owner ", job->job.owner(),
                                        " has ", room, " of its ", limit,
                                        " slot(s) free (--quota); this job would take ",
                                        RanksOn(job->spec, nodes)),
                           {}, {}, eligible});
            continue;
          }
        }
        out.push_back({Decision::Kind::kForm, job, "", window_end, std::move(nodes), eligible});
        return out;
      }
    }
  }
  return out;
}

}  // namespace ddp
