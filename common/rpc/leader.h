// Coordinators in standby (ddp-coordinator --store postgresql://...): how one that
// does not lead says so, and how workers and ddpctl, given several coordinator
// addresses, find the one that does.
//
// A standby answers every call with UNAVAILABLE "not the leader: <why>; the leader is
// at HOST:PORT" (the last part when it knows one). Clients try the named leader next,
// or else the next address of their list.
#ifndef DDP_COMMON_RPC_LEADER_H_
#define DDP_COMMON_RPC_LEADER_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ddp {

// The status a coordinator that does not lead answers with. `leader` may be empty
// (none known: the lease lapsed, the store is unreachable).
absl::Status NotLeaderError(const std::string& why, const std::string& leader);
bool IsNotLeader(const absl::Status& status);
// The leader's HOST:PORT named by a NotLeaderError, if any.
std::optional<std::string> LeaderNamedIn(const absl::Status& status);

// "a:29400,b:29400" (--coordinator, DDP_COORDINATOR): the addresses in order,
// whitespace trimmed. INVALID_ARGUMENT naming an entry that is not HOST:PORT, or an
// empty list.
absl::StatusOr<std::vector<std::string>> ParseCoordinatorList(const std::string& value);

// Which of `addresses` a client asks next after `current` (an index) failed with
// `status`: the leader it named when that is one of them, else the next in order.
size_t NextCoordinator(const std::vector<std::string>& addresses, size_t current,
                       const absl::Status& status);

}  // namespace ddp

#endif  // DDP_COMMON_RPC_LEADER_H_
