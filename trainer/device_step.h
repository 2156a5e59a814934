// The built-in trainer's step on a GPU, whole, on the device, and with train.cuda_graph
// captured in one CUDA graph (docs/trainer.md, "CUDA graphs"; decision 173).
//
//   step 1..3   eager, on the trainer's stream (StreamScope), inputs in static buffers
//   step 4      captured (CapturedGraph::Capture), then replayed: that is step 4
//   step 5..    the host copies the batch into the static buffers and replays the graph
//
// One step = every micro-batch's forward (under autocast for bf16), loss and backward
// (the reducer's all-reduces inside the last backward; no_sync before), clip_grad_norm
// (ClipGradNorm), the learning rate from the device's LrTable, the fused optimizer's step,
// and the losses summed on the device in double precision: nothing in it waits on the
// host, so the host runs ahead and the GPU runs the steps back to back. The loss is read
// (a synchronization) only when the trainer reports it. A step whose batch is short (the
// last of an epoch without drop_last) runs eagerly with the same code; so does every step
// when the graph is off or could not be captured. Without capture the same code runs
// eagerly every step: a graphed and an eager run launch the same kernels.
#ifndef DDP_TRAINER_DEVICE_STEP_H_
#define DDP_TRAINER_DEVICE_STEP_H_

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/jobspec/job_spec.h"
#include "ddp/distributed_data_parallel.h"
#include "libddp/engine/comm.h"
#include "libddp/engine/cuda_graph.h"
#include "trainer/model.h"

namespace ddp {

// A fused optimizer's learning rate as a device tensor (their step counts live on the
// device too): what lets the optimizer's step be captured.
struct FusedLr {
  std::function<void(const at::Tensor&)> set_lr_tensor;  // 0-dim, on the device
  at::ScalarType lr_dtype = at::kDouble;                // what the tensor must hold
};
// Set when `optimizer` is one of libddp's fused optimizers (ddp::FusedOptimizer), whose
// parameters are on `device`.
std::optional<FusedLr> FusedLrOf(torch::optim::Optimizer& optimizer, const at::Device& device);

// What keeps a job's step out of a CUDA graph, one line each ("train.comm_hook: fp16: a
// hook's collectives wait on the host"); empty when it can be captured. `device`: where
// the rank trains; `optimizer_fused`: its optimizer is one of the fused ones (step counts
// and learning rate on the device).
std::vector<std::string> CudaGraphBlockers(const JobSpec& spec, const DeviceChoice& device,
                                           bool optimizer_fused);

class DeviceStep {
 public:
  using LossFn = std::function<at::Tensor(const at::Tensor& out, const at::Tensor& target)>;
  struct Parts {
    Model* model = nullptr;
    DataParallel* ddp = nullptr;
    torch::optim::Optimizer* optimizer = nullptr;
    // Points the optimizer's learning rate at a 0-dim device tensor.
    std::function<void(const at::Tensor&)> set_lr_tensor;
    at::ScalarType lr_dtype = at::kDouble;
    std::vector<at::Tensor> params;
    LossFn loss;
  };
  // `lr_of(epoch, global_step)`: the learning rate of that step (the trainer's schedule,
  // LrAt); `steps_per_epoch` counts the epochs of the steps ahead (the table's).
  // `capture`: take the graph after `warmup` eager steps; `required`: a failed capture
  // fails the step (train.cuda_graph true) instead of leaving the run eager (auto).
  using LrOf = std::function<double(int64_t epoch, int64_t global_step)>;
  DeviceStep(Parts parts, const TrainSpec& train, const at::Device& device, LrOf lr_of,
             int64_t steps_per_epoch, bool capture, bool required, int warmup = 3);
  ~DeviceStep();

  // Global step `global_step` (step `step_in_epoch` of `epoch`) on `micro` (host tensors:
  // inputs and targets of each micro-batch). Returns once the work is queued. The
  // reducer's failure inside an eager backward comes back as its status; a collective of a
  // replayed graph that waits for a dead peer shows in the next LastLoss or EpochLossSum.
  absl::Status Take(int64_t epoch, int64_t step_in_epoch, int64_t global_step,
                    const std::vector<std::pair<at::Tensor, at::Tensor>>& micro);
  // The last step's loss (the micro-batches' mean), and the sum of the step losses since
  // SetEpochLossSum: each waits for the GPU, UNAVAILABLE (a peer failure) when its queued
  // work does not finish within train.collective_timeout_s.
  absl::StatusOr<double> LastLoss();
  absl::StatusOr<double> EpochLossSum();
  void SetEpochLossSum(double value);
  // Before the process group goes (a live recovery): the graph, which holds the group's
  // collectives (NCCL will not tear a communicator down while a graph holds it), goes
  // first; the next steps warm up and capture again.
  void DropGraph();
  // After a live recovery: the model's reducer is new (DropGraph, then this).
  void Rebind(DataParallel* ddp);
  // "captured after N eager steps", "eager: why", or "warming up (...)".
  std::string Describe() const { return graph_.Describe(); }
  bool captured() const { return graph_.captured(); }

 private:
  // The step itself on device tensors: inputs are the micro-batches' inputs, then their
  // targets; returns {the mean loss (0-dim double)}.
  std::vector<at::Tensor> Run(const std::vector<at::Tensor>& inputs);
  // Waits for the queued steps (Drain: WaitForDevice with the collective timeout).
  absl::Status Drain();

  Parts parts_;
  const TrainSpec& train_;
  at::Device device_;
  LrOf lr_of_;
  int64_t steps_per_epoch_;
  int64_t epoch_ = 0;        // The epoch of the step Take was last given,
  int64_t epoch_start_ = 0;  // and the global step it began at.
  LrTable lr_;
  StepGraph graph_;
  bool capture_;
  bool logged_ = false;    // The capture's outcome was logged.
  at::Tensor loss_;        // The last step's loss.
  at::Tensor epoch_loss_;  // 0-dim double: the losses summed since SetEpochLossSum.
};

}  // namespace ddp

#endif  // DDP_TRAINER_DEVICE_STEP_H_
