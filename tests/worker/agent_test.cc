// The worker agent against a fake coordinator client (scripted replies, recorded
// requests) and a fake trainer (a shell script), so each behaviour is deterministic.
// Real processes, pipes and signals; the test waits on conditions, never sleeps.
#include "worker/agent/agent.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <functional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/status_matchers.h"
#include "tests/common/test_util.h"

namespace ddp {
namespace {

using ::testing::HasSubstr;

// Records every request with a global sequence number; replies with `desired`.
class FakeCoordinator final : public CoordinatorClient {
 public:
  struct Call {
    int seq;
    std::string method;
    v1::HeartbeatRequest heartbeat;
    v1::ReportEventsRequest events;
    v1::RegisterRequest registration;
    absl::Status result;
  };

  absl::StatusOr<v1::RegisterResponse> Register(const v1::RegisterRequest& req,
                                                absl::Duration) override {
    absl::MutexLock lock(&mu_);
    calls_.push_back({next_++, "Register", {}, {}, req, absl::OkStatus()});
    v1::RegisterResponse resp;
    resp.set_heartbeat_interval_ms(50);
    resp.set_heartbeat_timeout_ms(1000);
    resp.set_rpc_deadline_ms(20);
    return resp;
  }

  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& req,
                                                  absl::Duration) override {
    absl::MutexLock lock(&mu_);
    calls_.push_back({next_++, "Heartbeat", req, {}, {}, absl::OkStatus()});
    if (!heartbeat_errors_.empty()) {
      absl::Status st = heartbeat_errors_.front();
      heartbeat_errors_.erase(heartbeat_errors_.begin());
      return st;
    }
    return desired_;
  }

  absl::Status ReportEvents(const v1::ReportEventsRequest& req, absl::Duration) override {
    absl::MutexLock lock(&mu_);
    auto released = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !hold_reports_; };
    mu_.Await(absl::Condition(&released));
    if (clock_ != nullptr) clock_->Advance(per_report_);  // Each call takes that long.
    absl::Status result;
    if (!report_errors_.empty()) {
      result = report_errors_.front();
      report_errors_.erase(report_errors_.begin());
    }
    calls_.push_back({next_++, "ReportEvents", {}, req, {}, result});
    return result;
  }

  void SetDesired(const std::vector<v1::Task>& tasks) {
    absl::MutexLock lock(&mu_);
    desired_.clear_tasks();
    for (const auto& t : tasks) *desired_.add_tasks() = t;
  }
  void FailNextHeartbeat(absl::Status st) {
    absl::MutexLock lock(&mu_);
    heartbeat_errors_.push_back(std::move(st));
  }
  void FailNextReport(absl::Status st) {
    absl::MutexLock lock(&mu_);
    report_errors_.push_back(std::move(st));
  }
  // ReportEvents blocks until ReleaseReports().
  void HoldReports() {
    absl::MutexLock lock(&mu_);
    hold_reports_ = true;
  }
  void ReleaseReports() {
    absl::MutexLock lock(&mu_);
    hold_reports_ = false;
  }
  // Each ReportEvents call advances `clock` by `d`, as a slow link would.
  void AdvanceOnReport(FakeClock* clock, absl::Duration d) {
    absl::MutexLock lock(&mu_);
    clock_ = clock;
    per_report_ = d;
  }

  // Waits until `pred(calls)` holds (10s at most); returns whether it did.
  bool WaitFor(const std::function<bool(const std::vector<Call>&)>& pred) {
    absl::MutexLock lock(&mu_);
    auto ready = [&] { return pred(calls_); };
    return mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Seconds(10));
  }
  std::vector<Call> calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }

 private:
  absl::Mutex mu_;
  std::vector<Call> calls_ ABSL_GUARDED_BY(mu_);
  int next_ ABSL_GUARDED_BY(mu_) = 0;
  v1::HeartbeatResponse desired_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Status> heartbeat_errors_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Status> report_errors_ ABSL_GUARDED_BY(mu_);
  bool hold_reports_ ABSL_GUARDED_BY(mu_) = false;
  FakeClock* clock_ ABSL_GUARDED_BY(mu_) = nullptr;
  absl::Duration per_report_ ABSL_GUARDED_BY(mu_);
};

