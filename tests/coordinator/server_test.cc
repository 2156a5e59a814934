// The coordinator's composition root in-process: a real gRPC server on a loopback
// port with a scratch state directory, reached through raw stubs.
#include "coordinator/server.h"

#include <grpc/grpc.h>
#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/support/channel_arguments.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/rpc/status.h"
#include "ddp/v1/job_service.grpc.pb.h"
#include "ddp/v1/worker_service.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/status_matchers.h"
#include "tests/common/test_util.h"

namespace ddp {
namespace {

using ::ddp::testing::StatusIs;
using ::testing::HasSubstr;

CoordinatorServerOptions Options(const std::string& state_dir, int port = 0) {
  CoordinatorServerOptions o;
  o.listen = absl::StrCat("127.0.0.1:", port);
  o.state_dir = state_dir;
  return o;
}

TEST(CoordinatorServerTest, QuotasComeFromFlagsAndAFileThatNamesItsErrors) {
  const std::string dir = testing::MakeTempDir("quota-file");
  const std::string file = dir + "/quotas";
  testing::WriteFile(file, "# team quotas\nalice = 8   # research\n\n*=2\n");
  DDP_ASSERT_OK_AND_ASSIGN(Quotas quotas, LoadQuotas({"bob=4"}, file));
  EXPECT_EQ(quotas.Limit("alice"), 8);
  EXPECT_EQ(quotas.Limit("bob"), 4);
  EXPECT_EQ(quotas.Limit("carol"), 2);
  testing::WriteFile(file, "alice=lots\n");
  EXPECT_THAT(LoadQuotas({}, file),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::AllOf(HasSubstr(file), HasSubstr("quota 'alice=lots'"))));
  EXPECT_THAT(LoadQuotas({}, dir + "/missing"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--quota-file: cannot read")));
  EXPECT_THAT(LoadQuotas({"alice=1"}, ""), ::testing::Not(StatusIs(absl::StatusCode::kInvalidArgument)));
  std::filesystem::remove_all(dir);
}

TEST(CoordinatorServerTest, ASecondServerOnTheSameStateDirFailsWithAClearError) {
  const std::string dir = testing::MakeTempDir("server-dir");
  auto first = CoordinatorServer::Start(Options(dir));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_THAT(CoordinatorServer::Start(Options(dir)),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr(absl::StrCat("state dir ", dir,
                                              " is in use by another ddp-coordinator (pid ",
                                              ::getpid(), "?)"))));
  first->reset();
  auto again = CoordinatorServer::Start(Options(dir));
  EXPECT_TRUE(again.ok()) << "the directory is free once the first server is gone: "
                          << again.status();
}

TEST(CoordinatorServerTest, ASecondServerCannotShareTheListenPort) {
  auto first = CoordinatorServer::Start(Options(testing::MakeTempDir("server-port-a")));
  ASSERT_TRUE(first.ok()) << first.status();
  const int port = (*first)->port();
  // gRPC would set SO_REUSEPORT and let both bind, splitting clients between them.
  EXPECT_THAT(CoordinatorServer::Start(Options(testing::MakeTempDir("server-port-b"), port)),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr(absl::StrCat("cannot listen on 127.0.0.1:", port))));
}

TEST(CoordinatorServerTest, BadOptionsNameTheFlag) {
  CoordinatorServerOptions o = Options(testing::MakeTempDir("server-flags"));
  o.retention.max_metric_rows = 0;
  EXPECT_THAT(ValidateServerOptions(o), StatusIs(absl::StatusCode::kInvalidArgument,
                                                 HasSubstr("--max-metric-rows: must be >= 1")));
  o = Options(testing::MakeTempDir("server-flags"));
  o.streams.per_caller = 0;
  EXPECT_THAT(ValidateServerOptions(o),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--max-streams-per-caller: must be >= 1 (got 0)")));
  o = Options(testing::MakeTempDir("server-flags"));
  o.usage.log_bytes_per_job = -1;
  EXPECT_THAT(ValidateServerOptions(o),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--max-log-bytes-per-job: must be >= 1")));
  o = Options("");
  EXPECT_THAT(ValidateServerOptions(o),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--state-dir (SQLite) or --store (postgresql://...) is required")));
  o = Options(testing::MakeTempDir("server-flags"));
  o.store_uri = "postgresql://ddp@db/ddp";
  EXPECT_THAT(ValidateServerOptions(o),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--state-dir and --store: give one")));
  o = Options("");
  o.store_uri = "postgres-ish://db";
  EXPECT_THAT(ValidateServerOptions(o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a PostgreSQL URI")));
  o.store_uri = "postgresql://ddp@db/ddp";
  EXPECT_TRUE(ValidateServerOptions(o).ok());
  o.lease.renew = absl::Seconds(2);  // Of a 3 s lease: one late renewal would depose it.
  EXPECT_THAT(ValidateServerOptions(o),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--lease-renew 2s must be above 0 and at most half of "
                                 "--lease-ttl 3s")));
  o.lease = LeaseOptions();
  o.lease.ttl = absl::Milliseconds(500);
  EXPECT_THAT(ValidateServerOptions(o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--lease-ttl 500ms")));
  o.lease = LeaseOptions();
  o.advertise_addr = "db";
  EXPECT_THAT(ValidateServerOptions(o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--advertise-addr")));
}

// A channel with a TCP connection of its own (gRPC would otherwise share one between
// channels to the same target, and a stalled stream's unread data would hold up the
// others' connection window). `stalled_reader`: no window growth (BDP probing off),
// so what the server writes while the reader does not read stays in the server's
// hands instead of piling up in the client's transport.
std::shared_ptr<grpc::Channel> Connect(int port, bool stalled_reader = false) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  if (stalled_reader) args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  return grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port),
                                   grpc::InsecureChannelCredentials(), args);
}

// The server with one registered worker running a one-node job.
class StreamingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = CoordinatorServer::Start(Options(testing::MakeTempDir("server-streams")));
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    workers_ = v1::WorkerService::NewStub(Connect(server_->port()));
    jobs_ = v1::JobService::NewStub(Connect(server_->port()));

    grpc::ClientContext rctx;
    v1::RegisterRequest reg;
    reg.set_worker("w1");
    reg.set_incarnation("inc");
    reg.set_address("127.0.0.1");
    reg.set_slots(1);
    v1::RegisterResponse reg_resp;
    ASSERT_TRUE(workers_->Register(&rctx, reg, &reg_resp).ok());
    Heartbeat(false);  // Reports a free port.
    grpc::ClientContext sctx;
    v1::SubmitJobRequest submit;
    submit.set_spec_yaml("name: streamed\nmodel: {mlp: {}}\ndata: {synthetic: {}}\n"
                         "train: {batch_size: 4}\n");
    v1::SubmitJobResponse submitted;
    ASSERT_TRUE(jobs_->SubmitJob(&sctx, submit, &submitted).ok());
    job_id_ = submitted.job_id();
    Heartbeat(false);  // Takes the task and reports its trainer running: RUNNING.
  }

  // Reports the job's trainer running, or (`exited`) done.
  void Heartbeat(bool exited) {
    grpc::ClientContext ctx;
    v1::HeartbeatRequest req;
    req.set_worker("w1");
    req.set_incarnation("inc");
    req.add_free_ports(45678);
    if (!job_id_.empty()) {
      v1::TaskStatus* t = req.add_tasks();
      t->set_job_id(job_id_);
      t->set_attempt(1);
      v1::LocalRankStatus* r = t->add_ranks();
      r->set_rank(0);
      r->set_pid(4242);
      r->set_exited(exited);
    }
    v1::HeartbeatResponse resp;
    ASSERT_TRUE(workers_->Heartbeat(&ctx, req, &resp).ok());
  }

  // Reports `n` more `epoch` events of rank 0; returns the RPC's status.
  grpc::Status ReportEpochs(int n) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::ReportEventsRequest req;
    req.set_worker("w1");
    req.set_incarnation("inc");
    req.set_batch_seq(++batch_seq_);
    for (int i = 0; i < n; ++i) {
      v1::ReportedEvent* e = req.add_events();
      e->set_job_id(job_id_);
      e->set_attempt(1);
      v1::TrainerEvent::Epoch* epoch = e->mutable_event()->mutable_epoch();
      epoch->set_epoch(++epochs_);
      epoch->set_train_loss(1.0 / epochs_);
      epoch->set_val_loss(2.0 / epochs_);
      epoch->set_val_accuracy(0.5);
    }
    v1::ReportEventsResponse resp;
    return workers_->ReportEvents(&ctx, req, &resp);
  }

  std::unique_ptr<CoordinatorServer> server_;
  std::unique_ptr<v1::WorkerService::Stub> workers_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
  std::string job_id_;
  int64_t batch_seq_ = 0;
  int epochs_ = 0;
};

TEST_F(StreamingTest, AHeartbeatStreamAnswersEveryBeatOfItsWorkerAndEndsAtAnother) {
  grpc::ClientContext ctx;
  auto stream = workers_->HeartbeatStream(&ctx);
  v1::HeartbeatRequest beat;
  beat.set_worker("w1");
  beat.set_incarnation("inc");
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(stream->Write(beat));
    v1::HeartbeatResponse resp;
    ASSERT_TRUE(stream->Read(&resp)) << "beat " << i << " answered";
    ASSERT_EQ(resp.tasks_size(), 1) << "the job's task, as a unary heartbeat gets it";
    EXPECT_EQ(resp.tasks(0).job_id(), job_id_);
    EXPECT_FALSE(resp.cluster_id().empty());
  }
  beat.set_worker("w2");
  ASSERT_TRUE(stream->Write(beat));
  v1::HeartbeatResponse resp;
  EXPECT_FALSE(stream->Read(&resp));
  const grpc::Status st = stream->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(), HasSubstr("this one began as w1, not w2"));

  grpc::ClientContext unknown_ctx;
  auto unknown = workers_->HeartbeatStream(&unknown_ctx);
  beat.set_worker("nobody");
  ASSERT_TRUE(unknown->Write(beat));
  EXPECT_FALSE(unknown->Read(&resp));
  EXPECT_EQ(unknown->Finish().error_code(), grpc::StatusCode::NOT_FOUND)
      << "as Heartbeat: register first";
}

// Quiet heartbeats (decision 161): a quiet beat is answered only when it is the
// stream's first, asks for it, or its answer carries a new desired state; every answer
// names its beat. Answers come in order, so reading beat 4's answer next shows that
// beats 2 and 3 were not answered.
TEST_F(StreamingTest, QuietBeatsAreAnsweredOnlyWhenAskedOrWithANewDesiredState) {
  grpc::ClientContext ctx;
  auto stream = workers_->HeartbeatStream(&ctx);
  v1::HeartbeatRequest beat;
  beat.set_worker("w1");
  beat.set_incarnation("inc");
  beat.set_quiet(true);
  v1::TaskStatus* t = beat.add_tasks();  // The trainer runs on: nothing new to say.
  t->set_job_id(job_id_);
  t->set_attempt(1);
  v1::LocalRankStatus* r = t->add_ranks();
  r->set_rank(0);
  r->set_pid(4242);

  beat.set_beat_seq(1);
  ASSERT_TRUE(stream->Write(beat));
  v1::HeartbeatResponse first;
  ASSERT_TRUE(stream->Read(&first)) << "a stream's first beat is answered";
  EXPECT_EQ(first.acked_seq(), 1u);
  ASSERT_EQ(first.tasks_size(), 1);
  EXPECT_EQ(first.tasks(0).job_id(), job_id_);
  for (uint64_t seq : {2, 3}) {
    beat.set_beat_seq(seq);
    ASSERT_TRUE(stream->Write(beat));
  }
  beat.set_beat_seq(4);
  beat.set_answer_now(true);
  ASSERT_TRUE(stream->Write(beat));
  v1::HeartbeatResponse asked;
  ASSERT_TRUE(stream->Read(&asked));
  EXPECT_EQ(asked.acked_seq(), 4u) << "beats 2 and 3 said nothing new and were not answered";
  EXPECT_EQ(asked.desired_version(), first.desired_version());
  EXPECT_EQ(asked.tasks_size(), 1) << "an answer asked for carries the whole desired state";
  EXPECT_FALSE(asked.cluster_id().empty());

  // The job cancelled: its task leaves this worker's desired state, and the next quiet
  // beat, which asks for nothing, is answered with it at once.
  grpc::ClientContext cctx;
  v1::CancelJobRequest cancel;
  cancel.set_job_id(job_id_);
  v1::Job cancelled;
  ASSERT_TRUE(jobs_->CancelJob(&cctx, cancel, &cancelled).ok());
  beat.set_beat_seq(5);
  beat.set_answer_now(false);
  ASSERT_TRUE(stream->Write(beat));
  v1::HeartbeatResponse news;
  ASSERT_TRUE(stream->Read(&news));
  EXPECT_EQ(news.acked_seq(), 5u);
  EXPECT_GT(news.desired_version(), asked.desired_version());
  EXPECT_EQ(news.tasks_size(), 0) << "the cancelled job's task is no longer wanted";
  ASSERT_TRUE(stream->WritesDone());
  EXPECT_TRUE(stream->Finish().ok());
}

// An agent older than quiet heartbeats (no beat_seq, no quiet) keeps getting an answer
// to every beat, and a unary Heartbeat is answered as before whatever the beat says.
TEST_F(StreamingTest, BeatsWithoutQuietAreEachAnsweredAsBefore) {
  grpc::ClientContext ctx;
  auto stream = workers_->HeartbeatStream(&ctx);
  v1::HeartbeatRequest beat;
  beat.set_worker("w1");
  beat.set_incarnation("inc");
  uint64_t version = 0;
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(stream->Write(beat));
    v1::HeartbeatResponse resp;
    ASSERT_TRUE(stream->Read(&resp)) << "beat " << i << " answered, nothing new in it";
    EXPECT_EQ(resp.acked_seq(), 0u) << "the beat named no number";
    if (i > 0) {
      EXPECT_EQ(resp.desired_version(), version);
    }
    version = resp.desired_version();
  }
  ASSERT_TRUE(stream->WritesDone());
  EXPECT_TRUE(stream->Finish().ok());
  grpc::ClientContext uctx;
  beat.set_quiet(true);
  beat.set_beat_seq(9);
  v1::HeartbeatResponse unary;
  ASSERT_TRUE(workers_->Heartbeat(&uctx, beat, &unary).ok());
  EXPECT_EQ(unary.desired_version(), version);
}

TEST_F(StreamingTest, AStalledWatcherHoldsUpNeitherIngestionNorOtherWatchersAndGetsTheNewest) {
  // Every update carries the whole epoch history: over 100 KB, more than the stalled
  // reader's window.
  ASSERT_TRUE(ReportEpochs(3000).ok());
  v1::WatchJobRequest req;
  req.set_job_id(job_id_);

  auto stalled_stub = v1::JobService::NewStub(Connect(server_->port(), /*stalled_reader=*/true));
  grpc::ClientContext stalled_ctx;
  auto stalled = stalled_stub->WatchJob(&stalled_ctx, req);
  v1::Job job;
  ASSERT_TRUE(stalled->Read(&job));
  ASSERT_EQ(job.state(), v1::RUNNING);
  ASSERT_EQ(job.epoch_history_size(), 3000);
  ASSERT_GT(job.ByteSizeLong(), 100u << 10);
  // From here on the stalled watcher reads nothing until the job has ended.

  grpc::ClientContext live_ctx;
  auto live = jobs_->WatchJob(&live_ctx, req);
  constexpr int kUpdates = 40;
  for (int i = 1; i <= kUpdates; ++i) {
    ASSERT_TRUE(ReportEpochs(10).ok()) << "ingestion is never held up by a watcher";
    do {
      ASSERT_TRUE(live->Read(&job)) << "the live watcher keeps getting updates";
    } while (job.epoch_history_size() < 3000 + 10 * i);
  }
  Heartbeat(/*exited=*/true);
  do {
    ASSERT_TRUE(live->Read(&job));
  } while (job.state() != v1::SUCCEEDED);
  EXPECT_TRUE(live->Finish().ok());

  // Resumed, the stalled watcher gets what its window held, then the newest state:
  // not one message per update.
  int received = 0;
  while (stalled->Read(&job)) ++received;
  EXPECT_TRUE(stalled->Finish().ok());
  EXPECT_EQ(job.state(), v1::SUCCEEDED);
  EXPECT_EQ(job.epoch_history_size(), 3000 + 10 * kUpdates);
  EXPECT_LE(received, 5) << "of " << kUpdates + 1 << " updates";
}

// Through real RPCs with tokens: owners, env redaction and the stream limits.
class LimitsTest : public ::testing::Test {
 protected:
  static constexpr char kAlice[] = "alice-token-0123456789";
  static constexpr char kBob[] = "bob-token-0123456789ab";
  static constexpr char kRoot[] = "root-token-0123456789a";

