// Collectives among the ranks of one node through one POSIX shared-memory segment.
//
// Role: the intra-node half of ddp-trainer's hierarchical all-reduce (docs/trainer.md,
// "Communication"). Ranks on one node (same GROUP_RANK) sum their buffers in shared
// memory; on a multi-node job the node's leader (LOCAL_RANK 0) then sums the node's
// result with the other leaders through a CrossNode (Gloo in the trainer) and the
// node's ranks copy the final result. No LibTorch here: buffers are raw floats.
//
// Lifecycle: Create() sets the segment up through the job's rendezvous store (local
// rank 0 creates it, the others map it, local rank 0 unlinks the name as soon as all
// have mapped it, so a crash leaves nothing in /dev/shm) -> Start*() / Poll() /
// Wait() for each collective, in the same order on every local rank -> destructor
// (unmaps). Thread-safe; the collectives themselves are serialized.
//
// One collective is split into rounds of at most one slot. Round r uses slot set
// r % 2 (so a round's writes never touch what a slower rank may still read from the
// round before); each rank has its own slot in the set. A sum round:
//
//   deposit    rank i copies its chunk into slot[i]          -> deposited[i] = r
//   reduce     once all deposited: rank i sums part i of the chunk over slots
//              0, 1, ..., L-1, in that order, into slot[0]   -> reduced[i] = r
//   (leader)   once all reduced, multi-node only: the leaders' all-reduce of
//              slot[0], in place                              -> result_ready = r
//   copy out   once all reduced (or result_ready): slot[0] -> the caller's buffer
//                                                             -> finished[i] = r
//
// Every element is summed once, by one rank, in local-rank order, and every rank
// copies the same bytes: results are bit-identical on every rank of the node (and,
// as the leaders' all-reduce hands every leader the same bytes, of the job).
// On a single node with two ranks (or small chunks), "reduce" is instead done by
// every rank over the whole chunk, in the same local-rank order, into its own buffer:
// the same bits with one barrier per round instead of two.
//
// Waiting spins briefly, then sleeps on a futex (futex_sync.h). A waiting rank
// checks, at least every 20 ms, the collective's deadline and its peers' liveness:
// each rank holds a robust process-shared mutex for its lifetime, so a peer that died
// (even by SIGKILL) is seen as EOWNERDEAD. Any rank that fails marks the group
// aborted with its reason, so the others fail at once rather than at their deadline.
#ifndef DDP_LIBDDP_ENGINE_SHM_COMM_H_
#define DDP_LIBDDP_ENGINE_SHM_COMM_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libddp/engine/futex_sync.h"
#include "libddp/engine/shm_segment.h"

namespace ddp {

enum class ShmDType { kFloat32, kFloat64 };

// The job's rendezvous store, as far as setting up a node's segment needs it.
class ShmRendezvous {
 public:
  virtual ~ShmRendezvous() = default;
  virtual absl::Status Set(const std::string& key, const std::string& value) = 0;
  // Waits (up to the rendezvous timeout) until `key` is set.
  virtual absl::StatusOr<std::string> Get(const std::string& key) = 0;
};

// One collective among node leaders, started by CrossNode.
class CrossNodeOp {
 public:
  virtual ~CrossNodeOp() = default;
  virtual bool Done() = 0;             // Never blocks.
  virtual absl::Status Wait() = 0;     // Blocks, up to the collective timeout.
};

// The leaders' collectives (one leader per node), in place on shared memory.
class CrossNode {
 public:
  virtual ~CrossNode() = default;
  virtual absl::StatusOr<std::unique_ptr<CrossNodeOp>> StartSum(void* data, size_t count,
                                                                ShmDType dtype) = 0;
  // From the leader of node 0.
  virtual absl::StatusOr<std::unique_ptr<CrossNodeOp>> StartBroadcast(void* data,
                                                                      size_t bytes) = 0;
};

class ShmNodeComm {
 public:
  struct Options {
    std::string job_id = "local";  // With the attempt and node, names the segment.
    int attempt = 0;
    int group_rank = 0;   // This node.
    int nodes = 1;        // Nodes in the job; > 1: results go through the leaders.
    int local_rank = 0;
    int local_world = 2;  // Ranks on this node, >= 2.
    absl::Duration timeout = absl::Minutes(5);  // Per collective.
    size_t slot_bytes = 0;                      // 0: 16 MiB / (2 * local_world), <= 4 MiB.
    // Single node: up to this many extra bytes read per rank, every rank sums whole
    // chunks (one barrier a round) rather than its part (two barriers).
    size_t whole_chunk_bytes = 256 << 10;
    AwaitOptions wait;
  };
  using OpId = uint64_t;

