#include "common/metrics/metrics_server.h"

#include <exception>

#include "absl/strings/str_cat.h"
#include "common/net.h"

namespace ddp {

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& listen) {
  auto parsed = ParseHostPort(listen);
  if (!parsed.ok()) return parsed.status();
  std::unique_ptr<MetricsServer> s(new MetricsServer());
  try {
    // One thread: scrapes come every few seconds from one or two servers.
    s->exposer_ = std::make_unique<prometheus::Exposer>(listen, /*num_threads=*/1);
  } catch (const std::exception& e) {  // civetweb reports a failed bind by throwing.
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", listen, " (", e.what(), "): is the port taken?"));
  }
  const std::vector<int> ports = s->exposer_->GetListeningPorts();
  if (ports.empty() || ports.front() <= 0) {
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", listen));
  }
  s->port_ = ports.front();
  return s;
}

void MetricsServer::Register(const std::weak_ptr<prometheus::Collectable>& collectable) {
  exposer_->RegisterCollectable(collectable);
}

}  // namespace ddp
