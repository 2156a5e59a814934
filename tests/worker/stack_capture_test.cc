// The stacks of a rank (decision 194): py-spy's and eu-stack's output parsed and
// summarized (where the main thread is, whether it waits in a collective), the text the
// job's log gets, and both tools run on a live Python process blocked in a function of
// its own (py-spy from .venv-tools, eu-stack from Debian's elfutils: the test command
// installs both).
#include "worker/agent/stack_capture.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/process.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"

namespace ddp {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kPySpyRank1[] = R"(Process 4242: /usr/bin/python3 stall_program.py 40 1 20 /tmp/f
Python v3.11.2 (/usr/bin/python3.11)

Thread 4242 (idle): "MainThread"
    block_forever (stall_program.py:21)
    main (stall_program.py:33)
    <module> (stall_program.py:43)
Thread 4250 (idle): "Thread-1"
    wait (threading.py:320)
    run (threading.py:975)
)";

constexpr char kPySpyRank0[] = R"(Process 4240: /usr/bin/python3 stall_program.py 40 1 20 /tmp/f
Python v3.11.2 (/usr/bin/python3.11)

Thread 0x7F1E2C3B4740 (idle): "MainThread"
    all_reduce (torch/distributed/distributed_c10d.py:1404)
    wrapper (torch/distributed/c10d_logger.py:72)
    main (stall_program.py:36)
    <module> (stall_program.py:43)
)";

constexpr char kEuStack[] = R"(PID 4300 - process
TID 4300:
#0  0x00007f5e90f402ad read
#1  0x00007f5e9112ee11 std::__basic_file<char>::xsgetn(char*, long)
#2  0x00000000004a1b2c ddp::SyntheticSource::Next(long)
#3  0x00000000005e25b4
TID 4301:
#0  0x00007f5e90ecf1d6 __futex_abstimed_wait_common64
#1  0x00007f5e9225d7aa c10d::ProcessGroupGloo::runLoop(int)
TID 4302:
#0  0x00007f5e90ecf1d6 __futex_abstimed_wait_common64
#1  0x00007f5e9225d7aa c10d::ProcessGroupGloo::runLoop(int)
)";

TEST(StackParseTest, PySpyThreadsAndFramesInnermostFirst) {
  const std::vector<ThreadStack> t = ParsePySpyDump(kPySpyRank1);
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0].tid, 4242);
  EXPECT_EQ(t[0].name, "MainThread");
  ASSERT_EQ(t[0].frames.size(), 3u);
  EXPECT_EQ(t[0].frames[0].function, "block_forever");
  EXPECT_EQ(t[0].frames[0].location, "stall_program.py:21");
  EXPECT_EQ(t[0].frames[2].function, "<module>");
  EXPECT_EQ(t[1].name, "Thread-1");
  // A pthread id, not a native one: unknown tid, found by its name.
  EXPECT_EQ(ParsePySpyDump(kPySpyRank0)[0].tid, 0);
}

TEST(StackParseTest, EuStackThreadsWithArgumentListsCut) {
  const std::vector<ThreadStack> t = ParseEuStack(kEuStack);
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t[0].tid, 4300);
  ASSERT_EQ(t[0].frames.size(), 4u);
  EXPECT_EQ(t[0].frames[0].function, "read");
  EXPECT_EQ(t[0].frames[1].function, "std::__basic_file<char>::xsgetn");
  EXPECT_EQ(t[0].frames[2].function, "ddp::SyntheticSource::Next");
  EXPECT_EQ(t[0].frames[3].function, "");  // No symbol.
  EXPECT_EQ(t[1].frames[1].function, "c10d::ProcessGroupGloo::runLoop");
  EXPECT_TRUE(ParseEuStack("eu-stack: dwfl_linux_proc_report pid 1: No such process\n").empty());
}

TEST(StackSummaryTest, APythonRankOutsideAnyCollectiveIsWhereItsOwnCodeIs) {
  const v1::StackSummary s = Summarize(4242, ParsePySpyDump(kPySpyRank1), {});
  EXPECT_FALSE(s.in_collective());
  EXPECT_EQ(s.where(), "block_forever (stall_program.py:21)");
}

TEST(StackSummaryTest, APythonRankInTorchDistributedWaitsInItsCollective) {
  const v1::StackSummary s = Summarize(4240, ParsePySpyDump(kPySpyRank0), {});
  EXPECT_TRUE(s.in_collective());
  EXPECT_EQ(s.where(), "all_reduce (torch/distributed/distributed_c10d.py:1404)");
}

TEST(StackSummaryTest, ANativeMainThreadIsJudgedAloneIdleGlooThreadsAreNotACollective) {
  const v1::StackSummary s = Summarize(4300, {}, ParseEuStack(kEuStack));
  EXPECT_FALSE(s.in_collective()) << "the Gloo worker threads idle in every process";
  EXPECT_EQ(s.where(), "read < ... < ddp::SyntheticSource::Next");
  const std::string waiting = R"(TID 7:
#0  0x1 __futex_abstimed_wait_common64
#1  0x2 gloo::transport::tcp::UnboundBuffer::waitRecv(int*, std::chrono::duration<long>)
#2  0x3 ddp::Comm::Wait(ddp::PendingSum&)
)";
  const v1::StackSummary w = Summarize(7, {}, ParseEuStack(waiting));
  EXPECT_TRUE(w.in_collective());
}