// The last status a heartbeat reported for `rank`, if any.
std::optional<v1::LocalRankStatus> RankStatus(const std::vector<FakeCoordinator::Call>& calls,
                                              int rank) {
  for (auto it = calls.rbegin(); it != calls.rend(); ++it) {
    if (it->method != "Heartbeat") continue;
    for (const auto& t : it->heartbeat.tasks()) {
      for (const auto& r : t.ranks()) {
        if (r.rank() == rank) return r;
      }
    }
  }
  return std::nullopt;
}

bool Exited(const std::vector<FakeCoordinator::Call>& calls, int rank) {
  auto s = RankStatus(calls, rank);
  return s.has_value() && s->exited();
}

// The seq of the first heartbeat that reports `rank` exited, or -1.
int ExitSeq(const std::vector<FakeCoordinator::Call>& calls, int rank) {
  for (const auto& call : calls) {
    if (Exited({call}, rank)) return call.seq;
  }
  return -1;
}

// Output lines delivered (by successful ReportEvents calls) from stdout.
int StdoutLines(const std::vector<FakeCoordinator::Call>& calls) {
  int n = 0;
  for (const auto& call : calls) {
    if (!call.result.ok()) continue;
    for (const auto& e : call.events.events()) n += e.has_log() && e.log().stream() == "stdout";
  }
  return n;
}

class AgentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir("agent");
    auto client = std::make_unique<FakeCoordinator>();
    fake_ = client.get();
    client_ = std::move(client);
  }

  void TearDown() override {
    if (agent_) agent_->Stop();
    if (thread_.joinable()) thread_.join();
  }

  // A fake ddp-trainer: a shell script with `body`.
  std::string Trainer(const std::string& body) {
    const std::string path = dir_ + "/fake-trainer.sh";
    testing::WriteFile(path, "#!/bin/sh\n" + body + "\n");
    chmod(path.c_str(), 0755);
    return path;
  }

  void StartAgent(const std::string& trainer, Clock* clock = RealClock()) {
    AgentOptions o;
    o.name = "w1";
    o.advertise_addr = "127.0.0.1";
    o.slots = 2;
    o.cpus = 4;
    o.trainer_path = trainer;
    o.work_dir = dir_ + "/work";
    o.stop_grace = absl::Milliseconds(300);
    o.tick = absl::Milliseconds(10);
    agent_ = std::make_unique<Agent>(o, std::move(client_), clock);
    thread_ = std::thread([this] { result_ = agent_->Run(); });
  }

  v1::Task Task(const std::string& job = "job-a") {
    v1::Task t;
    t.set_job_id(job);
    t.set_attempt(1);
    t.set_spec_yaml("name: fake\n");
    t.set_workdir(dir_);
    t.add_ranks(2);
    t.add_ranks(3);
    t.set_world_size(4);
    t.set_group_rank(1);
    t.set_master_addr("10.0.0.1");
    t.set_master_port(1234);
    (*t.mutable_env())["FOO"] = "bar";
    return t;
  }

  // Waits for a heartbeat that reports a task error and returns that error ("" if
  // none came).
  std::string FirstTaskError() {
    std::string error;
    fake_->WaitFor([&error](const auto& calls) {
      for (const auto& call : calls) {
        for (const auto& task : call.heartbeat.tasks()) {
          if (!task.error().empty()) {
            error = task.error();
            return true;
          }
        }
      }
      return false;
    });
    return error;
  }

  // The task with one rank (2) only.
  v1::Task OneRankTask() {
    v1::Task t = Task();
    t.clear_ranks();
    t.add_ranks(2);
    return t;
  }

  // A trainer that prints `lines` lines, runs `then`, tells the test through a FIFO
  // that everything is written (WaitForTrainerOutput), and runs `last`.
  std::string ChattyTrainer(int lines, const std::string& then, const std::string& last) {
    fifo_ = dir_ + "/written";
    EXPECT_EQ(::mkfifo(fifo_.c_str(), 0600), 0);
    return Trainer(absl::StrCat("seq 1 ", lines, "\n", then, "\necho done > ", fifo_, "\n",
                                last));
  }

  // Returns once the ChattyTrainer has written all its output (10s at most).
  void WaitForTrainerOutput() {
    const int fd = ::open(fifo_.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    pollfd p = {fd, POLLIN, 0};
    EXPECT_EQ(::poll(&p, 1, 10000), 1) << "the trainer did not finish writing";
    char buf[16];
    EXPECT_GT(::read(fd, buf, sizeof(buf)), 0);
    ::close(fd);
  }

  FakeClock fake_clock_;  // For agents that must not see real time pass.
  std::string dir_;
  std::string fifo_;
  std::unique_ptr<CoordinatorClient> client_;
  FakeCoordinator* fake_;
  std::unique_ptr<Agent> agent_;
  std::thread thread_;
  absl::Status result_;
};

