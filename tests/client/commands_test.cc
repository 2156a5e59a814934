// ddpctl's verbs against a real coordinator server in this process (loopback gRPC,
// scratch state directory), with output captured.
#include "client/commands.h"

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>

#include <memory>
#include <ostream>
#include <streambuf>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/server.h"
#include "ddp/v1/worker_service.grpc.pb.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"

namespace ddp {
namespace {

using ::testing::HasSubstr;

// An ostream whose text another thread can wait on.
class WatchedStream : public std::ostream {
 public:
  WatchedStream() : std::ostream(&buf_) {}

  // Whether `needle` was written within `timeout`.
  bool WaitFor(const std::string& needle, absl::Duration timeout = absl::Seconds(30)) {
    absl::MutexLock lock(&buf_.mu);
    auto found = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(buf_.mu) {
      return buf_.text.find(needle) != std::string::npos;
    };
    return buf_.mu.AwaitWithTimeout(absl::Condition(&found), timeout);
  }
  std::string text() {
    absl::MutexLock lock(&buf_.mu);
    return buf_.text;
  }

 private:
  struct Buf : std::streambuf {
    int_type overflow(int_type c) override {
      if (c != traits_type::eof()) {
        absl::MutexLock lock(&mu);
        text += static_cast<char>(c);
      }
      return c;
    }
    std::streamsize xsputn(const char* s, std::streamsize n) override {
      absl::MutexLock lock(&mu);
      text.append(s, static_cast<size_t>(n));
      return n;
    }
    absl::Mutex mu;
    std::string text ABSL_GUARDED_BY(mu);
  };
  Buf buf_;
};

class CommandsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    state_dir_ = testing::MakeTempDir("commands");
    StartServer(0);
    address_ = absl::StrCat("127.0.0.1:", server_->port());
    workers_ = v1::WorkerService::NewStub(
        grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  }

  void StartServer(int port) {
    CoordinatorServerOptions o;
    o.listen = absl::StrCat("127.0.0.1:", port);
    o.state_dir = state_dir_;
    auto server = CoordinatorServer::Start(o);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
  }

  // Stops the coordinator (its streams break) and starts another on the same port
  // and state directory.
  void RestartServer() {
    const int port = server_->port();
    server_.reset();
    StartServer(port);
  }

  CtlContext Context(bool json) { return MakeContext(address_, json, false, &out_, &err_); }

