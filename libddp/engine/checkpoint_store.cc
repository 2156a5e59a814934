#include "libddp/engine/checkpoint_store.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <optional>
#include <random>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/ascii.h"
#include "common/logging.h"

namespace ddp {
namespace {

namespace fs = std::filesystem;

constexpr char kPrefix[] = "checkpoint-";
constexpr char kSuffix[] = ".pt";

// The step of a complete checkpoint's file name, or -1.
int64_t StepOf(const std::string& name) {
  if (!absl::StartsWith(name, kPrefix) || !absl::EndsWith(name, kSuffix)) return -1;
  const std::string digits =
      name.substr(sizeof(kPrefix) - 1, name.size() - (sizeof(kPrefix) - 1) - (sizeof(kSuffix) - 1));
  int64_t step;
  if (digits.empty() || !std::all_of(digits.begin(), digits.end(), ::isdigit) ||
      !absl::SimpleAtoi(digits, &step)) {
    return -1;
  }
  return step;
}

absl::Status WriteAll(int fd, const char* p, size_t left, const std::string& path) {
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return absl::UnavailableError(absl::StrCat("cannot write ", path, ": ", std::strerror(errno)));
    p += n;
    left -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

constexpr char kFenceFile[] = ".fence";

// <dir>/.fence, opened and locked (flock, exclusive) for as long as it lives.
class FenceLock {
 public:
  explicit FenceLock(const std::string& dir) : path_((fs::path(dir) / kFenceFile).string()) {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd_ < 0) {
      error_ = absl::UnavailableError(absl::StrCat("cannot open ", path_, ": ", std::strerror(errno)));
      return;
    }
    while (::flock(fd_, LOCK_EX) != 0) {
      if (errno == EINTR) continue;
      error_ = absl::UnavailableError(absl::StrCat("cannot lock ", path_, ": ", std::strerror(errno)));
      return;
    }
  }
  ~FenceLock() {
    if (fd_ >= 0) ::close(fd_);  // Unlocks.
  }
  const absl::Status& error() const { return error_; }

  // The newest attempt recorded (0: none yet).
  absl::StatusOr<int64_t> Newest() const {
    char buf[32] = {};
    const ssize_t n = ::pread(fd_, buf, sizeof(buf) - 1, 0);
    if (n < 0) return absl::UnavailableError(absl::StrCat("cannot read ", path_, ": ", std::strerror(errno)));
    int64_t attempt = 0;
    const std::string raw(buf, static_cast<size_t>(n));
    const std::string text(absl::StripAsciiWhitespace(raw));
    if (!text.empty() && !absl::SimpleAtoi(text, &attempt)) {
      return absl::UnavailableError(absl::StrCat(path_, " holds '", text, "', not an attempt number"));
    }
    return attempt;
  }
  absl::Status Record(int64_t attempt) const {
    const std::string text = absl::StrCat(attempt, "\n");
    if (::ftruncate(fd_, 0) != 0 ||
        ::pwrite(fd_, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size()) ||
        ::fsync(fd_) != 0) {
      return absl::UnavailableError(absl::StrCat("cannot write ", path_, ": ", std::strerror(errno)));
    }
    return absl::OkStatus();
  }

 private:
  std::string path_;
  int fd_ = -1;
  absl::Status error_;
};

absl::Status Fenced(const std::string& dir, int64_t newest, int64_t mine) {
  return absl::FailedPreconditionError(absl::StrCat(
      "fenced: attempt ", newest, " of this job now owns checkpoint directory ", dir,
      "; this rank of attempt ", mine,
      " (given up on by the coordinator) writes no checkpoint there"));
}

void SyncDir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

}  // namespace

std::string FileNameToken(const std::string& s) {
  std::string out = s;
  for (char& c : out) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') c = '_';
  }
  return out.empty() ? "_" : out;
}

CheckpointStore::CheckpointStore(Options options) : options_(std::move(options)) {
  options_.writer = FileNameToken(options_.writer);
  if (options_.dir.empty()) options_.dir = ".";
}

std::string CheckpointStore::PathFor(int64_t step) const {
  return (fs::path(options_.dir) / absl::StrFormat("%s%010d%s", kPrefix, step, kSuffix)).string();
}

