#include "libddp/engine/cuda_graph.h"

#include <ATen/core/grad_mode.h>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <optional>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

#if TORCH_VERSION_MAJOR >= 2
#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_foreach_norm.h>
#include <ATen/ops/linalg_vector_norm.h>
#endif

#if DDP_WITH_CUDA && TORCH_VERSION_MAJOR >= 2
#define DDP_CUDA_GRAPHS 1
#include <ATen/core/CachingHostAllocator.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#else
#define DDP_CUDA_GRAPHS 0
#endif

namespace ddp {
#if DDP_CUDA_GRAPHS
namespace {

std::string FirstLine(const std::string& s) { return s.substr(0, s.find('\n')); }

c10::DeviceIndex IndexOf(const at::Device& device) {
  return device.index() >= 0 ? device.index() : c10::cuda::current_device();
}

// After a capture whose end failed (CUDAGraph::capture_end threw before it gave the pool
// back): the allocators stop routing allocations into the graph's pool, and the pool goes
// once its blocks are freed, as CUDAGraph::reset would have done. Best effort: each step
// on its own.
void AbandonPool(c10::DeviceIndex device, c10::MempoolId_t pool) {
  try {
    c10::cuda::CUDACachingAllocator::endAllocateToPool(device, pool);
  } catch (...) {
  }
  try {
    c10::cuda::CUDACachingAllocator::releasePool(device, pool);
  } catch (...) {
  }
  try {
    at::getHostAllocator(at::kCUDA)->end_allocate_to_pool(pool);
  } catch (...) {
  }
  try {
    at::getHostAllocator(at::kCUDA)->release_pool(pool);
  } catch (...) {
  }
  try {
    c10::cuda::CUDACachingAllocator::emptyCache();
  } catch (...) {
  }
}

}  // namespace
#endif

bool CudaGraphsBuilt() { return DDP_CUDA_GRAPHS != 0; }

// ---------------------------------------------------------------------------------------
// StreamScope

struct StreamScope::State {
#if DDP_CUDA_GRAPHS
  std::optional<c10::cuda::CUDAStream> previous;
  c10::DeviceIndex previous_device = -1;
#endif
};

StreamScope::StreamScope(const at::Device& device) : state_(std::make_unique<State>()) {
#if DDP_CUDA_GRAPHS
  if (!device.is_cuda()) return;
  const c10::DeviceIndex index = IndexOf(device);
  // The current device too: CUDAGraph captures on the current device's current stream
  // (a rank on cuda:3 under torchrun, which shows it every GPU, would capture on cuda:0's).
  state_->previous_device = c10::cuda::current_device();
  c10::cuda::set_device(index);
  state_->previous = c10::cuda::getCurrentCUDAStream(index);
  c10::cuda::setCurrentCUDAStream(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, index));
#else
  (void)device;
#endif
}

StreamScope::~StreamScope() {
#if DDP_CUDA_GRAPHS
  if (state_->previous) c10::cuda::setCurrentCUDAStream(*state_->previous);
  if (state_->previous_device >= 0) c10::cuda::set_device(state_->previous_device);
#endif
}

// ---------------------------------------------------------------------------------------
// CapturedGraph

struct CapturedGraph::Impl {
#if DDP_CUDA_GRAPHS
  at::cuda::CUDAGraph graph;
  c10::DeviceIndex device = 0;
#endif
};

