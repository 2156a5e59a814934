#include "worker/agent/stack_capture.h"

#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/process.h"
#include "common/utf8.h"

namespace ddp {
namespace {

constexpr size_t kMaxFramesPerThread = 32;
constexpr size_t kMaxFunction = 160;

// What a tool printed, or why it gave nothing.
struct ToolRun {
  std::string out;
  std::string error;  // Empty: it exited 0.
};

std::string FirstLine(absl::string_view text) {
  text = absl::StripAsciiWhitespace(text);
  const size_t nl = text.find('\n');
  std::string line(text.substr(0, nl));
  if (line.size() > 200) line = line.substr(0, 200) + "...";
  return line;
}

// Runs argv, reading its output until it exits or `timeout` passes (then kills it).
ToolRun RunTool(const std::vector<std::string>& argv, absl::Duration timeout, size_t max_out) {
  SpawnOptions o;
  o.argv = argv;
  o.capture_stdout = true;
  o.capture_stderr = true;
  auto proc = Subprocess::Spawn(o);
  if (!proc.ok()) return {"", std::string(proc.status().message())};
  std::string out, err;
  const absl::Time deadline = absl::Now() + timeout;
  pollfd fds[2] = {{(*proc)->stdout_fd(), POLLIN, 0}, {(*proc)->stderr_fd(), POLLIN, 0}};
  int open = 2;
  bool timed_out = false;
  char buf[8192];
  while (open > 0) {
    const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left <= 0) {
      timed_out = true;
      break;
    }
    const int n = ::poll(fds, 2, static_cast<int>(std::min<int64_t>(left, INT_MAX)));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) continue;
    for (pollfd& p : fds) {
      if (p.fd < 0 || (p.revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      const ssize_t r = ::read(p.fd, buf, sizeof(buf));
      if (r <= 0) {
        p.fd = -1;  // Polling a negative fd is a no-op.
        --open;
        continue;
      }
      std::string& to = p.fd == (*proc)->stdout_fd() ? out : err;
      if (to.size() < max_out) to.append(buf, static_cast<size_t>(r));
    }
  }
  // Its output ended: it is exiting (bounded all the same).
  std::optional<ExitStatus> exit;
  if (!timed_out) {
    exit = (*proc)->WaitFor(std::max(deadline - absl::Now(), absl::Milliseconds(100)));
  }
  if (!exit.has_value()) {
    (*proc)->Signal(SIGKILL);
    (*proc)->Wait();
    return {"", absl::StrCat("timed out after ", absl::FormatDuration(timeout))};
  }
  if (!exit->ok()) {
    const std::string why = FirstLine(err.empty() ? out : err);
    return {out, absl::StrCat(exit->ToString(), why.empty() ? "" : ": ", why)};
  }
  return {out, ""};
}

// "fn(args) const" -> "fn", keeping template arguments; cut to kMaxFunction.
std::string ShortFunction(absl::string_view f) {
  int depth = 0;
  size_t end = f.size();
  for (size_t i = 0; i < f.size(); ++i) {
    if (f[i] == '<') ++depth;
    if (f[i] == '>') --depth;
    if (f[i] == '(' && depth <= 0 && i > 0) {
      end = i;
      break;
    }
  }
  std::string s(absl::StripAsciiWhitespace(f.substr(0, end)));
  if (s.size() > kMaxFunction) s = s.substr(0, kMaxFunction) + "...";
  return s;
}

const ThreadStack* MainThread(int pid, const std::vector<ThreadStack>& threads) {
  for (const ThreadStack& t : threads) {
    if (t.tid == pid || t.name == "MainThread") return &t;
  }
  return threads.empty() ? nullptr : &threads.front();
}

bool IsCollectiveName(absl::string_view f) {
  static const char* const kNames[] = {
      "all_reduce",     "all_gather",          "all_gather_into_tensor", "all_gather_object",
      "broadcast",      "broadcast_object_list", "barrier",              "monitored_barrier",
      "reduce",         "reduce_scatter",      "reduce_scatter_tensor",  "all_to_all",
      "all_to_all_single", "gather",           "gather_object",          "scatter",
      "scatter_object_list", "send",           "recv",                   "isend",
      "irecv",          "wait"};
  for (const char* n : kNames) {
    if (f == n) return true;
  }
  return false;
}

bool IsCommFrame(absl::string_view f) {
  return absl::StrContains(f, "c10d::") || absl::StrContains(f, "gloo::") ||
         absl::StrContains(f, "nccl") || absl::StrContains(f, "ddp::Comm::");
}

std::string PythonFrame(const StackFrame& f) {
  return f.location.empty() ? f.function : absl::StrCat(f.function, " (", f.location, ")");
}

// The thread's frames as text lines ("    fn (file:line)" / "    #3 fn").
std::vector<std::string> FrameLines(const ThreadStack& t, bool python) {
  std::vector<std::string> lines;
  for (size_t i = 0; i < t.frames.size() && i < kMaxFramesPerThread; ++i) {
    const StackFrame& f = t.frames[i];
    lines.push_back(python ? absl::StrCat("    ", PythonFrame(f))
                           : absl::StrCat("    #", i, " ",
                                          f.function.empty() ? "??" : f.function));
  }
  if (t.frames.size() > kMaxFramesPerThread) {
    lines.push_back(absl::StrCat("    ... ", t.frames.size() - kMaxFramesPerThread,
                                 " more frames"));
  }
  return lines;
}

void AppendThreads(int pid, const std::vector<ThreadStack>& threads, bool python,
                   std::string* out) {
  const ThreadStack* main = MainThread(pid, threads);
  absl::StrAppend(out, python ? "Python (py-spy), " : "Native (eu-stack), ", threads.size(),
                  threads.size() == 1 ? " thread:\n" : " threads:\n");
  if (main != nullptr) {
    absl::StrAppend(out, "  Thread ", main->tid,
                    main->name.empty() ? "" : absl::StrCat(" \"", main->name, "\""),
                    " (main):\n", absl::StrJoin(FrameLines(*main, python), "\n"), "\n");
  }
  // The others, those with the same frames folded, in order of first appearance.
  std::vector<std::pair<std::vector<std::string>, std::vector<const ThreadStack*>>> groups;
  std::map<std::vector<std::string>, size_t> index;
  for (const ThreadStack& t : threads) {
    if (&t == main) continue;
    std::vector<std::string> lines = FrameLines(t, python);
    auto [it, fresh] = index.emplace(lines, groups.size());
    if (fresh) groups.push_back({std::move(lines), {}});
    groups[it->second].second.push_back(&t);
  }
  for (const auto& [lines, members] : groups) {
    std::vector<std::string> ids;
    for (size_t i = 0; i < members.size() && i < 8; ++i) {
      ids.push_back(absl::StrCat(members[i]->tid, members[i]->name.empty()
                                                      ? ""
                                                      : absl::StrCat(" \"", members[i]->name,
                                                                     "\"")));
    }
    if (members.size() > 8) ids.push_back(absl::StrCat("and ", members.size() - 8, " more"));
    absl::StrAppend(out, members.size() == 1 ? "  Thread " : "  Threads ",
                    absl::StrJoin(ids, ", "),
                    members.size() == 1 ? "" : absl::StrCat(" (", members.size(), ", one stack)"),
                    ":\n", absl::StrJoin(lines, "\n"), "\n");
  }
}

}  // namespace

std::string FindTool(const std::string& name) {
  if (name.empty()) return "";
  if (absl::StrContains(name, '/')) return ::access(name.c_str(), X_OK) == 0 ? name : "";
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path == nullptr ? "/usr/bin:/bin" : path, ':')) {
    if (dir.empty()) continue;
    std::string candidate = absl::StrCat(dir, "/", name);
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

std::vector<ThreadStack> ParsePySpyDump(absl::string_view text) {
  std::vector<ThreadStack> threads;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StartsWith(line, "Thread ")) {
      ThreadStack t;
      absl::string_view rest = line.substr(7);
      const size_t sp = rest.find(' ');
      absl::string_view id = rest.substr(0, sp);
      int tid = 0;
      if (!absl::StartsWith(id, "0x") && absl::SimpleAtoi(id, &tid)) t.tid = tid;
      const size_t q = line.find('"');
      const size_t q2 = q == absl::string_view::npos ? q : line.rfind('"');
      if (q != absl::string_view::npos && q2 > q) t.name = std::string(line.substr(q + 1, q2 - q - 1));
      threads.push_back(std::move(t));
      continue;
    }
    // A frame: four spaces, "fn (file:line)". Deeper lines (locals) are skipped.
    if (threads.empty() || !absl::StartsWith(line, "    ") || absl::StartsWith(line, "     ")) {
      continue;
    }
    absl::string_view f = absl::StripAsciiWhitespace(line);
    StackFrame frame;
    const size_t open = f.rfind(" (");
    if (open != absl::string_view::npos && absl::EndsWith(f, ")")) {
      frame.function = std::string(f.substr(0, open));
      frame.location = std::string(f.substr(open + 2, f.size() - open - 3));
    } else {
      frame.function = std::string(f);
    }
    threads.back().frames.push_back(std::move(frame));
  }
  return threads;
}

