#include "libddp/engine/environment.h"

#include <map>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/status_matchers.h"

namespace ddp {
namespace {

using ::ddp::testing::StatusIs;
using ::testing::HasSubstr;

absl::StatusOr<Environment> Read(std::map<std::string, std::string> vars) {
  return ReadEnvironment([&](const char* name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  });
}

TEST(EnvironmentTest, ReadsTorchrunVariables) {
  DDP_ASSERT_OK_AND_ASSIGN(
      Environment env, Read({{"RANK", "3"}, {"LOCAL_RANK", "1"}, {"WORLD_SIZE", "4"},
                             {"LOCAL_WORLD_SIZE", "2"}, {"GROUP_RANK", "1"},
                             {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "31000"},
                             {"DDP_EVENTS_FD", "3"}}));
  EXPECT_EQ(env.rank, 3);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.world_size, 4);
  EXPECT_EQ(env.local_world_size, 2);
  EXPECT_EQ(env.group_rank, 1);
  EXPECT_EQ(env.master_addr, "10.0.0.1");
  EXPECT_EQ(env.master_port, 31000);
  EXPECT_EQ(env.events_fd, 3);
}

TEST(EnvironmentTest, TorchrunsAgentStoreAndRestartCount) {
  const std::map<std::string, std::string> base = {{"RANK", "0"}, {"WORLD_SIZE", "2"},
                                                   {"MASTER_ADDR", "127.0.0.1"},
                                                   {"MASTER_PORT", "29600"}};
  DDP_ASSERT_OK_AND_ASSIGN(Environment plain, Read(base));
  EXPECT_FALSE(plain.use_agent_store);
  EXPECT_EQ(plain.attempt, 0);
  // torchrun's static rendezvous: its agent hosts the store; attempts are its restarts.
  auto vars = base;
  vars["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  vars["TORCHELASTIC_RESTART_COUNT"] = "2";
  DDP_ASSERT_OK_AND_ASSIGN(Environment torchrun, Read(vars));
  EXPECT_TRUE(torchrun.use_agent_store);
  EXPECT_EQ(torchrun.attempt, 2);
  // ddp-worker sets both: its own attempt number wins, and rank 0 hosts the store.
  vars["TORCHELASTIC_USE_AGENT_STORE"] = "False";
  vars["DDP_ATTEMPT"] = "5";
  DDP_ASSERT_OK_AND_ASSIGN(Environment worker, Read(vars));
  EXPECT_FALSE(worker.use_agent_store);
  EXPECT_EQ(worker.attempt, 5);
  vars["TORCHELASTIC_USE_AGENT_STORE"] = "maybe";
  EXPECT_THAT(Read(vars), StatusIs(absl::StatusCode::kInvalidArgument,
                                   HasSubstr("TORCHELASTIC_USE_AGENT_STORE: expected True or False")));
}

TEST(EnvironmentTest, LocalVariablesDefaultToOneNode) {
  DDP_ASSERT_OK_AND_ASSIGN(Environment env, Read({{"RANK", "1"}, {"WORLD_SIZE", "2"},
                                                  {"MASTER_ADDR", "127.0.0.1"},
                                                  {"MASTER_PORT", "29600"}}));
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 2);
  EXPECT_EQ(env.events_fd, -1);
}

TEST(EnvironmentTest, ReadsTheNodeAndTheCheckpointStallHook) {
  const std::map<std::string, std::string> base = {{"RANK", "0"}, {"WORLD_SIZE", "1"},
                                                   {"MASTER_ADDR", "127.0.0.1"},
                                                   {"MASTER_PORT", "29600"}};
  DDP_ASSERT_OK_AND_ASSIGN(Environment plain, Read(base));
  EXPECT_FALSE(plain.node.empty()) << "the host name when DDP_NODE is unset";
  EXPECT_EQ(plain.debug_checkpoint_stall, -1);
  auto vars = base;
  vars["DDP_NODE"] = "w2";
  vars["DDP_DEBUG_CHECKPOINT_STALL"] = "15";
  DDP_ASSERT_OK_AND_ASSIGN(Environment env, Read(vars));
  EXPECT_EQ(env.node, "w2");
  EXPECT_EQ(env.debug_checkpoint_stall, 15);
  vars["DDP_DEBUG_CHECKPOINT_STALL"] = "soon";
  EXPECT_THAT(Read(vars), StatusIs(absl::StatusCode::kInvalidArgument,
                                   HasSubstr("DDP_DEBUG_CHECKPOINT_STALL")));
}

TEST(EnvironmentTest, ErrorsNameTheVariable) {
  EXPECT_THAT(Read({}), StatusIs(absl::StatusCode::kInvalidArgument,
                                 HasSubstr("RANK is not set")));
  EXPECT_THAT(Read({{"RANK", "0"}, {"WORLD_SIZE", "two"}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("WORLD_SIZE: expected an integer >= 1, got 'two'")));
  EXPECT_THAT(Read({{"RANK", "2"}, {"WORLD_SIZE", "2"}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("RANK=2 is out of range for WORLD_SIZE=2")));
  EXPECT_THAT(Read({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_PORT", "1"}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("MASTER_ADDR is not set")));
}

}  // namespace
}  // namespace ddp
