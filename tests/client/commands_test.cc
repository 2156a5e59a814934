// ddpctl's verbs against a real coordinator server in this process (loopback gRPC,
// scratch state directory), with output captured.
#include "client/commands.h"

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <sqlite3.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <ostream>
#include <streambuf>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/server.h"
#include "ddp/v1/worker_service.grpc.pb.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tests/common/ports.h"
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
    // A port of this test's own (tests/common/ports.h): RestartServer binds it again,
    // and an ephemeral one could be taken in between by tests running beside this one.
    auto port = testing::ClaimPort();
    ASSERT_TRUE(port.ok()) << port.status();
    StartServer(*port);
    address_ = absl::StrCat("127.0.0.1:", server_->port());
    workers_ = v1::WorkerService::NewStub(
        grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  }

  void StartServer(int port) {
    CoordinatorServerOptions o;
    o.listen = absl::StrCat("127.0.0.1:", port);
    o.state_dir = state_dir_;
    o.timing.heartbeat_timeout = heartbeat_timeout_;
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

  // Registers worker w1 (incarnation "inc", `slots` slots) and heartbeats once with a free
  // port, so that a pending one-node job forms its attempt 1 there: w1 then hosts its
  // rank 0, whose events the coordinator takes from w1 alone.
  void RegisterWorker(int slots = 1) {
    grpc::ClientContext ctx;
    v1::RegisterRequest reg;
    reg.set_worker("w1");
    reg.set_incarnation("inc");
    reg.set_address("127.0.0.1");
    reg.set_slots(slots);
    v1::RegisterResponse resp;
    ASSERT_TRUE(workers_->Register(&ctx, reg, &resp).ok());
    grpc::ClientContext hctx;
    v1::HeartbeatRequest hb;
    hb.set_worker("w1");
    hb.set_incarnation("inc");
    hb.add_free_ports(29500);
    v1::HeartbeatResponse hresp;
    ASSERT_TRUE(workers_->Heartbeat(&hctx, hb, &hresp).ok());
  }

  // Registers worker w1 (incarnation "inc") and reports `texts` as stdout lines of
  // `job_id`'s rank 0, as batch `batch_seq`.
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

  // Submits a one-node job (with `extra` YAML); returns its id.
  std::string SubmitJob(const std::string& extra = "") {
    CtlContext ctx = Context(false);
    const std::string path = testing::MakeTempDir("commands-job") + "/job.yaml";
    testing::WriteFile(path, "name: demo\nmodel: {mlp: {}}\ndata: {synthetic: {}}\n"
                             "train: {batch_size: 4}\n" + extra);
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
        v1::TrainerEvent::Step* step = e->mutable_event()->mutable_step();
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

  absl::Duration heartbeat_timeout_ = CoordinatorOptions().heartbeat_timeout;
  std::string state_dir_;
  std::unique_ptr<CoordinatorServer> server_;
  std::string address_;
  std::unique_ptr<v1::WorkerService::Stub> workers_;
  WatchedStream out_, err_;
};

TEST_F(CommandsTest, WorkersFollowsEveryPageThenSummarizesOrStopsAtTheLimit) {
  // Workers that register and never beat: alive for a minute, not the default 2.5 s,
  // which registering 2,100 of them can take on a loaded machine.
  heartbeat_timeout_ = absl::Minutes(1);
  RestartServer();
  constexpr int kWorkers = 2100;  // More than two of ListWorkers' default pages.
  for (int i = 0; i < kWorkers; ++i) {
    grpc::ClientContext ctx;
    v1::RegisterRequest reg;
    reg.set_worker(absl::StrFormat("node-%04d", i));
    reg.set_incarnation("inc");
    reg.set_address("127.0.0.1");
    reg.set_slots(2);
    v1::RegisterResponse resp;
    ASSERT_TRUE(workers_->Register(&ctx, reg, &resp).ok());
  }
  CtlContext ctx = Context(false);
  ASSERT_EQ(Workers(ctx, /*limit=*/0, /*summary_only=*/false), kCtlOk) << err_.text();
  const std::string all = out_.text();
  EXPECT_THAT(all, HasSubstr("node-0000 "));
  EXPECT_THAT(all, HasSubstr("node-2099 "));
  EXPECT_EQ(std::count(all.begin(), all.end(), '\n'), 1 + kWorkers + 1)
      << "header, every worker once, summary";
  EXPECT_THAT(all, HasSubstr("2,100 workers: 2,100 alive, 0 lost; 4,200 slots, 4,200 free; 0 busy"));

  WatchedStream limited;
  CtlContext first = MakeContext(address_, false, false, &limited, &err_);
  ASSERT_EQ(Workers(first, /*limit=*/3, /*summary_only=*/false), kCtlOk);
  EXPECT_THAT(limited.text(), HasSubstr("node-0002 "));
  EXPECT_THAT(limited.text(), ::testing::Not(HasSubstr("node-0003 ")));
  EXPECT_THAT(limited.text(), HasSubstr("--limit 3 --page-token node-0002"));
  WatchedStream next;
  CtlContext second = MakeContext(address_, false, false, &next, &err_);
  ASSERT_EQ(Workers(second, 3, false, "node-0002"), kCtlOk);
  EXPECT_THAT(next.text(), HasSubstr("node-0003 "));
  EXPECT_THAT(next.text(), ::testing::Not(HasSubstr("node-0002 ")));

  WatchedStream summary;
  CtlContext brief = MakeContext(address_, false, false, &summary, &err_);
  ASSERT_EQ(Workers(brief, 0, /*summary_only=*/true), kCtlOk);
  EXPECT_EQ(summary.text(),
            "2,100 workers: 2,100 alive, 0 lost; 4,200 slots, 4,200 free; 0 busy\n");
}

TEST_F(CommandsTest, WorkerMaintenanceVerbsSayWhatHappenedAndRefuseWhatCannotBe) {
  RegisterWorker();
  const std::string id = SubmitJob();  // Placed on w1.
  auto run = [&](const std::string& action, const std::string& worker,
                 v1::DrainPolicy policy = v1::DRAIN_AT_CHECKPOINT, bool json = false) {
    WatchedStream out, err;
    CtlContext ctx = MakeContext(address_, json, false, &out, &err);
    const int code = WorkerMaintenance(ctx, action, worker, policy);
    return std::make_tuple(code, out.text(), err.text());
  };
  auto [code, out, err] = run("cordon", "w1");
  EXPECT_EQ(code, kCtlOk) << err;
  EXPECT_EQ(out, absl::StrCat("worker w1 cordoned: it takes no new ranks; its jobs (", id,
                              ") keep running\n"));
  std::tie(code, out, err) = run("drain", "w1", v1::DRAIN_WAIT, /*json=*/true);
  EXPECT_EQ(code, kCtlOk) << err;
  EXPECT_THAT(out, HasSubstr("\"maintenance\":\"WORKER_DRAINING\""));
  EXPECT_THAT(out, HasSubstr("\"drain_policy\":\"DRAIN_WAIT\""));
  std::tie(code, out, err) = run("uncordon", "w1");
  EXPECT_EQ(code, kCtlOk) << err;
  EXPECT_EQ(out, "worker w1 uncordoned: it takes new ranks again\n");

  std::tie(code, out, err) = run("cordon", "w9");
  EXPECT_EQ(code, kCtlFailed);
  EXPECT_THAT(err, HasSubstr("no worker named 'w9'"));
  std::tie(code, out, err) = run("rm", "w1");
  EXPECT_EQ(code, kCtlFailed);
  EXPECT_THAT(err, HasSubstr("only a lost worker can be removed"));
  EXPECT_EQ(out, "");

  // A coordinator whose state directory refuses the write says so; ddpctl does not
  // mistake that for a coordinator that is not there.
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open((state_dir_ + "/ddp.sqlite").c_str(), &db), SQLITE_OK);
    sqlite3_busy_timeout(db, 10000);
    auto exec = [&](const char* sql) {
      char* error = nullptr;
      EXPECT_EQ(sqlite3_exec(db, sql, nullptr, nullptr, &error), SQLITE_OK) << error;
      sqlite3_free(error);
    };
    exec("CREATE TRIGGER refuse BEFORE INSERT ON workers BEGIN"
         " SELECT RAISE(FAIL, 'database or disk is full'); END;");
    std::tie(code, out, err) = run("cordon", "w1");
    EXPECT_EQ(code, kCtlFailed);
    EXPECT_THAT(err, HasSubstr("ddpctl: worker w1 is cordoned, but the coordinator could not "
                               "store that yet"));
    EXPECT_THAT(err, ::testing::Not(HasSubstr("no coordinator at")));
    exec("DROP TRIGGER refuse");
    sqlite3_close(db);
  }

  // The cordon is stored: a restarted coordinator still shows it.
  std::tie(code, out, err) = run("cordon", "w1");
  ASSERT_EQ(code, kCtlOk) << err;
  RestartServer();
  WatchedStream listing;
  CtlContext ctx = MakeContext(address_, false, false, &listing, &err_);
  ASSERT_EQ(Workers(ctx, 0, false), kCtlOk) << err_.text();
  EXPECT_THAT(listing.text(), ::testing::ContainsRegex("w1 +alive,cordoned "));
  EXPECT_THAT(listing.text(), HasSubstr("w1 is cordoned since "));
  EXPECT_THAT(listing.text(), HasSubstr("; 1 cordoned or draining"));
}

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