  void SetUp() override {
    dir_ = testing::MakeTempDir("server-limits");
    CoordinatorServerOptions o = Options(dir_ + "/state");
    o.auth.token_file = dir_ + "/tokens";
    testing::WriteFile(o.auth.token_file, absl::StrCat(kAlice, " user alice\n", kBob,
                                                       " user bob\n", kRoot, " admin root\n"));
    o.streams.total = 3;
    o.streams.per_caller = 2;
    auto server = CoordinatorServer::Start(o);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    jobs_ = v1::JobService::NewStub(Connect(server_->port()));
  }
  void TearDown() override {
    server_.reset();
    std::filesystem::remove_all(dir_);
  }

  std::unique_ptr<grpc::ClientContext> As(const char* token) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->AddMetadata("authorization", absl::StrCat("Bearer ", token));
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    return ctx;
  }

  // A WatchJob stream of `token`; its first update read, or its refusal.
  struct Watch {
    std::unique_ptr<grpc::ClientContext> ctx;
    std::unique_ptr<grpc::ClientReader<v1::Job>> reader;
    grpc::Status refused;  // OK while open.
  };
  Watch Open(const char* token) {
    Watch w;
    w.ctx = As(token);
    v1::WatchJobRequest req;
    req.set_job_id(job_id_);
    w.reader = jobs_->WatchJob(w.ctx.get(), req);
    v1::Job job;
    if (!w.reader->Read(&job)) w.refused = w.reader->Finish();
    return w;
  }