  static constexpr int kMaxLocalRanks = 256;

  // Sets the node's segment up (see above). UNAVAILABLE (or RESOURCE_EXHAUSTED for a
  // full /dev/shm) if it cannot be created or mapped, or a peer reported so.
  static absl::StatusOr<std::unique_ptr<ShmNodeComm>> Create(const Options& options,
                                                             ShmRendezvous& rendezvous);
  ~ShmNodeComm();
  ShmNodeComm(const ShmNodeComm&) = delete;
  ShmNodeComm& operator=(const ShmNodeComm&) = delete;

  // The leader of a multi-node job must set this before the first collective.
  void SetCrossNode(CrossNode* cross);

  // Starts an in-place sum of `count` elements at `data` over every rank of the job;
  // `data` must stay valid until the collective completes. Collectives complete in
  // start order.
  OpId StartSum(void* data, size_t count, ShmDType dtype);
  // Starts copying global rank 0's `bytes` at `data` into `data` on every rank.
  OpId StartBroadcast(void* data, size_t bytes);
  // Advances started collectives as far as they go without waiting.
  void Poll();
  // Waits until collective `id` completed. UNAVAILABLE if it or an earlier one failed
  // (a peer died, hung past the timeout, or the group was aborted): from then on
  // every collective fails.
  absl::Status Wait(OpId id);
  absl::Status Sum(void* data, size_t count, ShmDType dtype) {
    return Wait(StartSum(data, count, dtype));
  }
  absl::Status Broadcast(void* data, size_t bytes) { return Wait(StartBroadcast(data, bytes)); }

  // Marks the group failed, so that every local rank's collectives fail at once.
  void Abort(const std::string& reason);

  const std::string& segment_name() const { return segment_.name(); }
  size_t slot_bytes() const { return slot_bytes_; }

 private:
  struct Header;
  enum class Kind { kSum, kBroadcast };
  enum class Stage { kBegin, kDeposit, kReduce, kAwaitReduced, kCross, kAwaitResult, kCopyOut };
  struct Op {
    OpId id = 0;
    Kind kind = Kind::kSum;
    ShmDType dtype = ShmDType::kFloat32;
    char* data = nullptr;
    size_t bytes = 0;
    absl::Time deadline;
    size_t offset = 0;  // Bytes of `data` done.
    size_t chunk = 0;   // This round's bytes.
    uint64_t round = 0;
    Stage stage = Stage::kBegin;
    std::unique_ptr<CrossNodeOp> cross;
  };

  ShmNodeComm(const Options& options, ShmSegment segment, size_t slot_bytes);

  OpId Start(Kind kind, void* data, size_t bytes, ShmDType dtype);
  // Runs `op` until it completes (true) or, unless `block`, until it would wait (false).
  absl::StatusOr<bool> AdvanceLocked(Op& op, bool block) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // true once `ready`; false if it is not and !block.
  absl::StatusOr<bool> WaitFor(absl::FunctionRef<bool()> ready, const Op& op, bool block,
                               const char* what);
  absl::Status Check(const Op& op, const char* what);
  absl::Status AbortedStatus() const;
  void FailLocked(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool AllAtLeast(int word, uint64_t round) const;
  char* Slot(uint64_t round, int rank) const;
  bool leader() const { return options_.local_rank == 0; }
  bool multi_node() const { return options_.nodes > 1; }

  const Options options_;
  ShmSegment segment_;
  Header* header_;
  char* slots_;
  const size_t slot_bytes_;
  CrossNode* cross_ = nullptr;

  absl::Mutex mu_;
  std::deque<Op> ops_ ABSL_GUARDED_BY(mu_);
  OpId next_id_ ABSL_GUARDED_BY(mu_) = 1;
  OpId done_id_ ABSL_GUARDED_BY(mu_) = 0;  // Collectives [1, done_id_] completed.
  uint64_t round_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status failed_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ddp

#endif  // DDP_LIBDDP_ENGINE_SHM_COMM_H_
