// Rendezvous and rank assignment: pure functions the coordinator's state machine uses,
// tested without sockets or clocks of their own.
//
// A job's attempt forms when `min` nodes can host it (a worker "joins" a job's
// rendezvous by having enough free slots when the job is at the head of the queue);
// with fewer than `max`, the coordinator waits a last-call window for more. Gang
// scheduling: every rank gets a slot, or the attempt does not form.
//
// Ranks are deterministic: the chosen nodes sorted by worker name; node i is
// GROUP_RANK i (node 0 hosts rank 0 and the TCPStore); its local ranks are contiguous:
//   node 0 (w-a): ranks 0..n0-1, node 1 (w-b): ranks n0..n0+n1-1, ...
#ifndef DDP_COORDINATOR_RENDEZVOUS_H_
#define DDP_COORDINATOR_RENDEZVOUS_H_

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/jobspec/job_spec.h"
#include "ddp/v1/types.pb.h"

namespace ddp {

// What a worker can give a job right now.
struct NodeOffer {
  std::string worker;
  std::string address;
  int free_slots = 0;
  int gpus = 0;
};

// Local ranks of a job on a worker: nproc_per_node, or for "auto" (0) one per GPU and
// 1 on a CPU-only worker.
int LocalRanksFor(int nproc_per_node, int gpus);

// The offers that can host one node of the job, sorted by worker name.
std::vector<NodeOffer> EligibleNodes(std::vector<NodeOffer> offers, int nproc_per_node);

// The rank table for `nodes` (already chosen), ordered as described above.
std::vector<v1::RankAssignment> AssignRanks(std::vector<NodeOffer> nodes, int nproc_per_node);

enum class RendezvousStep {
  kWait,      // Fewer than min nodes: the job stays (or goes back to) PENDING.
  kLastCall,  // min <= nodes < max and the window is open: keep gathering.
  kForm,      // Form the attempt now with up to max nodes.
};

// `window_end` is when the last-call window of this rendezvous closes.
RendezvousStep DecideRendezvous(int eligible_nodes, const NodeRange& range, absl::Time now,
                                absl::Time window_end);

}  // namespace ddp

#endif  // DDP_COORDINATOR_RENDEZVOUS_H_
