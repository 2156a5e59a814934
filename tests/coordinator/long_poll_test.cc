// Long polls for new tasks: TaskWaiters on its own, then WaitForTasks through the
// Coordinator (FakeClock, real SQLite): answered when a job is placed on the worker,
// when its attempt ends, at the deadline, at once when the agent is behind, and at
// shutdown.
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "coordinator/core/task_waiters.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/coordinator/coordinator_harness.h"

namespace ddp {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1'800'000'000);

// The answer one long poll got, waited for.
class Answer {
 public:
  TaskWaiters::Done Callback() {
    return [this](absl::StatusOr<uint64_t> v) {
      result_ = std::move(v);
      done_.Notify();
    };
  }
  bool answered() const { return done_.HasBeenNotified(); }
  absl::StatusOr<uint64_t> Get() {
    EXPECT_TRUE(done_.WaitForNotificationWithTimeout(absl::Seconds(30)));
    return result_;
  }

 private:
  absl::Notification done_;
  absl::StatusOr<uint64_t> result_ = absl::UnknownError("not answered");
};

TEST(TaskWaitersTest, AnswersOnAChangeOfThatWorkerOnlyAndAtTheDeadline) {
  TaskWaiters waiters;
  Answer a, b, c;
  waiters.Add("w1", 3, kT0 + absl::Seconds(30), a.Callback());
  waiters.Add("w2", 7, kT0 + absl::Seconds(30), b.Callback());
  waiters.Add("w3", 1, kT0 + absl::Seconds(5), c.Callback());
  waiters.Changed("w1", 3);  // Not a change for a caller that knows 3.
  waiters.Changed("w1", 4);
  EXPECT_EQ(*a.Get(), 4u);
  waiters.Expire(kT0 + absl::Seconds(6));
  EXPECT_EQ(*c.Get(), 1u) << "past its deadline: the same version";
  EXPECT_EQ(waiters.open(), 1);
  EXPECT_FALSE(b.answered());
  waiters.Close();
  EXPECT_EQ(b.Get().status().code(), absl::StatusCode::kUnavailable);
  Answer late;
  waiters.Add("w2", 7, kT0 + absl::Seconds(30), late.Callback());
  EXPECT_EQ(late.Get().status().code(), absl::StatusCode::kUnavailable) << "closed";
}

class LongPollTest : public testing::CoordinatorHarness {
 protected:
  void SetUp() override {
    CoordinatorHarness::SetUp();
    Register("w1");
  }

  v1::HeartbeatResponse Heartbeat(std::vector<v1::TaskStatus> tasks = {}) {
    return HeartbeatReply("w1", tasks);
  }

  void Poll(uint64_t version, Answer& answer, const std::string& incarnation = "w1-inc") {
    v1::WaitForTasksRequest req;
    req.set_worker("w1");
    req.set_incarnation(incarnation);
    req.set_desired_version(version);
    req.set_timeout_ms(10000);
    coordinator_->WaitForTasks(req, answer.Callback());
  }

  std::string Submit() {
    return CoordinatorHarness::Submit(
        "name: lp\nnodes: \"1\"\nmodel: {mlp: {}}\ndata: {synthetic: {}}\n"
        "train: {batch_size: 4}\n");
  }
};

TEST_F(LongPollTest, APlacedJobAnswersThePollAndTheNextHeartbeatCarriesIt) {
  const v1::HeartbeatResponse idle = Heartbeat();
  EXPECT_EQ(idle.tasks_size(), 0);
  Answer answer;
  Poll(idle.desired_version(), answer);
  EXPECT_FALSE(answer.answered()) << "nothing new yet";
  EXPECT_EQ(coordinator_->open_long_polls(), 1);

  const std::string id = Submit();  // Placed on w1 at once: the poll is answered.
  absl::StatusOr<uint64_t> version = answer.Get();
  ASSERT_TRUE(version.ok()) << version.status();
  EXPECT_NE(*version, idle.desired_version());
  const v1::HeartbeatResponse busy = Heartbeat();
  ASSERT_EQ(busy.tasks_size(), 1);
  EXPECT_EQ(busy.tasks(0).job_id(), id);
  EXPECT_EQ(busy.desired_version(), *version);

  // Ending the attempt changes the desired state again.
  Answer ended;
  Poll(busy.desired_version(), ended);
  ASSERT_TRUE(coordinator_->Cancel(id).ok());
  absl::StatusOr<uint64_t> after = ended.Get();
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_NE(*after, busy.desired_version());
  EXPECT_EQ(Heartbeat().tasks_size(), 0);
}

TEST_F(LongPollTest, ABehindAgentIsAnsweredAtOnceAndAQuietOneAtTheDeadline) {
  const uint64_t v = Heartbeat().desired_version();
  Answer behind;
  Poll(v + 100, behind);  // It names a version the coordinator is not at.
  EXPECT_EQ(*behind.Get(), v);

  Answer quiet;
  Poll(v, quiet);
  clock_.Advance(absl::Seconds(5));
  coordinator_->Tick();
  EXPECT_FALSE(quiet.answered());
  clock_.Advance(absl::Seconds(6));  // Past its 10 s.
  coordinator_->Tick();
  EXPECT_EQ(*quiet.Get(), v);
}

TEST_F(LongPollTest, AStaleIncarnationIsRefusedAndShutdownAnswersEveryPoll) {
  Answer stale;
  Poll(0, stale, "an-old-incarnation");
  EXPECT_EQ(stale.Get().status().code(), absl::StatusCode::kFailedPrecondition);
  Answer open;
  Poll(Heartbeat().desired_version(), open);
  coordinator_->CloseLongPolls();
  EXPECT_EQ(open.Get().status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace ddp
