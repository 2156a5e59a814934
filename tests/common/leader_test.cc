// How clients find the leading coordinator among several (common/rpc/leader.h).
#include "common/rpc/leader.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/status_matchers.h"

namespace ddp {
namespace {

using ::ddp::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(LeaderTest, AStandbysAnswerNamesTheLeaderAndClientsReadItBack) {
  const absl::Status st = NotLeaderError("this coordinator is a standby", "10.0.0.2:29400");
  EXPECT_TRUE(absl::IsUnavailable(st)) << "clients retry it as an outage";
  EXPECT_EQ(st.message(),
            "not the leader: this coordinator is a standby; the leader is at 10.0.0.2:29400");
  EXPECT_TRUE(IsNotLeader(st));
  EXPECT_EQ(LeaderNamedIn(st), "10.0.0.2:29400");
  const absl::Status unknown = NotLeaderError("the store is unreachable", "");
  EXPECT_TRUE(IsNotLeader(unknown));
  EXPECT_EQ(LeaderNamedIn(unknown), std::nullopt);
  EXPECT_FALSE(IsNotLeader(absl::UnavailableError("connection refused")));
  EXPECT_EQ(LeaderNamedIn(absl::NotFoundError("not the leader: x; the leader is at a:1")),
            std::nullopt)
      << "only a standby's UNAVAILABLE counts";
}

TEST(LeaderTest, ClientsMoveToTheNamedLeaderOrElseTheNextAddress) {
  const std::vector<std::string> all = {"a:1", "b:2", "c:3"};
  EXPECT_EQ(NextCoordinator(all, 0, NotLeaderError("standby", "c:3")), 2u);
  EXPECT_EQ(NextCoordinator(all, 2, absl::UnavailableError("connection refused")), 0u);
  EXPECT_EQ(NextCoordinator(all, 0, NotLeaderError("standby", "d:4")), 1u)
      << "a leader not on the list: the next address";
  EXPECT_EQ(NextCoordinator({"a:1"}, 0, absl::UnavailableError("gone")), 0u);
}

TEST(LeaderTest, CoordinatorListsAreParsedAndBadEntriesNamed) {
  EXPECT_THAT(ParseCoordinatorList(" a:29400 , b:29401,"), testing::IsOkAndHolds(ElementsAre("a:29400", "b:29401")));
  EXPECT_THAT(ParseCoordinatorList("a:29400,b"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'b' is not HOST:PORT")));
  EXPECT_THAT(ParseCoordinatorList(" , "),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no coordinator address")));
}

}  // namespace
}  // namespace ddp
