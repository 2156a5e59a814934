#include "worker/agent/fence.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace ddp {

FencePlan PlanFencing(absl::Duration interval, absl::Duration timeout, absl::Duration rpc_deadline,
                      int beats_per_ack) {
  FencePlan plan;
  plan.ask_deadline = std::max(absl::Milliseconds(50), rpc_deadline / 2);
  // An outage that began after our last good heartbeat: a witness's next heartbeat is
  // due within an interval of ours and fails within the deadline, as did ours. With
  // quiet heartbeats, the next beat that asks for an answer is due within k intervals.
  const absl::Duration all_noticed = 2 * (std::max(1, beats_per_ack) * interval + rpc_deadline);
  // Decided (asked and answered) half a deadline before the coordinator's verdict at
  // the earliest: room for the SIGKILLs and the reaping.
  const absl::Duration latest = timeout - rpc_deadline / 2 - plan.ask_deadline;
  plan.ask_after = std::min(all_noticed, latest);
  plan.tight = all_noticed > latest;
  // Where the timeout leaves room, witnesses get more time to answer (half the room,
  // at most a second more): a witness that is merely slow (a loaded host) must not
  // read as one that cannot be reached, which fences.
  if (!plan.tight) {
    plan.ask_deadline += std::min((latest - all_noticed) / 2, absl::Seconds(1));
  }
  return plan;
}

int QuietBeatsPerAck(absl::Duration interval, absl::Duration timeout, absl::Duration rpc_deadline) {
  if (interval <= absl::ZeroDuration()) return 1;
  int k = 1;
  while (k < kMaxBeatsPerAck && !PlanFencing(interval, timeout, rpc_deadline, k + 1).tight) ++k;
  return k;
}

FenceVerdict DecideFence(const std::vector<std::string>& witnesses,
                         const std::vector<absl::StatusOr<bool>>& answers) {
  if (witnesses.empty()) {
    return {false, "no other worker to ask: taken for a coordinator outage; ranks keep running"};
  }
  int answered = 0;
  for (size_t i = 0; i < answers.size() && i < witnesses.size(); ++i) {
    if (!answers[i].ok()) continue;
    ++answered;
    if (*answers[i]) {
      return {true, absl::StrCat("worker at ", witnesses[i],
                                 " still reaches the coordinator: this worker alone is cut off; "
                                 "fencing its ranks before the coordinator restarts them elsewhere")};
    }
  }
  if (answered == 0) {
    return {true, absl::StrCat("none of ", witnesses.size(),
                               " other workers answers either: this worker is cut off; fencing "
                               "its ranks before the coordinator restarts them elsewhere")};
  }
  return {false, absl::StrCat(answered, " of ", witnesses.size(),
                              " other workers lost the coordinator too: a coordinator outage; "
                              "ranks keep running")};
}

}  // namespace ddp