std::vector<ThreadStack> ParseEuStack(absl::string_view text) {
  std::vector<ThreadStack> threads;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StartsWith(line, "TID ")) {
      ThreadStack t;
      int tid = 0;
      if (absl::SimpleAtoi(absl::StripSuffix(line.substr(4), ":"), &tid)) t.tid = tid;
      threads.push_back(std::move(t));
      continue;
    }
    if (threads.empty() || !absl::StartsWith(line, "#")) continue;
    // "#3  0x00007f5e90f402ad read" or "#3  0x00000000005e25b4" (no symbol).
    std::vector<absl::string_view> parts =
        absl::StrSplit(line, absl::MaxSplits(' ', 1), absl::SkipEmpty());
    StackFrame frame;
    if (parts.size() == 2) {
      absl::string_view rest = absl::StripLeadingAsciiWhitespace(parts[1]);
      const size_t sp = rest.find(' ');
      if (sp != absl::string_view::npos) frame.function = ShortFunction(rest.substr(sp + 1));
    }
    threads.back().frames.push_back(std::move(frame));
  }
  return threads;
}

v1::StackSummary Summarize(int pid, const std::vector<ThreadStack>& python,
                           const std::vector<ThreadStack>& native) {
  v1::StackSummary s;
  const ThreadStack* py = MainThread(pid, python);
  const ThreadStack* nat = MainThread(pid, native);
  if (py != nullptr) {
    // The collective the program called: a torch.distributed frame, by its name if one
    // is a collective's, else the outermost of them (the one the program's code called).
    const StackFrame* named = nullptr;
    const StackFrame* outermost = nullptr;
    for (const StackFrame& f : py->frames) {  // Innermost first.
      if (!absl::StrContains(f.location, "torch/distributed/")) continue;
      outermost = &f;
      if (named == nullptr && IsCollectiveName(f.function)) named = &f;
    }
    const StackFrame* collective = named != nullptr ? named : outermost;
    if (collective != nullptr) {
      s.set_in_collective(true);
      s.set_where(PythonFrame(*collective));
    } else if (!py->frames.empty()) {
      s.set_where(PythonFrame(py->frames.front()));
    }
  }
  if (nat != nullptr) {
    // Where: the innermost named frame (most often a system call's wrapper), then the
    // next two that are not the C and C++ libraries' ("read < ... < ddp::Trainer::Next").
    bool comm = false, skipped = false;
    std::vector<std::string> named;
    for (size_t i = 0; i < nat->frames.size() && i < 64; ++i) {
      const std::string& f = nat->frames[i].function;
      if (IsCommFrame(f)) comm = true;
      if (f.empty() || named.size() >= 4) continue;
      const bool library = absl::StartsWith(f, "std::") || absl::StartsWith(f, "_");
      if (!named.empty() && library) {
        skipped = true;
        continue;
      }
      if (skipped) named.push_back("...");
      skipped = false;
      named.push_back(f);
    }
    if (comm) s.set_in_collective(true);
    if (s.where().empty()) s.set_where(absl::StrJoin(named, " < "));
  }
  return s;
}

