#include "coordinator/core/scheduler.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace ddp {
namespace {

std::string SlotsPerNode(const NodeNeed& need) {
  if (need.gpus) {
    return need.nproc_per_node > 0
               ? absl::StrCat(need.nproc_per_node, " GPU(s) (backend nccl)")
               : "at least 1 GPU (backend nccl, nproc_per_node auto)";
  }
  return need.nproc_per_node > 0 ? absl::StrCat(need.nproc_per_node, " slot(s)")
                                 : "auto slot(s) (one per free GPU, 1 on CPU)";
}

}  // namespace

bool JobQueue::Sync(JobRecord& job) {
  if (Queued(job)) return jobs_.emplace(job.seq, &job).second;
  return jobs_.erase(job.seq) > 0;
}

int64_t JobQueue::Position(const JobRecord& job) const {
  if (job.job.state() != v1::PENDING) return 0;
  int64_t position = 1;
  for (const auto& [seq, other] : jobs_) {
    if (seq >= job.seq) break;
    if (other->job.state() == v1::PENDING) ++position;
  }
  return position;
}

std::vector<Decision> SchedulePass(const JobQueue& queue, const ClusterView& cluster,
                                   absl::Time now) {
  std::vector<Decision> out;
  bool held = false;  // A job ahead holds the queue: the rest only get their labels.
  for (const auto& [seq, job] : queue.jobs()) {
    const NodeRange& range = job->spec.nodes;
    const NodeNeed need = NeedOf(job->spec);
    const int capable = cluster.CapableNodes(need);
    if (capable < range.min) {
      out.push_back({Decision::Kind::kUnschedulable, job,
                     absl::StrCat("unschedulable: needs ", range.min, " node(s) with ",
                                  SlotsPerNode(need), " each; the cluster has ", capable,
                                  " such node(s) alive (skipped until it can hold it)"),
                     {}, {}, 0});
      continue;  // Costs the queue nothing: the jobs behind it get their turn.
    }
    if (held) {
      if (job->job.unschedulable()) {  // The cluster grew: it fits again, in its turn.
        out.push_back({Decision::Kind::kWait, job,
                       "queued: waiting for the jobs ahead of it to start", {}, {}, 0});
      }
      continue;
    }
    const int eligible = cluster.EligibleNodes(need);
    const absl::Time window_end =
        job->gathering ? job->window_end : now + absl::Seconds(job->spec.rdzv.last_call_s);
    switch (DecideRendezvous(eligible, range, now, window_end)) {
      case RendezvousStep::kWait:
        out.push_back({Decision::Kind::kWait, job,
                       absl::StrCat("waiting for ", range.min, " node(s) with ",
                                    need.nproc_per_node > 0 ? absl::StrCat(need.nproc_per_node)
                                                            : std::string("auto"),
                                    need.gpus ? " free GPU(s); " : " free slot(s); ", eligible,
                                    " available"),
                       {}, {}, eligible});
        held = true;  // Strict FIFO: nothing behind it may start.
        break;
      case RendezvousStep::kLastCall:
        out.push_back({Decision::Kind::kLastCall, job, "", window_end, {}, eligible});
        held = true;
        break;
      case RendezvousStep::kForm: {
        std::vector<NodeOffer> nodes = cluster.Offers(need);
        if (nodes.size() < static_cast<size_t>(range.min)) {  // Counts and list disagree.
          out.push_back({Decision::Kind::kWait, job,
                         absl::StrCat("waiting for ", range.min, " node(s); ", nodes.size(),
                                      " available"),
                         {}, {}, static_cast<int>(nodes.size())});
          held = true;
          break;
        }
        nodes.resize(std::min(nodes.size(), static_cast<size_t>(range.max)));
        out.push_back({Decision::Kind::kForm, job, "", window_end, std::move(nodes), eligible});
        return out;
      }
    }
  }
  return out;
}

}  // namespace ddp
