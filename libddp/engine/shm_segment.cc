#include "libddp/engine/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ddp {
namespace {

absl::Status Errno(int err, const std::string& what) {
  std::string message = absl::StrCat(what, ": ", std::strerror(err));
  switch (err) {
    case ENOENT: return absl::NotFoundError(message);
    case ENOSPC:
    case ENOMEM:
      return absl::ResourceExhaustedError(absl::StrCat(
          message, " (is /dev/shm too small? a container's default is 64 MiB; raise it, or "
                   "set train.intra_node_comm: gloo)"));
    default: return absl::UnavailableError(message);
  }
}

}  // namespace

absl::StatusOr<ShmSegment> ShmSegment::Create(const std::string& name, size_t bytes) {
  const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) return Errno(errno, absl::StrCat("cannot create shared memory ", name));
  ShmSegment seg;
  seg.name_ = name;
  seg.linked_ = true;  // From here on, every failure unlinks it (the destructor).
  // ftruncate alone would leave the pages unreserved: tmpfs would SIGBUS later.
  if (int err = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes)); err != 0) {
    ::close(fd);
    return Errno(err, absl::StrCat("cannot reserve ", bytes, " bytes of shared memory ", name));
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);
  if (p == MAP_FAILED) return Errno(err, absl::StrCat("cannot map shared memory ", name));
  seg.data_ = p;
  seg.size_ = bytes;
  return seg;
}

absl::StatusOr<ShmSegment> ShmSegment::Open(const std::string& name) {
  const int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) return Errno(errno, absl::StrCat("cannot open shared memory ", name));
  struct stat st;
  if (::fstat(fd, &st) != 0 || st.st_size <= 0) {
    const int err = errno;
    ::close(fd);
    return Errno(err, absl::StrCat("cannot size shared memory ", name));
  }
  void* p = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED,
                   fd, 0);
  const int err = errno;
  ::close(fd);
  if (p == MAP_FAILED) return Errno(err, absl::StrCat("cannot map shared memory ", name));
  ShmSegment seg;
  seg.name_ = name;
  seg.data_ = p;
  seg.size_ = static_cast<size_t>(st.st_size);
  return seg;
}

ShmSegment::ShmSegment(ShmSegment&& other) noexcept { *this = std::move(other); }

ShmSegment& ShmSegment::operator=(ShmSegment&& other) noexcept {
  if (this != &other) {
    Release();
    name_ = std::move(other.name_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    linked_ = std::exchange(other.linked_, false);
  }
  return *this;
}

ShmSegment::~ShmSegment() { Release(); }

void ShmSegment::Release() {
  if (data_ != nullptr) ::munmap(data_, size_);
  data_ = nullptr;
  size_ = 0;
  (void)Unlink();
}

absl::Status ShmSegment::Unlink() {
  if (!linked_) return absl::OkStatus();
  linked_ = false;
  if (::shm_unlink(name_.c_str()) != 0 && errno != ENOENT) {
    return Errno(errno, absl::StrCat("cannot unlink shared memory ", name_));
  }
  return absl::OkStatus();
}

}  // namespace ddp
