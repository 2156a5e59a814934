#include "common/process.h"

#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/ascii.h"
#include "common/json_writer.h"
#include "common/net.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/status_matchers.h"

namespace ddp {
namespace {

using ::ddp::testing::StatusIs;
using ::testing::HasSubstr;

std::string ReadAll(int fd) {
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  return out;
}

TEST(ProcStatTest, ReadsAProcessGroupStateAndStartTimeAndNothingOfAGoneOne) {
  SpawnOptions o;
  o.argv = {"/bin/sleep", "30"};
  auto child = Subprocess::Spawn(o);
  ASSERT_TRUE(child.ok()) << child.status();
  const std::optional<ProcStat> s = ReadProcStat((*child)->pid());
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->pgrp, (*child)->pid()) << "it leads a group of its own";
  const std::optional<ProcStat> self = ReadProcStat(::getpid());
  ASSERT_TRUE(self.has_value());
  EXPECT_EQ(self->pgrp, ::getpgrp());
  EXPECT_EQ(self->state, 'R') << "it is reading its own stat";
  EXPECT_GE(s->start_ticks, self->start_ticks) << "started after this test process";
  (*child)->Signal(SIGKILL);
  (*child)->Wait();
  EXPECT_FALSE(ReadProcStat((*child)->pid()).has_value());
}

TEST(SubprocessTest, CapturesOutputEnvironmentAndExitCode) {
  SpawnOptions o;
  o.argv = {"/bin/sh", "-c", "echo out-$GREETING; echo err >&2; echo ev >&3; exit 7"};
  o.env["GREETING"] = "hi";
  o.capture_stdout = true;
  o.capture_stderr = true;
  o.events_fd = 3;
  DDP_ASSERT_OK_AND_ASSIGN(auto p, Subprocess::Spawn(o));
  EXPECT_EQ(ReadAll(p->stdout_fd()), "out-hi\n");
  EXPECT_EQ(ReadAll(p->stderr_fd()), "err\n");
  EXPECT_EQ(ReadAll(p->events_fd()), "ev\n");
  ExitStatus s = p->Wait();
  EXPECT_EQ(s.exit_code, 7);
  EXPECT_EQ(s.ToString(), "exit 7");
}

TEST(SubprocessTest, MissingProgramIsNotFound) {
  SpawnOptions o;
  o.argv = {"/nonexistent/ddp-trainer"};
  EXPECT_THAT(Subprocess::Spawn(o),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("/nonexistent/ddp-trainer")));
}

TEST(SubprocessTest, MissingWorkingDirectoryIsNotFound) {
  SpawnOptions o;
  o.argv = {"/bin/true"};
  o.cwd = "/nonexistent-dir";
  EXPECT_THAT(Subprocess::Spawn(o),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("/nonexistent-dir")));
}

TEST(SubprocessTest, TerminateEscalatesToKillAfterGrace) {
  SpawnOptions o;
  // Ignores SIGTERM, so only SIGKILL ends it.
  o.argv = {"/bin/sh", "-c", "trap '' TERM; echo ready; while :; do sleep 1; done"};
  o.capture_stdout = true;
  DDP_ASSERT_OK_AND_ASSIGN(auto p, Subprocess::Spawn(o));
  char c;
  ASSERT_EQ(::read(p->stdout_fd(), &c, 1), 1);  // Trap installed.
  ExitStatus s = p->Terminate(absl::Milliseconds(200));
  EXPECT_EQ(s.signal, SIGKILL);
  EXPECT_EQ(s.ToString(), "killed by SIGKILL");
}

TEST(SubprocessTest, ReapingKillsWhatTheChildLeftInItsGroup) {
  SpawnOptions o;
  // The child starts a grandchild in its process group, prints its pid, and exits.
  o.argv = {"/bin/sh", "-c", "sleep 300 >/dev/null 2>&1 & echo $!"};
  o.capture_stdout = true;
  DDP_ASSERT_OK_AND_ASSIGN(auto p, Subprocess::Spawn(o));
  std::string out = ReadAll(p->stdout_fd());
  int grandchild = 0;
  ASSERT_TRUE(absl::SimpleAtoi(absl::StripAsciiWhitespace(out), &grandchild)) << out;
  EXPECT_TRUE(p->Wait().ok());
  // The grandchild was reparented to init (or a subreaper) and killed: give the
  // kernel a moment to deliver, polling rather than sleeping a fixed time.
  bool gone = false;
  for (int i = 0; i < 200 && !gone; ++i) {
    gone = ::kill(grandchild, 0) != 0;
    if (!gone) {
      // A zombie still answers kill(0); check its state in /proc.
      FILE* f = std::fopen(("/proc/" + std::to_string(grandchild) + "/stat").c_str(), "r");
      if (f == nullptr) {
        gone = true;
      } else {
        int pid;
        char comm[256], state = 0;
        if (std::fscanf(f, "%d %255s %c", &pid, comm, &state) == 3 && state == 'Z') gone = true;
        std::fclose(f);
      }
    }
    if (!gone) ::usleep(10000);
  }
  EXPECT_TRUE(gone) << "grandchild " << grandchild << " survived its parent";
}

TEST(LineSplitterTest, SplitsAcrossChunksAndCapsLongLines) {
  LineSplitter s(/*max_line=*/8);
  std::vector<std::string> lines;
  auto add = [&](const std::string& l) { lines.push_back(l); };
  s.Feed("ab\ncd", 5, add);
  s.Feed("e\n0123456789", 12, add);
  s.Flush(add);
  EXPECT_THAT(lines, ::testing::ElementsAre("ab", "cde", "01234567", "89"));
}

TEST(JsonWriterTest, EscapesAndRoundTripsNumbers) {
  JsonObject o;
  o.Add("type", "log").Add("msg", "a\"b\\c\n\x01").Add("n", 3).Add("x", 0.1).Add("ok", true);
  o.Add("nan", std::nan(""));
  EXPECT_EQ(o.str(),
            R"({"type":"log","msg":"a\"b\\c\n\u0001","n":3,"x":0.1,"ok":true,"nan":null})");
}

TEST(NetTest, ParsesHostPortForms) {
  DDP_ASSERT_OK_AND_ASSIGN(HostPort a, ParseHostPort("127.0.0.1:29400"));
  EXPECT_EQ(a.host, "127.0.0.1");
  EXPECT_EQ(a.port, 29400);
  DDP_ASSERT_OK_AND_ASSIGN(HostPort b, ParseHostPort("[::1]:5"));
  EXPECT_EQ(b.host, "::1");
  EXPECT_EQ(b.ToString(), "[::1]:5");
  EXPECT_THAT(ParseHostPort("localhost"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not HOST:PORT")));
  EXPECT_THAT(ParseHostPort("h:99999"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("0..65535")));
}

TEST(NetTest, NamesTheInterfaceOfAnAddress) {
  EXPECT_EQ(InterfaceOfAddress("127.0.0.1"), "lo");
  EXPECT_EQ(InterfaceOfAddress("192.0.2.77"), "");  // TEST-NET-1: no interface here has it.
  EXPECT_EQ(InterfaceOfAddress("node-a"), "");      // Not an address literal.
  EXPECT_EQ(InterfaceOfAddress(""), "");
}

TEST(NetTest, PicksABindablePort) {
  DDP_ASSERT_OK_AND_ASSIGN(int port, PickFreePort("127.0.0.1"));
  EXPECT_GT(port, 0);
  EXPECT_LT(port, 65536);
}

}  // namespace
}  // namespace ddp
