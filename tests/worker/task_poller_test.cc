// The agent's long poll against a scripted coordinator client: it waits for a known
// version, reports news once, backs off after errors and gives up on UNIMPLEMENTED.
#include "worker/agent/task_poller.h"

#include <atomic>
#include <deque>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace ddp {
namespace {

// Answers WaitForTasks from a script; a call with nothing scripted blocks until
// cancelled, as a quiet coordinator would hold it.
class ScriptedClient final : public CoordinatorClient {
 public:
  absl::StatusOr<v1::RegisterResponse> Register(const v1::RegisterRequest&,
                                                absl::Duration) override {
    return absl::UnimplementedError("not in this test");
  }
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest&,
                                                  absl::Duration) override {
    return absl::UnimplementedError("not in this test");
  }
  absl::Status ReportEvents(const v1::ReportEventsRequest&, absl::Duration) override {
    return absl::UnimplementedError("not in this test");
  }
  absl::StatusOr<v1::WaitForTasksResponse> WaitForTasks(const v1::WaitForTasksRequest& req,
                                                        absl::Duration) override {
    absl::MutexLock lock(&mu_);
    seen.push_back(req.desired_version());
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return cancelled_ || !script.empty();
    };
    mu_.Await(absl::Condition(&ready));
    if (script.empty()) return absl::CancelledError("cancelled");
    absl::StatusOr<v1::WaitForTasksResponse> out = script.front();
    script.pop_front();
    return out;
  }
  void CancelWaits() override {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
  }
  void Push(absl::StatusOr<v1::WaitForTasksResponse> r) {
    absl::MutexLock lock(&mu_);
    script.push_back(std::move(r));
  }
  std::vector<uint64_t> Seen() {
    absl::MutexLock lock(&mu_);
    return seen;
  }

 private:
  absl::Mutex mu_;
  std::deque<absl::StatusOr<v1::WaitForTasksResponse>> script ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> seen ABSL_GUARDED_BY(mu_);
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

v1::WaitForTasksResponse Version(uint64_t v) {
  v1::WaitForTasksResponse r;
  r.set_desired_version(v);
  return r;
}

TEST(TaskPollerTest, ReportsNewsOnceAndWaitsForTheNextKnownVersion) {
  ScriptedClient client;
  std::atomic<int> news{0};
  absl::Notification first_news;
  TaskPoller::Options o;
  o.worker = "w1";
  o.incarnation = "i1";
  o.retry = absl::Milliseconds(10);
  TaskPoller poller(o, &client, [&] {
    if (++news == 1) first_news.Notify();
  });
  client.Push(Version(5));  // Same as known: nothing new, poll again.
  client.Push(Version(6));  // News.
  poller.Known(5);
  ASSERT_TRUE(first_news.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(client.Seen(), (std::vector<uint64_t>{5, 5}));
  // Until the agent's heartbeat tells it version 6, it does not poll again: it holds no
  // version to poll with (it dropped it before announcing the news).
  EXPECT_TRUE(poller.waiting_for_version());
  EXPECT_EQ(client.Seen().size(), 2u);
  client.Push(absl::UnavailableError("coordinator down"));
  client.Push(Version(9));
  poller.Known(6);
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (news.load() < 2 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(news.load(), 2);
  EXPECT_EQ(client.Seen(), (std::vector<uint64_t>{5, 5, 6, 6})) << "retried after the error";
  poller.Known(9);
  poller.Stop();  // Cancels the blocked call; returns.
}

TEST(TaskPollerTest, GivesUpOnACoordinatorWithoutLongPolls) {
  ScriptedClient client;
  client.Push(absl::UnimplementedError("WaitForTasks"));
  std::atomic<int> news{0};
  TaskPoller::Options o;
  o.worker = "w1";
  o.incarnation = "i1";
  TaskPoller poller(o, &client, [&] { ++news; });
  poller.Known(1);
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (!poller.gave_up() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  ASSERT_TRUE(poller.gave_up());
  EXPECT_EQ(client.Seen().size(), 1u) << "one call, then heartbeats only";
  EXPECT_EQ(poller.polls(), 1);
  EXPECT_EQ(news.load(), 0);
}

}  // namespace
}  // namespace ddp
