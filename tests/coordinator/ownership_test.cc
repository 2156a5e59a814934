// Who may do what to a job, and what a worker may say about one, checked in the
// coordinator's logic: job owners (stored, shown, surviving a restart), cancel and
// env rights, the queue limits, and reports from workers about ranks that the rank
// table does not give them. Real SQLite store and event hub, a fake clock, no sockets.
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/jobspec/job_spec.h"
#include "common/jobspec/redact.h"
#include "coordinator/core/coordinator.h"
#include "coordinator/core/event_hub.h"
#include "coordinator/store/state_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/status_matchers.h"
#include "tests/common/test_util.h"
#include "tests/coordinator/coordinator_harness.h"

namespace ddp {
namespace {

using ::ddp::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kSecretJob[] =
    "name: demo\nnodes: \"2\"\nmodel: {mlp: {}}\ndata: {synthetic: {}}\n"
    "train: {batch_size: 4}\n"
    "env:\n  API_KEY: hunter2-secret\n  NCCL_SOCKET_IFNAME: eth0\n  CUDA_LAUNCH_BLOCKING: \"1\"\n";

Caller User(const std::string& name) {
  Caller c;
  c.name = name;
  c.admin = false;
  return c;
}

Caller Admin(const std::string& name) {
  Caller c;
  c.name = name;
  c.admin = true;
  return c;
}

class OwnershipTest : public testing::CoordinatorHarness {
 protected:
  void Register(const std::string& name) {
    CoordinatorHarness::Register(name);
    Heartbeat(name);  // As the agent does right after registering.
  }

  // A job RUNNING on w1 (rank 0) and w2 (rank 1); their tasks.
  std::pair<v1::Task, v1::Task> StartOnW1AndW2(const std::string& id) {
    v1::Task t1, t2;
    for (const auto& t : Heartbeat("w1")) {
      if (t.job_id() == id) t1 = t;
    }
    for (const auto& t : Heartbeat("w2")) {
      if (t.job_id() == id) t2 = t;
    }
    Heartbeat("w1", {Running(t1)});
    Heartbeat("w2", {Running(t2)});
    EXPECT_EQ(coordinator_->GetJob(id)->state(), v1::RUNNING);
    return {t1, t2};
  }
};

TEST_F(OwnershipTest, TheSubmitterIsStoredShownAndSurvivesARestart) {
  auto job = Submit(kSecretJob, User("alice"));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->owner(), "alice");
  EXPECT_EQ(coordinator_->GetJob(job->id())->owner(), "alice");
  EXPECT_EQ(coordinator_->ListJobs(10).at(0).owner(), "alice");
  auto anonymous = Submit(absl::StrCat(kSecretJob, "rdzv_id: other\n"), Caller());
  ASSERT_TRUE(anonymous.ok());
  EXPECT_EQ(anonymous->owner(), "") << "an open coordinator's caller is anonymous";

  ASSERT_TRUE(coordinator_->Flush().ok());
  Open();  // A new coordinator on the same state, recovered.
  EXPECT_EQ(coordinator_->GetJob(job->id())->owner(), "alice");
  EXPECT_THAT(coordinator_->Cancel(job->id(), User("bob")),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("belongs to alice")));
}