std::string FormatStacks(int pid, const std::vector<ThreadStack>& python,
                         const std::vector<ThreadStack>& native, size_t max_bytes) {
  std::string out;
  if (!python.empty()) AppendThreads(pid, python, /*python=*/true, &out);
  if (!native.empty()) AppendThreads(pid, native, /*python=*/false, &out);
  if (out.size() > max_bytes) {
    size_t cut = out.rfind('\n', max_bytes);
    if (cut == std::string::npos) cut = max_bytes;
    out = absl::StrCat(out.substr(0, cut), "\n  ... (cut at ", max_bytes, " bytes)\n");
  }
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

bool IsPythonProcess(int pid) {
  char buf[PATH_MAX];
  const std::string link = absl::StrCat("/proc/", pid, "/exe");
  const ssize_t n = ::readlink(link.c_str(), buf, sizeof(buf) - 1);
  if (n <= 0) return false;
  absl::string_view exe(buf, static_cast<size_t>(n));
  const size_t slash = exe.rfind('/');
  if (slash != absl::string_view::npos) exe = exe.substr(slash + 1);
  return absl::StartsWith(exe, "python");
}

RankStacks TakeStacks(int pid, const StackTools& tools) {
  RankStacks r;
  std::vector<std::string> errors, used;
  std::vector<ThreadStack> python, native;
  const size_t max_out = std::max<size_t>(tools.max_bytes * 8, 256 * 1024);
  if (IsPythonProcess(pid)) {
    if (tools.py_spy.empty()) {
      errors.push_back("no py-spy for the Python stack (ddp-worker --py-spy)");
    } else {
      ToolRun py = RunTool({tools.py_spy, "dump", "--pid", absl::StrCat(pid)}, tools.timeout,
                           max_out);
      if (!py.error.empty()) errors.push_back(absl::StrCat("py-spy: ", py.error));
      python = ParsePySpyDump(py.out);
      if (!python.empty()) used.push_back("py-spy");
    }
  }
  if (tools.eu_stack.empty()) {
    errors.push_back("no eu-stack for the native stack (ddp-worker --eu-stack; Debian's elfutils)");
  } else {
    ToolRun eu = RunTool({tools.eu_stack, "-p", absl::StrCat(pid)}, tools.timeout, max_out);
    native = ParseEuStack(eu.out);
    // eu-stack exits 1 when some thread could not be unwound to the end, with the rest
    // printed: an error only when it printed no thread.
    if (native.empty()) {
      errors.push_back(absl::StrCat("eu-stack: ", eu.error.empty() ? "no thread" : eu.error));
    } else {
      used.push_back("eu-stack");
    }
  }
  r.summary = Summarize(pid, python, native);
  r.summary.set_tools(absl::StrJoin(used, ", "));
  std::string error = absl::StrJoin(errors, "; ");
  MakeValidUtf8(&error);
  r.summary.set_error(error);
  r.text = FormatStacks(pid, python, native, tools.max_bytes);
  MakeValidUtf8(&r.text);
  std::string where = r.summary.where();
  MakeValidUtf8(&where);
  r.summary.set_where(where);
  return r;
}

}  // namespace ddp
