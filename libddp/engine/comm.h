// Rendezvous and collectives for one ddp-trainer rank.
//
// Rank 0 hosts a c10d::TCPStore on MASTER_ADDR:MASTER_PORT; every rank connects to
// it and forms a c10d process group: Gloo on CPU, NCCL on CUDA (when built against a
// CUDA LibTorch). Each collective carries train.collective_timeout_s, so a dead or
// hung peer fails the rank with UNAVAILABLE instead of hanging it.
//
// On CPU with several ranks per node (train.intra_node_comm auto or shm), sums and
// broadcasts are hierarchical: the node's ranks meet in a shared-memory segment
// (ShmNodeComm), and on a multi-node job the node leaders (LOCAL_RANK 0) run the
// backend's collective among themselves in between (docs/trainer.md, Communication).
// Every rank votes on it at connect time, so the whole job uses one scheme.
#ifndef DDP_LIBDDP_ENGINE_COMM_H_
#define DDP_LIBDDP_ENGINE_COMM_H_

#include <ATen/ATen.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/contract/flight_recorder.h"
#include "libddp/engine/torch_compat.h"
#include "libddp/engine/environment.h"

namespace ddp {

class CrossNode;
class ShmNodeComm;
struct WaitRules;

struct DeviceChoice {
  at::Device device = at::kCPU;
  std::string backend;  // "gloo" or "nccl"
};

// Where this rank trains and which backend reduces:
//   device auto: backend auto -> NCCL on a GPU when this LibTorch has CUDA and a GPU is
//                visible, else Gloo on the CPU; gloo -> the CPU; nccl -> a GPU;
//   device cpu:  Gloo on the CPU (nccl is INVALID_ARGUMENT);
//   device cuda: a GPU, with NCCL (auto, nccl) or Gloo's CUDA path (gloo).
// The GPU is cuda:(LOCAL_RANK mod the visible GPUs): under ddp-worker
// CUDA_VISIBLE_DEVICES names the rank's own GPU (cuda:0), under torchrun every GPU of
// the node is visible, and with more ranks than GPUs they share them (Gloo only: NCCL
// refuses two ranks on one device). FAILED_PRECONDITION when a GPU is asked for and
// this build has no CUDA or no GPU is visible (permanent).
// The engine's own words for what a rank asks for (job.yaml's `backend` and
// `train.device` are mapped onto these by trainer/engine_options.h, libddp's
// ProcessGroupOptions by the public ProcessGroup).
struct DeviceRequest {
  enum class Backend { kAuto, kGloo, kNccl };
  enum class Device { kAuto, kCpu, kCuda };
  Backend backend = Backend::kAuto;
  Device device = Device::kAuto;
};
absl::StatusOr<DeviceChoice> ChooseDevice(const DeviceRequest& request, const Environment& env);

struct CommOptions {
  // Among a node's CPU ranks: auto (shared memory where every node can, else the
  // backend), shm (shared memory, or an error), gloo (the backend alone).
  enum class IntraNode { kAuto, kShm, kGloo };
  std::chrono::milliseconds rdzv_timeout{120000};
  std::chrono::milliseconds collective_timeout{300000};
  IntraNode intra_node = IntraNode::kAuto;
};

// An in-place sum started by Comm::StartSum. Sums complete in start order.
class PendingSum {
 public:
  virtual ~PendingSum() = default;
  // UNAVAILABLE when a peer died or hung past the collective timeout.
  virtual absl::Status Wait() = 0;
};

class Comm {
 public:
  // Connects to (rank 0: hosts) the TCPStore within rdzv.timeout_s, forms the
  // process group, and the node's shared-memory group where it applies.
  // UNAVAILABLE on timeouts, a port already in use or shared memory that cannot be set
  // up with intra_node_comm: shm (retryable); FAILED_PRECONDITION for shm on a GPU or
  // with ranks not numbered node by node (permanent).
  static absl::StatusOr<Comm> Connect(const Environment& env, const DeviceChoice& device,
                                      const CommOptions& options);
  Comm(Comm&&);
  Comm& operator=(Comm&&);
  ~Comm();

