// Whole training steps in CUDA graphs (docs/trainer.md, "CUDA graphs"; decision 173).
//
// A step that launches hundreds of small kernels spends most of its time launching them.
// Captured once in a CUDA graph and replayed, the whole step (forward, loss, backward with
// the reducer's NCCL all-reduces, clipping, the learning rate and the optimizer) costs the
// host one launch, and the GPU runs it back to back. What capture needs, and how the
// pieces here provide it:
//   - everything on one non-default stream from the start (StreamScope): autograd runs each
//     backward op, the parameters' AccumulateGrad nodes included, on the stream their
//     forward op (or their creation) ran on, and capture records one stream and what joins
//     it (NCCL's stream joins through the events c10d records);
//   - no host synchronization inside the step: ClipGradNorm is LibTorch's clip_grad_norm_
//     without its closing item(); the fused optimizers keep their step counts on the device;
//   - nothing the host computes per step baked into the graph: the learning rate of every
//     step sits in a device table (LrTable) that the captured step indexes with a device
//     counter, so the schedule runs inside the graph;
//   - inputs in static buffers that the host fills before each replay.
// CapturedGraph wraps at::cuda::CUDAGraph: capture into a private memory pool, replay.
// Everything here is usable (and does nothing CUDA-specific) in a build without CUDA,
// where CudaGraphsBuilt() is false and Capture fails with FAILED_PRECONDITION.
#ifndef DDP_LIBDDP_ENGINE_CUDA_GRAPH_H_
#define DDP_LIBDDP_ENGINE_CUDA_GRAPH_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ddp {

// Whether this build captures CUDA graphs: a CUDA LibTorch 2.x.
bool CudaGraphsBuilt();

// While it lives, `device` is this thread's current device and a stream from LibTorch's
// pool its current stream there (a CUDA device; on the CPU it does nothing). Graphs cannot
// be captured on the default stream, a step captured on one stream must have run its
// warm-up there too, and CUDAGraph captures on the current device's current stream.
class StreamScope {
 public:
  explicit StreamScope(const at::Device& device);
  ~StreamScope();
  StreamScope(const StreamScope&) = delete;
  StreamScope& operator=(const StreamScope&) = delete;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// One captured graph and its private memory pool.
class CapturedGraph {
 public:
  // Synchronizes `device` and empties the allocator's cache, then runs `fn` once under
  // stream capture on the device's current stream (not the default one), into a memory
  // pool of the graph's own, and instantiates the graph. Nothing `fn` launched has run
  // yet: Replay() runs it. FAILED_PRECONDITION without CUDA graphs in this build or on the
  // default stream; INTERNAL with CUDA's or LibTorch's message when capture fails (an
  // operation that synchronizes the host, say): the stream's capture is ended either way,
  // and the allocators stop allocating into the graph's pool, which goes once freed.
  static absl::StatusOr<std::unique_ptr<CapturedGraph>> Capture(const at::Device& device,
                                                                const std::function<void()>& fn);
  ~CapturedGraph();
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;

  // Launches the graph on the current stream.
  void Replay();