TEST_F(AgentTest, RunsEachLocalRankWithTorchrunEnvironmentAndRelaysItsOutput) {
  fake_->SetDesired({Task()});
  StartAgent(Trainer(
      "echo \"env RANK=$RANK LOCAL_RANK=$LOCAL_RANK WORLD_SIZE=$WORLD_SIZE "
      "LOCAL_WORLD_SIZE=$LOCAL_WORLD_SIZE GROUP_RANK=$GROUP_RANK MASTER=$MASTER_ADDR:$MASTER_PORT "
      "FOO=$FOO OMP=$OMP_NUM_THREADS JOB=$DDP_JOB_ID SPEC=$2 CWD=$(pwd)\"\n"
      "echo '{\"type\":\"step\",\"rank\":'$RANK',\"loss\":0.5,\"global_step\":7,\"extra\":[1]}' >&3\n"
      "echo oops >&2"));
  ASSERT_TRUE(fake_->WaitFor([](const auto& c) { return Exited(c, 2) && Exited(c, 3); }));
  auto calls = fake_->calls();
  EXPECT_EQ(calls[0].method, "Register");
  EXPECT_EQ(calls[0].registration.slots(), 2);
  EXPECT_EQ(RankStatus(calls, 2)->exit_code(), 0);
  std::vector<std::string> logs;
  int steps = 0;
  for (const auto& call : calls) {
    for (const auto& e : call.events.events()) {
      if (e.has_log()) logs.push_back(absl::StrCat(e.rank(), " ", e.log().stream(), " ",
                                                   e.log().text()));
      if (e.has_event() && e.event().type() == "step") {
        ++steps;
        EXPECT_DOUBLE_EQ(e.event().loss(), 0.5);
        EXPECT_EQ(e.event().global_step(), 7);
        EXPECT_EQ(e.job_id(), "job-a");
      }
    }
  }
  EXPECT_EQ(steps, 2);
  const std::string spec = dir_ + "/work/job-a/attempt-1/job.yaml";
  EXPECT_THAT(logs, ::testing::Contains(absl::StrCat(
                        "3 stdout env RANK=3 LOCAL_RANK=1 WORLD_SIZE=4 LOCAL_WORLD_SIZE=2 "
                        "GROUP_RANK=1 MASTER=10.0.0.1:1234 FOO=bar OMP=2 JOB=job-a SPEC=",
                        spec, " CWD=", dir_)));
  EXPECT_THAT(logs, ::testing::Contains("2 stderr oops"));
  EXPECT_EQ(testing::ReadFile(spec), "name: fake\n");
}

TEST_F(AgentTest, ATrainersErrorEventIsReportedBeforeItsExit) {
  fake_->SetDesired({Task()});
  StartAgent(Trainer(
      "echo '{\"type\":\"error\",\"message\":\"bad data\",\"retryable\":false}' >&3\nexit 2"));
  ASSERT_TRUE(fake_->WaitFor([](const auto& c) { return Exited(c, 2); }));
  int error_seq = -1, exit_seq = -1;
  for (const auto& call : fake_->calls()) {
    for (const auto& e : call.events.events()) {
      if (e.has_event() && e.event().type() == "error" && e.rank() == 2) error_seq = call.seq;
    }
    if (exit_seq < 0 && Exited({call}, 2)) exit_seq = call.seq;
  }
  ASSERT_GE(error_seq, 0);
  EXPECT_LT(error_seq, exit_seq);
  EXPECT_EQ(RankStatus(fake_->calls(), 2)->exit_code(), 2);
}