  // The world's process group (Gloo or NCCL), for collectives that do not go through
  // shared memory (a broadcast from a root other than rank 0, say).
  CommBackend& backend() { return *backend_; }
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  // Where collectives want their tensors.
  const at::Device& device() const { return device_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  // What ranks of one node reduce through: "shm", or the backend's name.
  std::string intra_node_comm() const;
  // This rank's flight recorder (decision 193): every collective of this Comm, and the
  // phase the rank says it is in; in DDP_FLIGHT_RECORDER's file under ddp-worker.
  flight::Recorder* recorder() const { return recorder_.get(); }

  // Starts an in-place sum of `flat` (contiguous, kept alive by the caller until
  // Wait) over all ranks. Never blocks on shared memory or on a CPU backend. `bucket`:
  // the gradient bucket it reduces, for the flight recorder (-1: none).
  std::unique_ptr<PendingSum> StartSum(const at::Tensor& flat, int bucket = -1);
  // Lets started shared-memory sums progress without waiting (from backward's hooks).
  void Poll();

  // Copies rank 0's values into `tensors` on every rank (one flattened broadcast).
  absl::Status Broadcast(const std::vector<at::Tensor>& tensors);
  // Rank 0's `bytes` (ignored elsewhere) on every rank.
  absl::StatusOr<std::vector<char>> BroadcastBytes(const std::vector<char>& bytes);
  // Rank `root`'s `bytes` (ignored elsewhere) on every rank, through the backend;
  // `what` names the transfer in errors ("sending the checkpoint").
  absl::StatusOr<std::vector<char>> BroadcastBytesFrom(int root, const std::vector<char>& bytes,
                                                       const char* what);
  // In-place sum over ranks.
  absl::Status AllReduceSum(at::Tensor& tensor);
  // Bytes of the tensors AllReduceSum was given so far (what a communication hook sends).
  int64_t all_reduce_sum_bytes() const { return all_reduce_sum_bytes_; }
  // Elementwise maxima of `values` over ranks, in double precision (one small
  // all-reduce through the backend: flags, counts).
  absl::StatusOr<std::vector<double>> MaxOverRanks(const std::vector<double>& values);
  absl::Status Barrier();

  // Waits for `work`, a collective started on backend(), as this group's own
  // collectives are waited for: UNAVAILABLE naming `what` when a peer fails it, past
  // the collective timeout, or (under ddp-worker) once the attempt's next generation is
  // announced in DDP_GENERATION_FILE while it waits: the coordinator is replacing a
  // lost peer, and a peer whose host went silent would otherwise hold the wait until
  // the timeout. A group that abandoned a collective so is kept, not destroyed, when
  // its Comm goes (its threads still run the collective until it fails by itself).
  absl::Status Wait(const c10::intrusive_ptr<c10d::Work>& work, const char* what);

 private:
  Comm() = default;
  // Starts `op` and waits for it, recorded as a collective of `kind` and `bytes`.
  absl::Status Run(const char* what, flight::Kind kind, uint64_t bytes,
                   const std::function<c10::intrusive_ptr<c10d::Work>()>& op);
  // Runs `body` (a collective of this Comm that does not go through Run) recorded.
  absl::Status Recorded(flight::Kind kind, uint64_t bytes,
                        const std::function<absl::Status()>& body);
  // Sets up the node's shared-memory group and agrees on it with every rank.
  absl::Status SetUpNodeGroup(const Environment& env, CommOptions::IntraNode mode);

  c10::intrusive_ptr<c10d::Store> store_;
  CommBackendPtr backend_;
  std::string backend_name_;
  // Hierarchical mode: the node's group, and (node leaders of multi-node jobs) the
  // leaders' process group it sums through (destroyed first to last: shm_, cross_, leaders_).
  CommBackendPtr leaders_;
  std::unique_ptr<CrossNode> cross_;
  std::unique_ptr<ShmNodeComm> shm_;
  at::Device device_ = at::kCPU;
  int rank_ = 0;
  int world_size_ = 1;
  std::chrono::milliseconds timeout_{0};
  std::shared_ptr<WaitRules> wait_;  // Shared with cross_ and the pending sums.
  int64_t all_reduce_sum_bytes_ = 0;
  std::shared_ptr<flight::Recorder> recorder_;  // Shared with the pending sums.
};

}  // namespace ddp

#endif  // DDP_LIBDDP_ENGINE_COMM_H_
