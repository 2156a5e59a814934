// The worker's client of several coordinators in standby (MakeFollowingCoordinatorClient):
// it follows the leader a standby names, moves on from one that is gone, and refuses
// a coordinator of another cluster.
#include "worker/agent/coordinator_client.h"

#include <memory>
#include <string>
#include <vector>

#include <grpcpp/create_channel.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>

#include <atomic>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/rpc/leader.h"
#include "ddp/v1/worker_service.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/status_matchers.h"

namespace ddp {
namespace {

using ::ddp::testing::StatusIs;
using ::testing::HasSubstr;

// Answers every call with *answer (a response of `cluster` when OK), and counts them.
class FakeCoordinator final : public CoordinatorClient {
 public:
  FakeCoordinator(std::shared_ptr<absl::Status> answer, std::string cluster, int* calls)
      : answer_(std::move(answer)), cluster_(std::move(cluster)), calls_(calls) {}
  absl::StatusOr<v1::RegisterResponse> Register(const v1::RegisterRequest&,
                                                absl::Duration) override {
    ++*calls_;
    if (!answer_->ok()) return *answer_;
    v1::RegisterResponse r;
    r.set_cluster_id(cluster_);
    return r;
  }
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest&,
                                                  absl::Duration) override {
    ++*calls_;
    if (!answer_->ok()) return *answer_;
    v1::HeartbeatResponse r;
    r.set_cluster_id(cluster_);
    return r;
  }
  absl::Status ReportEvents(const v1::ReportEventsRequest&, absl::Duration) override {
    ++*calls_;
    return *answer_;
  }

 private:
  std::shared_ptr<absl::Status> answer_;
  std::string cluster_;
  int* calls_;
};

std::shared_ptr<absl::Status> Answer(absl::Status st) {
  return std::make_shared<absl::Status>(std::move(st));
}

TEST(FollowingClientTest, FollowsTheLeaderAStandbyNamesAndMovesOnFromOneThatIsGone) {
  int gone = 0, standby = 0, leader = 0;
  std::vector<std::unique_ptr<CoordinatorClient>> clients;
  clients.push_back(std::make_unique<FakeCoordinator>(
      Answer(absl::UnavailableError("connection refused")), "", &gone));
  clients.push_back(std::make_unique<FakeCoordinator>(
      Answer(NotLeaderError("standby", "c:3")), "", &standby));
  clients.push_back(std::make_unique<FakeCoordinator>(Answer(absl::OkStatus()), "x", &leader));
  auto client = MakeFollowingCoordinatorClient({"a:1", "b:2", "c:3"}, std::move(clients));
  const absl::Duration d = absl::Seconds(1);
  EXPECT_THAT(client->Heartbeat({}, d), StatusIs(absl::StatusCode::kUnavailable)) << "a: gone";
  EXPECT_TRUE(client->Heartbeat({}, d).ok()) << "b, a standby, named c: asked at once";
  EXPECT_TRUE(client->Register({}, d).ok());
  EXPECT_TRUE(client->ReportEvents({}, d).ok());
  EXPECT_EQ(gone, 1);
  EXPECT_EQ(standby, 1);
  EXPECT_EQ(leader, 3) << "it stays with the leader";
}

TEST(FollowingClientTest, ACoordinatorOfAnotherStoreIsRefusedNamingBothAndNotFollowed) {
  int a_calls = 0, b_calls = 0;
  auto a = Answer(absl::OkStatus());
  std::vector<std::unique_ptr<CoordinatorClient>> clients;
  clients.push_back(std::make_unique<FakeCoordinator>(a, "cluster-x", &a_calls));
  clients.push_back(std::make_unique<FakeCoordinator>(Answer(absl::OkStatus()), "cluster-y",
                                                      &b_calls));
  auto client = MakeFollowingCoordinatorClient({"a:1", "b:2"}, std::move(clients));
  const absl::Duration d = absl::Seconds(1);
  ASSERT_TRUE(client->Register({}, d).ok());  // a's cluster is the one this worker joined.
  *a = absl::UnavailableError("connection refused");
  EXPECT_FALSE(client->Heartbeat({}, d).ok()) << "a went away";
  EXPECT_THAT(client->Heartbeat({}, d),
              StatusIs(absl::StatusCode::kUnavailable,
                       ::testing::AllOf(HasSubstr("the coordinator at b:2 serves another cluster "
                                                  "(store cluster id cluster-y)"),
                                        HasSubstr("joined through a:1 (cluster-x)"))));
  *a = absl::OkStatus();
  EXPECT_TRUE(client->Heartbeat({}, d).ok()) << "back to a, not following b";
  EXPECT_EQ(b_calls, 1);
  EXPECT_EQ(a_calls, 3);
}

// A coordinator's WorkerService with only what a test gives it: heartbeats answered
// unary, over a stream, or not at all (a stream that never answers).
class FakeWorkerService final : public v1::WorkerService::Service {
 public:
  // kQuiet: as a coordinator with quiet heartbeats (decision 161): a quiet beat is
  // answered when it is the stream's first, asks (answer_now), or `version` changed
  // since the last answer; every answer names its beat. `mute`: no answers at all,
  // the stream left open.
  enum class Stream { kAnswer, kUnimplemented, kSilent, kQuiet };
  explicit FakeWorkerService(Stream stream) : stream_(stream) {}

  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest* req,
                         v1::HeartbeatResponse* resp) override {
    ++unary;
    resp->set_desired_version(static_cast<uint64_t>(req->free_ports_size()));
    return grpc::Status::OK;
  }
  grpc::Status HeartbeatStream(
      grpc::ServerContext* ctx,
      grpc::ServerReaderWriter<v1::HeartbeatResponse, v1::HeartbeatRequest>* stream) override {
    if (stream_ == Stream::kUnimplemented) {
      return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "no stream here");
    }
    ++streams;
    v1::HeartbeatRequest req;
    while (stream->Read(&req)) {
      ++streamed;
      if (stream_ == Stream::kSilent) {
        while (!ctx->IsCancelled()) absl::SleepFor(absl::Milliseconds(5));
        return grpc::Status::CANCELLED;
      }
      v1::HeartbeatResponse resp;
      if (stream_ == Stream::kQuiet) {
        const uint64_t v = version.load();
        const bool say = !req.quiet() || req.answer_now() || answered == 0 || v != last;
        if (!say || mute) continue;
        ++answered;
        last = v;
        resp.set_desired_version(v);
        resp.set_acked_seq(req.beat_seq());
        stream->Write(resp);
        continue;
      }
      resp.set_desired_version(static_cast<uint64_t>(req.free_ports_size()));
      stream->Write(resp);
    }
    return grpc::Status::OK;
  }

  std::atomic<int> unary{0}, streams{0}, streamed{0}, answered{0};
  std::atomic<uint64_t> version{1};
  std::atomic<bool> mute{false};
  uint64_t last = 0;  // The stream's last answer's version (one stream at a time).

 private:
  const Stream stream_;
};

