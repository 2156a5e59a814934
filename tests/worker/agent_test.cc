// The worker agent against a fake coordinator client (scripted replies, recorded
// requests) and a fake trainer (a shell script), so each behaviour is deterministic.
// Real processes, pipes and signals; the test waits on conditions, never sleeps.
#include "worker/agent/agent.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <functional>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/ports.h"
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
    if (unreachable_) return absl::DeadlineExceededError("Deadline Exceeded");
    if (quiet_ && req.quiet()) {
      // As the gRPC client over a quiet coordinator's stream: a beat that does not ask
      // returns once written, with news if the coordinator sent some; one that asks
      // gets its own answer, or (muted: the stream open, nothing coming back) fails at
      // its deadline.
      if (!req.answer_now()) {
        if (!news_) return v1::HeartbeatResponse();
        news_ = false;
      } else if (muted_) {
        return absl::DeadlineExceededError("no answer to a heartbeat within 20ms");
      }
      v1::HeartbeatResponse resp = desired_;
      resp.set_acked_seq(req.beat_seq());
      return resp;
    }
    if (!heartbeat_errors_.empty()) {
      absl::Status st = heartbeat_errors_.front();
      heartbeat_errors_.erase(heartbeat_errors_.begin());
      return st;
    }
    return desired_;
  }

  absl::Status ReportEvents(const v1::ReportEventsRequest& req, absl::Duration) override {
    absl::MutexLock lock(&mu_);
    ++reports_started_;
    auto released = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !hold_reports_; };
    mu_.Await(absl::Condition(&released));
    if (clock_ != nullptr) clock_->Advance(per_report_);  // Each call takes that long.
    absl::Status result;
    if (!report_errors_.empty()) {
      result = report_errors_.front();
      report_errors_.erase(report_errors_.begin());
    } else if (reject_ && reject_(req)) {
      // What gRPC answers when the request does not parse on the server.
      result = absl::InternalError("");
    }
    calls_.push_back({next_++, "ReportEvents", {}, req, {}, result});
    return result;
  }

  absl::Status Leave(const v1::LeaveRequest& req, absl::Duration) override {
    absl::MutexLock lock(&mu_);
    Call call{next_++, "Leave", {}, {}, {}, absl::OkStatus()};
    call.registration.set_worker(req.worker());
    call.registration.set_incarnation(req.incarnation());
    leave_reason_ = req.reason();
    calls_.push_back(std::move(call));
    return absl::OkStatus();
  }
  std::string leave_reason() {
    absl::MutexLock lock(&mu_);
    return leave_reason_;
  }

  void SetDesired(const std::vector<v1::Task>& tasks) {
    absl::MutexLock lock(&mu_);
    desired_.clear_tasks();
    for (const auto& t : tasks) *desired_.add_tasks() = t;
  }
  // Heartbeat rate scaling (decision 162): the interval and timeout every answer gives.
  void SetInterval(int64_t interval_ms, int64_t timeout_ms) {
    absl::MutexLock lock(&mu_);
    desired_.set_heartbeat_interval_ms(interval_ms);
    desired_.set_heartbeat_timeout_ms(timeout_ms);
  }
  // Quiet heartbeats (decision 161): before the agent starts.
  void SetQuiet(bool quiet) {
    absl::MutexLock lock(&mu_);
    quiet_ = quiet;
  }
  bool QuietCapable() const override {
    absl::MutexLock lock(&mu_);
    return quiet_;
  }
  void SetOnAnswer(std::function<void()> fn) override {
    absl::MutexLock lock(&mu_);
    on_answer_ = std::move(fn);
  }
  // Beats that ask for an answer get none (the stream stays open, its beats written).
  void MuteAnswers(bool muted) {
    absl::MutexLock lock(&mu_);
    muted_ = muted;
  }
  // A new desired state, sent unasked as a quiet coordinator sends it: the agent is
  // told, and its next beat takes it.
  void SendDesired(const std::vector<v1::Task>& tasks) {
    std::function<void()> tell;
    {
      absl::MutexLock lock(&mu_);
      desired_.clear_tasks();
      for (const auto& t : tasks) *desired_.add_tasks() = t;
      news_ = true;
      tell = on_answer_;
    }
    if (tell) tell();
  }
  // Every heartbeat fails (DEADLINE_EXCEEDED, as across a cut) while set.
  void SetUnreachable(bool unreachable) {
    absl::MutexLock lock(&mu_);
    unreachable_ = unreachable;
  }
  void SetWitnesses(const std::vector<std::string>& witnesses) {
    absl::MutexLock lock(&mu_);
    desired_.clear_witnesses();
    for (const std::string& w : witnesses) desired_.add_witnesses(w);
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
  // ReportEvents answers INTERNAL (unparsable) to every batch `pred` picks.
  void RejectReportsWhere(std::function<bool(const v1::ReportEventsRequest&)> pred) {
    absl::MutexLock lock(&mu_);
    reject_ = std::move(pred);
  }
  // Waits until some ReportEvents call has begun (10s at most).
  bool WaitForAReport() {
    absl::MutexLock lock(&mu_);
    auto started = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return reports_started_ > 0; };
    return mu_.AwaitWithTimeout(absl::Condition(&started), absl::Seconds(10));
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
  mutable absl::Mutex mu_;
  bool quiet_ ABSL_GUARDED_BY(mu_) = false;
  bool muted_ ABSL_GUARDED_BY(mu_) = false;
  bool news_ ABSL_GUARDED_BY(mu_) = false;
  std::function<void()> on_answer_ ABSL_GUARDED_BY(mu_);
  std::vector<Call> calls_ ABSL_GUARDED_BY(mu_);
  std::string leave_reason_ ABSL_GUARDED_BY(mu_);
  int next_ ABSL_GUARDED_BY(mu_) = 0;
  v1::HeartbeatResponse desired_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Status> heartbeat_errors_ ABSL_GUARDED_BY(mu_);
  bool unreachable_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<absl::Status> report_errors_ ABSL_GUARDED_BY(mu_);
  bool hold_reports_ ABSL_GUARDED_BY(mu_) = false;
  int reports_started_ ABSL_GUARDED_BY(mu_) = 0;
  std::function<bool(const v1::ReportEventsRequest&)> reject_ ABSL_GUARDED_BY(mu_);
  FakeClock* clock_ ABSL_GUARDED_BY(mu_) = nullptr;
  absl::Duration per_report_ ABSL_GUARDED_BY(mu_);
};