TEST_F(OwnershipTest, AUserCancelsOnlyItsOwnJobsAndAnAdminAny) {
  auto alices = Submit(kSecretJob, User("alice"));
  auto bobs = Submit(absl::StrCat(kSecretJob, "rdzv_id: b\n"), User("bob"));
  auto anonymous = Submit(absl::StrCat(kSecretJob, "rdzv_id: c\n"), Caller());
  ASSERT_TRUE(alices.ok() && bobs.ok() && anonymous.ok());

  EXPECT_THAT(coordinator_->Cancel(alices->id(), User("bob")),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr(absl::StrCat("bob may not cancel job ", alices->id(),
                                              ": it belongs to alice"))));
  EXPECT_EQ(coordinator_->GetJob(alices->id())->state(), v1::PENDING) << "untouched";
  EXPECT_THAT(coordinator_->Cancel(anonymous->id(), User("bob")),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("belongs to no one")));

  auto own = coordinator_->Cancel(bobs->id(), User("bob"));
  ASSERT_TRUE(own.ok()) << own.status();
  EXPECT_EQ(own->state(), v1::CANCELLED);
  auto by_admin = coordinator_->Cancel(alices->id(), Admin("root"));
  ASSERT_TRUE(by_admin.ok()) << by_admin.status();
  EXPECT_EQ(by_admin->state(), v1::CANCELLED);
  EXPECT_TRUE(coordinator_->Cancel(anonymous->id(), Caller()).ok())
      << "an open coordinator trusts every caller";
}