struct FakeServer {
  explicit FakeServer(FakeWorkerService::Stream stream) : service(stream) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
  }
  ~FakeServer() { server->Shutdown(std::chrono::system_clock::now()); }
  std::unique_ptr<CoordinatorClient> Client() {
    return MakeGrpcCoordinatorClient(grpc::CreateChannel(absl::StrCat("127.0.0.1:", port),
                                                         grpc::InsecureChannelCredentials()));
  }
  FakeWorkerService service;
  int port = 0;
  std::unique_ptr<grpc::Server> server;
};

v1::HeartbeatRequest Beat(int n) {
  v1::HeartbeatRequest req;
  req.set_worker("w1");
  for (int i = 0; i < n; ++i) req.add_free_ports(30000 + i);
  return req;
}

TEST(GrpcCoordinatorClientTest, HeartbeatsShareOneStreamEachAnsweredInTurn) {
  FakeServer fake(FakeWorkerService::Stream::kAnswer);
  auto client = fake.Client();
  for (int n = 1; n <= 5; ++n) {
    auto resp = client->Heartbeat(Beat(n), absl::Seconds(5));
    ASSERT_TRUE(resp.ok()) << resp.status();
    EXPECT_EQ(resp->desired_version(), static_cast<uint64_t>(n)) << "its own beat's answer";
  }
  EXPECT_EQ(fake.service.streams, 1);
  EXPECT_EQ(fake.service.streamed, 5);
  EXPECT_EQ(fake.service.unary, 0);
}

TEST(GrpcCoordinatorClientTest, ACoordinatorWithoutTheStreamGetsUnaryHeartbeats) {
  FakeServer fake(FakeWorkerService::Stream::kUnimplemented);
  auto client = fake.Client();
  for (int n = 1; n <= 3; ++n) {
    auto resp = client->Heartbeat(Beat(n), absl::Seconds(5));
    ASSERT_TRUE(resp.ok()) << resp.status();
    EXPECT_EQ(resp->desired_version(), static_cast<uint64_t>(n));
  }
  EXPECT_EQ(fake.service.unary, 3);
}

TEST(GrpcCoordinatorClientTest, AnUnansweredBeatTimesOutAndTheNextOneOpensAnotherStream) {
  FakeServer fake(FakeWorkerService::Stream::kSilent);
  auto client = fake.Client();
  const absl::Time t0 = absl::Now();
  EXPECT_THAT(client->Heartbeat(Beat(1), absl::Milliseconds(300)),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("within 300ms")));
  EXPECT_LT(absl::Now() - t0, absl::Seconds(5)) << "cancelled, not left waiting";
  EXPECT_THAT(client->Heartbeat(Beat(1), absl::Milliseconds(300)),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_EQ(fake.service.streams, 2);
}

v1::HeartbeatRequest QuietBeat(uint64_t seq, bool answer_now) {
  v1::HeartbeatRequest req = Beat(1);
  req.set_quiet(true);
  req.set_beat_seq(seq);
  req.set_answer_now(answer_now);
  return req;
}

