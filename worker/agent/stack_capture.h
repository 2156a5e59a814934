// The stacks of a rank's process, taken by its worker (decision 194): the Python stack
// of every thread with py-spy (`py-spy dump`, PyPI) when the process is a Python
// interpreter, and the native stack of every thread with elfutils' eu-stack (Debian's
// `elfutils`). Both attach with ptrace for a moment and detach; the rank goes on.
//
// Bounded: each tool gets `timeout` and is killed past it, and what goes into the
// job's log is cut at `max_bytes` (the main thread first, then the other threads,
// those with the same stack folded into one entry). A tool that is missing, fails or
// times out leaves the other's stack and says why in StackSummary.error.
//
// The summary says where the main thread is and whether it waits in a collective,
// which is what the coordinator's stall watch blames from when a program keeps no
// flight recorder: a rank outside any collective while the others wait in one is the
// one they wait for.
#ifndef DDP_WORKER_AGENT_STACK_CAPTURE_H_
#define DDP_WORKER_AGENT_STACK_CAPTURE_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "ddp/v1/types.pb.h"

namespace ddp {

struct StackTools {
  std::string py_spy;    // The py-spy binary; empty: no Python stacks.
  std::string eu_stack;  // The eu-stack binary; empty: no native stacks.
  absl::Duration timeout = absl::Seconds(5);  // Per tool and process.
  size_t max_bytes = 16 * 1024;               // Per rank, of the text logged.
};

// `name` on PATH (or a path as given, if it contains '/'), if executable; else "".
std::string FindTool(const std::string& name);

struct StackFrame {
  std::string function;  // "block_forever", "ddp::Comm::Wait", "" when unnamed.
  std::string location;  // "train.py:4" (Python); "" (native).
};

struct ThreadStack {
  int tid = 0;
  std::string name;                 // py-spy's thread name: "MainThread".
  std::vector<StackFrame> frames;   // Innermost first.
};

// `py-spy dump` output: "Thread 4242 (idle): "MainThread"" then "    fn (file:line)".
std::vector<ThreadStack> ParsePySpyDump(absl::string_view text);
// `eu-stack -p PID` output: "TID 4242:" then "#0  0x00007f... read".
std::vector<ThreadStack> ParseEuStack(absl::string_view text);

// The summary of process `pid`'s stacks (either may be empty). Its seq, taken_ms,
// tools and error are the caller's.
v1::StackSummary Summarize(int pid, const std::vector<ThreadStack>& python,
                           const std::vector<ThreadStack>& native);

// The log text: Python threads, then native ones (the main thread first, threads with
// the same stack folded), cut at `max_bytes`.
std::string FormatStacks(int pid, const std::vector<ThreadStack>& python,
                         const std::vector<ThreadStack>& native, size_t max_bytes);

struct RankStacks {
  v1::StackSummary summary;
  std::string text;  // For the job's log; empty when neither tool gave a stack.
};

// Takes process `pid`'s stacks now (blocking, up to twice tools.timeout).
RankStacks TakeStacks(int pid, const StackTools& tools);

// Whether process `pid` runs a Python interpreter (/proc/PID/exe is python*).
bool IsPythonProcess(int pid);

}  // namespace ddp

#endif  // DDP_WORKER_AGENT_STACK_CAPTURE_H_