TEST_F(OwnershipTest, EnvValuesAreShownOnlyToTheOwnerAndAdmins) {
  auto job = Submit(kSecretJob, User("alice"));
  ASSERT_TRUE(job.ok());
  EXPECT_THAT(job->spec_yaml(), HasSubstr("hunter2-secret")) << "the submitter's own view";
  EXPECT_THAT(coordinator_->GetJob(job->id(), false, User("alice"))->spec_yaml(),
              HasSubstr("hunter2-secret"));
  EXPECT_THAT(coordinator_->GetJob(job->id(), false, Admin("root"))->spec_yaml(),
              HasSubstr("hunter2-secret"));

  const std::string seen = coordinator_->GetJob(job->id(), false, User("bob"))->spec_yaml();
  EXPECT_THAT(seen, Not(HasSubstr("hunter2-secret")));
  EXPECT_THAT(seen, Not(HasSubstr("eth0")));
  // The keys stay, and the rest of the spec still reads as the same job.
  auto spec = ParseJobSpec(seen, "seen.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status() << "\n" << seen;
  EXPECT_EQ(spec->env.at("API_KEY"), kRedacted);
  EXPECT_EQ(spec->env.at("NCCL_SOCKET_IFNAME"), kRedacted);
  EXPECT_EQ(spec->name, "demo");
  EXPECT_EQ(spec->train.batch_size, 4);

  // What the workers get is the real thing: the job's NCCL_* and CUDA_* settings
  // reach its trainers (the agent adds them to the trainers' environment as they are).
  Register("w1");
  Register("w2");
  auto [t1, t2] = StartOnW1AndW2(job->id());
  EXPECT_EQ(t1.env().at("API_KEY"), "hunter2-secret");
  EXPECT_EQ(t1.env().at("NCCL_SOCKET_IFNAME"), "eth0");
  EXPECT_EQ(t2.env().at("CUDA_LAUNCH_BLOCKING"), "1");
}

TEST(RedactSpecEnvTest, KeepsASpecWithoutEnvAndWithholdsWhatItCannotParse) {
  const std::string plain = "name: x\n# a comment\nmodel: {mlp: {}}\n";
  EXPECT_EQ(RedactSpecEnv(plain), plain);
  EXPECT_THAT(RedactSpecEnv("env: {A: secret\n"), Not(HasSubstr("secret")));
  // An alias cannot carry a value past the redaction.
  const std::string aliased = "name: &n job\nenv: {A: *n, B: &b secret}\nrdzv_id: *b\n";
  const std::string out = RedactSpecEnv(aliased);
  EXPECT_THAT(out, HasSubstr("A: <redacted>"));
  EXPECT_THAT(out, HasSubstr("rdzv_id: secret")) << "a field shown to all stays shown";
}

TEST_F(OwnershipTest, AnotherWorkersErrorReportLeavesTheJobAlone) {
  Register("w1");
  Register("w2");
  Register("w3");
  auto job = Submit(kSecretJob, Caller());
  ASSERT_TRUE(job.ok());
  auto [t1, t2] = StartOnW1AndW2(job->id());

  // w3 hosts nothing of the job, yet claims its task failed and its ranks exited.
  v1::TaskStatus forged = Running(t1);
  forged.set_error("disk on fire");
  for (auto& r : *forged.mutable_ranks()) {
    r.set_exited(true);
    r.set_exit_code(1);
  }
  Heartbeat("w3", {forged});
  // w2 claims w1's rank 0 exited (its own rank 1 is left out).
  v1::TaskStatus stolen = forged;
  stolen.clear_error();
  Heartbeat("w2", {stolen});

  auto now = coordinator_->GetJob(job->id());
  EXPECT_EQ(now->state(), v1::RUNNING);
  EXPECT_EQ(now->attempts_size(), 1);
  EXPECT_FALSE(now->attempts(0).ranks(0).exited());
  EXPECT_EQ(coordinator_->stats().foreign_reports, 2);

  // Its rightful worker's report still counts.
  v1::TaskStatus failed = Running(t1);
  failed.set_error("workdir missing");
  Heartbeat("w1", {failed});
  EXPECT_EQ(coordinator_->GetJob(job->id())->state(), v1::FAILED);
}

TEST_F(OwnershipTest, EventsForRanksAWorkerDoesNotHostAreDropped) {
  Register("w1");
  Register("w2");
  auto job = Submit(kSecretJob, Caller());
  ASSERT_TRUE(job.ok());
  StartOnW1AndW2(job->id());

  auto event = [&](v1::ReportEventsRequest& req, int attempt, int rank, const std::string& text,
                   bool error) {
    v1::ReportedEvent* e = req.add_events();
    e->set_job_id(job->id());
    e->set_attempt(attempt);
    e->set_rank(rank);
    if (error) {
      e->mutable_event()->mutable_error()->set_message(text);
    } else {
      e->mutable_log()->set_stream("stdout");
      e->mutable_log()->set_text(text);
    }
  };
  v1::ReportEventsRequest req;
  req.set_worker("w2");  // Hosts rank 1 only.
  req.set_incarnation("w2-inc");
  event(req, 1, 0, "injected into rank 0", false);
  event(req, 1, 0, "rank 0 blew up", true);
  event(req, 7, 1, "an attempt that does not exist", false);
  event(req, 1, 1, "mine", false);
  event(req, 1, 1, "rank 1 says why", true);
  ASSERT_TRUE(coordinator_->ReportEvents(req).ok()) << "the batch is taken, not refused";

  std::vector<std::string> texts;
  for (const auto& l : hub_->Logs(job->id(), 0, std::nullopt, 100)) {
    texts.push_back(absl::StrCat(l.rank(), " ", l.text()));
  }
  EXPECT_THAT(texts, ::testing::Contains("1 mine"));
  for (const std::string& t : texts) EXPECT_THAT(t, Not(HasSubstr("injected")));
  for (const std::string& t : texts) EXPECT_THAT(t, Not(HasSubstr("blew up")));
  auto now = coordinator_->GetJob(job->id());
  EXPECT_EQ(now->attempts(0).ranks(0).error(), "");
  EXPECT_EQ(now->attempts(0).ranks(1).error(), "rank 1 says why");
  EXPECT_EQ(coordinator_->stats().foreign_reports, 3);
}

// A live recovery moves a lost worker's ranks to a spare within the same attempt. When
// the lost worker comes back, it delivers what its ranks printed before it fenced them:
// those lines are the rank's, and kept; its other reports for the moved rank (errors,
// metrics) are not, since the rank is the spare's now.
TEST_F(OwnershipTest, AFormerHostsLastLinesAreKeptAfterItsRankMovedToASpare) {
  Register("w1");
  Register("w2");
  Register("w3");
  auto job = Submit(
      "name: moved\nnodes: 2\nmax_recoveries: 1\nmodel: {mlp: {}}\ndata: {synthetic: {}}\n"
      "train: {batch_size: 4}\n",
      Caller());
  ASSERT_TRUE(job.ok()) << job.status();
  auto [t1, t2] = StartOnW1AndW2(job->id());
  ASSERT_EQ(coordinator_->GetJob(job->id())->attempts(0).ranks(1).worker(), "w2");
  // w2 goes silent past the heartbeat timeout (2.5 s); w1 and the spare w3 beat on.
  for (int i = 0; i < 3; ++i) {
    clock_.Advance(absl::Seconds(1));
    Heartbeat("w1", {Running(t1)});
    Heartbeat("w3");
  }
  coordinator_->Tick();
  const v1::Job moved = *coordinator_->GetJob(job->id());
  ASSERT_EQ(moved.attempts_size(), 1) << moved.ShortDebugString();
  ASSERT_EQ(moved.attempts(0).ranks(1).worker(), "w3") << moved.ShortDebugString();
  ASSERT_EQ(moved.attempts(0).recoveries_size(), 1);

  v1::ReportEventsRequest req;
  req.set_worker("w2");  // Back, with what its rank 1 printed before the fence.
  req.set_incarnation(Incarnation("w2"));
  auto add = [&](int rank) {
    v1::ReportedEvent* e = req.add_events();
    e->set_job_id(job->id());
    e->set_attempt(1);
    e->set_rank(rank);
    return e;
  };
  for (const char* text : {"rank 1 step 41", "rank 1: peer gone, exiting"}) {
    v1::ReportedEvent* e = add(1);
    e->mutable_log()->set_stream("stderr");
    e->mutable_log()->set_text(text);
  }
  add(1)->mutable_event()->mutable_error()->set_message("w2 says rank 1 failed");
  v1::ReportedEvent* step = add(1);
  step->mutable_event()->mutable_step()->set_global_step(999);
  step->mutable_event()->mutable_step()->set_loss(7.0);
  v1::ReportedEvent* injected = add(0);  // Never w2's.
  injected->mutable_log()->set_stream("stdout");
  injected->mutable_log()->set_text("injected into rank 0");
  ASSERT_TRUE(coordinator_->ReportEvents(req).ok());

  std::vector<std::string> texts;
  for (const auto& l : hub_->Logs(job->id(), 0, std::nullopt, 100)) {
    texts.push_back(absl::StrCat(l.attempt(), " ", l.rank(), " ", l.text()));
  }
  EXPECT_THAT(texts, ::testing::Contains("1 1 rank 1 step 41"));
  EXPECT_THAT(texts, ::testing::Contains("1 1 rank 1: peer gone, exiting"));
  for (const std::string& t : texts) EXPECT_THAT(t, Not(HasSubstr("injected")));
  const v1::Job now = *coordinator_->GetJob(job->id());
  EXPECT_EQ(now.attempts(0).ranks(1).error(), "") << "the spare's rank 1 did not fail";
  for (const auto& m : now.metrics()) EXPECT_NE(m.global_step(), 999) << "w2's metric taken";
  EXPECT_EQ(coordinator_->stats().foreign_reports, 3);
}

TEST_F(OwnershipTest, TheQueueIsBoundedInTotalAndPerUser) {
  limits_.queued_jobs = 3;
  limits_.queued_jobs_per_user = 2;
  Open();
  auto submit = [&](const Caller& c, int n) {
    return Submit(absl::StrCat(kSecretJob, "rdzv_id: r", n, "\n"), c);
  };
  ASSERT_TRUE(submit(User("alice"), 1).ok());
  ASSERT_TRUE(submit(User("alice"), 2).ok());
  EXPECT_THAT(submit(User("alice"), 3),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("alice has 2 jobs waiting in the queue, the coordinator's "
                                 "--max-queued-jobs-per-user is 2")));
  auto bobs = submit(User("bob"), 4);
  ASSERT_TRUE(bobs.ok());
  EXPECT_THAT(submit(User("carol"), 5),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("the queue is full: 3 jobs are waiting, the coordinator's "
                                 "--max-queued-jobs is 3")));
  EXPECT_EQ(coordinator_->ListJobs(100).size(), 3u) << "nothing of the refused is kept";
  // A job that leaves the queue makes room.
  ASSERT_TRUE(coordinator_->Cancel(bobs->id(), User("bob")).ok());
  EXPECT_TRUE(submit(User("carol"), 6).ok());
}

