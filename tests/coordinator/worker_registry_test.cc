// The worker registry alone: liveness from the deadline heap, incarnations, and the
// slot counts the scheduler reads.
#include "coordinator/core/worker_registry.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/status_matchers.h"

namespace ddp {
namespace {

using ::ddp::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

const absl::Time kT0 = absl::FromUnixSeconds(1'800'000'000);
constexpr absl::Duration kTimeout = absl::Seconds(10);

v1::RegisterRequest Req(const std::string& name, int slots = 1, const std::string& inc = "i1",
                        int gpus = 0) {
  v1::RegisterRequest r;
  r.set_worker(name);
  r.set_incarnation(inc);
  r.set_address("10.0.0.1");
  r.set_slots(slots);
  r.set_gpus(gpus);
  for (int g = 0; g < gpus; ++g) {  // What a fake NVML inventory would report.
    v1::GpuDevice* d = r.add_gpu_devices();
    d->set_index(g);
    d->set_uuid(absl::StrCat("GPU-", name, "-", g));
    d->set_model("NVIDIA H100 80GB HBM3");
    d->set_memory_bytes(int64_t{80} << 30);
  }
  return r;
}

google::protobuf::RepeatedPtrField<v1::TaskStatus> Tasks(
    std::vector<std::pair<TaskKey, std::vector<bool>>> tasks) {  // (key, exited per rank)
  google::protobuf::RepeatedPtrField<v1::TaskStatus> out;
  for (const auto& [key, exited] : tasks) {
    v1::TaskStatus* t = out.Add();
    t->set_job_id(key.first);
    t->set_attempt(key.second);
    for (size_t i = 0; i < exited.size(); ++i) {
      v1::LocalRankStatus* r = t->add_ranks();
      r->set_rank(static_cast<int>(i));
      r->set_pid(100 + static_cast<int>(i));
      r->set_exited(exited[i]);
    }
  }
  return out;
}

class WorkerRegistryTest : public ::testing::Test {
 protected:
  WorkerRegistry registry_{kTimeout};
};

TEST_F(WorkerRegistryTest, AWorkerSilentPastTheTimeoutIsLostOnceAndBackOnItsNextHeartbeat) {
  registry_.Register(Req("w1"), kT0);
  registry_.Register(Req("w2"), kT0);
  WorkerRecord& w1 = **registry_.Check("w1", "i1");
  for (int s = 1; s <= 15; ++s) {
    registry_.Heartbeat(w1, kT0 + absl::Seconds(s));
    const std::vector<std::string> lost = registry_.Expire(kT0 + absl::Seconds(s));
    if (s == 11) {
      EXPECT_THAT(lost, ElementsAre("w2")) << "silent for 11s > 10s";
    } else {
      EXPECT_THAT(lost, IsEmpty()) << "at " << s << "s";
    }
  }
  EXPECT_EQ(registry_.Summary().lost(), 1);
  EXPECT_EQ(registry_.Summary().lost_events(), 1);
  WorkerRecord& w2 = **registry_.Check("w2", "i1");
  EXPECT_TRUE(registry_.Heartbeat(w2, kT0 + absl::Seconds(16))) << "it came back";
  EXPECT_EQ(registry_.Summary().alive(), 2);
  EXPECT_THAT(registry_.Expire(kT0 + absl::Seconds(25)), IsEmpty());
  EXPECT_THAT(registry_.Expire(kT0 + absl::Seconds(27)), ElementsAre("w1", "w2"));
}

TEST_F(WorkerRegistryTest, ExpiryLooksOnlyAtWorkersDueNotAtEveryWorker) {
  for (int i = 0; i < 1000; ++i) registry_.Register(Req(absl::StrCat("w", i)), kT0);
  // Each worker has one deadline entry; heartbeats add none, so a tick before any is
  // due pops nothing, and one after pops each entry once (re-arming the live ones).
  for (int i = 0; i < 1000; ++i) {
    registry_.Heartbeat(**registry_.Check(absl::StrCat("w", i), "i1"), kT0 + absl::Seconds(5));
  }
  EXPECT_THAT(registry_.Expire(kT0 + absl::Seconds(9)), IsEmpty());
  EXPECT_THAT(registry_.Expire(kT0 + absl::Seconds(11)), IsEmpty()) << "all heard from at 5s";
  EXPECT_EQ(registry_.Expire(kT0 + absl::Seconds(16)).size(), 1000u);
}

TEST_F(WorkerRegistryTest, StaleAndUnknownWorkersAreRefused) {
  registry_.Register(Req("w1", 1, "old"), kT0);
  EXPECT_THAT(registry_.Check("ghost", "x"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("register first")));
  auto reg = registry_.Register(Req("w1", 1, "new"), kT0);
  EXPECT_TRUE(reg.restarted);
  EXPECT_FALSE(reg.is_new);
  EXPECT_THAT(registry_.Check("w1", "old"),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("stale worker")));
  EXPECT_TRUE(registry_.Check("w1", "new").ok());
}

TEST_F(WorkerRegistryTest, CountsNodesBySizeAndByFreeSlots) {
  registry_.Register(Req("small", 1), kT0);
  registry_.Register(Req("big", 4), kT0);
  registry_.Register(Req("gpu", 8, "i1", /*gpus=*/4), kT0);
  EXPECT_EQ(registry_.CapableNodes(1), 3);
  EXPECT_EQ(registry_.CapableNodes(4), 2);
  EXPECT_EQ(registry_.CapableNodes(5), 1);
  EXPECT_EQ(registry_.CapableNodes(0), 3) << "auto: any node with a free slot";
  EXPECT_EQ(registry_.CapableNodes(NodeNeed(2, /*gpus=*/true)), 1) << "only gpu has GPUs";
  EXPECT_EQ(registry_.Summary().slots(), 13);

  registry_.Assign("big", {"j", 1}, {{0, 1, 2}, 0});
  EXPECT_EQ(registry_.EligibleNodes(1), 3);
  EXPECT_EQ(registry_.EligibleNodes(2), 1) << "big has 1 free slot now";
  EXPECT_EQ(registry_.CapableNodes(4), 2) << "capacity does not change with load";
  registry_.Assign("gpu", {"j", 1}, {{3, 4, 5, 6, 7}, 1});
  EXPECT_EQ(registry_.EligibleNodes(0), 3) << "auto takes what is free: 1 slot will do";
  EXPECT_EQ(registry_.EligibleNodes(NodeNeed(3, true)), 1);
  EXPECT_EQ(registry_.EligibleNodes(NodeNeed(4, true)), 0)
      << "the CPU task took slots, not GPUs, but a GPU rank needs a slot too: 3 free";
  EXPECT_EQ(registry_.Summary().free_slots(), 1 + 1 + 3);
  EXPECT_EQ(registry_.Summary().busy_workers(), 2);
  std::vector<std::string> offers;
  for (const NodeOffer& o : registry_.Offers(1)) offers.push_back(o.worker);
  EXPECT_THAT(offers, ElementsAre("big", "gpu", "small")) << "name order";
}

TEST_F(WorkerRegistryTest, SlotsOfAnEndedAttemptStayBusyUntilItsTrainersAreShownGone) {
  registry_.Register(Req("w1", 2), kT0);
  WorkerRecord& w = **registry_.Check("w1", "i1");
  const TaskKey key{"j", 1};
  registry_.Assign("w1", key, {{0, 1}, 0});
  registry_.Dispatch(w, key, 2);
  EXPECT_EQ(w.free_slots, 0);
  EXPECT_FALSE(registry_.Report(w, Tasks({{key, {false, false}}})).counts_changed)
      << "its trainers run: still busy";
  EXPECT_FALSE(registry_.Unassign("w1", key)) << "the attempt ended, its trainers still run";
  EXPECT_EQ(w.free_slots, 0);
  EXPECT_TRUE(registry_.Report(w, Tasks({{key, {true, false}}})).counts_changed);
  EXPECT_EQ(w.free_slots, 1);
  EXPECT_TRUE(registry_.Report(w, Tasks({{key, {true, true}}})).counts_changed);
  EXPECT_EQ(w.free_slots, 2);
}

TEST_F(WorkerRegistryTest, ATaskHandedOutButNeverReportedHoldsItsSlotsForOneHeartbeat) {
  registry_.Register(Req("w1", 1), kT0);
  WorkerRecord& w = **registry_.Check("w1", "i1");
  const TaskKey key{"j", 1};
  registry_.Assign("w1", key, {{0}, 0});
  registry_.Dispatch(w, key, 1);
  registry_.Unassign("w1", key);  // Cancelled before the worker reported it.
  EXPECT_EQ(w.free_slots, 0) << "the reply may have reached it";
  EXPECT_TRUE(registry_.Report(w, Tasks({})).counts_changed) << "it never got it";
  EXPECT_EQ(w.free_slots, 1);
}

TEST_F(WorkerRegistryTest, ARepeatedReportChangesNothing) {
  registry_.Register(Req("w1", 1), kT0);
  WorkerRecord& w = **registry_.Check("w1", "i1");
  const TaskKey key{"j", 1};
  registry_.Assign("w1", key, {{0}, 0});
  auto first = registry_.Report(w, Tasks({{key, {false}}}));
  EXPECT_EQ(first.changed.size(), 1u);
  auto again = registry_.Report(w, Tasks({{key, {false}}}));
  EXPECT_TRUE(again.changed.empty());
  EXPECT_FALSE(again.counts_changed);
  EXPECT_EQ(registry_.Report(w, Tasks({{key, {true}}})).changed.size(), 1u);
}

TEST_F(WorkerRegistryTest, ARestoredWorkerCountsAsCapacityButTakesNothingUntilItChecksIn) {
  v1::Worker info;
  info.set_name("w1");
  info.set_incarnation("i1");
  info.set_slots(2);
  registry_.Restore(info, kT0, kTimeout);
  EXPECT_EQ(registry_.CapableNodes(2), 1);
  EXPECT_EQ(registry_.EligibleNodes(1), 0);
  EXPECT_TRUE(registry_.Heartbeat(**registry_.Check("w1", "i1"), kT0 + absl::Seconds(1)));
  EXPECT_EQ(registry_.EligibleNodes(2), 1);
}

TEST_F(WorkerRegistryTest, ALostWorkerIsNeitherCapacityNorOffered) {
  registry_.Register(Req("w1", 2), kT0);
  registry_.Register(Req("w2", 2), kT0 + absl::Seconds(5));
  EXPECT_THAT(registry_.Expire(kT0 + absl::Seconds(11)), ElementsAre("w1"));
  EXPECT_EQ(registry_.CapableNodes(1), 1);
  EXPECT_EQ(registry_.EligibleNodes(1), 1);
  EXPECT_EQ(registry_.Offers(1).size(), 1u);
  EXPECT_EQ(registry_.Summary().slots(), 2);
}

TEST_F(WorkerRegistryTest, ARestoredWorkerHasItsGraceToCheckInThenTheHeartbeatTimeout) {
  v1::Worker info;
  info.set_name("w1");
  info.set_incarnation("i1");
  info.set_slots(1);
  registry_.Restore(info, kT0, absl::Seconds(30));  // Longer than kTimeout (10 s).
  EXPECT_THAT(registry_.Expire(kT0 + absl::Seconds(20)), IsEmpty());
  // Checked in: from now on a silence of kTimeout loses it, the grace is spent.
  registry_.Heartbeat(**registry_.Check("w1", "i1"), kT0 + absl::Seconds(21));
  EXPECT_THAT(registry_.Expire(kT0 + absl::Seconds(31) + absl::Milliseconds(1)),
              ElementsAre("w1"));
  // Another, never checking in: lost once its grace is over.
  info.set_name("w2");
  registry_.Restore(info, kT0, absl::Seconds(30));
  EXPECT_THAT(registry_.Expire(kT0 + absl::Seconds(29)), IsEmpty());
  EXPECT_THAT(registry_.Expire(kT0 + absl::Seconds(31)), ElementsAre("w2"));
}

TEST_F(WorkerRegistryTest, AQuarantinedWorkerIsCapacityButNotOfferedUntilItsQuarantineEnds) {
  registry_.Register(Req("w1", 2), kT0);
  registry_.Register(Req("w2", 2), kT0);
  WorkerRecord& w1 = **registry_.Check("w1", "i1");
  EXPECT_EQ(registry_.Quarantine(w1, {"j", 1}, "workdir /x does not exist", kT0),
            WorkerRegistry::kQuarantineFirst);
  EXPECT_TRUE(registry_.Quarantined(w1));
  EXPECT_EQ(w1.quarantine.reason, "workdir /x does not exist");
  // Still capacity (a job waits for it rather than turning unschedulable)...
  EXPECT_EQ(registry_.CapableNodes(2), 2);
  // ...but it takes nothing new.
  EXPECT_EQ(registry_.EligibleNodes(2), 1);
  ASSERT_EQ(registry_.Offers(2).size(), 1u);
  EXPECT_EQ(registry_.Offers(2)[0].worker, "w2");
  // The same attempt reported again (every heartbeat carries it) counts once.
  EXPECT_EQ(registry_.Quarantine(w1, {"j", 1}, "again", kT0 + absl::Seconds(1)),
            absl::ZeroDuration());
  EXPECT_THAT(registry_.LiftQuarantines(kT0 + absl::Seconds(29)), IsEmpty());
  EXPECT_THAT(registry_.LiftQuarantines(kT0 + absl::Seconds(30)), ElementsAre("w1"));
  EXPECT_FALSE(registry_.Quarantined(w1));
  EXPECT_EQ(registry_.EligibleNodes(2), 2);
}

TEST_F(WorkerRegistryTest, QuarantinesDoubleWithEachFaultInARowUpToTenMinutesAndResetOnSuccess) {
  registry_.Register(Req("w1"), kT0);
  WorkerRecord& w1 = **registry_.Check("w1", "i1");
  std::vector<int64_t> lengths;
  absl::Time now = kT0;
  for (int attempt = 1; attempt <= 7; ++attempt) {
    const absl::Duration d = registry_.Quarantine(w1, {"j", attempt}, "fault", now);
    lengths.push_back(absl::ToInt64Seconds(d));
    now += d;
    EXPECT_THAT(registry_.LiftQuarantines(now), ElementsAre("w1"));
  }
  EXPECT_THAT(lengths, ElementsAre(30, 60, 120, 240, 480, 600, 600));
  // A trainer that exits 0 there ends the streak: the next fault starts over.
  registry_.NodeWorked(w1);
  EXPECT_EQ(registry_.Quarantine(w1, {"j", 8}, "fault", now), absl::Seconds(30));
}

TEST_F(WorkerRegistryTest, WitnessesAreTheNextLiveWorkersWithAHealthPortAroundTheRing) {
  for (const char* name : {"w1", "w2", "w3", "w4", "w5", "w6"}) {
    v1::RegisterRequest r = Req(name);
    r.set_address(absl::StrCat("10.0.0.", name + 1));
    r.set_witness_port(std::string(name) == "w4" ? 0 : 7000);  // w4 serves none.
    registry_.Register(r, kT0);
  }
  v1::RegisterRequest v6 = Req("w7");
  v6.set_address("fd00::7");
  v6.set_witness_port(7000);
  registry_.Register(v6, kT0);
  // w3 falls silent and is lost; the others keep beating.
  for (const char* name : {"w1", "w2", "w4", "w5", "w6", "w7"}) {
    registry_.Heartbeat(**registry_.Check(name, "i1"), kT0 + absl::Seconds(8));
  }
  EXPECT_THAT(registry_.Expire(kT0 + kTimeout + absl::Seconds(1)), ElementsAre("w3"));
  EXPECT_THAT(registry_.Witnesses("w2", 4),
              ElementsAre("10.0.0.5:7000", "10.0.0.6:7000", "[fd00::7]:7000", "10.0.0.1:7000"));
  // Around the end of the ring, never the asker itself, and no more than there are.
  EXPECT_THAT(registry_.Witnesses("w7", 2), ElementsAre("10.0.0.1:7000", "10.0.0.2:7000"));
  EXPECT_THAT(registry_.Witnesses("w1", 10),
              ElementsAre("10.0.0.2:7000", "10.0.0.5:7000", "10.0.0.6:7000", "[fd00::7]:7000"));
}

TEST_F(WorkerRegistryTest, WitnessesAreLookedForAmongABoundedNumberOfNeighbours) {
  // 1,000 workers, none serving a health service but the last: every heartbeat asks
  // for witnesses, so the registry is not walked whole for each.
  for (int i = 0; i < 1000; ++i) {
    v1::RegisterRequest r = Req(absl::StrFormat("w%04d", i));
    r.set_address("10.0.0.1");
    r.set_witness_port(i == 999 ? 7000 : 0);
    registry_.Register(r, kT0);
  }
  EXPECT_THAT(registry_.Witnesses("w0990", 4), ElementsAre("10.0.0.1:7000"))
      << "within reach";
  EXPECT_THAT(registry_.Witnesses("w0000", 4), ::testing::IsEmpty())
      << "past the first " << WorkerRegistry::kWitnessScan << " neighbours";
}

}  // namespace
}  // namespace ddp