  absl::Status CancelJob(const std::string& id) {
    auto stub = v1::JobService::NewStub(
        grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    v1::CancelJobRequest req;
    req.set_job_id(id);
    v1::Job job;
    grpc::Status st = stub->CancelJob(&ctx, req, &job);
    return st.ok() ? absl::OkStatus() : absl::UnknownError(st.error_message());
  }

  // Registers worker w1 (incarnation "inc", one slot).
  void RegisterWorker() {
    grpc::ClientContext ctx;
    v1::RegisterRequest reg;
    reg.set_worker("w1");
    reg.set_incarnation("inc");
    reg.set_address("127.0.0.1");
    reg.set_slots(1);
    v1::RegisterResponse resp;
    ASSERT_TRUE(workers_->Register(&ctx, reg, &resp).ok());
  }

  // Registers worker w1 (incarnation "inc") and reports `texts` as stdout lines of
  // `job_id`, as batch `batch_seq`.
  void ReportLines(const std::string& job_id, const std::vector<std::string>& texts,
                   int64_t batch_seq) {
    RegisterWorker();
    v1::ReportEventsRequest req;
    req.set_worker("w1");
    req.set_incarnation("inc");
    req.set_batch_seq(batch_seq);
    for (const std::string& text : texts) {
      v1::ReportedEvent* e = req.add_events();
      e->set_job_id(job_id);
      e->set_attempt(1);
      e->mutable_log()->set_stream("stdout");
      e->mutable_log()->set_text(text);
    }
    grpc::ClientContext ctx;
    v1::ReportEventsResponse resp;
    ASSERT_TRUE(workers_->ReportEvents(&ctx, req, &resp).ok());
  }

  // Submits a one-node job; returns its id.
  std::string SubmitJob() {
    CtlContext ctx = Context(false);
    const std::string path = testing::MakeTempDir("commands-job") + "/job.yaml";
    testing::WriteFile(path, "name: demo\nmodel: {mlp: {}}\ndata: {synthetic: {}}\n"
                             "train: {batch_size: 4}\n");
    EXPECT_EQ(Submit(ctx, path, /*watch=*/false), kCtlOk) << err_.text();
    std::string id = out_.text();
    id.erase(id.find_last_not_of('\n') + 1);
    return id;
  }

  // Registers worker w1 and reports `steps` step events of rank 0 for `job_id`.
  void ReportSteps(const std::string& job_id, int steps) {
    RegisterWorker();
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

  std::string state_dir_;
  std::unique_ptr<CoordinatorServer> server_;
  std::string address_;
  std::unique_ptr<v1::WorkerService::Stub> workers_;
  WatchedStream out_, err_;
};

TEST_F(CommandsTest, GetWithHistoryReadsMoreThanGrpcsDefaultFourMegabytes) {
  const std::string id = SubmitJob();
  ASSERT_FALSE(id.empty());
  ReportSteps(id, 100000);  // About 6 MB of stored metrics.
  WatchedStream out;
  CtlContext ctx = MakeContext(address_, /*json=*/true, false, &out, &err_);
  ASSERT_EQ(Get(ctx, id, /*history=*/true), kCtlOk) << err_.text();
  EXPECT_GT(out.text().size(), 4u << 20);
  v1::Job job;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(out.text(), &job).ok());
  EXPECT_EQ(job.history_size(), 100000);
}

TEST_F(CommandsTest, WatchRidesOutACoordinatorRestartAndEndsWithTheOutcome) {
  const std::string id = SubmitJob();
  int code = -1;
  std::thread watch([&] {
    CtlContext ctx = Context(false);
    code = Watch(ctx, id);
  });
  ASSERT_TRUE(out_.WaitFor(absl::StrCat("job ", id, " PENDING")));
  RestartServer();
  ASSERT_TRUE(err_.WaitFor("reconnected to the coordinator"));
  ASSERT_TRUE(CancelJob(id).ok());
  watch.join();
  EXPECT_EQ(code, kCtlCancelled) << err_.text();
  EXPECT_THAT(err_.text(), HasSubstr("coordinator unavailable, reconnecting..."));
  EXPECT_THAT(out_.text(), HasSubstr(absl::StrCat("job ", id, " CANCELLED")));
}

TEST_F(CommandsTest, WatchExitsFourWhenTheCoordinatorStaysAway) {
  const std::string id = SubmitJob();
  int code = -1;
  std::thread watch([&] {
    CtlContext ctx = Context(false);
    ctx.reconnect_for = absl::Milliseconds(300);
    code = Watch(ctx, id);
  });
  ASSERT_TRUE(out_.WaitFor(absl::StrCat("job ", id, " PENDING")));
  server_.reset();
  watch.join();
  EXPECT_EQ(code, kCtlLost);
  EXPECT_THAT(err_.text(), HasSubstr("coordinator unavailable, reconnecting..."));
  EXPECT_THAT(err_.text(), HasSubstr(absl::StrCat("lost the coordinator at ", address_)));
}

TEST_F(CommandsTest, FollowedLogsResumeAfterTheLastLineSeenAcrossARestart) {
  const std::string id = SubmitJob();
  ReportLines(id, {"one", "two"}, 1);
  int code = -1;
  std::thread logs([&] {
    CtlContext ctx = Context(false);
    code = Logs(ctx, id, /*follow=*/true, /*rank=*/-1, /*tail=*/0);
  });
  ASSERT_TRUE(out_.WaitFor("two\n"));
  RestartServer();
  ReportLines(id, {"three"}, 2);
  ASSERT_TRUE(out_.WaitFor("three\n"));
  ASSERT_TRUE(CancelJob(id).ok());
  logs.join();
  EXPECT_EQ(code, kCtlOk) << err_.text();
  EXPECT_EQ(out_.text().substr(out_.text().find("[rank 0] one")),
            "[rank 0] one\n[rank 0] two\n[rank 0] three\n")
      << "nothing repeated, nothing lost";
}

}  // namespace
}  // namespace ddp