TEST_F(OwnershipTest, AJobsOutputIsKeptUpToItsByteLimitAcrossARestart) {
  limits_.log_bytes_per_job = 100;
  Open();
  Register("w1");
  Register("w2");
  auto job = Submit(kSecretJob, Caller());
  ASSERT_TRUE(job.ok());
  StartOnW1AndW2(job->id());
  auto lines = [&](const std::vector<std::string>& texts) {
    v1::ReportEventsRequest req;
    req.set_worker("w1");
    req.set_incarnation("w1-inc");
    for (const std::string& text : texts) {
      v1::ReportedEvent* e = req.add_events();
      e->set_job_id(job->id());
      e->set_attempt(1);
      e->set_rank(0);
      e->mutable_log()->set_stream("stdout");
      e->mutable_log()->set_text(text);
    }
    ASSERT_TRUE(coordinator_->ReportEvents(req).ok());
  };
  auto stored = [&] {
    std::vector<std::string> out;
    for (const auto& l : hub_->Logs(job->id(), 0, std::nullopt, 100)) out.push_back(l.text());
    return out;
  };
  const std::string line30(30, 'x');
  lines({line30, line30, line30, line30 + "!", line30 + "?"});
  std::vector<std::string> kept = stored();
  ASSERT_EQ(kept.size(), 5u);
  EXPECT_EQ(kept[3], line30 + "!") << "the line that reaches the limit is kept";
  EXPECT_THAT(kept[4], HasSubstr("reached the coordinator's --max-log-bytes-per-job (100 "
                                 "bytes): what it prints from now on is not kept"));
  lines({"later"});
  EXPECT_EQ(stored().size(), 5u);

  ASSERT_TRUE(coordinator_->Flush().ok());
  Open();  // Recovered: the count comes back from the stored lines.
  lines({"after a restart"});
  EXPECT_EQ(stored().size(), 5u);
}

