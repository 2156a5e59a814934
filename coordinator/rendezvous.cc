#include "coordinator/rendezvous.h"

#include <algorithm>

namespace ddp {

int LocalRanksFor(int nproc_per_node, int gpus) {
  if (nproc_per_node > 0) return nproc_per_node;
  return gpus > 0 ? gpus : 1;
}

std::vector<NodeOffer> EligibleNodes(std::vector<NodeOffer> offers, int nproc_per_node) {
  offers.erase(std::remove_if(offers.begin(), offers.end(),
                              [&](const NodeOffer& o) {
                                return o.free_slots < LocalRanksFor(nproc_per_node, o.gpus);
                              }),
               offers.end());
  std::sort(offers.begin(), offers.end(),
            [](const NodeOffer& a, const NodeOffer& b) { return a.worker < b.worker; });
  return offers;
}

std::vector<v1::RankAssignment> AssignRanks(std::vector<NodeOffer> nodes, int nproc_per_node) {
  std::sort(nodes.begin(), nodes.end(),
            [](const NodeOffer& a, const NodeOffer& b) { return a.worker < b.worker; });
  std::vector<v1::RankAssignment> table;
  int rank = 0;
  for (size_t node = 0; node < nodes.size(); ++node) {
    const int local = LocalRanksFor(nproc_per_node, nodes[node].gpus);
    for (int l = 0; l < local; ++l) {
      v1::RankAssignment a;
      a.set_rank(rank++);
      a.set_local_rank(l);
      a.set_group_rank(static_cast<int32_t>(node));
      a.set_worker(nodes[node].worker);
      a.set_address(nodes[node].address);
      table.push_back(std::move(a));
    }
  }
  return table;
}

RendezvousStep DecideRendezvous(int eligible_nodes, const NodeRange& range, absl::Time now,
                                absl::Time window_end) {
  if (eligible_nodes < range.min) return RendezvousStep::kWait;
  if (eligible_nodes >= range.max || now >= window_end) return RendezvousStep::kForm;
  return RendezvousStep::kLastCall;
}

}  // namespace ddp
