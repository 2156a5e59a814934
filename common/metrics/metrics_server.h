// The HTTP endpoint that serves Prometheus' /metrics, with prometheus-cpp's exposer
// (its text format, its HTTP server). What it serves comes from the collectables
// registered with it: prometheus::Registry for metrics updated as things happen,
// custom collectables for values read when a scrape asks.
//
// Lifecycle: Start() binds and serves; collectables are held weakly (one that is gone
// is skipped); the destructor stops the server, so destroy it before what its
// collectables read.
#ifndef DDP_COMMON_METRICS_METRICS_SERVER_H_
#define DDP_COMMON_METRICS_METRICS_SERVER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "prometheus/collectable.h"
#include "prometheus/exposer.h"

namespace ddp {

class MetricsServer {
 public:
  // Serves http://`listen`/metrics (HOST:PORT; port 0: any free port).
  // INVALID_ARGUMENT for a malformed address, UNAVAILABLE when it cannot be bound.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& listen);

  int port() const { return port_; }
  void Register(const std::weak_ptr<prometheus::Collectable>& collectable);

 private:
  MetricsServer() = default;

  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
};

}  // namespace ddp

#endif  // DDP_COMMON_METRICS_METRICS_SERVER_H_