TEST(GrpcCoordinatorClientTest, QuietBeatsReturnOnceWrittenAndABeatThatAsksGetsItsOwnAnswer) {
  FakeServer fake(FakeWorkerService::Stream::kQuiet);
  auto client = fake.Client();
  ASSERT_TRUE(client->QuietCapable());
  // A new stream's first beat asks for its answer whatever the caller said: it shows
  // whether the coordinator is quiet.
  auto first = client->Heartbeat(QuietBeat(1, false), absl::Seconds(5));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->acked_seq(), 1u);
  EXPECT_EQ(first->desired_version(), 1u);
  for (uint64_t seq : {2, 3}) {
    auto quiet = client->Heartbeat(QuietBeat(seq, false), absl::Seconds(5));
    ASSERT_TRUE(quiet.ok()) << quiet.status();
    EXPECT_EQ(quiet->acked_seq(), 0u) << "nothing said back";
  }
  auto asked = client->Heartbeat(QuietBeat(4, true), absl::Seconds(5));
  ASSERT_TRUE(asked.ok()) << asked.status();
  EXPECT_EQ(asked->acked_seq(), 4u);
  EXPECT_EQ(fake.service.streams, 1);
  EXPECT_EQ(fake.service.streamed, 4);
  EXPECT_EQ(fake.service.answered, 2);
}

TEST(GrpcCoordinatorClientTest, AnAnswerNoBeatWaitsForIsToldAtOnceAndTakenByTheNextBeat) {
  absl::Notification told;  // Outlives the client, whose reader may tell it at the end.
  FakeServer fake(FakeWorkerService::Stream::kQuiet);
  auto client = fake.Client();
  client->SetOnAnswer([&told] {
    if (!told.HasBeenNotified()) told.Notify();
  });
  ASSERT_TRUE(client->Heartbeat(QuietBeat(1, true), absl::Seconds(5)).ok());
  fake.service.version = 7;  // A new desired state: the next beat is answered with it.
  auto quiet = client->Heartbeat(QuietBeat(2, false), absl::Seconds(5));
  ASSERT_TRUE(quiet.ok()) << quiet.status();
  ASSERT_TRUE(told.WaitForNotificationWithTimeout(absl::Seconds(10)))
      << "the agent is woken to take it";
  v1::HeartbeatResponse news;
  for (uint64_t seq = 3; news.acked_seq() == 0 && seq < 100; ++seq) {
    if (quiet->acked_seq() != 0) {  // Already back when beat 2 returned.
      news = *quiet;
      break;
    }
    auto next = client->Heartbeat(QuietBeat(seq, false), absl::Seconds(5));
    ASSERT_TRUE(next.ok()) << next.status();
    news = *next;
  }
  EXPECT_EQ(news.acked_seq(), 2u) << "the beat the coordinator answered";
  EXPECT_EQ(news.desired_version(), 7u);
}

TEST(GrpcCoordinatorClientTest, AnOpenStreamThatStopsAnsweringFailsTheBeatThatAsks) {
  FakeServer fake(FakeWorkerService::Stream::kQuiet);
  auto client = fake.Client();
  ASSERT_TRUE(client->Heartbeat(QuietBeat(1, true), absl::Seconds(5)).ok());
  fake.service.mute = true;
  auto quiet = client->Heartbeat(QuietBeat(2, false), absl::Seconds(5));
  ASSERT_TRUE(quiet.ok()) << "written: a quiet beat cannot tell";
  EXPECT_EQ(quiet->acked_seq(), 0u);
  EXPECT_THAT(client->Heartbeat(QuietBeat(3, true), absl::Milliseconds(300)),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("within 300ms")));
  fake.service.mute = false;
  auto back = client->Heartbeat(QuietBeat(4, false), absl::Seconds(5));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->acked_seq(), 4u) << "a new stream, whose first beat asks";
  EXPECT_EQ(fake.service.streams, 2);
}

TEST(GrpcCoordinatorClientTest, ACoordinatorOlderThanQuietBeatsAnswersEveryBeatInTurn) {
  FakeServer fake(FakeWorkerService::Stream::kAnswer);  // Ignores quiet, names no beat.
  auto client = fake.Client();
  for (int n = 1; n <= 4; ++n) {
    v1::HeartbeatRequest req = QuietBeat(static_cast<uint64_t>(n), false);
    for (int i = 1; i < n; ++i) req.add_free_ports(40000 + i);
    auto resp = client->Heartbeat(req, absl::Seconds(5));
    ASSERT_TRUE(resp.ok()) << resp.status();
    EXPECT_EQ(resp->desired_version(), static_cast<uint64_t>(n)) << "its own beat's answer";
    EXPECT_EQ(resp->acked_seq(), static_cast<uint64_t>(n)) << "named by the client";
  }
  EXPECT_EQ(fake.service.streams, 1);
}

}  // namespace
}  // namespace ddp