// Polls `pred` until it holds or `timeout` passes; returns whether it held.
bool WaitUntil(const std::function<bool()>& pred, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!pred()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

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

  void StartAgent(const std::string& trainer, Clock* clock = RealClock(),
                  bool leave_on_exit = false) {
    AgentOptions o;
    o.labels = {{"pool", "team-a"}};
    o.leave_on_exit = leave_on_exit;
    o.name = "w1";
    o.advertise_addr = "127.0.0.1";
    o.slots = 2;
    o.cpus = 4;
    o.trainer_path = trainer;
    o.work_dir = dir_ + "/work";
    o.stop_grace = absl::Milliseconds(300);
    o.tick = absl::Milliseconds(10);
    o.store_ports = store_ports_;
    o.ask_witnesses = [this](const std::vector<std::string>& witnesses, absl::Duration deadline) {
      absl::MutexLock lock(&witness_mu_);
      asked_.push_back({witnesses, deadline});
      if (back_when_asked_) fake_->SetUnreachable(false);
      return witness_answers_;
    };
    agent_ = std::make_unique<Agent>(o, std::move(client_), clock);
    agent_->set_on_reachable([this](bool up) {
      absl::MutexLock lock(&reachable_mu_);
      reachable_.push_back(up);
    });
    thread_ = std::thread([this] { result_ = agent_->Run(); });
  }

  static constexpr char kFakeSpec[] =
      "name: fake\nmodel: {mlp: {}}\ndata: {synthetic: {}}\ntrain: {batch_size: 4}\n";
  v1::Task Task(const std::string& job = "job-a") {
    v1::Task t;
    t.set_job_id(job);
    t.set_attempt(1);
    // A valid built-in trainer job (the agent reads its kind); the fake trainer ignores it.
    t.set_spec_yaml(kFakeSpec);
    t.set_workdir(dir_);
    t.add_ranks(2);
    t.add_ranks(3);
    t.set_world_size(4);
    t.set_group_rank(1);
    t.set_master_addr("10.0.0.1");
    t.set_master_port(1234);
    (*t.mutable_env())["FOO"] = "bar";
    // NCCL's and CUDA's own settings come from the job's env even when the agent's
    // environment has none (its allowlist passes only what the agent has).
    (*t.mutable_env())["NCCL_SOCKET_IFNAME"] = "lo";
    (*t.mutable_env())["CUDA_LAUNCH_BLOCKING"] = "1";
    return t;
  }

  // Waits for a heartbeat that reports a task error and returns that task's status
  // (empty if none came).
  v1::TaskStatus FirstTaskError() {
    v1::TaskStatus failed;
    fake_->WaitFor([&failed](const auto& calls) {
      for (const auto& call : calls) {
        for (const auto& task : call.heartbeat.tasks()) {
          if (!task.error().empty()) {
            failed = task;
            return true;
          }
        }
      }
      return false;
    });
    return failed;
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

  std::vector<bool> Reachability() {
    absl::MutexLock lock(&reachable_mu_);
    return reachable_;
  }

  // The fence (fence.h): what the witnesses answer, and whom the agent asked.
  struct Asked {
    std::vector<std::string> witnesses;
    absl::Duration deadline;
  };
  void AnswerWitnesses(std::vector<absl::StatusOr<bool>> answers) {
    absl::MutexLock lock(&witness_mu_);
    witness_answers_ = std::move(answers);
  }
  std::vector<Asked> Asks() {
    absl::MutexLock lock(&witness_mu_);
    return asked_;
  }
  // Runs a task of two sleeping ranks, then cuts the agent off from the coordinator
  // while the two witnesses answer `answers`.
  void CutOffWhileWitnessesSay(std::vector<absl::StatusOr<bool>> answers) {
    AnswerWitnesses(std::move(answers));
    fake_->SetWitnesses({"10.0.0.8:4000", "10.0.0.9:4000"});
    fake_->SetDesired({Task()});
    StartAgent(Trainer("echo '{\"type\":\"start\"}' >&3\nwhile :; do sleep 1; done"));
    ASSERT_TRUE(fake_->WaitFor([](const auto& c) {
      auto a = RankStatus(c, 2), b = RankStatus(c, 3);
      return a.has_value() && a->pid() != 0 && b.has_value() && b->pid() != 0;
    }));
    cut_at_ = absl::Now();
    fake_->SetUnreachable(true);
  }
  absl::Time cut_at_;

  absl::Mutex witness_mu_;
  std::vector<absl::StatusOr<bool>> witness_answers_ ABSL_GUARDED_BY(witness_mu_);
  std::vector<Asked> asked_ ABSL_GUARDED_BY(witness_mu_);
  // The coordinator answers again as the witnesses are asked (one that took over, or
  // restarted, and answered a witness first).
  bool back_when_asked_ ABSL_GUARDED_BY(witness_mu_) = false;
  FakeClock fake_clock_;  // For agents that must not see real time pass.
  PortRange store_ports_;  // StartAgent's --store-ports (none: free ports of the kernel's).
  absl::Mutex reachable_mu_;
  std::vector<bool> reachable_ ABSL_GUARDED_BY(reachable_mu_);  // on_reachable calls.
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
      "FOO=$FOO NCCL=$NCCL_SOCKET_IFNAME CUDA=$CUDA_LAUNCH_BLOCKING OMP=$OMP_NUM_THREADS "
      "JOB=$DDP_JOB_ID NODE=$DDP_NODE SPEC=$2 CWD=$(pwd)\"\n"
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
      if (e.has_event() && e.event().has_step()) {
        ++steps;
        EXPECT_DOUBLE_EQ(e.event().step().loss(), 0.5);
        EXPECT_EQ(e.event().step().global_step(), 7);
        EXPECT_EQ(e.job_id(), "job-a");
      }
    }
  }
  EXPECT_EQ(steps, 2);
  const std::string spec = dir_ + "/work/job-a/attempt-1/job.yaml";
  EXPECT_THAT(logs, ::testing::Contains(absl::StrCat(
                        "3 stdout env RANK=3 LOCAL_RANK=1 WORLD_SIZE=4 LOCAL_WORLD_SIZE=2 "
                        "GROUP_RANK=1 MASTER=10.0.0.1:1234 FOO=bar NCCL=lo CUDA=1 OMP=2 JOB=job-a "
                        "NODE=w1 SPEC=",
                        spec, " CWD=", dir_)));
  EXPECT_THAT(logs, ::testing::Contains("2 stderr oops"));
  EXPECT_EQ(testing::ReadFile(spec), kFakeSpec);
}