CapturedGraph::CapturedGraph(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CapturedGraph::~CapturedGraph() = default;

absl::StatusOr<std::unique_ptr<CapturedGraph>> CapturedGraph::Capture(
    const at::Device& device, const std::function<void()>& fn) {
#if DDP_CUDA_GRAPHS
  if (!device.is_cuda()) {
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA graphs capture GPU work; ", device.str(), " is not a GPU"));
  }
  const c10::DeviceIndex index = IndexOf(device);
  const c10::cuda::CUDAGuard guard(index);  // CUDAGraph captures on the current device.
  if (c10::cuda::getCurrentCUDAStream(index) == c10::cuda::getDefaultCUDAStream(index)) {
    return absl::FailedPreconditionError(
        "a CUDA graph cannot be captured on the default stream: run the step under a "
        "StreamScope from before the model is made");
  }
  // What torch.cuda.graph does first: nothing of the warm-up is still in flight (NCCL's
  // watchdog then has no work of it to poll while the capture runs). And the warm-up's
  // cached blocks go back: the capture allocates from a pool of its own, and while it
  // runs the allocator cannot free the other pool's cache to make room.
  c10::cuda::device_synchronize();
  c10::cuda::CUDACachingAllocator::emptyCache();
  auto impl = std::make_unique<Impl>();
  impl->device = index;
  const c10::MempoolId_t pool = at::cuda::graph_pool_handle();
  bool begun = false, ended = false;
  try {
    impl->graph.capture_begin(pool);
    begun = true;
    try {
      fn();
    } catch (...) {
      // End the stream's capture before reporting, so that the stream is usable again.
      try {
        impl->graph.capture_end();
        ended = true;
      } catch (...) {
      }
      throw;
    }
    impl->graph.capture_end();
    ended = true;
  } catch (const std::exception& e) {
    if (begun && !ended) AbandonPool(index, pool);
    return absl::InternalError(absl::StrCat("CUDA graph capture failed: ", FirstLine(e.what())));
  }
  return std::unique_ptr<CapturedGraph>(new CapturedGraph(std::move(impl)));
#else
  (void)device;
  (void)fn;
  return absl::FailedPreconditionError(
      "this build has no CUDA graphs (it needs a CUDA LibTorch 2.x)");
#endif
}

void CapturedGraph::Replay() {
#if DDP_CUDA_GRAPHS
  const c10::cuda::CUDAGuard guard(impl_->device);
  impl_->graph.replay();
#endif
}

// ---------------------------------------------------------------------------------------
// RunAhead and WaitForDevice

struct RunAhead::Impl {
#if DDP_CUDA_GRAPHS
  std::deque<at::cuda::CUDAEvent> marks;
#endif
};

RunAhead::RunAhead(const at::Device& device, int depth)
    : impl_(std::make_unique<Impl>()), device_(device), depth_(std::max(depth, 1)) {}
RunAhead::~RunAhead() = default;

void RunAhead::Mark() {
#if DDP_CUDA_GRAPHS
  if (!device_.is_cuda()) return;
  impl_->marks.emplace_back(cudaEventDisableTiming);
  impl_->marks.back().record(c10::cuda::getCurrentCUDAStream(IndexOf(device_)));
  while (static_cast<int>(impl_->marks.size()) > depth_) {
    impl_->marks.front().synchronize();
    impl_->marks.pop_front();
  }
#endif
}

void RunAhead::Clear() {
#if DDP_CUDA_GRAPHS
  impl_->marks.clear();
#endif
}

absl::Status WaitForDevice(const at::Device& device, absl::Duration timeout) {
#if DDP_CUDA_GRAPHS
  if (!device.is_cuda()) return absl::OkStatus();
  at::cuda::CUDAEvent done(cudaEventDisableTiming);
  done.record(c10::cuda::getCurrentCUDAStream(IndexOf(device)));
  const auto deadline = std::chrono::steady_clock::now() + absl::ToChronoMilliseconds(timeout);
  auto pause = std::chrono::microseconds(50);
  while (!done.query()) {
    if (std::chrono::steady_clock::now() > deadline) {
      return absl::UnavailableError(absl::StrCat(
          "the GPU's queued steps did not finish within ", absl::FormatDuration(timeout),
          " (train.collective_timeout_s): a collective in them waits for a peer that died "
          "or hung"));
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(2000));
  }
#else
  (void)device;
  (void)timeout;
#endif
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------
// StepGraph

StepGraph::StepGraph(Fn fn, const at::Device& device, int warmup, bool capture, bool required)
    : fn_(std::move(fn)),
      device_(device),
      // At least one eager step: the optimizer makes its state there, and state made
      // inside a capture would be made anew (zeroed) by every replay.
      warmup_(std::max(warmup, 1)),
      capture_(capture),
      required_(required),
      run_ahead_(device) {
  if (!capture_) eager_reason_ = "capture is off";
}

StepGraph::~StepGraph() = default;

absl::StatusOr<std::vector<at::Tensor>> StepGraph::Run(const std::vector<at::Tensor>& inputs,
                                                       bool regular) {
  bool same = !static_.empty() && static_.size() == inputs.size();
  for (size_t i = 0; same && i < inputs.size(); ++i) {
    same = inputs[i].sizes() == static_[i].sizes() &&
           inputs[i].scalar_type() == static_[i].scalar_type();
  }
  if (!regular || (!static_.empty() && !same)) {
    // Not the step's regular shapes (an epoch's short last batch): eagerly, on the inputs
    // themselves (moved to the device), the static inputs and the warm-up left alone.
    std::vector<at::Tensor> moved;
    for (const at::Tensor& t : inputs) moved.push_back(t.to(device_, /*non_blocking=*/true));
    std::vector<at::Tensor> out = fn_(moved);
    run_ahead_.Mark();
    return out;
  }
  if (static_.empty()) {
    for (const at::Tensor& t : inputs) {
      static_.push_back(at::empty(t.sizes(), t.options().device(device_)));
    }
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    const at::Tensor& t = inputs[i];
    if (t.device().is_cpu() && device_.is_cuda()) {
      // Through a pinned block of our own (a caller's pinned tensor may be refilled while
      // the copy is queued): the caching host allocator hands it out again only once the
      // copy from it is done, so the host never waits for the GPU here.
      static_[i].copy_(at::empty(t.sizes(), t.options().pinned_memory(true)).copy_(t),
                       /*non_blocking=*/true);
    } else {
      static_[i].copy_(t, /*non_blocking=*/true);
    }
  }
  if (graph_ != nullptr) {
    graph_->Replay();
    run_ahead_.Mark();
    return outputs_;
  }
  if (!capture_ || warm_done_ < warmup_) {
    if (capture_) ++warm_done_;
    std::vector<at::Tensor> out = fn_(static_);
    run_ahead_.Mark();
    return out;
  }
  // The capture records the step without running it; the replay right after runs it.
  std::vector<at::Tensor> outputs;
  absl::StatusOr<std::unique_ptr<CapturedGraph>> graph =
      CapturedGraph::Capture(device_, [&] { outputs = fn_(static_); });
  if (graph.ok()) {
    graph_ = *std::move(graph);
    outputs_ = std::move(outputs);
    captured_at_ = warm_done_;
    graph_->Replay();
    run_ahead_.Mark();
    return outputs_;
  }
  const std::string why(graph.status().message());
  if (required_) {
    return absl::FailedPreconditionError(
        absl::StrCat("the step could not be captured in a CUDA graph: ", why));
  }
  capture_ = false;
  eager_reason_ = why;
  std::vector<at::Tensor> out = fn_(static_);
  run_ahead_.Mark();
  return out;
}

void StepGraph::Reset() {
  run_ahead_.Clear();
  graph_.reset();
  outputs_.clear();
  warm_done_ = 0;
  captured_at_ = -1;
}

std::string StepGraph::Describe() const {
  if (graph_ != nullptr) return absl::StrCat("captured after ", captured_at_, " eager steps");
  if (!eager_reason_.empty()) return absl::StrCat("eager: ", eager_reason_);
  return absl::StrCat("warming up (", warm_done_, " of ", warmup_, " eager steps)");
}

// ---------------------------------------------------------------------------------------
// ClipGradNorm

at::Tensor ClipGradNorm(const std::vector<at::Tensor>& params, double max_norm) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> grads;
  for (const at::Tensor& p : params) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  if (grads.empty()) return {};
  at::Tensor total;
#if TORCH_VERSION_MAJOR >= 2
  bool same_cuda = grads[0].is_cuda();
  for (const at::Tensor& g : grads) {
    same_cuda = same_cuda && g.device() == grads[0].device() &&
                g.scalar_type() == grads[0].scalar_type();
  }
  if (same_cuda) {
    // torch.nn.utils.clip_grad_norm_'s foreach path (get_total_norm, clip_grads_with_norm_).
    const std::vector<at::Tensor> norms = at::_foreach_norm(grads, 2);
    total = at::linalg_vector_norm(at::stack(norms), 2);
    // Python's `max_norm / (total + 1e-6)` is Tensor.__rtruediv__: reciprocal, then times.
    const at::Tensor coef = at::clamp_max((total + 1e-6).reciprocal() * max_norm, 1.0);
    at::_foreach_mul_(grads, coef);
    return total;
  }
#endif
  // LibTorch's clip_grad_norm_ (torch/nn/utils/clip_grad.h), without its closing item().
  std::vector<at::Tensor> norms;
  norms.reserve(grads.size());
  for (const at::Tensor& g : grads) norms.push_back(g.norm(2));
  total = norms.size() == 1 ? norms[0] : at::stack(norms).norm(2);
  const at::Tensor coef = at::clamp_max(max_norm / (total + 1e-6), 1.0);
  for (at::Tensor& g : grads) g.mul_(coef);
  return total;
}

// ---------------------------------------------------------------------------------------
// LrTable

LrTable::LrTable(std::function<double(int64_t)> lr_of_step, const at::Device& device,
                 at::ScalarType dtype, int64_t window)
    : lr_of_step_(std::move(lr_of_step)), window_(window > 0 ? window : 1) {
  const at::TensorOptions opts = at::TensorOptions().device(device);
  table_ = at::zeros({window_}, opts.dtype(dtype));
  index_ = at::zeros({1}, opts.dtype(at::kLong));
  lr_ = at::zeros({}, opts.dtype(dtype));
}

void LrTable::Fill(int64_t first_step) {
  at::Tensor host = at::empty({window_}, at::TensorOptions().dtype(at::kDouble));
  double* v = host.data_ptr<double>();
  for (int64_t i = 0; i < window_; ++i) v[i] = lr_of_step_(first_step + i);
  table_.copy_(host);  // Rounded to the table's dtype as a Python float would be.
  index_.zero_();
  first_ = first_step;
  next_ = first_step;
}

void LrTable::Prepare(int64_t step) {
  if (first_ < 0 || step != next_ || step - first_ >= window_) Fill(step);
}

void LrTable::Advance() {
  at::NoGradGuard no_grad;
  lr_.copy_(at::index_select(table_, 0, index_).squeeze(0));
  index_.add_(1);
}

void LrTable::Next() { ++next_; }

void LrTable::Invalidate() { first_ = -1; }

}  // namespace ddp
