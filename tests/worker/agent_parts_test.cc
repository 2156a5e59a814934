// The agent's building blocks on their own: retry backoff, the outbox's bounds, line
// cutting, UTF-8 repair of outgoing messages, the output pump's view of a rank's
// pipes, and telling a stopped trainer.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "common/process.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/agent/agent.h"
#include "worker/agent/backoff.h"
#include "worker/agent/event_buffer.h"
#include "worker/agent/line_cutter.h"
#include "worker/agent/output_pump.h"
#include "worker/agent/proto_utf8.h"
#include "worker/agent/trainer_task.h"

namespace ddp {
namespace {

TEST(BackoffTest, DoublesWithJitterUpToItsCapAndStartsOverOnReset) {
  Backoff backoff(absl::Milliseconds(100), absl::Seconds(1));
  absl::Duration d = absl::Milliseconds(100);
  for (int i = 0; i < 20; ++i) {
    const absl::Duration got = backoff.Next();
    EXPECT_GE(got, d / 2) << "retry " << i;
    EXPECT_LE(got, d) << "retry " << i;
    d = std::min(d * 2, absl::Seconds(1));
  }
  backoff.Reset();
  EXPECT_LE(backoff.Next(), absl::Milliseconds(100));
}

TEST(ReconnectBoundTest, CoversTheChannelsReconnectOurRetryAndTheCall) {
  // The documented figure for the defaults (heartbeat every 1 s, retries capped at
  // 1 s, 500 ms deadline), which the coordinator's recovery grace must cover.
  EXPECT_EQ(ReconnectBound(absl::Seconds(1), AgentOptions().max_backoff,
                           absl::Milliseconds(500)),
            absl::Milliseconds(3500));
  EXPECT_GE(kMaxConnectDelay, kMaxReconnectBackoff * 1.2) << "gRPC's jitter is 20%";
}

TEST(EventBufferTest, DropsTheOldestWhenFullAndCountsThem) {
  EventBuffer buffer(EventBuffer::Limits{.max_entries = 3});
  for (int i = 0; i < 5; ++i) {
    v1::ReportedEvent e;
    e.set_rank(i);
    buffer.Push(e);
  }
  int64_t dropped = 0;
  auto batch = buffer.Take(10, 1 << 20, &dropped);
  ASSERT_EQ(batch.size(), 3u);
  EXPECT_EQ(batch[0].rank(), 2);
  EXPECT_EQ(dropped, 2);
  EXPECT_EQ(buffer.pushed(), 5);
  EXPECT_EQ(buffer.departed(), 5) << "two dropped, three taken";
}

TEST(EventBufferTest, BoundsBytesAndBatchesByBytes) {
  EventBuffer buffer(EventBuffer::Limits{.max_entries = 100, .max_bytes = 10000});
  v1::ReportedEvent e;
  e.mutable_log()->set_text(std::string(990, 'x'));
  const size_t one = WireSize(e);
  for (int i = 0; i < 12; ++i) buffer.Push(e);
  EXPECT_EQ(buffer.size(), 10000 / one) << "the oldest go when the bytes run over";
  int64_t dropped = 0;
  auto batch = buffer.Take(100, 3 * one, &dropped);
  EXPECT_EQ(batch.size(), 3u);
  EXPECT_EQ(dropped, 12 - static_cast<int64_t>(10000 / one));
  batch = buffer.Take(100, one / 2, &dropped);
  EXPECT_EQ(batch.size(), 1u) << "one entry larger than the cap still goes, alone";
}

TEST(LineCutterTest, SplitsLinesAcrossChunksAndCutsLongOnesOnACharacterBoundary) {
  LineCutter cutter(/*max_line=*/8);
  std::vector<std::pair<std::string, int64_t>> lines;
  auto sink = [&](std::string_view l, int64_t cut) { lines.emplace_back(std::string(l), cut); };
  cutter.Feed("ab\ncd", 5, sink);
  cutter.Feed("e\n0123456789", 12, sink);
  cutter.Feed("abc\n", 4, sink);
  // 6 ASCII bytes then a 3-byte euro sign that would straddle the limit.
  cutter.Feed("123456\xE2\x82\xAC-tail\nend", 18, sink);
  cutter.Flush(sink);
  EXPECT_THAT(lines, ::testing::ElementsAre(std::pair<std::string, int64_t>{"ab", 0},
                                            std::pair<std::string, int64_t>{"cde", 0},
                                            std::pair<std::string, int64_t>{"01234567", 5},
                                            std::pair<std::string, int64_t>{"123456", 8},
                                            std::pair<std::string, int64_t>{"end", 0}));
}

// The exit of a rank that flooded its output is reported once its pipes are drained,
// or, after a grace, once they hold nothing unread (a grandchild may keep a pipe open).
// The pump takes a pipe's last chunk out of the pipe before its lines reach the outbox:
// in between, Unread must still say the pump is behind, or the agent would report the
// exit ahead of those lines (it once did, under load, for a trainer's last 30,000).
TEST(OutputPumpTest, LinesReadButNotYetPushedStillCountAsUnread) {
  EventBuffer buffer;
  absl::Notification first_push, release;
  OutputPump pump(&buffer, RealClock(), [&] {
    if (!first_push.HasBeenNotified()) {
      first_push.Notify();
      release.WaitForNotificationWithTimeout(absl::Seconds(20));
    }
  });
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const OutputSource source{"job-1", 1, 0};
  const OutputSource other{"job-1", 1, 1};
  const std::string bytes = "first\nsecond\nlast\n";
  ASSERT_EQ(::write(fds[1], bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  ::close(fds[1]);
  pump.Add(source, -1, fds[0], -1);
  ASSERT_TRUE(first_push.WaitForNotificationWithTimeout(absl::Seconds(20)));
  // The pump holds all three lines (the pipe is empty) and has pushed one.
  EXPECT_EQ(buffer.pushed(), 1);
  EXPECT_TRUE(pump.Unread(source)) << "lines in the pump's hands are not yet delivered";
  EXPECT_FALSE(pump.Drained(source));
  EXPECT_FALSE(pump.Unread(other)) << "only the rank being read is behind";
  release.Notify();
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (!pump.Drained(source) && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(2));
  ASSERT_TRUE(pump.Drained(source));
  EXPECT_FALSE(pump.Unread(source));
  EXPECT_EQ(buffer.pushed(), 3) << "every line was in the outbox before the pipe counted as drained";
}

TEST(RepairUtf8Test, RepairsEveryStringFieldOfANestedMessage) {
  v1::HeartbeatRequest req;
  req.set_worker("node-\xE9");
  v1::TaskStatus* t = req.add_tasks();
  t->set_job_id("job");
  t->set_error("cannot create /data/caf\xE9: Permission denied");
  v1::ReportedEvent ev;
  ev.mutable_event()->mutable_error()->set_message("torn \xE2\x82");  // Two levels down.
  v1::Task task;
  (*task.mutable_env())["K"] = "v\xFF";
  EXPECT_EQ(RepairUtf8(&req), 2);
  EXPECT_EQ(RepairUtf8(&ev), 1);
  EXPECT_EQ(RepairUtf8(&task), 1);
  for (const google::protobuf::Message* m :
       std::vector<const google::protobuf::Message*>{&req, &ev, &task}) {
    std::unique_ptr<google::protobuf::Message> copy(m->New());
    EXPECT_TRUE(copy->ParseFromString(m->SerializeAsString())) << m->DebugString();
  }
  EXPECT_EQ(req.tasks(0).error(), "cannot create /data/caf\xEF\xBF\xBD: Permission denied");
  EXPECT_EQ(RepairUtf8(&req), 0) << "valid already";
}

TEST(ProcessStoppedTest, TellsAStoppedProcessFromARunningOneAndAGoneOne) {
  SpawnOptions o;
  o.argv = {"/bin/sleep", "60"};
  auto proc = Subprocess::Spawn(o);
  ASSERT_TRUE(proc.ok()) << proc.status();
  const int pid = (*proc)->pid();
  EXPECT_FALSE(ProcessStopped(pid));
  (*proc)->Signal(SIGSTOP);
  // The state changes when the kernel delivers the signal: ask until it shows.
  bool stopped = false;
  for (int i = 0; i < 1000 && !stopped; ++i) {
    stopped = ProcessStopped(pid);
    if (!stopped) absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_TRUE(stopped);
  (*proc)->Signal(SIGKILL);  // Works on a stopped process; ~Subprocess reaps it.
  (*proc)->Wait();
  EXPECT_FALSE(ProcessStopped(pid));
}

}  // namespace
}  // namespace ddp
