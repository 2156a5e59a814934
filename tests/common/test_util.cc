#include "tests/common/test_util.h"

#include <dirent.h>
#include <ftw.h>
#include <unistd.h>

#include <cstdio>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace ddp::testing {
namespace {

// Every scratch directory this test process made, removed when it exits (after its
// tests ran and their fixtures stopped the processes that used them), so that a test
// that forgets, or fails halfway, leaves nothing in $TMPDIR.
std::vector<std::string>& MadeDirs() {
  static auto* dirs = new std::vector<std::string>();
  return *dirs;
}

// With nftw, not std::filesystem::remove_all: PyPI's LibTorch 2.x exports a copy of
// std::filesystem from libtorch.so that the test binaries' calls bind to, and that copy
// jumps to a null pointer when called from an exit handler.
void RemoveMadeDirs() {
  for (const std::string& dir : MadeDirs()) RemoveTree(dir);
}

}  // namespace

void RemoveTree(const std::string& dir) {
  ::nftw(
      dir.c_str(),
      [](const char* path, const struct stat*, int, struct FTW*) {
        (void)::remove(path);
        return 0;
      },
      16, FTW_DEPTH | FTW_PHYS);
}

std::string MakeTempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::filesystem::path root = base ? base : std::filesystem::temp_directory_path();
  std::filesystem::path dir =
      root / absl::StrCat("ddp-", name, "-", ::getpid(), "-", absl::ToUnixMicros(absl::Now()));
  std::filesystem::create_directories(dir);
  if (MadeDirs().empty() && std::getenv("DDP_KEEP_TEST_DIRS") == nullptr) {
    std::atexit(RemoveMadeDirs);
  }
  MadeDirs().push_back(dir.string());
  return dir.string();
}

void WriteFile(const std::string& path, const std::string& text) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream out(path);
  out << text;
  if (!out) std::abort();
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

bool WaitUntilStopped(pid_t pid, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  const std::string tasks = absl::StrCat("/proc/", pid, "/task");
  while (true) {
    DIR* dir = ::opendir(tasks.c_str());
    if (dir == nullptr) return false;  // Gone.
    bool all_stopped = true;
    int threads = 0;
    while (dirent* e = ::readdir(dir)) {
      if (e->d_name[0] == '.') continue;
      std::ifstream stat(absl::StrCat(tasks, "/", e->d_name, "/stat"));
      std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
      // "TID (COMM) STATE ...": COMM may hold anything, the state follows its last ')'.
      const size_t paren = text.rfind(')');
      if (paren == std::string::npos || paren + 2 >= text.size()) continue;  // Just exited.
      ++threads;
      if (text[paren + 2] != 'T') all_stopped = false;
    }
    ::closedir(dir);
    if (threads > 0 && all_stopped) return true;
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
}

}  // namespace ddp::testing
