#include "libddp/engine/environment.h"

#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/contract/launch_env.h"
#include "common/net.h"

namespace ddp {
namespace {

using Getenv = std::function<std::optional<std::string>(const char*)>;

absl::StatusOr<int> IntVar(const Getenv& getenv, const char* name, int min,
                           std::optional<int> fallback) {
  std::optional<std::string> v = getenv(name);
  if (!v.has_value() || v->empty()) {
    if (fallback.has_value()) return *fallback;
    return absl::InvalidArgumentError(absl::StrCat(
        name, " is not set: ddp-trainer needs torchrun's environment (RANK, WORLD_SIZE, "
              "MASTER_ADDR, MASTER_PORT); start it through ddp-worker or torchrun"));
  }
  int out;
  if (!absl::SimpleAtoi(*v, &out) || out < min) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": expected an integer >= ", min, ", got '", *v, "'"));
  }
  return out;
}

}  // namespace

absl::StatusOr<Environment> ReadEnvironment(const Getenv& getenv) {
  Environment env;
  auto rank = IntVar(getenv, env::kRank, 0, std::nullopt);
  if (!rank.ok()) return rank.status();
  auto world = IntVar(getenv, env::kWorldSize, 1, std::nullopt);
  if (!world.ok()) return world.status();
  env.rank = *rank;
  env.world_size = *world;
  if (env.rank >= env.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("RANK=", env.rank, " is out of range for WORLD_SIZE=", env.world_size));
  }
  auto local_rank = IntVar(getenv, env::kLocalRank, 0, env.rank);
  if (!local_rank.ok()) return local_rank.status();
  auto local_world = IntVar(getenv, env::kLocalWorldSize, 1, env.world_size);
  if (!local_world.ok()) return local_world.status();
  auto group_rank = IntVar(getenv, env::kGroupRank, 0, 0);
  if (!group_rank.ok()) return group_rank.status();
  env.local_rank = *local_rank;
  env.local_world_size = *local_world;
  env.group_rank = *group_rank;
  if (env.local_rank >= env.local_world_size) {
    return absl::InvalidArgumentError(absl::StrCat("LOCAL_RANK=", env.local_rank,
                                                   " is out of range for LOCAL_WORLD_SIZE=",
                                                   env.local_world_size));
  }
  std::optional<std::string> addr = getenv(env::kMasterAddr);
  if (!addr.has_value() || addr->empty()) {
    return absl::InvalidArgumentError(
        "MASTER_ADDR is not set: it names the host of rank 0's TCPStore");
  }
  env.master_addr = *addr;
  auto port = IntVar(getenv, env::kMasterPort, 1, std::nullopt);
  if (!port.ok()) return port.status();
  if (*port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("MASTER_PORT: ", *port, " is not a port"));
  }
  env.master_port = *port;
  auto events_fd = IntVar(getenv, env::kEventsFd, 0, -1);
  if (!events_fd.ok()) return events_fd.status();
  env.events_fd = *events_fd;
  env.gloo_socket_ifname = getenv("GLOO_SOCKET_IFNAME").value_or("");
  auto omp = IntVar(getenv, env::kOmpNumThreads, 1, 0);
  if (!omp.ok()) return omp.status();
  env.omp_num_threads = *omp;
  if (auto id = getenv(env::kJobId); id.has_value() && !id->empty()) env.job_id = *id;
  // Under torchrun (no DDP_ATTEMPT) the restart count tells attempts apart.
  auto restarts = IntVar(getenv, env::kRestartCount, 0, 0);
  if (!restarts.ok()) return restarts.status();
  auto attempt = IntVar(getenv, env::kAttempt, 0, *restarts);
  if (!attempt.ok()) return attempt.status();
  env.attempt = *attempt;
  if (auto agent = getenv(env::kUseAgentStore); agent.has_value() && !agent->empty()) {
    const std::string v = absl::AsciiStrToLower(*agent);
    if (v == "true" || v == "1") {
      env.use_agent_store = true;
    } else if (v != "false" && v != "0") {
      return absl::InvalidArgumentError(absl::StrCat(
          env::kUseAgentStore, ": expected True or False, got '", *agent, "'"));
    }
  }
  if (auto node = getenv(env::kNode); node.has_value() && !node->empty()) {
    env.node = *node;
  } else {
    env.node = LocalHostname();
  }
  auto stall = IntVar(getenv, "DDP_DEBUG_CHECKPOINT_STALL", 0, -1);
  if (!stall.ok()) return stall.status();
  env.debug_checkpoint_stall = *stall;
  auto generation = IntVar(getenv, env::kGeneration, 0, 0);
  if (!generation.ok()) return generation.status();
  env.generation = *generation;
  env.generation_file = getenv(env::kGenerationFile).value_or("");
  env.flight_recorder = getenv(env::kFlightRecorder).value_or("");
  env.notice_file = getenv(env::kNoticeFile).value_or("");
  return env;
}

absl::StatusOr<Environment> ReadEnvironment() {
  return ReadEnvironment([](const char* name) -> std::optional<std::string> {
    const char* v = std::getenv(name);
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  });
}

}  // namespace ddp
