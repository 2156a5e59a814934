// Small helpers shared by the tests: scratch directories and files.
#ifndef DDP_TESTS_COMMON_TEST_UTIL_H_
#define DDP_TESTS_COMMON_TEST_UTIL_H_

#include <sys/types.h>

#include <string>

#include "absl/time/time.h"

namespace ddp::testing {

// A fresh directory under $TEST_TMPDIR (or the system temp dir), removed when the
// test process exits (kept with DDP_KEEP_TEST_DIRS=1, to look at after a failure).
std::string MakeTempDir(const std::string& name);

// Removes `dir` and everything in it (nftw, not std::filesystem::remove_all: see
// test_util.cc).
void RemoveTree(const std::string& dir);
// Writes `text` to `path`, creating parent directories; aborts on failure.
void WriteFile(const std::string& path, const std::string& text);
std::string ReadFile(const std::string& path);

// Waits until every thread of `pid` is stopped (state T in /proc/PID/task/*/stat), as
// after SIGSTOP: kill() returns before each thread has stopped, and a thread running
// on another CPU (of a virtual machine, whose interrupt can wait for the host) can
// still answer a call for a few milliseconds. False at the timeout, or once `pid` is
// gone.
bool WaitUntilStopped(pid_t pid, absl::Duration timeout);

}  // namespace ddp::testing

#endif  // DDP_TESTS_COMMON_TEST_UTIL_H_