TEST_F(AgentTest, StopsUnwantedTrainersWithTermThenKill) {
  fake_->SetDesired({Task()});
  // Ignores SIGTERM: only the SIGKILL after the grace period ends it.
  StartAgent(Trainer("trap '' TERM\necho '{\"type\":\"start\"}' >&3\nwhile :; do sleep 1; done"));
  ASSERT_TRUE(fake_->WaitFor([](const auto& c) {
    auto s = RankStatus(c, 3);
    return s.has_value() && s->pid() != 0;
  }));
  fake_->SetDesired({});
  ASSERT_TRUE(fake_->WaitFor([](const auto& c) { return Exited(c, 2) && Exited(c, 3); }));
  EXPECT_EQ(RankStatus(fake_->calls(), 3)->signal(), SIGKILL);
  // Once reported, the finished task is forgotten: later heartbeats carry no tasks.
  ASSERT_TRUE(fake_->WaitFor([](const auto& c) {
    return c.back().method == "Heartbeat" && c.back().heartbeat.tasks().empty();
  }));
}

TEST_F(AgentTest, RegistersAgainWhenTheCoordinatorForgetsIt) {
  fake_->FailNextHeartbeat(absl::NotFoundError("worker 'w1' is not registered"));
  StartAgent(Trainer("exit 0"));
  ASSERT_TRUE(fake_->WaitFor([](const auto& c) {
    int registers = 0;
    for (const auto& call : c) registers += call.method == "Register";
    return registers == 2;
  }));
  std::string first, second;
  for (const auto& call : fake_->calls()) {
    if (call.method != "Register") continue;
    (first.empty() ? first : second) = call.registration.incarnation();
  }
  EXPECT_EQ(first, second) << "the same agent keeps its incarnation";
}

TEST_F(AgentTest, GivesUpWhenAnotherAgentTookItsName) {
  fake_->FailNextHeartbeat(absl::FailedPreconditionError("stale worker: 'w1' incarnation x"));
  StartAgent(Trainer("exit 0"));
  thread_.join();
  EXPECT_THAT(result_, testing::StatusIs(absl::StatusCode::kFailedPrecondition,
                                         HasSubstr("stale worker")));
}

TEST_F(AgentTest, AMissingWorkdirIsReportedAsATaskError) {
  v1::Task t = Task();
  t.set_workdir("/nonexistent/dir");
  fake_->SetDesired({t});
  StartAgent(Trainer("exit 0"));
  EXPECT_THAT(FirstTaskError(), HasSubstr("workdir /nonexistent/dir does not exist"));
}

TEST_F(AgentTest, ATaskWithoutRanksIsReportedAsATaskError) {
  v1::Task t = Task();
  t.clear_ranks();
  fake_->SetDesired({t});
  StartAgent(Trainer("exit 0"));
  EXPECT_THAT(FirstTaskError(), HasSubstr("has no ranks"));
}

TEST_F(AgentTest, ABatchLostToADeadlineIsResentUnchangedWithItsNumber) {
  fake_->FailNextReport(absl::DeadlineExceededError("deadline exceeded"));
  fake_->SetDesired({OneRankTask()});
  StartAgent(Trainer("echo one\necho two\nexit 0"));
  ASSERT_TRUE(fake_->WaitFor([](const auto& c) { return Exited(c, 2); }));
  std::vector<FakeCoordinator::Call> reports;
  for (const auto& call : fake_->calls()) {
    if (call.method == "ReportEvents") reports.push_back(call);
  }
  ASSERT_GE(reports.size(), 2u);
  EXPECT_FALSE(reports[0].result.ok());
  EXPECT_EQ(reports[0].events.batch_seq(), 1);
  EXPECT_EQ(reports[1].events.SerializeAsString(), reports[0].events.SerializeAsString())
      << "the same batch, with the same number: the coordinator drops it if it had it";
  for (size_t i = 2; i < reports.size(); ++i) {
    EXPECT_EQ(reports[i].events.batch_seq(), reports[i - 1].events.batch_seq() + 1);
  }
  EXPECT_EQ(StdoutLines(fake_->calls()), 2);
}

