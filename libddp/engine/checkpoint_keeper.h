// Checkpoints that survive losing a node: who writes them, and which one a restart
// resumes from, agreed by every rank.
//
// Writers: each node's local rank 0 keeps the checkpoints it took part in, in its own
// checkpoint.dir ({node} in the path gives every node its own directory even on one
// host or on shared storage), the last `checkpoint.keep` of them. Nodes whose
// directories are one and the same (shared storage without {node}) are told apart at
// start: each candidate drops a marker file, and after a barrier a candidate that sees
// a lower node's marker leaves the writing to that node. So with shared storage one
// node writes; without it, every node does.
//
// Resume: the ranks all-gather the newest step each writer holds; the newest of all
// wins, and the lowest rank holding it sends its bytes to every rank over the process
// group. So a restart whose rank 0 lands on a node without any checkpoint (no shared
// storage) still resumes from the newest one any rank has. A checkpoint written by
// another job (another DDP_JOB_ID) is refused unless checkpoint.resume is `force`.
//
// Fencing: each node's writer candidate claims its directory for its attempt at
// Setup (and every node's, with {node}): a rank of an older attempt still running
// somewhere, cut off, can no longer put a checkpoint there (checkpoint_store.h).
//
// Lifecycle: constructed once the process group is up -> Setup() (collective) ->
// Restore() (collective) -> Save() at each checkpoint (every rank calls it; writers
// write).
#ifndef DDP_LIBDDP_ENGINE_CHECKPOINT_KEEPER_H_
#define DDP_LIBDDP_ENGINE_CHECKPOINT_KEEPER_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "libddp/engine/checkpoint.h"
#include "libddp/engine/checkpoint_store.h"
#include "libddp/engine/comm.h"
#include "libddp/engine/environment.h"

namespace ddp {

// checkpoint.dir with {job_id} and {node} replaced from the environment.
std::string CheckpointDirFor(const std::string& dir, const Environment& env);

// Collective: rank 0's CPU generator state on every rank (checkpoints carry it, as if
// rank 0 had written them all). `device`: where the comm wants its tensors.
absl::StatusOr<at::Tensor> RankZeroRngState(Comm& comm, const at::Device& device);
// This rank's CPU generator state (what a live recovery's transfer carries).
at::Tensor CpuRngState();
// Makes `state` (from RankZeroRngState, via a checkpoint) the CPU generator's.
void RestoreRngState(const at::Tensor& state);

class CheckpointKeeper {
 public:
  // What to keep and what to resume: job.yaml's `checkpoint` (trainer/engine_options.h
  // maps it) or libddp's CheckpointOptions.
  struct Options {
    std::string dir_template;  // As written: {job_id} and {node} not yet replaced.
    std::string dir;           // This node's: CheckpointDirFor(dir_template, env).
    int64_t keep = 2;          // Checkpoints each writer keeps, newest first.
    // Restore(): kNo finds nothing; kYes refuses another job's checkpoint; kForce takes it.
    enum class Resume { kNo, kYes, kForce };
    Resume resume = Resume::kYes;
  };
  // `comm` and `device` (where collectives want their tensors) outlive the keeper.
  CheckpointKeeper(Options options, const Environment& env, Comm* comm, at::Device device);

  // Collective: decides whether this rank writes, and removes the temporaries its
  // predecessors on this node left behind (saves killed midway).
  absl::Status Setup();
  bool writer() const { return writer_; }

  struct Restored {
    TrainingState state;
    std::string path;    // On the holder's node.
    int holder = 0;      // The rank that sent it.
  };
  // Collective: the newest checkpoint any rank holds, or nullopt when there is none
  // (or checkpoint.resume is false). INVALID_ARGUMENT (permanent) when it belongs to
  // another job or is not a ddp checkpoint; UNAVAILABLE (retryable) when the holder
  // cannot read it or a rank cannot list its directory.
  absl::StatusOr<std::optional<Restored>> Restore();

  // Saves `state` if this rank writes, and returns the path written ("" elsewhere).
  // `state.identity` is filled in here.
  absl::StatusOr<std::string> Save(TrainingState state);
  // Where Save() puts the checkpoint of `global_step` on this rank ("" elsewhere).
  std::string PathFor(int64_t global_step) const {
    return writer_ ? store_.PathFor(global_step) : std::string();
  }

 private:
  std::string MarkerPrefix() const;
  // Makes this attempt the newest of the directory (and, with {node} in the template,
  // of every node's directory there is): CheckpointStore::Claim.
  absl::Status ClaimDirectories();

  const Options options_;
  const Environment env_;
  Comm* const comm_;
  const at::Device device_;
  CheckpointStore store_;
  bool writer_ = false;
};

}  // namespace ddp

#endif  // DDP_LIBDDP_ENGINE_CHECKPOINT_KEEPER_H_