namespace ddp {
namespace {

TEST_F(CommandsTest, LogsCollapseFoldsALineEveryRankPrintedIntoOne) {
  const std::string id = SubmitJob("nproc_per_node: 2\n");
  RegisterWorker(/*slots=*/2);  // Hosts ranks 0 and 1.
  v1::ReportEventsRequest req;
  req.set_worker("w1");
  req.set_incarnation("inc");
  req.set_batch_seq(1);
  for (const auto& [rank, text] : std::vector<std::pair<int, std::string>>{
           {1, "loading data"}, {0, "loading data"}, {0, "only rank 0"}, {1, "done"},
           {0, "done"}}) {
    v1::ReportedEvent* e = req.add_events();
    e->set_job_id(id);
    e->set_attempt(1);
    e->set_rank(rank);
    e->mutable_log()->set_stream("stdout");
    e->mutable_log()->set_text(text);
  }
  grpc::ClientContext rpc;
  v1::ReportEventsResponse resp;
  ASSERT_TRUE(workers_->ReportEvents(&rpc, req, &resp).ok());
  WatchedStream out;
  CtlContext ctx = MakeContext(address_, /*json=*/false, false, &out, &err_);
  ASSERT_EQ(Logs(ctx, id, /*follow=*/false, /*rank=*/-1, /*tail=*/0, /*collapse=*/true), kCtlOk)
      << err_.text();
  EXPECT_EQ(out.text(), "[ranks 0,1] loading data\n[rank 0] only rank 0\n[ranks 0,1] done\n");
}

TEST_F(CommandsTest, PlotWritesThePictureNamedByItsExtensionAndRefusesOthers) {
  const std::string id = SubmitJob();
  {
    WatchedStream out, err;
    CtlContext ctx = MakeContext(address_, false, false, &out, &err);
    EXPECT_EQ(Plot(ctx, id, {"x.png", 960, 720}), kCtlFailed);
    EXPECT_THAT(err.text(), HasSubstr("has no step metrics yet"));
  }
  ReportSteps(id, 50);
  const std::string dir = testing::MakeTempDir("plot");
  for (const char* name : {"curves.svg", "curves.png"}) {
    WatchedStream out, err;
    CtlContext ctx = MakeContext(address_, false, false, &out, &err);
    ASSERT_EQ(Plot(ctx, id, {dir + "/" + name, 800, 600}), kCtlOk) << err.text();
    EXPECT_THAT(err.text(), HasSubstr("(800x600, 1 ranks, 50 steps"));
    const std::string bytes = testing::ReadFile(dir + "/" + name);
    const bool png = absl::EndsWith(name, ".png");
    EXPECT_TRUE(absl::StartsWith(bytes, png ? "\x89PNG\r\n" : "<?xml")) << name;
  }
  WatchedStream out, err;
  CtlContext ctx = MakeContext(address_, false, false, &out, &err);
  EXPECT_EQ(Plot(ctx, id, {dir + "/curves.jpg", 960, 720}), kCtlUsage);
  EXPECT_THAT(err.text(), HasSubstr("-o must name a .svg or .png file"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ddp