 private:
  struct Impl;
  explicit CapturedGraph(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Bounds how far the host runs ahead of the GPU: Mark() after each step records an event
// on the current stream and, with more than `depth` steps in flight, waits for the oldest.
// Enough queued work keeps the GPU busy; more would only lengthen what a host-waited
// collective (a notice check, a checkpoint) waits behind. Does nothing on the CPU.
class RunAhead {
 public:
  explicit RunAhead(const at::Device& device, int depth = 8);
  ~RunAhead();
  void Mark();
  void Clear();  // Forgets the marks (their stream may be gone).

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  at::Device device_;
  int depth_;
};

// Waits until the work queued so far on `device`'s current stream is done, polling, for at
// most `timeout`: UNAVAILABLE (a peer failure, which a live recovery may cure) when a
// replayed graph's collective waits for a peer that died, which nothing else would notice
// (c10d's watchdog does not watch collectives inside a graph). OK at once on the CPU.
absl::Status WaitForDevice(const at::Device& device, absl::Duration timeout);

// A training step, warmed up eagerly, then captured and replayed:
//
//   calls 1..warmup    fn runs eagerly on the static inputs
//   call warmup+1      fn is captured (CapturedGraph), and the graph replayed at once
//   later calls        the inputs are copied into the static buffers; the graph replays
//
// The static inputs are made at the first regular call, shaped like its inputs, on the
// device; each call copies its inputs into them (from the host through pinned memory, so
// that the copy is asynchronous and the host runs ahead). A call that is not `regular` (an
// epoch's short last batch), or whose inputs are shaped otherwise, runs fn eagerly on them
// instead, and does not count as warm-up. Without capture (`capture` false, or a capture
// that failed when not `required`), every call runs fn eagerly on the static inputs: the
// same kernels as the graph's. At least one warm-up step (the optimizer's state must be
// made outside the capture). The host runs at most a few steps ahead of the GPU
// (RunAhead). Must run on a non-default stream (StreamScope) that also ran whatever fn's
// autograd graph builds on (the model's move to the device, the DDP reducer's hooks).
class StepGraph {
 public:
  using Fn = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>& inputs)>;
  StepGraph(Fn fn, const at::Device& device, int warmup, bool capture, bool required);
  ~StepGraph();

  // One step; returns fn's outputs (once captured, the graph's: overwritten by the next
  // call). fn's exceptions in an eager call propagate. A failed capture is
  // FAILED_PRECONDITION when `required`; otherwise the step runs eagerly, and so do all
  // later ones (Describe() says why).
  absl::StatusOr<std::vector<at::Tensor>> Run(const std::vector<at::Tensor>& inputs,
                                              bool regular = true);
  // Drops the graph (its collectives belong to a process group that is gone, say): the
  // next calls warm up and capture again.
  void Reset();
  bool captured() const { return graph_ != nullptr; }
  // "captured after N eager steps", "eager: why", or "warming up (k of N eager steps)".
  std::string Describe() const;

 private:
  Fn fn_;
  at::Device device_;
  int warmup_;
  bool capture_;
  bool required_;
  int warm_done_ = 0;
  int captured_at_ = -1;
  std::string eager_reason_;
  std::unique_ptr<CapturedGraph> graph_;
  std::vector<at::Tensor> static_;   // The static inputs.
  std::vector<at::Tensor> outputs_;  // The graph's outputs.
  RunAhead run_ahead_;
};

// torch.nn.utils.clip_grad_norm_(params, max_norm) with the L2 norm, without a host
// synchronization: LibTorch's clip_grad_norm_ computes on the device and then reads the
// norm back (item()), which a graph cannot hold. The same operations as LibTorch's (a
// norm per gradient, the norm of those, max_norm / (norm + 1e-6) clamped at 1, every
// gradient scaled) on the CPU and with LibTorch 1.13; on a GPU with LibTorch 2.x,
// PyTorch's own CUDA path (torch._foreach_norm and torch._foreach_mul_), which Python's
// clip_grad_norm_ takes there. Parameters without a gradient are skipped. Returns the
// total norm (a 0-dim tensor on the gradients' device), undefined when none has one.
at::Tensor ClipGradNorm(const std::vector<at::Tensor>& params, double max_norm);

// The learning rate of each step, kept on the device so that a captured step finds its
// own: `lr_of_step(k)` (the host's schedule, e.g. ddp::scheduled_lr) is evaluated for a
// window of steps into a device table; Advance(), inside the step, copies the current
// entry into lr() and moves a device counter on. The host keeps a mirror of the counter
// and refills the table when the window is used up (Next(), outside any graph). The
// values are the host's, bit for bit.
class LrTable {
 public:
  // `dtype`: of the table and of lr() (what the optimizer's tensor lr wants).
  LrTable(std::function<double(int64_t)> lr_of_step, const at::Device& device,
          at::ScalarType dtype = at::kDouble, int64_t window = 4096);

  // Outside a graph, before the step that is global step `step`: refills the table when
  // `step` is not the next entry of the window (a new window, a resume, a skip).
  void Prepare(int64_t step);
  // Inside the step (device work only): lr() = the entry for the step Prepare named;
  // the counter moves on.
  void Advance();
  // Outside a graph, after each step (eager or replayed): the host's mirror moves on.
  void Next();
  // The next Prepare refills the table (after a failed step, when the counter on the
  // device may have moved without the mirror, or when the schedule's function changed).
  void Invalidate();
  // 0-dim, on the device: the learning rate of the step being taken.
  const at::Tensor& lr() const { return lr_; }

 private:
  void Fill(int64_t first_step);

  std::function<double(int64_t)> lr_of_step_;
  at::Tensor table_;  // [window] on the device
  at::Tensor index_;  // [1] int64 on the device: the entry Advance() reads
  at::Tensor lr_;     // 0-dim
  int64_t window_;
  int64_t first_ = -1;  // Global step of table_[0]; -1 before the first fill.
  int64_t next_ = 0;    // Host mirror: the global step the next Advance() serves.
};

}  // namespace ddp

#endif  // DDP_LIBDDP_ENGINE_CUDA_GRAPH_H_