TEST_F(AgentTest, AChattyTrainerCannotStarveHeartbeats) {
  FakeClock& clock = fake_clock_;
  // Each report takes longer than the heartbeat interval (50ms): a heartbeat is due
  // after every turn.
  fake_->AdvanceOnReport(&clock, absl::Milliseconds(60));
  fake_->HoldReports();  // Lets a backlog of many batches build up.
  fake_->SetDesired({OneRankTask()});
  StartAgent(ChattyTrainer(40000, "", "exec sleep 30"), &clock);
  WaitForTrainerOutput();
  fake_->ReleaseReports();
  ASSERT_TRUE(fake_->WaitFor([](const auto& c) { return StdoutLines(c) == 40000; }));
  int run = 0, longest = 0, heartbeats = 0;
  bool reporting = false;
  for (const auto& call : fake_->calls()) {
    if (call.method == "ReportEvents") {
      reporting = true;
      longest = std::max(longest, ++run);
    } else if (call.method == "Heartbeat" && reporting) {
      ++heartbeats;
      run = 0;
    }
  }
  EXPECT_LE(longest, 4) << "at most four batches before the heartbeat's turn";
  EXPECT_GE(heartbeats, 4) << "heartbeats went on while the backlog drained";
}

TEST_F(AgentTest, AnExitIsReportedOnlyAfterAllTheOutputBeforeIt) {
  FakeClock& clock = fake_clock_;
  fake_->AdvanceOnReport(&clock, absl::Milliseconds(60));
  fake_->HoldReports();
  fake_->SetDesired({OneRankTask()});
  StartAgent(ChattyTrainer(
                 30000, "echo '{\"type\":\"error\",\"message\":\"bad data\"}' >&3", "exit 2"),
             &clock);
  WaitForTrainerOutput();
  fake_->ReleaseReports();
  ASSERT_TRUE(fake_->WaitFor([](const auto& c) { return Exited(c, 2); }));
  const auto calls = fake_->calls();
  int error_seq = -1, last_line_seq = -1;
  for (const auto& call : calls) {
    if (!call.result.ok()) continue;
    for (const auto& e : call.events.events()) {
      if (e.has_event() && e.event().type() == "error") error_seq = call.seq;
      if (e.has_log() && e.log().text() == "30000") last_line_seq = call.seq;
    }
  }
  const int exit_seq = ExitSeq(calls, 2);
  ASSERT_GE(error_seq, 0);
  ASSERT_GE(last_line_seq, 0);
  EXPECT_LT(last_line_seq, exit_seq);
  EXPECT_LT(error_seq, exit_seq) << "the error that explains the exit arrives first";
  EXPECT_EQ(RankStatus(calls, 2)->exit_code(), 2);
}

TEST(EventBufferTest, DropsTheOldestWhenFullAndCountsThem) {
  EventBuffer buffer(/*capacity=*/3);
  for (int i = 0; i < 5; ++i) {
    v1::ReportedEvent e;
    e.set_rank(i);
    buffer.Push(e);
  }
  int64_t dropped = 0;
  auto batch = buffer.Take(10, &dropped);
  ASSERT_EQ(batch.size(), 3u);
  EXPECT_EQ(batch[0].rank(), 2);
  EXPECT_EQ(dropped, 2);
  buffer.PutBack(batch, dropped);  // A failed send keeps order and the count.
  batch = buffer.Take(1, &dropped);
  EXPECT_EQ(batch[0].rank(), 2);
  EXPECT_EQ(dropped, 2);
  EXPECT_EQ(buffer.pushed(), 5);
  EXPECT_EQ(buffer.departed(), 3) << "two dropped, one taken";
}

TEST(TrainerEventParsingTest, ParsesTrainerLinesAndRejectsOthers) {
  v1::TrainerEvent e;
  EXPECT_TRUE(ParseTrainerEvent(
      R"({"type":"epoch","rank":0,"epoch":2,"train_loss":0.5,"val_loss":0.25,"val_accuracy":null,"resumed_from":{"epoch":1}})",
      &e));
  EXPECT_EQ(e.type(), "epoch");
  EXPECT_EQ(e.epoch(), 2);
  EXPECT_TRUE(e.has_val_loss());
  EXPECT_FALSE(e.has_val_accuracy());
  EXPECT_FALSE(ParseTrainerEvent("Traceback (most recent call last):", &e));
  EXPECT_FALSE(ParseTrainerEvent("{not json", &e));
}

}  // namespace
}  // namespace ddp
