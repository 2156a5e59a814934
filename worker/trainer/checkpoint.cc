#include "worker/trainer/checkpoint.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <torch/serialize.h>

#include <cstring>
#include <filesystem>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ddp {

std::string CheckpointPath(const std::string& dir) {
  return (std::filesystem::path(dir) / kCheckpointFile).string();
}

std::vector<char> EncodeCheckpoint(const c10::IValue& dict) { return torch::pickle_save(dict); }

absl::Status WriteFileAtomically(const std::string& path, const std::vector<char>& bytes) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  std::error_code ec;
  fs::create_directories(target.parent_path(), ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat("cannot create checkpoint directory ",
                                               target.parent_path().string(), ": ", ec.message()));
  }
  const std::string tmp = absl::StrCat(path, ".tmp.", ::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("cannot write ", tmp, ": ", std::strerror(errno)));
  }
  const char* p = bytes.data();
  size_t left = bytes.size();
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int e = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return absl::UnavailableError(absl::StrCat("cannot write ", tmp, ": ", std::strerror(e)));
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    return absl::UnavailableError(absl::StrCat("cannot flush ", tmp, ": ", std::strerror(e)));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    return absl::UnavailableError(
        absl::StrCat("cannot rename ", tmp, " to ", path, ": ", std::strerror(e)));
  }
  // Make the rename itself durable.
  int dir = ::open(target.parent_path().empty() ? "." : target.parent_path().c_str(),
                   O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
  return absl::OkStatus();
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

void RemoveStaleTemporaries(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  const std::string prefix = target.filename().string() + ".tmp.";
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(
           target.parent_path().empty() ? fs::path(".") : target.parent_path(), ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) == 0) fs::remove(entry.path(), ec);
  }
}

absl::StatusOr<c10::impl::GenericDict> DecodeCheckpoint(const std::vector<char>& bytes,
                                                        const std::string& path) {
  c10::IValue v;
  try {
    v = torch::pickle_load(bytes);
  } catch (const std::exception& e) {
    std::string what = e.what();
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint ", path, " is unreadable (", what.substr(0, what.find('\n')),
        "): delete it or set checkpoint.resume: false"));
  }
  if (!v.isGenericDict()) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint ", path, " is not a ddp checkpoint"));
  }
  c10::impl::GenericDict d = v.toGenericDict();
  auto fmt = d.find("format");
  if (fmt == d.end() || !fmt->value().isString() || fmt->value().toStringRef() != kCheckpointFormat) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint ", path, " is not in format ", kCheckpointFormat));
  }
  return d;
}

}  // namespace ddp