  std::string dir_;
  std::unique_ptr<CoordinatorServer> server_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
  std::string job_id_;
};

TEST_F(LimitsTest, OwnersEnvAndStreamLimitsHoldOverRpcs) {
  v1::SubmitJobRequest submit;
  submit.set_spec_yaml("name: owned\nmodel: {mlp: {}}\ndata: {synthetic: {}}\n"
                       "train: {batch_size: 4}\nenv: {API_KEY: hunter2-secret}\n");
  v1::SubmitJobResponse submitted;
  ASSERT_TRUE(jobs_->SubmitJob(As(kAlice).get(), submit, &submitted).ok());
  job_id_ = submitted.job_id();
  EXPECT_EQ(submitted.job().owner(), "alice");

  v1::GetJobRequest get;
  get.set_job_id(job_id_);
  v1::Job seen;
  ASSERT_TRUE(jobs_->GetJob(As(kBob).get(), get, &seen).ok());
  EXPECT_EQ(seen.owner(), "alice");
  EXPECT_THAT(seen.spec_yaml(), ::testing::Not(HasSubstr("hunter2")));
  EXPECT_THAT(seen.spec_yaml(), HasSubstr("API_KEY: <redacted>"));
  ASSERT_TRUE(jobs_->GetJob(As(kRoot).get(), get, &seen).ok());
  EXPECT_THAT(seen.spec_yaml(), HasSubstr("hunter2-secret"));

  v1::CancelJobRequest cancel;
  cancel.set_job_id(job_id_);
  v1::Job cancelled;
  EXPECT_THAT(FromGrpcStatus(jobs_->CancelJob(As(kBob).get(), cancel, &cancelled)),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("belongs to alice")));

  Watch a1 = Open(kAlice), a2 = Open(kAlice);
  ASSERT_TRUE(a1.refused.ok() && a2.refused.ok()) << a1.refused.error_message();
  Watch a3 = Open(kAlice);
  EXPECT_EQ(a3.refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(a3.refused.error_message(),
              HasSubstr("alice has 2 watch and log streams open, the coordinator's "
                        "--max-streams-per-caller is 2"));
  Watch b1 = Open(kBob);
  ASSERT_TRUE(b1.refused.ok()) << b1.refused.error_message();
  v1::StreamLogsRequest logs;
  logs.set_job_id(job_id_);
  logs.set_follow(true);
  auto b2ctx = As(kBob);
  auto b2 = jobs_->StreamLogs(b2ctx.get(), logs);
  v1::LogBatch batch;
  EXPECT_FALSE(b2->Read(&batch));
  const grpc::Status full = b2->Finish();
  EXPECT_EQ(full.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(full.error_message(), HasSubstr("--max-streams is 3"));

  // The owner cancels: the job ends, so do its watches, and their slots come back.
  ASSERT_TRUE(jobs_->CancelJob(As(kAlice).get(), cancel, &cancelled).ok());
  for (Watch* w : {&a1, &a2, &b1}) {
    v1::Job job;
    while (w->reader->Read(&job)) {
    }
    EXPECT_TRUE(w->reader->Finish().ok());
  }
  // A stream's slot is given back when the server is done with it, just after the
  // client saw it end: a new one is admitted within moments.
  grpc::Status last;
  for (int i = 0; i < 1000; ++i) {
    Watch again = Open(kBob);
    last = again.refused;
    if (last.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED) break;
  }
  EXPECT_NE(last.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << last.error_message();
}

}  // namespace
}  // namespace ddp
