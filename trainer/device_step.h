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
  // `lr_of_step(k)`: the learning rate of global step k (the trainer's schedule).
  // `capture`: take the graph after `warmup` eager steps; `required`: a failed capture
  // fails the step (train.cuda_graph true) instead of leaving the run eager (auto).
  DeviceStep(Parts parts, const TrainSpec& train, const at::Device& device,
             std::function<double(int64_t)> lr_of_step, bool capture, bool required,
             int warmup = 3);
  ~DeviceStep();

  // Global step `global_step` on `micro` (host tensors: inputs and targets of each
  // micro-batch). Returns once the work is queued. The reducer's failure inside an eager
  // backward comes back as its status (in a replayed graph NCCL's watchdog reports it).
  absl::Status Take(int64_t global_step,
                    const std::vector<std::pair<at::Tensor, at::Tensor>>& micro);
  // The last step's loss (the micro-batches' mean); waits for it.
  double LastLoss();
  // The sum of the step losses since SetEpochLossSum; waits for it.
  double EpochLossSum();
  void SetEpochLossSum(double value);
  // After a live recovery: the model's reducer and the process group are new; a graph
  // holding the old ones is dropped, and the next steps warm up and capture again.
  void Rebind(DataParallel* ddp);
  // "captured after N eager steps", "eager: why", or "warming up (...)".
  std::string Describe() const { return graph_.Describe(); }
  bool captured() const { return graph_.captured(); }

 private:
  // The step itself on device tensors: inputs are the micro-batches' inputs, then their
  // targets; returns {the mean loss (0-dim double)}.
  std::vector<at::Tensor> Run(const std::vector<at::Tensor>& inputs);

  Parts parts_;
  const TrainSpec& train_;
  at::Device device_;
  LrTable lr_;
  StepGraph graph_;
  bool capture_;
  bool logged_ = false;    // The capture's outcome was logged.
  at::Tensor loss_;        // The last step's loss.
  at::Tensor epoch_loss_;  // 0-dim double: the losses summed since SetEpochLossSum.
};

}  // namespace ddp

#endif  // DDP_TRAINER_DEVICE_STEP_H_
