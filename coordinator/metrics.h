// The coordinator's Prometheus metrics (`--metrics-listen`); docs/operations.md lists
// them. Two sources:
//   - a collectable that reads Coordinator::Metrics() when scraped: workers and jobs
//     by state, heartbeat lag and rendezvous histograms, restarts, and the running
//     ranks' latest samples/s, loss and step time. Finished jobs' series vanish with
//     them, and heartbeats pay for nothing but a histogram bucket under the lock
//     they already hold.
//   - a gRPC server interceptor counting every RPC by method and status code, with
//     its latency (streams: how long they were open).
//
// Lifecycle: construct before the gRPC server (its interceptor factory goes into the
// builder), register collectables() with the MetricsServer; destroy after both the
// gRPC server and the MetricsServer have stopped.
#ifndef DDP_COORDINATOR_METRICS_H_
#define DDP_COORDINATOR_METRICS_H_

#include <grpcpp/support/server_interceptor.h>

#include <memory>
#include <vector>

#include "coordinator/core/coordinator.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace ddp {

class CoordinatorMetricsExporter {
 public:
  explicit CoordinatorMetricsExporter(Coordinator* coordinator);

  // What the MetricsServer serves (held here; it keeps weak references).
  std::vector<std::weak_ptr<prometheus::Collectable>> collectables() const;
  // For grpc::ServerBuilder::experimental().SetInterceptorCreators.
  std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> InterceptorFactory();

  // Called by the interceptor when a call ends.
  void RecordRpc(const std::string& method, grpc::StatusCode code, double seconds);

 private:
  std::shared_ptr<prometheus::Collectable> scrape_view_;
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>* rpc_requests_;
  prometheus::Family<prometheus::Histogram>* rpc_seconds_;
};

// "NOT_FOUND" for grpc::StatusCode::NOT_FOUND: the label value of `code`.
const char* StatusCodeName(grpc::StatusCode code);

}  // namespace ddp

#endif  // DDP_COORDINATOR_METRICS_H_
