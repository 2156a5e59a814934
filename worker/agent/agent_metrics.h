// The worker's Prometheus metrics (`ddp-worker --metrics-listen`): the node's view,
// read from Agent::stats() when scraped. docs/operations.md lists them.
#ifndef DDP_WORKER_AGENT_AGENT_METRICS_H_
#define DDP_WORKER_AGENT_AGENT_METRICS_H_

#include <memory>

#include "prometheus/collectable.h"
#include "worker/agent/agent.h"

namespace ddp {

// Reads `agent` (which must outlive every scrape: stop the MetricsServer first).
std::shared_ptr<prometheus::Collectable> MakeAgentMetrics(const Agent* agent);

}  // namespace ddp

#endif  // DDP_WORKER_AGENT_AGENT_METRICS_H_
