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
  enum class Stream { kAnswer, kUnimplemented, kSilent };
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
      resp.set_desired_version(static_cast<uint64_t>(req.free_ports_size()));
      stream->Write(resp);
    }
    return grpc::Status::OK;
  }

  std::atomic<int> unary{0}, streams{0}, streamed{0};

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

}  // namespace
}  // namespace ddp