TEST_F(AgentTest, ATrainersErrorEventIsReportedBeforeItsExit) {
  fake_->SetDesired({Task()});
  StartAgent(Trainer(
      "echo '{\"type\":\"error\",\"message\":\"bad data\",\"retryable\":false}' >&3\nexit 2"));
  ASSERT_TRUE(fake_->WaitFor([](const auto& c) { return Exited(c, 2); }));
  int error_seq = -1, exit_seq = -1;
  for (const auto& call : fake_->calls()) {
    for (const auto& e : call.events.events()) {
      if (e.has_event() && e.event().has_error() && e.rank() == 2) error_seq = call.seq;
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

TEST_F(AgentTest, SendsItsLabelsAndLeavesOnlyWhenToldToOnStop) {
  StartAgent(Trainer("exit 0"), RealClock(), /*leave_on_exit=*/true);
  ASSERT_TRUE(fake_->WaitFor([](const auto& c) { return c.size() >= 2; }));
  agent_->Stop("received SIGTERM");
  thread_.join();
  std::vector<std::string> methods;
  std::string incarnation;
  for (const auto& call : fake_->calls()) {
    methods.push_back(call.method);
    if (call.method == "Register") {
      EXPECT_EQ(call.registration.labels().at("pool"), "team-a");
      incarnation = call.registration.incarnation();
    }
    if (call.method == "Leave") {
      EXPECT_EQ(call.registration.incarnation(), incarnation);
    }
  }
  ASSERT_FALSE(methods.empty());
  EXPECT_EQ(methods.back(), "Leave") << "after its last heartbeat";
  int leaving = 0;
  for (const auto& call : fake_->calls()) {
    if (call.method == "Heartbeat" && !call.heartbeat.leaving().empty()) {
      ++leaving;
      EXPECT_EQ(call.heartbeat.leaving(), "received SIGTERM");
    }
  }
  EXPECT_GE(leaving, 1) << "it says it is leaving before it stops its trainers";
  EXPECT_EQ(fake_->leave_reason(), "received SIGTERM");
}

TEST_F(AgentTest, AnAgentNotToldToLeaveDoesNotLeave) {
  StartAgent(Trainer("exit 0"));
  ASSERT_TRUE(fake_->WaitFor([](const auto& c) { return c.size() >= 2; }));
  agent_->Stop();
  thread_.join();
  for (const auto& call : fake_->calls()) {
    EXPECT_NE(call.method, "Leave");
    EXPECT_TRUE(call.heartbeat.leaving().empty());
  }
}

TEST_F(AgentTest, GivesUpWhenAnotherAgentTookItsName) {
  fake_->FailNextHeartbeat(absl::FailedPreconditionError("stale worker: 'w1' incarnation x"));
  StartAgent(Trainer("exit 0"));
  thread_.join();
  EXPECT_THAT(result_, testing::StatusIs(absl::StatusCode::kFailedPrecondition,
                                         HasSubstr("stale worker")));
}

TEST_F(AgentTest, AMissingWorkdirIsThisNodesFault) {
  v1::Task t = Task();
  t.set_workdir("/nonexistent/dir");
  fake_->SetDesired({t});
  StartAgent(Trainer("exit 0"));
  const v1::TaskStatus failed = FirstTaskError();
  EXPECT_THAT(failed.error(), HasSubstr("workdir /nonexistent/dir does not exist"));
  EXPECT_TRUE(failed.node_fault()) << "another node may have it";
}

TEST_F(AgentTest, AMissingTrainerBinaryIsThisNodesFault) {
  fake_->SetDesired({Task()});
  StartAgent(dir_ + "/no-such-trainer");
  const v1::TaskStatus failed = FirstTaskError();
  EXPECT_THAT(failed.error(), HasSubstr("cannot run " + dir_ + "/no-such-trainer"));
  EXPECT_TRUE(failed.node_fault());
  EXPECT_TRUE(failed.ranks().empty()) << "nothing runs";
}

TEST_F(AgentTest, ATaskWithoutRanksIsNoNodesFault) {
  v1::Task t = Task();
  t.clear_ranks();
  fake_->SetDesired({t});
  StartAgent(Trainer("exit 0"));
  const v1::TaskStatus failed = FirstTaskError();
  EXPECT_THAT(failed.error(), HasSubstr("has no ranks"));
  EXPECT_FALSE(failed.node_fault()) << "any node would get the same task";
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

TEST_F(AgentTest, WithStorePortsHeartbeatsOfferTheRangesFreePortsInTurn) {
  DDP_ASSERT_OK_AND_ASSIGN(PortRange block, testing::ClaimPortBlock());
  store_ports_ = {block.first, block.first + 4};
  // The range's second port is taken (a server listens there): it is never offered.
  const int taken = block.first + 1;
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(taken));
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  StartAgent(Trainer("exit 0"));
  ASSERT_TRUE(fake_->WaitFor([](const auto& c) {
    int beats = 0;
    for (const auto& call : c) beats += call.method == "Heartbeat";
    return beats >= 3;
  }));
  std::set<int> offered;
  std::vector<std::vector<int>> beats;
  for (const auto& call : fake_->calls()) {
    if (call.method != "Heartbeat") continue;
    beats.emplace_back(call.heartbeat.free_ports().begin(), call.heartbeat.free_ports().end());
    offered.insert(beats.back().begin(), beats.back().end());
  }
  ::close(fd);
  ASSERT_GE(beats.size(), 3u);
  // Three a beat (kFreePorts), of the range's four free ports: the next beat starts
  // where the last one stopped.
  EXPECT_THAT(beats[0], ::testing::ElementsAre(block.first, block.first + 2, block.first + 3));
  EXPECT_THAT(beats[1], ::testing::ElementsAre(block.first + 4, block.first, block.first + 2));
  EXPECT_EQ(offered, (std::set<int>{block.first, block.first + 2, block.first + 3,
                                    block.first + 4}));
}

TEST_F(AgentTest, HeartbeatsGoOnWhileAReportHangs) {
  fake_->HoldReports();  // The coordinator takes a batch and never answers.
  fake_->SetDesired({OneRankTask()});
  StartAgent(ChattyTrainer(5000, "", "exec sleep 30"));
  WaitForTrainerOutput();
  ASSERT_TRUE(fake_->WaitForAReport());
  const size_t before = fake_->calls().size();
  // Five more heartbeats while the report is still stuck.
  ASSERT_TRUE(fake_->WaitFor([before](const auto& c) {
    int heartbeats = 0;
    for (size_t i = before; i < c.size(); ++i) heartbeats += c[i].method == "Heartbeat";
    return heartbeats >= 5;
  }));
  for (const auto& call : fake_->calls()) EXPECT_NE(call.method, "ReportEvents");
  fake_->ReleaseReports();
  ASSERT_TRUE(fake_->WaitFor([](const auto& c) { return StdoutLines(c) == 5000; }));
}

TEST_F(AgentTest, ABatchTheCoordinatorCannotParseIsSplitAndOnlyTheBadEventIsDropped) {
  // Every batch holding the line "poison" is rejected, as a coordinator rejects a
  // request that does not parse. The agent must not re-send it forever.
  fake_->RejectReportsWhere([](const v1::ReportEventsRequest& req) {
    for (const auto& e : req.events()) {
      if (e.has_log() && e.log().text() == "poison") return true;
    }
    return false;
  });
  fake_->HoldReports();  // So that the poison shares a batch with good lines.
  fake_->SetDesired({OneRankTask()});
  StartAgent(ChattyTrainer(500, "echo poison\nseq 501 1000", "exit 1"));
  WaitForTrainerOutput();
  fake_->ReleaseReports();
  // The exit, and the notice of the loss (sent after the exit may have been).
  ASSERT_TRUE(fake_->WaitFor([](const auto& c) {
    bool notice = false;
    for (const auto& call : c) {
      for (const auto& e : call.events.events()) {
        notice |= call.result.ok() && e.has_log() &&
                  absl::StrContains(e.log().text(), "[ddp-worker] dropped one");
      }
    }
    return Exited(c, 2) && notice;
  }));
  const auto calls = fake_->calls();
  EXPECT_EQ(StdoutLines(calls), 1000) << "every good line";
  int64_t dropped = 0;
  int rejected = 0;
  bool notice = false;
  std::set<int64_t> applied;
  for (const auto& call : calls) {
    if (call.method != "ReportEvents") continue;
    if (!call.result.ok()) {
      ++rejected;
      continue;
    }
    EXPECT_TRUE(applied.insert(call.events.batch_seq()).second) << "numbers are never reused";
    dropped += call.events.dropped();
    for (const auto& e : call.events.events()) {
      notice |= e.has_log() && absl::StrContains(e.log().text(), "[ddp-worker] dropped one "
                                                                 "output line");
    }
  }
  EXPECT_EQ(dropped, 1) << "the loss is counted in a later batch";
  EXPECT_TRUE(notice) << "and told to the job's log";
  EXPECT_LE(rejected, 2 * 12 + 2) << "halving isolates the bad line in log2(n) steps";
  // Numbers increase in the order the coordinator applied the batches.
  int64_t last = 0;
  for (const auto& call : calls) {
    if (call.method != "ReportEvents" || !call.result.ok()) continue;
    EXPECT_GT(call.events.batch_seq(), last);
    last = call.events.batch_seq();
  }
}

TEST_F(AgentTest, InvalidUtf8AndHugeLinesReachTheCoordinatorRepairedAndCut) {
  fake_->SetDesired({OneRankTask()});
  // Latin-1 on stdout, a torn multi-byte character on stderr, an event whose message
  // has a Latin-1 byte, and a 10 MB line without a newline until its end.
  StartAgent(Trainer(
      "printf 'caf\\351\\n'\n"
      "printf 'euro \\342\\202\\n' >&2\n"
      "printf '{\"type\":\"error\",\"message\":\"bad header \\351\",\"retryable\":false}\\n' >&3\n"
      "head -c 10000000 /dev/zero | tr '\\0' x\n"
      "echo\n"
      "echo after\n"
      "exit 2"));
  ASSERT_TRUE(fake_->WaitFor([](const auto& c) { return Exited(c, 2); }));
  std::vector<std::string> texts;
  std::string error;
  for (const auto& call : fake_->calls()) {
    if (call.method != "ReportEvents" || !call.result.ok()) continue;
    // What the coordinator would parse: proto3 rejects invalid UTF-8 in strings.
    v1::ReportEventsRequest parsed;
    EXPECT_TRUE(parsed.ParseFromString(call.events.SerializeAsString()));
    EXPECT_LE(call.events.ByteSizeLong(), 1u << 20) << "batches stay far below 4 MB";
    for (const auto& e : call.events.events()) {
      if (e.has_log()) texts.push_back(e.log().text());
      if (e.has_event() && e.event().has_error()) error = e.event().error().message();
    }
  }
  EXPECT_THAT(texts, ::testing::Contains("caf\xEF\xBF\xBD"));
  EXPECT_THAT(texts, ::testing::Contains("euro \xEF\xBF\xBD"));
  EXPECT_EQ(error, "bad header \xEF\xBF\xBD");
  const std::string cut = std::string(kMaxLineBytes, 'x') + " [ddp-worker: line cut, " +
                          std::to_string(10000000 - kMaxLineBytes) + " more bytes]";
  EXPECT_THAT(texts, ::testing::Contains(cut));
  EXPECT_THAT(texts, ::testing::Contains("after"));
  EXPECT_EQ(RankStatus(fake_->calls(), 2)->exit_code(), 2);
}

TEST_F(AgentTest, ReachabilityFollowsTheHeartbeats) {
  fake_->FailNextHeartbeat(absl::UnavailableError("connection refused"));
  fake_->FailNextHeartbeat(absl::UnavailableError("connection refused"));
  StartAgent(Trainer("exit 0"));
  // Registered but the first heartbeats fail: not reachable; then they succeed.
  ASSERT_TRUE(fake_->WaitFor([this](const auto&) {
    const auto r = Reachability();
    return !r.empty() && r.back();
  }));
  EXPECT_THAT(Reachability(), ::testing::ElementsAre(false, true));
  fake_->FailNextHeartbeat(absl::NotFoundError("worker 'w1' is not registered"));
  ASSERT_TRUE(fake_->WaitFor([this](const auto&) { return Reachability().size() == 4; }));
  EXPECT_THAT(Reachability(), ::testing::ElementsAre(false, true, false, true));
}

TEST_F(AgentTest, ATaskThatCannotStartIsReportedAtOnce) {
  // The fake clock never moves, so no heartbeat ever falls due: only the agent's own
  // "tell it now" can carry the error.
  v1::Task t = Task();
  t.set_workdir("/nonexistent/dir");
  fake_->SetDesired({t});
  StartAgent(Trainer("exit 0"), &fake_clock_);
  EXPECT_THAT(FirstTaskError().error(), HasSubstr("workdir /nonexistent/dir does not exist"));
}

// Reports advance the clock, so the exit's drain grace (2 s) passes while the pump
// still works through the flood: the exit waits for lines that are out of the pipe but
// not yet in the outbox too (OutputPumpTest in agent_parts_test.cc pins that window).
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
      if (e.has_event() && e.event().has_error()) error_seq = call.seq;
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

// The fake coordinator's timing (interval 50 ms, timeout 1 s, deadline 20 ms) plans
// the witnesses' question for 140 ms after the last good heartbeat, 450 ms for answers
// (50 ms, and half the 800 ms the timeout leaves).
TEST_F(AgentTest, ACutOffWorkerKillsItsRanksWhenAWitnessStillReachesTheCoordinator) {
  CutOffWhileWitnessesSay({false, true});
  ASSERT_TRUE(WaitUntil([this] { return agent_->stats().fences == 1; }, absl::Seconds(10)));
  const absl::Duration fenced_after = absl::Now() - cut_at_;
  EXPECT_LT(fenced_after, absl::Seconds(1)) << "before the coordinator's heartbeat timeout";
  ASSERT_TRUE(WaitUntil([this] { return agent_->stats().trainers_running == 0; },
                        absl::Seconds(10)));
  ASSERT_EQ(Asks().size(), 1u);
  EXPECT_THAT(Asks()[0].witnesses, ::testing::ElementsAre("10.0.0.8:4000", "10.0.0.9:4000"));
  EXPECT_EQ(Asks()[0].deadline, absl::Milliseconds(450));
  // Back: the ranks' exits reach the coordinator, killed at once (no SIGTERM first).
  fake_->SetUnreachable(false);
  ASSERT_TRUE(fake_->WaitFor([](const auto& c) { return Exited(c, 2) && Exited(c, 3); }));
  EXPECT_EQ(RankStatus(fake_->calls(), 2)->signal(), SIGKILL);
  EXPECT_EQ(RankStatus(fake_->calls(), 3)->signal(), SIGKILL);
}

TEST_F(AgentTest, AWitnessReachingACoordinatorThisWorkerReachesTooKillsNothing) {
  {
    absl::MutexLock lock(&witness_mu_);
    back_when_asked_ = true;
  }
  CutOffWhileWitnessesSay({true, true});
  ASSERT_TRUE(WaitUntil([this] { return Asks().size() == 1; }, absl::Seconds(10)));
  ASSERT_TRUE(WaitUntil([this]() -> bool { return Reachability().back(); }, absl::Seconds(10)))
      << "the heartbeat tried before fencing got through";
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(agent_->stats().fences, 0);
  EXPECT_EQ(agent_->stats().trainers_running, 2);
}

TEST_F(AgentTest, AWorkerCutOffFromEveryoneKillsItsRanks) {
  CutOffWhileWitnessesSay({absl::UnavailableError("no route"), absl::DeadlineExceededError("")});
  ASSERT_TRUE(WaitUntil([this] { return agent_->stats().fences == 1; }, absl::Seconds(10)));
  ASSERT_TRUE(WaitUntil([this] { return agent_->stats().trainers_running == 0; },
                        absl::Seconds(10)));
}

TEST_F(AgentTest, ACoordinatorOutageTheWitnessesSeeTooLeavesTheRanksRunning) {
  CutOffWhileWitnessesSay({false, absl::UnavailableError("no route")});
  ASSERT_TRUE(WaitUntil([this] { return Asks().size() == 1; }, absl::Seconds(10)));
  // Asked once per outage, however long it lasts; the ranks run on.
  absl::SleepFor(absl::Milliseconds(500));
  EXPECT_EQ(Asks().size(), 1u);
  EXPECT_EQ(agent_->stats().fences, 0);
  EXPECT_EQ(agent_->stats().trainers_running, 2);
  // The coordinator back, then away again: a new outage, asked again.
  fake_->SetUnreachable(false);
  ASSERT_TRUE(WaitUntil([this]() -> bool { return Reachability().back(); }, absl::Seconds(10)));
  fake_->SetUnreachable(true);
  ASSERT_TRUE(WaitUntil([this] { return Asks().size() == 2; }, absl::Seconds(10)));
  EXPECT_EQ(agent_->stats().trainers_running, 2);
}

// Beats that went out quiet (written, no answer asked) and those that asked, from
// call `from` on.
std::pair<int, int> QuietAndAsked(const std::vector<FakeCoordinator::Call>& calls, size_t from) {
  std::pair<int, int> n{0, 0};
  for (size_t i = from; i < calls.size(); ++i) {
    if (calls[i].method != "Heartbeat" || !calls[i].heartbeat.quiet()) continue;
    (calls[i].heartbeat.answer_now() ? n.second : n.first) += 1;
  }
  return n;
}

// Quiet heartbeats (decision 161). The fake's timing (50 ms, 1 s, 20 ms) lets the
// coordinator answer one beat in QuietBeatsPerAck's k; the witnesses are asked on the
// plan for that k.
TEST_F(AgentTest, AQuietAgentFencesWhenAnswersStopThoughItsStreamStaysOpen) {
  const int k = QuietBeatsPerAck(absl::Milliseconds(50), absl::Seconds(1), absl::Milliseconds(20));
  ASSERT_GT(k, 1);
  const FencePlan plan =
      PlanFencing(absl::Milliseconds(50), absl::Seconds(1), absl::Milliseconds(20), k);
  fake_->SetQuiet(true);
  AnswerWitnesses({true});  // A witness still hears the coordinator.
  fake_->SetWitnesses({"10.0.0.8:4000"});
  fake_->SetDesired({Task()});
  StartAgent(Trainer("echo '{\"type\":\"start\"}' >&3\nwhile :; do sleep 1; done"));
  ASSERT_TRUE(fake_->WaitFor([](const auto& c) {
    auto a = RankStatus(c, 2), b = RankStatus(c, 3);
    return a.has_value() && a->pid() != 0 && b.has_value() && b->pid() != 0;
  }));
  // Steady state: most beats ask for nothing.
  const size_t steady = fake_->calls().size();
  ASSERT_TRUE(WaitUntil([&] { return QuietAndAsked(fake_->calls(), steady).first >= 3 * k; },
                        absl::Seconds(10)));
  const auto [quiet, asked] = QuietAndAsked(fake_->calls(), steady);
  EXPECT_GT(quiet, asked) << "one beat in " << k << " asks";
  EXPECT_GT(agent_->stats().quiet_beats, 0);
  EXPECT_EQ(agent_->stats().fences, 0);

  fake_->MuteAnswers(true);
  const size_t muted = fake_->calls().size();
  ASSERT_TRUE(WaitUntil([this] { return agent_->stats().fences == 1; }, absl::Seconds(10)))
      << "an open stream that brings no answer is not being heard";
  ASSERT_TRUE(WaitUntil([this] { return agent_->stats().trainers_running == 0; },
                        absl::Seconds(10)));
  EXPECT_GT(QuietAndAsked(fake_->calls(), muted).first, 0)
      << "quiet beats were written after the answers stopped, and counted for nothing";
  ASSERT_EQ(Asks().size(), 1u);
  EXPECT_EQ(Asks()[0].deadline, plan.ask_deadline);
  EXPECT_FALSE(Reachability().back());
}

TEST_F(AgentTest, AQuietAgentTakesANewDesiredStateAtOnce) {
  fake_->SetQuiet(true);
  StartAgent(Trainer("echo '{\"type\":\"start\"}' >&3\nwhile :; do sleep 1; done"));
  ASSERT_TRUE(WaitUntil([this] { return agent_->stats().quiet_beats >= 3; }, absl::Seconds(10)));
  // Sent unasked between beats: the agent beats at once to take it and starts the
  // task's ranks (without the wake it would wait for its next beat).
  fake_->SendDesired({Task()});
  ASSERT_TRUE(fake_->WaitFor([](const auto& c) {
    auto a = RankStatus(c, 2), b = RankStatus(c, 3);
    return a.has_value() && a->pid() != 0 && b.has_value() && b->pid() != 0;
  }));
  EXPECT_EQ(agent_->stats().tasks_started, 1);
  // The beat reporting the new pids asked for its answer: what it tells must be heard.
  bool told_and_asked = false;
  for (const auto& call : fake_->calls()) {
    if (call.method != "Heartbeat") continue;
    for (const auto& t : call.heartbeat.tasks()) {
      for (const auto& r : t.ranks()) {
        if (r.pid() != 0 && call.heartbeat.answer_now()) told_and_asked = true;
      }
    }
  }
  EXPECT_TRUE(told_and_asked);
}

// Heartbeat rate scaling (decision 162): the agent beats at the interval the answers
// give and says so in every beat; an answer whose interval is not below its timeout
// (no coordinator sends one) changes nothing.
TEST_F(AgentTest, BeatsAtTheIntervalTheAnswersGiveAndSaysWhichItUses) {
  auto says = [](const std::vector<FakeCoordinator::Call>& calls, int64_t ms) {
    int n = 0;
    for (const auto& c : calls) {
      if (c.method == "Heartbeat" && c.heartbeat.heartbeat_interval_ms() == ms) ++n;
    }
    return n;
  };
  StartAgent(Trainer("exit 0"));
  ASSERT_TRUE(fake_->WaitFor([&](const auto& c) { return says(c, 50) >= 2; }))
      << "Register's 50 ms";
  fake_->SetInterval(100, 1000);
  ASSERT_TRUE(fake_->WaitFor([&](const auto& c) { return says(c, 100) >= 2; }));
  fake_->SetInterval(2000, 1000);  // Out of order: kept at 100 ms.
  const size_t before = fake_->calls().size();
  ASSERT_TRUE(fake_->WaitFor([&](const auto& c) {
    int after = 0;
    for (size_t i = before; i < c.size(); ++i) after += c[i].method == "Heartbeat";
    return after >= 3;
  }));
  const auto calls = fake_->calls();
  for (size_t i = before; i < calls.size(); ++i) {
    if (calls[i].method != "Heartbeat") continue;
    EXPECT_EQ(calls[i].heartbeat.heartbeat_interval_ms(), 100) << "call " << i;
  }
  EXPECT_EQ(says(calls, 2000), 0);
}

TEST_F(AgentTest, AnAgentWhoseClientHasNoQuietBeatsWaitsForEveryAnswer) {
  StartAgent(Trainer("exit 0"));
  ASSERT_TRUE(fake_->WaitFor([](const auto& c) {
    int beats = 0;
    for (const auto& call : c) beats += call.method == "Heartbeat";
    return beats >= 5;
  }));
  for (const auto& call : fake_->calls()) {
    if (call.method != "Heartbeat") continue;
    EXPECT_FALSE(call.heartbeat.quiet());
    EXPECT_EQ(call.heartbeat.beat_seq(), 0u);
  }
  EXPECT_EQ(agent_->stats().quiet_beats, 0);
}

}  // namespace
}  // namespace ddp
