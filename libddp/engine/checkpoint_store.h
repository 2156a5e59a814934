// The checkpoints one writer keeps in its directory (no LibTorch here):
//
//   <dir>/checkpoint-<global step, 10 digits>.pt     complete checkpoints
//   <dir>/.checkpoint-<step>.pt.tmp.<writer>.<pid>.<random>
//                                                    a save in progress
//
// A save writes a temporary of a name nobody else can pick (this writer's identity,
// its pid and 64 random bits), opened with O_CREAT|O_EXCL|O_NOFOLLOW so it can never
// clobber or follow anything already there; fsyncs it; renames it to its final name
// and fsyncs the directory. So a kill at any moment leaves either no trace of the new
// checkpoint or the whole of it, never a torn or half-visible one, and the previous
// checkpoints stay untouched. Once the new one is in place the oldest complete ones
// beyond `keep` are deleted. A writer's leftover temporaries (a save killed midway)
// are removed by the next writer with the same identity, never anyone else's.
//
// Fenced by attempt: <dir>/.fence holds the newest attempt of the job that claimed
// the directory (Claim(), at every attempt's start). A save checks it, under an
// exclusive flock of that file, right before its rename: a writer of an older attempt
// (a rank the coordinator has given up on, still running behind a partition) finds a
// newer one there and writes nothing, FAILED_PRECONDITION; a claim waits for a rename
// in progress. So a stale attempt never puts a checkpoint over a newer attempt's.
#ifndef DDP_LIBDDP_ENGINE_CHECKPOINT_STORE_H_
#define DDP_LIBDDP_ENGINE_CHECKPOINT_STORE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ddp {

class CheckpointStore {
 public:
  struct Options {
    std::string dir;
    // Who writes here, e.g. "<job id>.<node>"; made safe for file names. Two writers
    // that may run at once must differ.
    std::string writer;
    int64_t keep = 2;
    // DDP_DEBUG_CHECKPOINT_STALL: stop halfway through the save of this global step
    // and wait to be killed (tests stage a kill during a save). -1: never.
    int64_t stall_at_step = -1;
    // The writer's attempt (1, 2, ...): saves are fenced by it. 0: not fenced.
    int64_t attempt = 0;
  };

  explicit CheckpointStore(Options options);

  const std::string& dir() const { return options_.dir; }
  std::string PathFor(int64_t step) const;
  // Global steps of the complete checkpoints, oldest first (temporaries and other
  // files ignored). An absent directory holds none; UNAVAILABLE when it exists but
  // cannot be listed.
  absl::StatusOr<std::vector<int64_t>> Steps() const;
  // The checkpoint of `step`: NOT_FOUND when it is gone, UNAVAILABLE when it cannot
  // be read.
  absl::StatusOr<std::vector<char>> Read(int64_t step) const;
  // Saves `bytes` as the checkpoint of `step` (replacing one of the same step), then
  // deletes the oldest beyond `keep`. UNAVAILABLE on I/O errors, naming the path.
  absl::Status Write(int64_t step, const std::vector<char>& bytes);
  // Records this writer's attempt as the directory's newest (creating the directory),
  // unless a newer one did: FAILED_PRECONDITION then, naming it. UNAVAILABLE on I/O
  // errors. No-op without an attempt.
  absl::Status Claim() const;
  // Deletes this writer's temporaries (saves killed midway); returns how many.
  int RemoveOwnTemporaries() const;

  // Empty marker files, by which writers tell whether they share this directory.
  absl::Status PutMarker(const std::string& name) const;
  std::vector<std::string> Markers(const std::string& prefix) const;
  void RemoveMarker(const std::string& name) const;

 private:
  Options options_;
};

// `s` with every character outside [A-Za-z0-9._-] replaced by '_' (empty: "_").
std::string FileNameToken(const std::string& s);

// Reads a whole file. NOT_FOUND when it does not exist; UNAVAILABLE when it exists
// but cannot be read (permissions, I/O errors).
absl::StatusOr<std::vector<char>> ReadFileBytes(const std::string& path);

}  // namespace ddp

#endif  // DDP_LIBDDP_ENGINE_CHECKPOINT_STORE_H_
