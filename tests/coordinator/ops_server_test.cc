// The coordinator's operations side doors, in-process with a real gRPC server: the
// plaintext health port (following whether the store can write), the Prometheus
// endpoint, and agent versions in ListWorkers.
#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <sqlite3.h>

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/version.h"
#include "coordinator/server.h"
#include "ddp/v1/job_service.grpc.pb.h"
#include "ddp/v1/worker_service.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/probes.h"
#include "tests/common/test_util.h"

namespace ddp {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

void RunSql(const std::string& dir, const std::string& sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((dir + "/ddp.sqlite").c_str(), &db), SQLITE_OK);
  sqlite3_busy_timeout(db, 10000);  // The coordinator's store writer may be committing.
  char* err = nullptr;
  EXPECT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err), SQLITE_OK) << (err ? err : "");
  sqlite3_free(err);
  sqlite3_close(db);
}

class OpsServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir("ops-server");
    CoordinatorServerOptions o;
    o.listen = "127.0.0.1:0";
    o.state_dir = dir_;
    o.health_listen = "127.0.0.1:0";
    o.metrics_listen = "127.0.0.1:0";
    o.tick = absl::Milliseconds(20);
    auto server = CoordinatorServer::Start(o);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", server_->port()),
                                       grpc::InsecureChannelCredentials());
    workers_ = v1::WorkerService::NewStub(channel);
    jobs_ = v1::JobService::NewStub(channel);
  }

  grpc::Status Register(const std::string& name, const std::string& version) {
    grpc::ClientContext ctx;
    v1::RegisterRequest req;
    req.set_worker(name);
    req.set_incarnation(name + "-1");
    req.set_address("127.0.0.1");
    req.set_slots(2);
    req.set_version(version);
    if (name == "w1") {
      (*req.mutable_labels())["pool"] = "team-a";
      (*req.mutable_labels())["example.com/rack"] = "r1";
    }
    v1::RegisterResponse resp;
    return workers_->Register(&ctx, req, &resp);
  }

  std::string dir_;
  std::unique_ptr<CoordinatorServer> server_;
  std::unique_ptr<v1::WorkerService::Stub> workers_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
};

TEST_F(OpsServerTest, HealthIsNotServingWhileTheStoreCannotWriteAndServingAgainAfter) {
  ASSERT_GT(server_->health_port(), 0);
  EXPECT_EQ(testing::HealthCheck(server_->health_port(), "").value_or(false), true);
  EXPECT_EQ(testing::HealthCheck(server_->health_port(), "liveness").value_or(false), true);

  // Every write of a worker row fails, as on a full disk; a registration stages one.
  RunSql(dir_, "CREATE TRIGGER refuse BEFORE INSERT ON workers BEGIN"
               " SELECT RAISE(FAIL, 'database or disk is full'); END;");
  ASSERT_TRUE(Register("w1", "x").ok());
  EXPECT_TRUE(testing::WaitForHealth(server_->health_port(), "", false).ok());
  EXPECT_EQ(testing::HealthCheck(server_->health_port(), "liveness").value_or(false), true)
      << "liveness does not follow the store: restarting would not fix a disk";

  // The writer retries the row; once it lands the coordinator is ready again.
  RunSql(dir_, "DROP TRIGGER refuse;");
  EXPECT_TRUE(testing::WaitForHealth(server_->health_port(), "", true).ok());
}

TEST_F(OpsServerTest, ListWorkersShowsTheAgentsVersionsAndTheCoordinators) {
  ASSERT_TRUE(Register("w1", VersionString()).ok());
  ASSERT_TRUE(Register("w2", "0.0.9 (git old)").ok());
  grpc::ClientContext ctx;
  v1::ListWorkersResponse resp;
  ASSERT_TRUE(jobs_->ListWorkers(&ctx, v1::ListWorkersRequest(), &resp).ok());
  EXPECT_EQ(resp.coordinator_version(), VersionString());
  ASSERT_EQ(resp.workers_size(), 2);
  EXPECT_EQ(resp.workers(0).version(), VersionString());
  EXPECT_EQ(resp.workers(1).version(), "0.0.9 (git old)");
}

TEST_F(OpsServerTest, MetricsCountWorkersJobsAndRpcsByMethodAndCode) {
  ASSERT_GT(server_->metrics_port(), 0);
  ASSERT_TRUE(Register("w1", "x").ok());
  ASSERT_TRUE(Register("w2", "x").ok());
  {
    grpc::ClientContext ctx;
    v1::GetJobRequest req;
    req.set_job_id("no-such-job");
    v1::Job job;
    EXPECT_EQ(jobs_->GetJob(&ctx, req, &job).error_code(), grpc::StatusCode::NOT_FOUND);
  }
  auto body = testing::HttpGet(server_->metrics_port(), "/metrics");
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_THAT(*body, HasSubstr("ddp_workers{state=\"alive\"} 2\n"));
  EXPECT_THAT(*body, HasSubstr("ddp_workers{state=\"lost\"} 0\n"));
  EXPECT_THAT(*body, HasSubstr("ddp_worker_labels{worker=\"w1\",label_example_com_rack=\"r1\","
                               "label_pool=\"team-a\"} 1\n"))
      << "one series per labelled worker; w2 has none";
  EXPECT_THAT(*body, Not(HasSubstr("ddp_worker_labels{worker=\"w2\"")));
  EXPECT_THAT(*body, HasSubstr("ddp_jobs{state=\"pending\"} 0\n"));
  EXPECT_THAT(*body, HasSubstr("ddp_job_restarts_total 0\n"));
  EXPECT_THAT(*body, HasSubstr("# TYPE ddp_heartbeat_lag_seconds histogram"));
  EXPECT_THAT(*body, HasSubstr("# TYPE ddp_rendezvous_seconds histogram"));
  EXPECT_THAT(*body, HasSubstr("# TYPE ddp_heartbeat_interval_seconds gauge"));
  EXPECT_THAT(*body, HasSubstr("# TYPE ddp_heartbeat_timeout_seconds gauge"));
  EXPECT_THAT(*body, HasSubstr("ddp_rpc_requests_total{code=\"OK\",method=\"ddp.v1.WorkerService/"
                               "Register\"} 2\n"));
  EXPECT_THAT(*body, HasSubstr("ddp_rpc_requests_total{code=\"NOT_FOUND\",method=\"ddp.v1."
                               "JobService/GetJob\"} 1\n"));
  EXPECT_THAT(*body, HasSubstr("ddp_rpc_duration_seconds_count{code=\"OK\",method=\"ddp.v1."
                               "WorkerService/Register\"} 2\n"));
}

}  // namespace
}  // namespace ddp
