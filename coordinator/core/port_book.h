// Store ports: the port each active attempt's rank-0 node serves its TCPStore on
// (MASTER_PORT). A manager over plain records, as job_lifecycle is: the facade holds
// the lock and calls it when an attempt forms, is placed (also on recovery) and ends.
//
// A port comes from the head node's last heartbeat (the ports it found free) and is
// never handed out twice at one address while an attempt holds it. When the head of
// the queue finds no usable port on its rank-0 node, the book remembers that node:
// its next heartbeat that brings ports asks for a scheduling pass (WaitsOn).
#ifndef DDP_COORDINATOR_CORE_PORT_BOOK_H_
#define DDP_COORDINATOR_CORE_PORT_BOOK_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace ddp {

class PortBook {
 public:
  // A port of `free_ports` (the head's last offer) that no attempt holds at
  // `address`, taken out of the offer; 0 if there is none, and `worker` is then the
  // node waited on. Holding it is Hold's, when the attempt is placed.
  int Pick(const std::string& worker, const std::string& address,
           std::vector<int32_t>& free_ports);
  void Hold(const std::string& address, int port);
  void Release(const std::string& address, int port);
  // Whether the queue waits on `worker` for a free port.
  bool WaitsOn(const std::string& worker) const { return !worker.empty() && waiting_ == worker; }
  // `worker` is gone: nothing waits on it any more.
  void Forget(const std::string& worker);
  // Ports held at `address` (tests, ListWorkers).
  size_t held(const std::string& address) const;

 private:
  std::map<std::string, std::multiset<int>> held_;  // By rank-0 address.
  std::string waiting_;
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_CORE_PORT_BOOK_H_
