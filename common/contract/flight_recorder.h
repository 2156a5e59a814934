// The flight recorder (decision 193): what a rank is doing now and the last collectives
// it entered, in a fixed ring of a small file the rank maps and its worker reads.
//
// The engine's Comm records every collective it starts (sequence number, kind, bytes,
// the gradient bucket, start and end times), and the trainer (or a libddp program) says
// which phase of its step it is in: data loading, forward and backward, waiting in
// communication, the optimizer, a checkpoint. Under ddp-worker the ring lives in the file
// DDP_FLIGHT_RECORDER names, so the worker reads it at each heartbeat without the rank's
// help, also when the rank is stopped, hung in a system call or spinning in its own code:
// the coordinator then knows, for a stall, which collective the waiting ranks are in and
// where the silent one is. Outside ddp-worker the ring is in memory only, for the engine's
// own error messages.
//
// Sequence numbers count one Comm's collectives (1, 2, ...): every rank of a process
// group runs the same collectives in the same order, so "#4817" is the same collective on
// every rank. A live recovery's new generation starts counting again.
//
// Writing costs a few relaxed stores per collective and per phase change: no lock, no
// system call. Each entry is written seqlock-style (its seq word cleared, the fields
// written, the seq word set last), so a reader never takes a torn entry for a whole one.
// Times are CLOCK_MONOTONIC nanoseconds: the writer's and the reader's on one host, and
// what leaves the host is durations, never times.
#ifndef DDP_CONTRACT_FLIGHT_RECORDER_H_
#define DDP_CONTRACT_FLIGHT_RECORDER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ddp::flight {

// What the rank is doing (the order is the file format's: append only).
enum class Phase : uint32_t {
  kStarting = 0,   // Before its first step: rendezvous, loading, the initial broadcast.
  kData = 1,       // Loading its batch.
  kCompute = 2,    // Forward and backward.
  kCommWait = 3,   // Waiting for a collective to complete.
  kOptimizer = 4,  // The optimizer step (ZeRO's broadcasts within).
  kCheckpoint = 5,
  kEvaluate = 6,
  kProgram = 7,  // A libddp program's own code, outside ddp's calls.
  kRecovery = 8,  // A live recovery: the new generation forming, the state moving.
  kDone = 9,
};
inline constexpr uint32_t kPhaseCount = 10;
// "data loading", "forward and backward", ...: how a reason names it ("rank 1 is in
// data loading").
const char* PhaseName(Phase phase);
// "data", "compute", ...: a short label (the heartbeat's FlightState, JSON).
const char* PhaseLabel(Phase phase);
// PhaseName of the phase labelled `label`; "an unknown phase (LABEL)" for another.
std::string PhaseNameOfLabel(const std::string& label);

enum class Kind : uint32_t {
  kAllReduce = 1,
  kBroadcast = 2,
  kAllGather = 3,
  kBarrier = 4,
  kReduceScatter = 5,
  kOther = 6,
};
const char* KindName(Kind kind);  // "all-reduce", "broadcast", ...

inline constexpr uint32_t kCapacity = 64;  // Collectives kept.
inline constexpr uint64_t kMagic = 0x31524644'50504444ull;  // "DDPPDFR1"
inline constexpr uint32_t kVersion = 1;

// CLOCK_MONOTONIC, in nanoseconds.
int64_t NowNs();

// One collective as read back.
struct Collective {
  uint64_t seq = 0;
  Kind kind = Kind::kOther;
  int bucket = -1;  // The gradient bucket it reduces; -1: not a bucket's.
  uint64_t bytes = 0;
  int64_t start_ns = 0;
  int64_t end_ns = 0;  // 0: still in flight.
};
// "all-reduce #4817 (bucket 3, 1.2 MB)".
std::string Describe(const Collective& c);

// A recorder as read at one moment.
struct Snapshot {
  int pid = 0;
  int rank = -1;
  Phase phase = Phase::kStarting;
  int64_t phase_since_ns = 0;
  int64_t global_step = -1;  // Of its last step begun; -1 before the first.
  uint64_t entered = 0;      // The last collective it entered (0: none yet).
  uint64_t completed = 0;    // The last one that completed.
  std::vector<Collective> recent;  // Oldest first, at most kCapacity.
  // The oldest collective entered and not completed, if any (nullptr: none in flight).
  const Collective* OldestInFlight() const;
  // The last collective entered, if any.
  const Collective* Last() const;
};

// The file's layout (and the in-memory ring's), shared by writer and reader.
struct Entry {
  std::atomic<uint64_t> seq;  // 0 while being written.
  std::atomic<uint32_t> kind;
  std::atomic<int32_t> bucket;
  std::atomic<uint64_t> bytes;
  std::atomic<int64_t> start_ns;
  std::atomic<int64_t> end_ns;
};
struct Layout {
  uint64_t magic;
  uint32_t version;
  uint32_t capacity;
  std::atomic<int32_t> pid;
  std::atomic<int32_t> rank;
  std::atomic<uint32_t> phase;
  uint32_t pad;
  std::atomic<int64_t> phase_since_ns;
  std::atomic<int64_t> global_step;
  std::atomic<uint64_t> entered;
  std::atomic<uint64_t> completed;
  Entry entries[kCapacity];
};

// The writer: one per Comm (a process group); thread-safe for the engine's use (one
// thread starts collectives, any thread may complete them or change the phase).
class Recorder {
 public:
  // In memory only.
  Recorder();
  // Maps `path` (created, or truncated and filled anew): under ddp-worker, the rank's
  // DDP_FLIGHT_RECORDER. An error (the file cannot be made) names the path; the caller
  // may fall back to memory.
  static absl::StatusOr<std::unique_ptr<Recorder>> OpenFile(const std::string& path, int rank);
  ~Recorder();
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  // A collective starts: its sequence number.
  uint64_t Enter(Kind kind, uint64_t bytes, int bucket = -1);
  // It completed (successfully or not: it is no longer waited for).
  void Exit(uint64_t seq);
  // The phase the rank enters now; returns the one it leaves.
  Phase SetPhase(Phase phase);
  Phase phase() const;
  void SetStep(int64_t global_step);
  Snapshot Read() const;
  // "all-reduce #17 (bucket 2, 1.2 MB)", or "collective #17" once it left the ring.
  std::string Describe(uint64_t seq) const;
  const std::string& path() const { return path_; }

 private:
  explicit Recorder(Layout* layout, size_t mapped, std::string path);
  void Init(int rank);

  Layout* layout_;
  size_t mapped_ = 0;  // > 0: `layout_` is a mapping of path_.
  std::string path_;
  std::unique_ptr<Layout> owned_;
};

// Names the phase for its scope, and restores the one before it at its end.
class PhaseScope {
 public:
  PhaseScope(Recorder* recorder, Phase phase)
      : recorder_(recorder), before_(recorder ? recorder->SetPhase(phase) : phase) {}
  ~PhaseScope() {
    if (recorder_ != nullptr) recorder_->SetPhase(before_);
  }
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  Recorder* recorder_;
  Phase before_;
};

// The worker's side: the recorder a rank keeps at `path`, as it is now. NOT_FOUND
// before the rank made it; DATA_LOSS when it is not a recorder.
absl::StatusOr<Snapshot> ReadFile(const std::string& path);

}  // namespace ddp::flight

#endif  // DDP_CONTRACT_FLIGHT_RECORDER_H_
