// Rendezvous and collectives for one ddp-trainer rank.
//
// Rank 0 hosts a c10d::TCPStore on MASTER_ADDR:MASTER_PORT; every rank connects to
// it and forms a c10d process group: Gloo on CPU, NCCL on CUDA (when built against a
// CUDA LibTorch). Each collective carries train.collective_timeout_s, so a dead or
// hung peer fails the rank with UNAVAILABLE instead of hanging it.
#ifndef DDP_WORKER_TRAINER_COMM_H_
#define DDP_WORKER_TRAINER_COMM_H_

#include <ATen/ATen.h>

#include <chrono>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/jobspec/job_spec.h"
#include "worker/trainer/torch_compat.h"
#include "worker/trainer/torchrun_env.h"

namespace ddp {

struct DeviceChoice {
  at::Device device = at::kCPU;
  std::string backend;  // "gloo" or "nccl"
};

// backend auto -> NCCL on cuda:LOCAL_RANK when this LibTorch has CUDA and a GPU is
// visible, else Gloo on CPU. FAILED_PRECONDITION for nccl without CUDA (permanent).
absl::StatusOr<DeviceChoice> ChooseDevice(const JobSpec& spec, const TorchrunEnv& env);

class Comm {
 public:
  // Connects to (rank 0: hosts) the TCPStore within rdzv.timeout_s and forms the
  // process group. UNAVAILABLE on timeouts or a port already in use (retryable).
  static absl::StatusOr<Comm> Connect(const TorchrunEnv& env, const DeviceChoice& device,
                                      std::chrono::milliseconds rdzv_timeout,
                                      std::chrono::milliseconds collective_timeout);

  CommBackend& backend() { return *backend_; }
  const CommBackendPtr& backend_ptr() const { return backend_; }
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

  // Copies rank 0's values into `tensors` on every rank (one flattened broadcast).
  absl::Status Broadcast(const std::vector<at::Tensor>& tensors);
  // Rank 0's `bytes` (ignored elsewhere) on every rank.
  absl::StatusOr<std::vector<char>> BroadcastBytes(const std::vector<char>& bytes);
  // In-place sum over ranks.
  absl::Status AllReduceSum(at::Tensor& tensor);
  absl::Status Barrier();

 private:
  absl::Status Run(const char* what, const std::function<c10::intrusive_ptr<c10d::Work>()>& op);

  c10::intrusive_ptr<c10d::Store> store_;
  CommBackendPtr backend_;
  at::Device device_ = at::kCPU;
  int rank_ = 0;
  int world_size_ = 1;
  std::chrono::milliseconds timeout_{0};
};

}  // namespace ddp

#endif  // DDP_WORKER_TRAINER_COMM_H_
