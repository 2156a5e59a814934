// The facade's small managers over plain records, alone: admission, the store-port
// book, start deadlines, the stall checks' schedule and the drain rules. (The facade's tests drive
// them through the Coordinator; these pin their own rules.)
#include <map>
#include <string>
#include <vector>

#include "coordinator/core/admission.h"
#include "coordinator/core/drain_policy.h"
#include "coordinator/core/port_book.h"
#include "coordinator/core/timers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/status_matchers.h"

namespace ddp {
namespace {

using ::ddp::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

const absl::Time kT0 = absl::FromUnixSeconds(1'800'000'000);

JobRecord Job(const std::string& id, v1::JobState state, const std::string& owner,
              const std::string& rdzv_id) {
  JobRecord rec;
  rec.job.set_id(id);
  rec.job.set_state(state);
  rec.job.set_owner(owner);
  rec.job.set_rdzv_id(rdzv_id);
  return rec;
}

TEST(AdmissionTest, ALiveRdzvIdOrOneBeingStoredIsRefusedAndNamed) {
  Admission admission{UsageLimits()};
  std::map<std::string, JobRecord> jobs;
  jobs["a-1"] = Job("a-1", v1::RUNNING, "alice", "shared");
  jobs["b-1"] = Job("b-1", v1::SUCCEEDED, "bob", "old");
  EXPECT_THAT(admission.Admit(jobs, "shared", "bob"),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("in use by job a-1 (RUNNING)")));
  EXPECT_TRUE(admission.Admit(jobs, "old", "bob").ok()) << "a finished job's rdzv_id is free";
  admission.Reserve("c-1", "new", "carol");
  EXPECT_TRUE(admission.Reserved("c-1"));
  EXPECT_THAT(admission.Admit(jobs, "new", "bob"),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("being submitted right now")));
  admission.Release("c-1", "new", "carol");
  EXPECT_FALSE(admission.Reserved("c-1"));
  EXPECT_TRUE(admission.Admit(jobs, "new", "bob").ok());
}

TEST(AdmissionTest, QueueLimitsCountSubmissionsBeingStored) {
  UsageLimits limits;
  limits.queued_jobs = 3;
  limits.queued_jobs_per_user = 2;
  Admission admission(limits);
  std::map<std::string, JobRecord> jobs;
  jobs["a-1"] = Job("a-1", v1::PENDING, "alice", "a-1");
  jobs["r-1"] = Job("r-1", v1::RUNNING, "alice", "r-1");  // Running: not queued.
  admission.Reserve("a-2", "a-2", "alice");
  EXPECT_THAT(admission.Admit(jobs, "a-3", "alice"),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("alice has 2 jobs waiting in the queue")));
  EXPECT_TRUE(admission.Admit(jobs, "b-1", "bob").ok());
  admission.Reserve("b-1", "b-1", "bob");
  EXPECT_THAT(admission.Admit(jobs, "b-2", "bob"),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("the queue is full: 3 jobs are waiting")));
  // An anonymous caller (an open coordinator) is bounded by the total alone.
  admission.Release("b-1", "b-1", "bob");
  admission.Reserve("x-1", "x-1", "");
  EXPECT_THAT(admission.Admit(jobs, "x-2", ""),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("the queue is full")));
}

TEST(AdmissionTest, CheckSubmissionAppliesTheTimingAndCommandJobPolicy) {
  JobSpec spec;
  spec.rdzv.timeout_s = 2;
  UsageLimits limits;
  EXPECT_THAT(CheckSubmission(spec, "job.yaml", "", Caller(), limits, absl::Seconds(2.5)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("job.yaml: rdzv.timeout_s: must be greater than the "
                                 "coordinator's heartbeat timeout (2.5s)")));
  spec.rdzv.timeout_s = 600;
  EXPECT_THAT(CheckSubmission(spec, "job.yaml", "rel/dir", Caller(), limits, absl::Seconds(2.5)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("must be an absolute path")));
  spec.command = {"python3", "train.py"};
  ASSERT_TRUE(spec.is_command());
  Caller user;
  user.name = "alice";
  user.admin = false;
  limits.command_jobs = UsageLimits::CommandJobs::kAdmins;
  EXPECT_THAT(CheckSubmission(spec, "job.yaml", "/srv", user, limits, absl::Seconds(2.5)),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("only role admin")));
  EXPECT_TRUE(CheckSubmission(spec, "job.yaml", "/srv", Caller(), limits, absl::Seconds(2.5)).ok());
  limits.command_jobs = UsageLimits::CommandJobs::kOff;
  EXPECT_THAT(CheckSubmission(spec, "job.yaml", "/srv", Caller(), limits, absl::Seconds(2.5)),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("--command-jobs=off")));
}

TEST(PortBookTest, APortHeldAtAnAddressIsNotHandedOutAgainUntilReleased) {
  PortBook book;
  std::vector<int32_t> offer = {29500, 29501};
  const int first = book.Pick("w1", "10.0.0.1", offer, kT0);
  EXPECT_EQ(first, 29500);
  EXPECT_THAT(offer, ElementsAre(29501)) << "taken out of the offer";
  book.Hold("10.0.0.1", first);
  std::vector<int32_t> again = {29500};  // The next heartbeat offers it again.
  EXPECT_EQ(book.Pick("w1", "10.0.0.1", again, kT0), 0) << "held by a live attempt";
  EXPECT_TRUE(book.WaitsOn("w1")) << "its next heartbeat with ports retries";
  std::vector<int32_t> elsewhere = {29500};
  EXPECT_EQ(book.Pick("w2", "10.0.0.2", elsewhere, kT0), 29500) << "another address";
  EXPECT_TRUE(book.WaitsOn("w1")) << "another node's port does not end w1's wait";
  book.Release("10.0.0.1", first, kT0);
  EXPECT_EQ(book.held("10.0.0.1"), 0u);
  std::vector<int32_t> freed = {29500};
  EXPECT_EQ(book.Pick("w1", "10.0.0.1", freed, kT0), 29500) << "the offer's only port";
  EXPECT_FALSE(book.WaitsOn("w1")) << "its port came";
  book.Pick("w3", "10.0.0.3", offer = {}, kT0);
  EXPECT_TRUE(book.WaitsOn("w3"));
  book.Forget("w3");
  EXPECT_FALSE(book.WaitsOn("w3"));
}

