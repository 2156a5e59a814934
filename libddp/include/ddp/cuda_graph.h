// Whole training steps in CUDA graphs, for a LibTorch program's own loop.
//
//   auto group = ddp::init_process_group();                 // NCCL on a GPU
//   ddp::CudaStreamScope stream(group->device());           // first: all GPU work runs on it
//   Net net;
//   ddp::DistributedDataParallel model(net, group);
//   ddp::FusedAdamW opt(model.module()->parameters(), ...); // <ddp/fused_optimizer.h>
//   ddp::DeviceLrSchedule lr(schedule, /*base_lr=*/6e-4, total_steps, group->device());
//   opt.set_lr_tensor(lr.lr());                             // the optimizer reads it there
//   ddp::GraphedStepOptions options;
//   options.lr = &lr;                                       // counted with the steps
//   ddp::GraphedStep step(model.core(), [&](const std::vector<at::Tensor>& in) {
//     at::Tensor loss = loss_fn(model(in[0]), in[1]);
//     loss.backward();                                      // all-reduces, as always
//     ddp::clip_grad_norm_(params, 1.0);                    // no host sync
//     lr.advance();                                         // this step's lr, on the GPU
//     opt.step();
//     opt.zero_grad();
//     return std::vector<at::Tensor>{loss.detach()};
//   }, options);
//   for (auto& [x, y] : batches) {
//     at::Tensor loss = step({x, y})[0];                    // read it only when needed
//   }
//
// The first `warmup_steps` calls run the step eagerly; the next one captures it in a CUDA
// graph (forward, backward with the gradient all-reduces, clipping, the learning rate, the
// optimizer) and every later call copies its inputs into the graph's static buffers and
// replays it: one launch a step instead of hundreds, and the host runs ahead of the GPU.
// What a step may do to be captured: only GPU work on the current stream (no .item(), no
// .cpu(), no printing of tensors); the same shapes every step; an optimizer whose step
// counts and learning rate live on the device (the fused ones); nothing the host decides
// per step (a learning rate set as a double is baked in: DeviceLrSchedule instead).
// Inputs shaped otherwise than the first call's (a short last batch) run eagerly.
// A model whose steps cannot be captured (cuda_graph_blocker() says why: the CPU, Gloo,
// a communication hook, find_unused_parameters) runs eagerly, or, with `required`, is
// refused when the GraphedStep is made. docs/library.md, "CUDA graphs".
#ifndef DDP_CUDA_GRAPH_H_
#define DDP_CUDA_GRAPH_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ddp/distributed_data_parallel.h"
#include "ddp/lr_schedule.h"

namespace ddp {

// While it lives, a stream of LibTorch's pool is the calling thread's current stream on
// `device` (nothing on the CPU). Make it before the model is made or moved to the GPU:
// autograd runs each backward op, the parameters' gradient accumulation included, on the
// stream its forward op ran on, and a graph cannot be captured on the default stream.
class CudaStreamScope {
 public:
  explicit CudaStreamScope(const at::Device& device);
  ~CudaStreamScope();
  CudaStreamScope(const CudaStreamScope&) = delete;
  CudaStreamScope& operator=(const CudaStreamScope&) = delete;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The learning rate of each step as a 0-dim tensor on the device, for an optimizer that
// reads it there (FusedAdamW::set_lr_tensor): the schedule's values (ddp::scheduled_lr,
// bit for bit) for a window of steps sit in a device table, and advance(), inside the
// step, copies the current one into lr(). GraphedStep keeps the host's side in step (give
// it as GraphedStepOptions::lr); an eager loop calls before_step() and after_step().
class DeviceLrSchedule {
 public:
  // `total`: scheduler steps in the whole run (for t_max 0). `dtype`: lr()'s.
  DeviceLrSchedule(LrSchedule schedule, double base_lr, int64_t total, const at::Device& device,
                   at::ScalarType dtype = at::kDouble);
  ~DeviceLrSchedule();
  const at::Tensor& lr() const;
  // Inside the step: lr() becomes this step's learning rate. Device work only.
  void advance();
  // Outside the step, around it: before_step() makes the table hold this step's entry,
  // after_step() counts the step.
  void before_step();
  void after_step();
  // Steps done (PyTorch's scheduler's last_epoch); set_count after a resume.
  int64_t count() const { return count_; }
  void set_count(int64_t count);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int64_t count_ = 0;
};

struct GraphedStepOptions {
  int warmup_steps = 3;              // Eager calls before the capture (at least 1).
  bool capture = true;               // false: every call eager (the same step, no graph).
  bool required = false;             // Throw (kFailedPrecondition) where it cannot capture.
  DeviceLrSchedule* lr = nullptr;    // Kept in step with the calls, when given.
};

class GraphedStep {
 public:
  // One whole training step of `model` on `inputs` (device tensors, the same shapes
  // every call); returns what the caller reads afterwards (the loss, detached).
  using StepFn = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>& inputs)>;
  GraphedStep(DataParallel& model, StepFn step, GraphedStepOptions options = {});
  ~GraphedStep();
  GraphedStep(const GraphedStep&) = delete;
  GraphedStep& operator=(const GraphedStep&) = delete;

  // One step on `inputs` (on the host or the device): copied into the static buffers,
  // then the step runs (eagerly, captured, or replayed, as above). The outputs of a
  // replayed step are the graph's own tensors: the next call overwrites them.
  std::vector<at::Tensor> operator()(const std::vector<at::Tensor>& inputs);
  bool captured() const;
  // "captured after 3 eager steps", "eager: <why>", or "warming up (k of N eager steps)".
  std::string status() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Why a step of `model` cannot be captured in a CUDA graph, or "" when it can: its group
// is not NCCL on a GPU, a communication hook is registered (its collectives wait on the
// host), find_unused_parameters (a graph walk and a host read every step), or this
// LibTorch has no CUDA graphs.
std::string cuda_graph_blocker(const DataParallel& model);

// torch.nn.utils.clip_grad_norm_(parameters, max_norm) as PyTorch 2.x computes it, without
// a host synchronization (ddp::clip_grad_norm returns a double, which waits for the GPU):
// returns the total norm before clipping as a 0-dim tensor, or an undefined tensor when no
// parameter has a gradient.
at::Tensor clip_grad_norm_(const std::vector<at::Tensor>& parameters, double max_norm);

}  // namespace ddp

#endif  // DDP_CUDA_GRAPH_H_
