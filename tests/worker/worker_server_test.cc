// ddp-worker's composition root on real parts: what the flags leave to the node is
// resolved, every bad flag value is named (main exits 2 on them), and the health
// service it serves answers as Kubernetes' probes ask.
#include "worker/agent/server.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/probes.h"
#include "tests/common/test_util.h"

namespace ddp {
namespace {

using ::testing::HasSubstr;

WorkerServerOptions Plain(const std::string& dir) {
  WorkerServerOptions o;
  o.coordinator = "127.0.0.1:1";  // Nothing listens: Start does not connect.
  o.agent.name = "w-test";
  o.agent.trainer_path = "/bin/true";
  o.agent.work_dir = dir + "/work";
  o.health_listen = "127.0.0.1:0";
  return o;
}

TEST(WorkerServerTest, BadFlagValuesAreInvalidArgumentsNamingTheFlag) {
  const std::string dir = testing::MakeTempDir("worker-server-flags");
  struct Case {
    void (*edit)(WorkerServerOptions&);
    const char* names;
  };
  const Case cases[] = {
      {[](WorkerServerOptions& o) { o.coordinator = "no-port"; }, "--coordinator"},
      {[](WorkerServerOptions& o) { o.agent.trainer_path = "/nonexistent/ddp-trainer"; },
       "--trainer: cannot execute /nonexistent/ddp-trainer"},
      {[](WorkerServerOptions& o) { o.allow_exec = {"relative/bin"}; },
       "--allow-exec relative/bin: give an absolute path"},
      {[](WorkerServerOptions& o) { o.token_file = "/nonexistent/token"; }, "--token-file"},
      {[](WorkerServerOptions& o) { o.agent.work_dir = "/proc/self/cwd/x/y"; }, "--work-dir"},
      {[](WorkerServerOptions& o) { o.store_ports = "29599-29500"; },
       "--store-ports: '29599-29500': the ports must be 1..65535, the first not above the last"},
      {[](WorkerServerOptions& o) { o.store_ports = "many"; },
       "--store-ports: 'many' is not a port range LO-HI"},
  };
  for (const Case& c : cases) {
    WorkerServerOptions o = Plain(dir);
    c.edit(o);
    auto server = WorkerServer::Start(o);
    ASSERT_FALSE(server.ok()) << c.names;
    EXPECT_TRUE(absl::IsInvalidArgument(server.status())) << server.status();
    EXPECT_THAT(std::string(server.status().message()), HasSubstr(c.names));
  }
}

TEST(WorkerServerTest, ResolvesTheNodeAndServesLivenessBeforeItIsRegistered) {
  const std::string dir = testing::MakeTempDir("worker-server");
  auto server = WorkerServer::Start(Plain(dir));
  ASSERT_TRUE(server.ok()) << server.status();
  const AgentOptions& agent = (*server)->agent_options();
  EXPECT_EQ(agent.name, "w-test");
  EXPECT_EQ(agent.slots, 1) << "a CPU-only node without --slots";
  EXPECT_EQ(agent.work_dir, dir + "/work");
  EXPECT_FALSE(agent.advertise_addr.empty()) << "the route to the coordinator, or the host name";
  EXPECT_TRUE(agent.exec.allow_all) << "a plaintext loopback worker may start any program";
  EXPECT_EQ((*server)->metrics_port(), 0) << "no --metrics-listen";
  // "liveness" while the process runs; "" (readiness) only once registered.
  auto live = testing::HealthCheck((*server)->health_port(), "liveness");
  ASSERT_TRUE(live.ok()) << live.status();
  EXPECT_TRUE(*live);
  auto ready = testing::HealthCheck((*server)->health_port(), "");
  ASSERT_TRUE(ready.ok()) << ready.status();
  EXPECT_FALSE(*ready);
}

TEST(WorkerServerTest, ASecuredWorkerStartsNoProgramUnlessAllowed) {
  const std::string dir = testing::MakeTempDir("worker-server-exec");
  WorkerServerOptions o = Plain(dir);
  o.coordinator = "10.255.255.1:29400";  // Not loopback: secured by default.
  auto server = WorkerServer::Start(o);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_FALSE((*server)->agent_options().exec.allow_all);
  EXPECT_TRUE((*server)->agent_options().exec.allowed.empty());
}

}  // namespace
}  // namespace ddp
