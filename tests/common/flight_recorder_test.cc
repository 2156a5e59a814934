// The flight recorder's writer and reader (common/contract/flight_recorder.h): what a
// rank writes is what its worker reads back from the file, the ring keeps the newest
// collectives in order, and a reader racing the writer never sees a torn entry.
#include "common/contract/flight_recorder.h"

#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <string>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"

namespace ddp::flight {
namespace {

using ::testing::HasSubstr;

TEST(FlightRecorderTest, WhatTheRankWritesIsWhatItsWorkerReads) {
  const std::string path = ::ddp::testing::MakeTempDir("flight") + "/flight.2";
  auto rec = Recorder::OpenFile(path, 2);
  ASSERT_TRUE(rec.ok()) << rec.status();
  Recorder& r = **rec;
  r.SetStep(41);
  const uint64_t a = r.Enter(Kind::kBroadcast, 4096);
  r.Exit(a);
  r.SetPhase(Phase::kCompute);
  const uint64_t b = r.Enter(Kind::kAllReduce, 1200000, 3);
  EXPECT_EQ(a, 1u);
  EXPECT_EQ(b, 2u);

  absl::StatusOr<Snapshot> s = ReadFile(path);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->pid, ::getpid());
  EXPECT_EQ(s->rank, 2);
  EXPECT_EQ(s->phase, Phase::kCompute);
  EXPECT_EQ(s->global_step, 41);
  EXPECT_EQ(s->entered, 2u);
  EXPECT_EQ(s->completed, 1u);
  ASSERT_EQ(s->recent.size(), 2u);
  EXPECT_GT(s->recent[0].end_ns, 0);
  ASSERT_NE(s->OldestInFlight(), nullptr);
  EXPECT_EQ(Describe(*s->OldestInFlight()), "all-reduce #2 (bucket 3, 1.2 MB)");
  EXPECT_EQ(Describe(s->recent[0]), "broadcast #1 (4.1 kB)");

  r.Exit(b);
  r.SetPhase(Phase::kData);
  s = ReadFile(path);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->OldestInFlight(), nullptr);
  EXPECT_EQ(s->Last()->seq, 2u);
  EXPECT_EQ(s->completed, 2u);
  EXPECT_EQ(s->phase, Phase::kData);
  EXPECT_STREQ(PhaseName(s->phase), "data loading");
  EXPECT_EQ(PhaseNameOfLabel(PhaseLabel(Phase::kData)), "data loading");
  EXPECT_THAT(PhaseNameOfLabel("warp"), HasSubstr("unknown phase (warp)"));
}

TEST(FlightRecorderTest, TheRingKeepsTheNewestCollectivesInOrder) {
  Recorder r;
  for (int i = 0; i < 200; ++i) r.Exit(r.Enter(Kind::kAllReduce, 8 * (i + 1), i % 5));
  const uint64_t open = r.Enter(Kind::kBarrier, 0);
  const Snapshot s = r.Read();
  ASSERT_EQ(s.recent.size(), kCapacity);
  EXPECT_EQ(s.recent.front().seq, 201 - kCapacity + 1);
  EXPECT_EQ(s.recent.back().seq, open);
  for (size_t i = 1; i < s.recent.size(); ++i) EXPECT_EQ(s.recent[i].seq, s.recent[i - 1].seq + 1);
  EXPECT_EQ(s.OldestInFlight()->seq, open);
  EXPECT_EQ(r.Describe(open), "barrier #201");
  EXPECT_EQ(r.Describe(3), "collective #3") << "left the ring";
}

TEST(FlightRecorderTest, PhaseScopesNestAndRestore) {
  Recorder r;
  EXPECT_EQ(r.phase(), Phase::kStarting);
  {
    PhaseScope data(&r, Phase::kData);
    EXPECT_EQ(r.phase(), Phase::kData);
    {
      PhaseScope wait(&r, Phase::kCommWait);
      EXPECT_EQ(r.phase(), Phase::kCommWait);
    }
    EXPECT_EQ(r.phase(), Phase::kData);
  }
  EXPECT_EQ(r.phase(), Phase::kStarting);
  PhaseScope none(nullptr, Phase::kData);  // No recorder: nothing to do.
}

// A reader beside a writer that never stops: every entry read is whole (its bytes are
// the ones written with its sequence number), and sequence numbers only grow.
TEST(FlightRecorderTest, AReaderRacingTheWriterNeverSeesATornEntry) {
  const std::string path = ::ddp::testing::MakeTempDir("flight-race") + "/flight.0";
  auto rec = Recorder::OpenFile(path, 0);
  ASSERT_TRUE(rec.ok()) << rec.status();
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    Recorder& r = **rec;
    // Fields tied to the sequence number (the only writer's: n is the next seq), so
    // that a read mixing two entries of one slot shows.
    for (uint64_t n = 1; !stop.load(); ++n) {
      r.Exit(r.Enter(Kind::kAllReduce, n * 8, static_cast<int>(n % 7)));
    }
  });
  uint64_t last_entered = 0;
  int reads = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
  while (std::chrono::steady_clock::now() < until) {
    absl::StatusOr<Snapshot> s = ReadFile(path);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_GE(s->entered, last_entered);
    last_entered = s->entered;
    for (size_t i = 0; i < s->recent.size(); ++i) {
      const Collective& c = s->recent[i];
      EXPECT_EQ(c.kind, Kind::kAllReduce);
      EXPECT_EQ(c.bytes, c.seq * 8);
      EXPECT_EQ(c.bucket, static_cast<int>(c.seq % 7));
      EXPECT_LE(c.seq, s->entered);
      if (c.end_ns != 0) EXPECT_GE(c.end_ns, c.start_ns) << "seq " << c.seq;
      if (i > 0) EXPECT_GT(c.seq, s->recent[i - 1].seq);
    }
    ++reads;
  }
  stop = true;
  writer.join();
  EXPECT_GT(reads, 10);
  EXPECT_GT(last_entered, kCapacity);
}

TEST(FlightRecorderTest, WhatIsNotARecorderIsNamed) {
  const std::string dir = ::ddp::testing::MakeTempDir("flight-bad");
  EXPECT_EQ(ReadFile(dir + "/none").status().code(), absl::StatusCode::kNotFound);
  const std::string junk = dir + "/junk";
  std::ofstream(junk) << std::string(sizeof(Layout) + 10, 'x');
  absl::StatusOr<Snapshot> s = ReadFile(junk);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("is not a ddp flight recorder"));
  std::ofstream(dir + "/short") << "x";
  EXPECT_EQ(ReadFile(dir + "/short").status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<std::unique_ptr<Recorder>> bad = Recorder::OpenFile(dir + "/no/such/dir/f", 0);
  EXPECT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("no/such/dir/f"));
}

}  // namespace
}  // namespace ddp::flight