TEST(StackFormatTest, TheMainThreadFirstAndLikeThreadsFoldedWithinTheCap) {
  const std::string text =
      FormatStacks(4300, ParsePySpyDump(kPySpyRank1), ParseEuStack(kEuStack), 16 * 1024);
  EXPECT_THAT(text, HasSubstr("Python (py-spy), 2 threads:\n  Thread 4242 \"MainThread\" "
                              "(main):\n    block_forever (stall_program.py:21)\n"));
  EXPECT_THAT(text, HasSubstr("Native (eu-stack), 3 threads:\n  Thread 4300 (main):\n"
                              "    #0 read\n"));
  EXPECT_THAT(text, HasSubstr("  Threads 4301, 4302 (2, one stack):\n    #0 "
                              "__futex_abstimed_wait_common64\n    #1 "
                              "c10d::ProcessGroupGloo::runLoop"));
  const std::string cut =
      FormatStacks(4300, ParsePySpyDump(kPySpyRank1), ParseEuStack(kEuStack), 200);
  EXPECT_LE(cut.size(), 200u + 40);
  EXPECT_THAT(cut, HasSubstr("... (cut at 200 bytes)"));
  EXPECT_THAT(cut, HasSubstr("block_forever"));
}

// A Python process of our own blocked reading a FIFO inside hold_here(): both tools
// attach, and the summary and the text say where it is.
TEST(TakeStacksTest, BothToolsOnALivePythonProcess) {
  StackTools tools;
  tools.py_spy = FindTool(DDP_PY_SPY);
  tools.eu_stack = FindTool("eu-stack");
  ASSERT_FALSE(tools.py_spy.empty())
      << DDP_PY_SPY << " is missing: run scripts/install_test_tools.sh";
  ASSERT_FALSE(tools.eu_stack.empty())
      << "eu-stack is missing: run scripts/install_deps.sh (Debian's elfutils)";
  const std::string dir = testing::MakeTempDir("stack-capture");
  const std::string fifo = dir + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string script = dir + "/hold.py";
  testing::WriteFile(script, absl::StrCat("def hold_here(path):\n",
                                          "    with open(path, 'rb') as f:\n",
                                          "        f.read(1)\n",
                                          "hold_here('", fifo, "')\n"));
  SpawnOptions o;
  o.argv = {"/usr/bin/python3", script};
  auto proc = Subprocess::Spawn(o);
  ASSERT_TRUE(proc.ok()) << proc.status();
  // Returns once the process has opened the FIFO to read: it then blocks in the read.
  const int fd = ::open(fifo.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  EXPECT_TRUE(IsPythonProcess((*proc)->pid()));
  const RankStacks s = TakeStacks((*proc)->pid(), tools);
  ::close(fd);
  (*proc)->Wait();
  EXPECT_EQ(s.summary.error(), "");
  EXPECT_EQ(s.summary.tools(), "py-spy, eu-stack");
  EXPECT_FALSE(s.summary.in_collective());
  EXPECT_THAT(s.summary.where(), HasSubstr("hold_here (hold.py:3)"));
  EXPECT_THAT(s.text, HasSubstr("Python (py-spy), 1 thread:\n  Thread "));
  // The main thread by its id (py-spy names threads only once `threading` is imported).
  EXPECT_THAT(s.text, HasSubstr(absl::StrCat("Thread ", (*proc)->pid(),
                                             " (main):\n    hold_here (hold.py:3)\n")));
  EXPECT_THAT(s.text, HasSubstr("Native (eu-stack), "));
  EXPECT_THAT(s.text, HasSubstr("read"));
  testing::RemoveTree(dir);
}

TEST(TakeStacksTest, AMissingToolOrAGoneProcessIsSaidNotFatal) {
  StackTools none;
  const RankStacks s = TakeStacks(::getpid(), none);
  EXPECT_EQ(s.summary.tools(), "");
  EXPECT_THAT(s.summary.error(), HasSubstr("no eu-stack for the native stack"));
  EXPECT_EQ(s.text, "");
  StackTools eu;
  eu.eu_stack = FindTool("eu-stack");
  ASSERT_FALSE(eu.eu_stack.empty());
  // A pid past pid_max: no such process.
  const RankStacks gone = TakeStacks(1 << 23, eu);
  EXPECT_EQ(gone.summary.tools(), "");
  EXPECT_THAT(gone.summary.error(), HasSubstr("eu-stack: "));
  EXPECT_THAT(FindTool("no-such-tool-ddp"), Not(HasSubstr("no-such")));
}

}  // namespace
}  // namespace ddp
