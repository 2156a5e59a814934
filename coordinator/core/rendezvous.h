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
#ifndef DDP_COORDINATOR_CORE_RENDEZVOUS_H_
#define DDP_COORDINATOR_CORE_RENDEZVOUS_H_

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/jobspec/job_spec.h"
#include "ddp/v1/types.pb.h"

namespace ddp {

// What one node of a job needs: `nproc_per_node` ranks (0: "auto"), each with a GPU
// of its own when `gpus` (backend nccl). Implicit from a rank count: a CPU need.
struct NodeNeed {
  NodeNeed(int nproc = 1, bool gpus_needed = false,  // NOLINT: implicit on purpose.
           const Labels* node_selector = nullptr)
      : nproc_per_node(nproc), gpus(gpus_needed), selector(node_selector) {}
  int nproc_per_node;
  bool gpus;
  // A node with at least one GPU (free, to be offered now), which its ranks share
  // (train.device cuda without backend nccl: Gloo's CUDA path; decision 181).
  bool gpu_node = false;
  // The job's node_selector (null or empty: any node), owned by its JobSpec.
  const Labels* selector;
  bool selective() const { return selector != nullptr && !selector->empty(); }
  // The fewest ranks a node must be able to take: nproc_per_node, 1 for auto.
  int MinRanks() const { return nproc_per_node > 0 ? nproc_per_node : 1; }
};
// The need of one node of `spec`: GPUs only for backend nccl (backend auto uses
// GPUs when the nodes it lands on have them free: UseGpus); a node with a GPU for
// train.device cuda.
NodeNeed NeedOf(const JobSpec& spec);

// What a worker can give a job right now.
struct NodeOffer {
  std::string worker;
  std::string address;
  int free_slots = 0;
  int gpus = 0;                         // GPUs the node has.
  std::vector<std::string> free_gpus;   // UUIDs of those no trainer holds, index order.
};

// Whether an attempt on `nodes` gives every rank a GPU of its own: always for
// backend nccl (the scheduler offered only nodes with enough free GPUs), never for
// gloo, and for auto when every node has at least `MinRanks` free GPUs (all or
// nothing: a job never mixes CUDA and CPU ranks).
bool UseGpus(const JobSpec& spec, const std::vector<NodeOffer>& nodes);

// Local ranks of a job on a worker: nproc_per_node; for "auto" (0) one per free GPU
// when the attempt uses GPUs, else 1.
int LocalRanksFor(int nproc_per_node, const NodeOffer& offer, bool use_gpus);

// The rank table for `nodes` (already chosen), ordered as described above.
// With `use_gpus`, local rank l of a node gets that node's free_gpus[l]; with
// `share_gpus` (ShareGpus), free_gpus[l mod their number]: ranks share the node's free
// GPUs, which no other job holds.
std::vector<v1::RankAssignment> AssignRanks(std::vector<NodeOffer> nodes, int nproc_per_node,
                                            bool use_gpus = false, bool share_gpus = false);

// Whether the ranks of an attempt that does not give each rank a GPU of its own
// (`use_gpus` false) share their node's free GPUs: train.device cuda over Gloo's CUDA
// path (the scheduler offered only nodes with a free GPU: NodeNeed::gpu_node).
bool ShareGpus(const JobSpec& spec, bool use_gpus);

// MASTER_PORT for a new attempt: the first of the ports its rank-0 node found free
// in its last heartbeat that no live attempt on that address holds; 0 if none.
int PickMasterPort(const std::vector<int32_t>& free_ports, const std::multiset<int>& taken);

enum class RendezvousStep {
  kWait,      // Fewer than min nodes: the job stays (or goes back to) PENDING.
  kLastCall,  // min <= nodes < max and the window is open: keep gathering.
  kForm,      // Form the attempt now with up to max nodes.
};

// `window_end` is when the last-call window of this rendezvous closes.
RendezvousStep DecideRendezvous(int eligible_nodes, const NodeRange& range, absl::Time now,
                                absl::Time window_end);

}  // namespace ddp

#endif  // DDP_COORDINATOR_CORE_RENDEZVOUS_H_
