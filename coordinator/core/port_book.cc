#include "coordinator/core/port_book.h"

#include <algorithm>

#include "coordinator/core/rendezvous.h"

namespace ddp {

int PortBook::Pick(const std::string& worker, const std::string& address,
                   std::vector<int32_t>& free_ports, absl::Time now) {
  static const std::multiset<int> kNone;
  auto held = held_.find(address);
  const std::multiset<int>& taken = held == held_.end() ? kNone : held->second;
  // First the offer's ports that are neither held nor cooling, then those cooling.
  std::multiset<int> taken_or_cooling = taken;
  if (auto r = released_.find(address); r != released_.end()) {
    for (auto it = r->second.begin(); it != r->second.end();) {
      if (now - it->second >= kCooling) {
        it = r->second.erase(it);
      } else {
        taken_or_cooling.insert(it->first);
        ++it;
      }
    }
    if (r->second.empty()) released_.erase(r);
  }
  int port = PickMasterPort(free_ports, taken_or_cooling);
  if (port == 0) port = PickMasterPort(free_ports, taken);
  if (port == 0) {
    waiting_ = worker;  // Its next heartbeat with ports: try again.
    return 0;
  }
  free_ports.erase(std::find(free_ports.begin(), free_ports.end(), port));
  if (waiting_ == worker) waiting_.clear();
  return port;
}

void PortBook::Hold(const std::string& address, int port) { held_[address].insert(port); }

void PortBook::Release(const std::string& address, int port, absl::Time now) {
  auto ports = held_.find(address);
  if (ports == held_.end()) return;
  released_[address][port] = now;
  auto it = ports->second.find(port);
  if (it != ports->second.end()) ports->second.erase(it);
  if (ports->second.empty()) held_.erase(ports);
}

void PortBook::Forget(const std::string& worker) {
  if (waiting_ == worker) waiting_.clear();
}

size_t PortBook::held(const std::string& address) const {
  auto it = held_.find(address);
  return it == held_.end() ? 0 : it->second.size();
}

}  // namespace ddp
