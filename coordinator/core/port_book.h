// Store ports: the port each active attempt's rank-0 node serves its TCPStore on
// (MASTER_PORT). A manager over plain records, as job_lifecycle is: the facade holds
// the lock and calls it when an attempt forms, is placed (also on recovery) and ends.
//
// A port comes from the head node's last heartbeat (the ports it found free) and is
// never handed out twice at one address while an attempt holds it. One released less
// than kCooling ago is handed out only when the offer has no other: a new attempt or
// generation gets a store of its own, not the port its predecessor's ranks (a stopped
// one, not yet gone) may still reach for; with ports the kernel finds free that was
// chance, with a node's --store-ports range, whose few ports come round again within
// seconds, it is this rule. When the head of the queue finds no usable port on its
// rank-0 node, the book remembers that node: its next heartbeat that brings ports asks
// for a scheduling pass (WaitsOn).
#ifndef DDP_COORDINATOR_CORE_PORT_BOOK_H_
#define DDP_COORDINATOR_CORE_PORT_BOOK_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace ddp {

class PortBook {
 public:
  // A port of `free_ports` (the head's last offer) that no attempt holds at
  // `address`, taken out of the offer; 0 if there is none, and `worker` is then the
  // node waited on. Holding it is Hold's, when the attempt is placed.
  int Pick(const std::string& worker, const std::string& address,
           std::vector<int32_t>& free_ports, absl::Time now);
  void Hold(const std::string& address, int port);
  void Release(const std::string& address, int port, absl::Time now);
  // Whether the queue waits on `worker` for a free port.
  bool WaitsOn(const std::string& worker) const { return !worker.empty() && waiting_ == worker; }
  // `worker` is gone: nothing waits on it any more.
  void Forget(const std::string& worker);
  // Ports held at `address` (tests, ListWorkers).
  size_t held(const std::string& address) const;

 private:
  static constexpr absl::Duration kCooling = absl::Minutes(2);
  std::map<std::string, std::multiset<int>> held_;  // By rank-0 address.
  // When each port was last released, by address; entries go once they have cooled.
  std::map<std::string, std::map<int, absl::Time>> released_;
  std::string waiting_;
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_CORE_PORT_BOOK_H_