TEST_F(OwnershipTest, AnOverlongLineIsCutOnACharacterBoundary) {
  Register("w1");
  Register("w2");
  auto job = Submit(kSecretJob, Caller());
  ASSERT_TRUE(job.ok());
  StartOnW1AndW2(job->id());
  v1::ReportEventsRequest req;
  req.set_worker("w1");
  req.set_incarnation("w1-inc");
  v1::ReportedEvent* e = req.add_events();
  e->set_job_id(job->id());
  e->set_attempt(1);
  e->set_rank(0);
  e->mutable_log()->set_stream("stdout");
  std::string text = "a";
  while (text.size() < (200u << 10)) text += "\u00e9";  // Two bytes each.
  e->mutable_log()->set_text(text);
  ASSERT_TRUE(coordinator_->ReportEvents(req).ok());
  auto kept = hub_->Logs(job->id(), 0, std::nullopt, 10);
  ASSERT_EQ(kept.size(), 1u);
  EXPECT_LE(kept[0].text().size(), (64u << 10) + 60);
  EXPECT_THAT(kept[0].text(), HasSubstr(" more bytes of this line were cut]"));
  EXPECT_EQ(kept[0].text().substr(0, 3), "a\u00e9");
  // "a" and whole two-byte characters: an odd number of bytes before the note.
  const size_t note = kept[0].text().find(" [ddp: ");
  ASSERT_NE(note, std::string::npos);
  EXPECT_EQ(note % 2, 1u) << "a character was split";
  EXPECT_GT(note, (64u << 10) - 2);
}

}  // namespace
}  // namespace ddp
