// ddpctl's verbs against a real coordinator server in this process (loopback gRPC,
// scratch state directory), with output captured.
#include "client/commands.h"

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>

#include <memory>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "coordinator/server.h"
#include "ddp/v1/worker_service.grpc.pb.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"

namespace ddp {
namespace {

class CommandsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CoordinatorServerOptions o;
    o.listen = "127.0.0.1:0";
    o.state_dir = testing::MakeTempDir("commands");
    auto server = CoordinatorServer::Start(o);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    address_ = absl::StrCat("127.0.0.1:", server_->port());
    workers_ = v1::WorkerService::NewStub(
        grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  }

  CtlContext Context(bool json) { return MakeContext(address_, json, false, &out_, &err_); }

  // Submits a one-node job; returns its id.
  std::string SubmitJob() {
    CtlContext ctx = Context(false);
    const std::string path = testing::MakeTempDir("commands-job") + "/job.yaml";
    testing::WriteFile(path, "name: demo\nmodel: {mlp: {}}\ndata: {synthetic: {}}\n"
                             "train: {batch_size: 4}\n");
    EXPECT_EQ(Submit(ctx, path, /*watch=*/false), kCtlOk) << err_.str();
    std::string id = out_.str();
    id.erase(id.find_last_not_of('\n') + 1);
    out_.str("");
    return id;
  }

  // Registers worker w1 and reports `steps` step events of rank 0 for `job_id`.
  void ReportSteps(const std::string& job_id, int steps) {
    grpc::ClientContext rctx;
    v1::RegisterRequest reg;
    reg.set_worker("w1");
    reg.set_incarnation("inc");
    reg.set_address("127.0.0.1");
    reg.set_slots(1);
    v1::RegisterResponse reg_resp;
    ASSERT_TRUE(workers_->Register(&rctx, reg, &reg_resp).ok());
    constexpr int kBatch = 5000;
    for (int first = 0; first < steps; first += kBatch) {
      v1::ReportEventsRequest req;
      req.set_worker("w1");
      req.set_incarnation("inc");
      req.set_batch_seq(first / kBatch + 1);
      for (int i = first; i < std::min(steps, first + kBatch); ++i) {
        v1::ReportedEvent* e = req.add_events();
        e->set_job_id(job_id);
        e->set_attempt(1);
        v1::TrainerEvent* step = e->mutable_event();
        step->set_type("step");
        step->set_epoch(i / 1000 + 1);
        step->set_step(i % 1000 + 1);
        step->set_steps(1000);
        step->set_global_step(i + 1);
        step->set_loss(0.5 + i * 1e-6);
        step->set_samples_per_s(12345.678);
        step->set_step_ms(12.34);
        step->set_comm_ms(5.67);
      }
      grpc::ClientContext ctx;
      v1::ReportEventsResponse resp;
      grpc::Status st = workers_->ReportEvents(&ctx, req, &resp);
      ASSERT_TRUE(st.ok()) << st.error_message();
    }
  }

  std::unique_ptr<CoordinatorServer> server_;
  std::string address_;
  std::unique_ptr<v1::WorkerService::Stub> workers_;
  std::ostringstream out_, err_;
};

TEST_F(CommandsTest, GetWithHistoryReadsMoreThanGrpcsDefaultFourMegabytes) {
  const std::string id = SubmitJob();
  ASSERT_FALSE(id.empty());
  ReportSteps(id, 100000);  // About 6 MB of stored metrics.
  CtlContext ctx = Context(/*json=*/true);
  ASSERT_EQ(Get(ctx, id, /*history=*/true), kCtlOk) << err_.str();
  EXPECT_GT(out_.str().size(), 4u << 20);
  v1::Job job;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(out_.str(), &job).ok());
  EXPECT_EQ(job.history_size(), 100000);
}

}  // namespace
}  // namespace ddp
