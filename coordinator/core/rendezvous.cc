#include "coordinator/core/rendezvous.h"

#include <algorithm>

namespace ddp {

NodeNeed NeedOf(const JobSpec& spec) {
  NodeNeed need(spec.nproc_per_node, spec.backend == Backend::kNccl, &spec.node_selector);
  // A rank asked to train on a GPU fails on a node without one (exit 3, a node fault):
  // place it where it can run, sharing the node's GPUs when there are fewer than ranks.
  need.gpu_node = !need.gpus && !spec.is_command() && spec.train.device == Device::kCuda;
  return need;
}

bool UseGpus(const JobSpec& spec, const std::vector<NodeOffer>& nodes) {
  if (spec.backend == Backend::kNccl) return true;
  if (spec.backend != Backend::kAuto || nodes.empty()) return false;
  const int need = NeedOf(spec).MinRanks();
  for (const NodeOffer& n : nodes) {
    if (static_cast<int>(n.free_gpus.size()) < need) return false;
  }
  return true;
}

int LocalRanksFor(int nproc_per_node, const NodeOffer& offer, bool use_gpus) {
  if (nproc_per_node > 0) return nproc_per_node;
  return use_gpus ? std::max<int>(1, static_cast<int>(offer.free_gpus.size())) : 1;
}

bool ShareGpus(const JobSpec& spec, bool use_gpus) { return !use_gpus && NeedOf(spec).gpu_node; }

std::vector<v1::RankAssignment> AssignRanks(std::vector<NodeOffer> nodes, int nproc_per_node,
                                            bool use_gpus, bool share_gpus) {
  std::sort(nodes.begin(), nodes.end(),
            [](const NodeOffer& a, const NodeOffer& b) { return a.worker < b.worker; });
  std::vector<v1::RankAssignment> table;
  int rank = 0;
  for (size_t node = 0; node < nodes.size(); ++node) {
    const int local = LocalRanksFor(nproc_per_node, nodes[node], use_gpus);
    for (int l = 0; l < local; ++l) {
      v1::RankAssignment a;
      a.set_rank(rank++);
      a.set_local_rank(l);
      a.set_group_rank(static_cast<int32_t>(node));
      a.set_worker(nodes[node].worker);
      a.set_address(nodes[node].address);
      const std::vector<std::string>& free = nodes[node].free_gpus;
      if (use_gpus && l < static_cast<int>(free.size())) {
        a.set_gpu_uuid(free[static_cast<size_t>(l)]);
      } else if (share_gpus && !free.empty()) {
        a.set_gpu_uuid(free[static_cast<size_t>(l) % free.size()]);
      }
      table.push_back(std::move(a));
    }
  }
  return table;
}

int PickMasterPort(const std::vector<int32_t>& free_ports, const std::multiset<int>& taken) {
  for (int32_t port : free_ports) {
    if (port > 0 && !taken.count(port)) return port;
  }
  return 0;
}

RendezvousStep DecideRendezvous(int eligible_nodes, const NodeRange& range, absl::Time now,
                                absl::Time window_end) {
  if (eligible_nodes < range.min) return RendezvousStep::kWait;
  if (eligible_nodes >= range.max || now >= window_end) return RendezvousStep::kForm;
  return RendezvousStep::kLastCall;
}

}  // namespace ddp