absl::StatusOr<std::vector<int64_t>> CheckpointStore::Steps() const {
  std::vector<int64_t> steps;
  std::error_code ec;
  if (!fs::exists(options_.dir, ec)) return steps;
  fs::directory_iterator it(options_.dir, ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("cannot list checkpoint directory ", options_.dir, ": ", ec.message()));
  }
  for (const auto& entry : it) {
    const int64_t step = StepOf(entry.path().filename().string());
    if (step >= 0) steps.push_back(step);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

absl::StatusOr<std::vector<char>> CheckpointStore::Read(int64_t step) const {
  return ReadFileBytes(PathFor(step));
}

absl::Status CheckpointStore::Write(int64_t step, const std::vector<char>& bytes) {
  std::error_code ec;
  fs::create_directories(options_.dir, ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("cannot create checkpoint directory ", options_.dir, ": ", ec.message()));
  }
  const std::string path = PathFor(step);
  std::random_device entropy;
  const uint64_t nonce = (uint64_t{entropy()} << 32) ^ entropy();
  const std::string tmp =
      (fs::path(options_.dir) /
       absl::StrFormat(".%s.tmp.%s.%d.%016x", fs::path(path).filename().string(),
                       options_.writer, ::getpid(), nonce))
          .string();
  // O_EXCL|O_NOFOLLOW: never through a link or over a file someone else put there.
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("cannot create ", tmp, ": ", std::strerror(errno)));
  }
  auto fail = [&](absl::Status st) {
    ::close(fd);
    ::unlink(tmp.c_str());
    return st;
  };
  size_t first = bytes.size();
  if (step == options_.stall_at_step) first = bytes.size() / 2;
  if (absl::Status st = WriteAll(fd, bytes.data(), first, tmp); !st.ok()) return fail(st);
  if (first < bytes.size()) {
    ::fsync(fd);
    DDP_LOG(WARNING) << "DDP_DEBUG_CHECKPOINT_STALL=" << step << ": stopped halfway through "
                     << tmp << " (" << first << " of " << bytes.size()
                     << " bytes); waiting to be killed";
    while (true) ::pause();
  }
  if (::fsync(fd) != 0) {
    return fail(absl::UnavailableError(absl::StrCat("cannot flush ", tmp, ": ", std::strerror(errno))));
  }
  if (::close(fd) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    return absl::UnavailableError(absl::StrCat("cannot flush ", tmp, ": ", std::strerror(e)));
  }
  {
    // The fence is checked, and the rename made, under its lock: a newer attempt's
    // claim comes entirely before (and this save is refused) or after.
    std::optional<FenceLock> fence;
    if (options_.attempt > 0) {
      fence.emplace(options_.dir);
      if (!fence->error().ok()) {
        ::unlink(tmp.c_str());
        return fence->error();
      }
      absl::StatusOr<int64_t> newest = fence->Newest();
      if (!newest.ok() || *newest > options_.attempt) {
        ::unlink(tmp.c_str());
        return newest.ok() ? Fenced(options_.dir, *newest, options_.attempt) : newest.status();
      }
    }
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
      const int e = errno;
      ::unlink(tmp.c_str());
      return absl::UnavailableError(
          absl::StrCat("cannot rename ", tmp, " to ", path, ": ", std::strerror(e)));
    }
  }
  SyncDir(options_.dir);  // The rename itself must survive a crash.
  // Only now, with the new one complete, do the oldest go.
  auto steps = Steps();
  if (steps.ok()) {
    const int64_t excess = static_cast<int64_t>(steps->size()) - std::max<int64_t>(1, options_.keep);
    for (int64_t i = 0; i < excess; ++i) {
      if ((*steps)[i] == step) continue;
      fs::remove(PathFor((*steps)[i]), ec);
    }
  }
  return absl::OkStatus();
}

absl::Status CheckpointStore::Claim() const {
  if (options_.attempt <= 0) return absl::OkStatus();
  std::error_code ec;
  fs::create_directories(options_.dir, ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("cannot create checkpoint directory ", options_.dir, ": ", ec.message()));
  }
  FenceLock fence(options_.dir);
  if (!fence.error().ok()) return fence.error();
  absl::StatusOr<int64_t> newest = fence.Newest();
  if (!newest.ok()) return newest.status();
  if (*newest > options_.attempt) return Fenced(options_.dir, *newest, options_.attempt);
  if (*newest == options_.attempt) return absl::OkStatus();
  return fence.Record(options_.attempt);
}

int CheckpointStore::RemoveOwnTemporaries() const {
  const std::string mine = absl::StrCat(".tmp.", options_.writer, ".");
  int removed = 0;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(options_.dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (absl::StartsWith(name, absl::StrCat(".", kPrefix)) && absl::StrContains(name, mine)) {
      std::error_code rm;
      if (fs::remove(entry.path(), rm)) ++removed;
    }
  }
  return removed;
}

absl::Status CheckpointStore::PutMarker(const std::string& name) const {
  std::error_code ec;
  fs::create_directories(options_.dir, ec);
  const std::string path = (fs::path(options_.dir) / name).string();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("cannot create ", path, ": ", std::strerror(errno)));
  }
  ::close(fd);
  return absl::OkStatus();
}

std::vector<std::string> CheckpointStore::Markers(const std::string& prefix) const {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(options_.dir, ec)) {
    std::string name = entry.path().filename().string();
    if (absl::StartsWith(name, prefix)) names.push_back(std::move(name));
  }
  return names;
}

void CheckpointStore::RemoveMarker(const std::string& name) const {
  std::error_code ec;
  fs::remove(fs::path(options_.dir) / name, ec);
}

absl::StatusOr<std::vector<char>> ReadFileBytes(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    const std::string msg = absl::StrCat("cannot open ", path, ": ", std::strerror(e));
    return e == ENOENT ? absl::NotFoundError(msg) : absl::UnavailableError(msg);
  }
  std::vector<char> bytes;
  char buf[1 << 16];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      ::close(fd);
      return absl::UnavailableError(absl::StrCat("cannot read ", path, ": ", std::strerror(e)));
    }
    if (n == 0) break;
    bytes.insert(bytes.end(), buf, buf + n);
  }
  ::close(fd);
  return bytes;
}

}  // namespace ddp