TEST(PortBookTest, AJustReleasedPortGoesToTheNextAttemptOnlyWhenTheOfferHasNoOther) {
  // A node's --store-ports range offers its few ports in turn: the attempt (or
  // generation) after one that released 29500 gets another port while 29500 cools.
  PortBook book;
  std::vector<int32_t> offer = {29500, 29501, 29502};
  ASSERT_EQ(book.Pick("w1", "10.0.0.1", offer, kT0), 29500);
  book.Hold("10.0.0.1", 29500);
  book.Release("10.0.0.1", 29500, kT0 + absl::Seconds(10));
  offer = {29500, 29501, 29502};
  EXPECT_EQ(book.Pick("w1", "10.0.0.1", offer, kT0 + absl::Seconds(20)), 29501);
  offer = {29500};
  EXPECT_EQ(book.Pick("w1", "10.0.0.1", offer, kT0 + absl::Seconds(20)), 29500)
      << "cooling, but the only port offered";
  offer = {29500, 29501};
  EXPECT_EQ(book.Pick("w1", "10.0.0.1", offer, kT0 + absl::Minutes(3)), 29500)
      << "cooled: the offer's order again";
}

TEST(TimersTest, StartDeadlinesComeDueInOrderOnce) {
  StartDeadlines d;
  d.Add(kT0 + absl::Seconds(10), "b", 1);
  d.Add(kT0 + absl::Seconds(5), "a", 2);
  d.Add(kT0 + absl::Seconds(20), "c", 1);
  EXPECT_TRUE(d.Due(kT0).empty());
  EXPECT_THAT(d.Due(kT0 + absl::Seconds(10)), ElementsAre(Pair("a", 2), Pair("b", 1)));
  EXPECT_TRUE(d.Due(kT0 + absl::Seconds(10)).empty()) << "taken out";
  EXPECT_EQ(d.size(), 1u);
}

TEST(TimersTest, StallChecksRunAtMostOnceAPeriodOverTheWatchedJobs) {
  StallChecks s;
  s.Watch("b");
  s.Watch("a");
  EXPECT_TRUE(s.Due(kT0));
  EXPECT_FALSE(s.Due(kT0 + absl::Milliseconds(500)));
  EXPECT_TRUE(s.Due(kT0 + StallChecks::kPeriod));
  EXPECT_THAT(s.watched(), ElementsAre("a", "b"));
  s.Unwatch("a");
  EXPECT_THAT(s.watched(), ElementsAre("b"));
}

TEST(DrainPolicyTest, WhoMovesAtOnceAndWhoAtTheNextCheckpoint) {
  JobSpec periodic;
  periodic.checkpoint.dir = "/ckpt";
  periodic.checkpoint.every_steps = 50;
  periodic.train.epochs = 3;
  JobSpec none;  // No checkpoints at all.
  v1::Attempt running, starting;
  running.set_state(v1::RUNNING);
  starting.set_state(v1::RENDEZVOUS);
  EXPECT_FALSE(MoveNowReason("w2", v1::DRAIN_WAIT, periodic, starting).has_value());
  EXPECT_THAT(MoveNowReason("w2", v1::DRAIN_NOW, periodic, running).value_or(""),
              HasSubstr("restarting elsewhere from the last checkpoint"));
  EXPECT_THAT(MoveNowReason("w2", v1::DRAIN_NOW, none, running).value_or(""),
              HasSubstr("from the start (it resumes from no checkpoint)"));
  EXPECT_THAT(MoveNowReason("w2", v1::DRAIN_AT_CHECKPOINT, none, starting).value_or(""),
              HasSubstr("moving before its trainers started"));
  EXPECT_FALSE(MoveNowReason("w2", v1::DRAIN_AT_CHECKPOINT, periodic, running).has_value())
      << "a running job waits for its next checkpoint";

  EXPECT_TRUE(ResumesFromPeriodicCheckpoints(periodic));
  EXPECT_FALSE(ResumesFromPeriodicCheckpoints(none));
  v1::TrainerEvent::Checkpoint mid, last;
  mid.set_epoch(1);
  mid.set_global_step(150);
  last.set_epoch(3);  // Taken as the job finishes.
  EXPECT_TRUE(MovesAtCheckpoint(periodic, mid));
  EXPECT_FALSE(MovesAtCheckpoint(periodic, last)) << "nothing left to train elsewhere";
  EXPECT_FALSE(MovesAtCheckpoint(none, mid));
  JobSpec program;
  program.command = {"python3", "train.py"};
  EXPECT_TRUE(MovesAtCheckpoint(program, last)) << "a program's epochs are its own";
  EXPECT_EQ(MoveAtCheckpointReason("w2", mid),
            "worker w2 is draining: moving to other workers from the checkpoint of global step 150");
}

}  // namespace
}  // namespace ddp
