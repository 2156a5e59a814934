// The job's process group: torch.distributed.init_process_group for C++.
//
// Rank 0 hosts a c10d TCPStore on MASTER_ADDR:MASTER_PORT, every rank connects to it
// and the ranks form a c10d process group: Gloo on CPU, NCCL on CUDA (when libddp is
// built against a CUDA LibTorch). With several CPU ranks on one node, sums and
// broadcasts go through shared memory on the node and through the backend between
// node leaders only. Every collective carries the collective timeout, so a dead or
// hung peer throws ddp::Error (kUnavailable) instead of hanging the rank.
#ifndef DDP_PROCESS_GROUP_H_
#define DDP_PROCESS_GROUP_H_

#include <ATen/ATen.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "ddp/environment.h"

namespace ddp {

struct ProcessGroupOptions {
  // "auto" (NCCL on cuda:LOCAL_RANK when a GPU is visible, else Gloo on the CPU),
  // "gloo" or "nccl".
  std::string backend = "auto";
  // Where the rank's tensors live: "auto" (a GPU when the backend is NCCL, or auto with
  // a GPU visible; else the CPU), "cpu", or "cuda" (also with "gloo": Gloo's CUDA path,
  // on which several ranks may share one GPU, as NCCL refuses). The GPU is
  // cuda:(LOCAL_RANK mod the visible GPUs).
  std::string device = "auto";
  // How ranks of one node reduce: "auto" (shared memory on CPU when a node runs more
  // than one rank), "shm" (required) or "gloo" (the backend only).
  std::string intra_node_comm = "auto";
  // Every rank must reach the store within this.
  std::chrono::milliseconds rdzv_timeout{std::chrono::seconds(120)};
  // A collective that takes longer fails with kUnavailable (a peer died or hung).
  std::chrono::milliseconds collective_timeout{std::chrono::seconds(300)};
};

class ProcessGroup {
 public:
  // Connects this rank (collective: every rank of the job calls it). Throws
  // ddp::Error: kInvalidArgument for bad options, kFailedPrecondition for NCCL without
  // a GPU, kUnavailable when the rendezvous times out or the port is taken.
  static std::shared_ptr<ProcessGroup> create(const Environment& env,
                                              const ProcessGroupOptions& options = {});
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const;
  int world_size() const;
  int local_rank() const;
  const Environment& environment() const;
  // Where this rank's tensors live for collectives: the CPU, or cuda:N with NCCL.
  at::Device device() const;
  // "gloo" or "nccl".
  const std::string& backend() const;
  // "shm", or the backend's name.
  std::string intra_node_comm() const;

  // In-place sum over all ranks.
  void all_reduce_sum(at::Tensor& tensor);
  // Sums of `values` over all ranks, in double precision (one collective).
  std::vector<double> sum(const std::vector<double>& values);
  // Copies rank 0's values into `tensors` on every rank.
  void broadcast(const std::vector<at::Tensor>& tensors);
  void barrier();

  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  explicit ProcessGroup(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// What this rank is doing now, for a stall's reason (the flight recorder: docs/library.md,
// Process group). DistributedDataParallel marks forward and backward and its
// communication waits itself, and anything else counts as the program's own code; a
// program names its own phases, its data loading above all, for their scope:
//
//   { ddp::StepPhase loading(*group, ddp::StepPhase::kData); batch = next_batch(); }
//
// So when a rank hangs reading its data, the others' wait is explained: "rank 1 never
// entered all-reduce #4817 ...; rank 1 is in data loading". Costs a clock read and two
// stores.
class StepPhase {
 public:
  enum Phase { kData = 1, kCompute = 2, kOptimizer = 4, kCheckpoint = 5, kEvaluate = 6 };
  StepPhase(ProcessGroup& group, Phase phase);
  ~StepPhase();  // Back to the phase before.
  StepPhase(const StepPhase&) = delete;
  StepPhase& operator=(const StepPhase&) = delete;

 private:
  ProcessGroup* group_;
  int before_;
};

// torch.distributed.init_process_group(): read_environment(), then ProcessGroup::create.
std::shared_ptr<ProcessGroup> init_process_group(const ProcessGroupOptions& options = {});

}  // namespace ddp

#endif  // DDP_PROCESS_GROUP_H_
