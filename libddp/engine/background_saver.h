// Checkpoints written off the training loop (decision 192).
//
// The loop hands over a TrainingState and goes on; one writer thread copies its
// tensors into host memory of their own (unless the loop did: Snapshot()), says so,
// and then serializes the copy and saves it through the CheckpointKeeper (temporary
// file, fsync, rename, fence: a kill at any moment leaves the previous checkpoints and
// either all of the new one or none of it). The loop may change nothing the copy reads
// before WaitForCopy() returns: for ddp-trainer, until its next optimizer step, so the
// copy overlaps the next forward and backward. At most one save is in flight (Submit
// waits for the one before), so memory holds at most one copy beyond the training
// state, released when its write ends. The loop collects each finished save (its path
// or its error, its durations) with TakeFinished().
#ifndef DDP_LIBDDP_ENGINE_BACKGROUND_SAVER_H_
#define DDP_LIBDDP_ENGINE_BACKGROUND_SAVER_H_

#include <condition_variable>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "libddp/engine/checkpoint.h"
#include "libddp/engine/checkpoint_keeper.h"

namespace ddp {

// `state` with every tensor (model, optimizer state, generator) copied into host
// memory of its own: the copies stay as they are while training changes the originals.
// A GPU tensor is copied to the host (synchronously, after the work queued before it
// on the calling thread's stream).
TrainingState Snapshot(const TrainingState& state);

class BackgroundSaver {
 public:
  struct Finished {
    absl::StatusOr<std::string> path;  // Written ("" where this rank does not write).
    int64_t global_step = 0;
    double copy_ms = 0;   // The writer thread's copy (0 when the loop copied).
    double write_ms = 0;  // Serializing and saving.
  };

  // `keeper` outlives the saver.
  explicit BackgroundSaver(CheckpointKeeper* keeper);
  // Waits for the save in flight.
  ~BackgroundSaver();
  BackgroundSaver(const BackgroundSaver&) = delete;
  BackgroundSaver& operator=(const BackgroundSaver&) = delete;

  // Waits for the save in flight, if any (returns how long, ms), then starts saving
  // `state`: `copy` true, the writer thread copies it first (Snapshot), and the
  // caller leaves its tensors alone until WaitForCopy(); false, it is a Snapshot
  // already.
  double Submit(TrainingState state, bool copy);
  // Waits until the save in flight has copied the state; ms waited (0 if none).
  double WaitForCopy();
  // Waits until no save is in flight.
  void Wait();
  // The save that finished since the last call, if one did.
  std::optional<Finished> TakeFinished();

 private:
  void Run();
  bool Idle() const { return !pending_.has_value() && !writing_; }

  CheckpointKeeper* const keeper_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<TrainingState> pending_;  // Handed over, not yet taken by the thread.
  bool copy_ = false;
  bool copying_ = false;  // pending_ or the thread's state is not yet a copy.
  bool writing_ = false;
  bool stop_ = false;
  std::optional<Finished> finished_;
  std::thread thread_;
};

}  // namespace ddp

#endif  // DDP_LIBDDP_ENGINE_BACKGROUND_SAVER_H_
