#include "common/contract/launch_env.h"

namespace ddp {

std::map<std::string, std::string> LaunchEnvironment(const RankLaunch& l) {
  auto s = [](int v) { return std::to_string(v); };
  std::map<std::string, std::string> out = {
      {env::kRank, s(l.rank)},
      {env::kLocalRank, s(l.local_rank)},
      {env::kWorldSize, s(l.world_size)},
      {env::kLocalWorldSize, s(l.local_world_size)},
      {env::kGroupRank, s(l.group_rank)},
      {env::kGroupWorldSize, s(l.group_world_size)},
      {env::kRoleRank, s(l.rank)},
      {env::kRoleWorldSize, s(l.world_size)},
      {env::kRoleName, env::kDefaultRoleName},
      {env::kMasterAddr, l.master_addr},
      {env::kMasterPort, s(l.master_port)},
      {env::kRestartCount, s(l.restart_count)},
      {env::kMaxRestarts, s(l.max_restarts)},
      {env::kRunId, l.run_id},
      {env::kUseAgentStore, "False"},
      {env::kEventsFd, s(l.events_fd)},
      {env::kJobId, l.job_id},
      {env::kAttempt, s(l.attempt)},
  };
  if (!l.node.empty()) out[env::kNode] = l.node;
  return out;
}

const std::vector<std::string>& ContractEnvNames() {
  static const auto* names = [] {
    auto* out = new std::vector<std::string>;
    RankLaunch any;
    any.node = "n";
    for (const auto& [k, v] : LaunchEnvironment(any)) out->push_back(k);
    return out;
  }();
  return *names;
}

}  // namespace ddp
