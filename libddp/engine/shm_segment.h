// A POSIX shared-memory segment (shm_open + mmap), owned by one rank of a node.
//
// Lifecycle: the node's first local rank Create()s it (exclusively, with its pages
// reserved up front), the others Open() it by name, and the creator Unlink()s the
// name as soon as every local rank has mapped it. From then on the memory lives
// exactly as long as some rank still maps it: a crash, even SIGKILL, leaves nothing
// in /dev/shm. The destructor unmaps, and unlinks the name if its creator still holds
// it (a setup that failed half-way).
//
// No LibTorch here.
#ifndef DDP_LIBDDP_ENGINE_SHM_SEGMENT_H_
#define DDP_LIBDDP_ENGINE_SHM_SEGMENT_H_

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"

namespace ddp {

class ShmSegment {
 public:
  // Creates `name` ("/..." as shm_open wants it) of `bytes`, failing if it exists.
  // The pages are reserved (posix_fallocate), so a full /dev/shm is an error here
  // (RESOURCE_EXHAUSTED) rather than a SIGBUS on first touch.
  static absl::StatusOr<ShmSegment> Create(const std::string& name, size_t bytes);
  // Maps an existing segment whole. NOT_FOUND if it is gone.
  static absl::StatusOr<ShmSegment> Open(const std::string& name);

  ShmSegment(ShmSegment&& other) noexcept;
  ShmSegment& operator=(ShmSegment&& other) noexcept;
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;
  ~ShmSegment();

  // Removes the name (the creator, once every rank has mapped it). Idempotent.
  absl::Status Unlink();

  void* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }

 private:
  ShmSegment() = default;
  void Release();

  std::string name_;
  void* data_ = nullptr;
  size_t size_ = 0;
  bool linked_ = false;  // This object created the name and has not unlinked it.
};

}  // namespace ddp

#endif  // DDP_LIBDDP_ENGINE_SHM_SEGMENT_H_
