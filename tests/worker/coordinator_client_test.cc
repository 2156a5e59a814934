// The worker's client of several coordinators in standby (MakeFollowingCoordinatorClient):
// it follows the leader a standby names, moves on from one that is gone, and refuses
// a coordinator of another cluster.
#include "worker/agent/coordinator_client.h"

#include <memory>
#include <string>
#include <vector>

#include "common/rpc/leader.h"
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
  EXPECT_THAT(client->Heartbeat({}, d), StatusIs(absl::StatusCode::kUnavailable)) << "b: standby";
  EXPECT_TRUE(client->Heartbeat({}, d).ok()) << "c: the leader b named";
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
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       ::testing::AllOf(HasSubstr("the coordinator at b:2 serves another cluster "
                                                  "(store cluster id cluster-y)"),
                                        HasSubstr("joined through a:1 (cluster-x)"))));
  *a = absl::OkStatus();
  EXPECT_TRUE(client->Heartbeat({}, d).ok()) << "back to a, not following b";
  EXPECT_EQ(b_calls, 1);
  EXPECT_EQ(a_calls, 3);
}

}  // namespace
}  // namespace ddp
