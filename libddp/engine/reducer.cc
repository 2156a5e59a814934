#include "libddp/engine/reducer.h"

#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/engine.h>

#include <algorithm>
#include <map>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ddp {
namespace {

// A bucket a communication hook reduced already.
class DoneSum : public PendingSum {
 public:
  absl::Status Wait() override { return absl::OkStatus(); }
};

}  // namespace

void ReducerTrace::Reset() {
  std::lock_guard<std::mutex> lock(mu_);
  entries_.clear();
  start_ = std::chrono::steady_clock::now();
}

void ReducerTrace::Record(Kind kind, int64_t index) {
  std::lock_guard<std::mutex> lock(mu_);
  double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start_)
                  .count();
  entries_.push_back({kind, index, us});
}

std::vector<ReducerTrace::Entry> ReducerTrace::Take() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(entries_, {});
}

const char* ReducerTrace::KindName(Kind kind) {
  switch (kind) {
    case Kind::kGradReady: return "grad_ready";
    case Kind::kLaunch: return "allreduce_launch";
    case Kind::kBackwardEnd: return "backward_end";
    case Kind::kWaitDone: return "allreduce_done";
  }
  return "?";
}

std::vector<BucketLayout> AssignBuckets(const std::vector<int64_t>& sizes_bytes,
                                        int64_t first_cap_bytes, int64_t cap_bytes) {
  std::vector<BucketLayout> buckets;
  BucketLayout current;
  int64_t limit = first_cap_bytes;
  for (size_t k = sizes_bytes.size(); k-- > 0;) {
    current.params.push_back(k);
    current.bytes += sizes_bytes[k];
    if (current.bytes >= limit) {
      buckets.push_back(std::move(current));
      current = BucketLayout();
      limit = cap_bytes;
    }
  }
  if (!current.params.empty()) buckets.push_back(std::move(current));
  return buckets;
}

GradientReducer::GradientReducer(std::vector<at::Tensor> params, Comm* comm, Options options,
                                 ReducerTrace* trace)
    : params_(std::move(params)), comm_(comm), options_(options), trace_(trace) {
  const int world_size = comm_->world_size();
  alone_ = world_size == 1;
  TORCH_CHECK(!params_.empty(), "GradientReducer needs parameters");
  const at::TensorOptions opts = params_[0].options();
  std::vector<int64_t> sizes;
  for (const at::Tensor& p : params_) {
    TORCH_CHECK(p.requires_grad(), "every parameter must require grad");
    TORCH_CHECK(p.scalar_type() == params_[0].scalar_type() && p.device() == params_[0].device(),
                "parameters must share dtype and device");
    sizes.push_back(p.numel() * static_cast<int64_t>(p.element_size()));
  }
  // Multiplying by this 0-dim double tensor rounds exactly like DDP's
  // mul_out(bucket_view, grad, wrapped_scalar_tensor(1. / world)).
  scale_ = at::scalar_tensor(1.0 / world_size, at::TensorOptions().dtype(at::kDouble));

  buckets_ = AssignBuckets(sizes, options_.first_bucket_cap_bytes, options_.bucket_cap_bytes);
  locate_.resize(params_.size());
  state_.resize(buckets_.size());
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = state_[b];
    bucket.layout = buckets_[b];
    for (size_t idx : bucket.layout.params) bucket.layout.numel += params_[idx].numel();
    buckets_[b].numel = bucket.layout.numel;
    bucket.flat = at::zeros({bucket.layout.numel}, opts.requires_grad(false));
    ViewBucket(b);
  }
  ready_.assign(params_.size(), false);
  // Alone, the hooks would only feed the trace (or queue the final callback, which
  // gives unused parameters their zeros): without either, backward runs bare.
  if (alone_ && trace_ == nullptr && !options_.finish_in_backward) return;
  RegisterHooks();
}

void GradientReducer::ViewBucket(size_t b) {
  Bucket& bucket = state_[b];
  bucket.views.clear();
  bucket.params.clear();
  int64_t offset = 0;
  for (size_t slot = 0; slot < bucket.layout.params.size(); ++slot) {
    const at::Tensor& p = params_[bucket.layout.params[slot]];
    bucket.views.push_back(bucket.flat.narrow(0, offset, p.numel()).view(p.sizes()));
    bucket.params.push_back(p);
    locate_[bucket.layout.params[slot]] = {b, slot};
    offset += p.numel();
  }
}

void GradientReducer::RegisterHooks() {
  for (size_t i = 0; i < params_.size(); ++i) {
    hook_handles_.push_back(
        params_[i].register_hook([this, i](const at::Tensor& grad) { OnGradient(i, grad); }));
  }
}

void GradientReducer::SetCommHook(BucketHook hook) {
  std::lock_guard<std::mutex> lock(mu_);
  comm_hook_ = std::move(hook);
  // A hook runs on a world of 1 too (PowerSGD changes the gradients there as well).
  alone_ = comm_hook_ == nullptr && comm_->world_size() == 1;
  if (!alone_ && hook_handles_.empty()) RegisterHooks();
  if (comm_hook_ && finished_ == 0) {
    std::vector<size_t> registration(params_.size());
    for (size_t i = 0; i < registration.size(); ++i) registration[i] = i;
    LayOutLocked(registration);
    relayout_pending_ = true;
    ready_order_.clear();
  }
}

void GradientReducer::LayOutLocked(const std::vector<size_t>& position) {
  for (size_t b = 0; b < state_.size(); ++b) {
    Bucket& bucket = state_[b];
    std::stable_sort(bucket.layout.params.begin(), bucket.layout.params.end(),
                     [&](size_t x, size_t y) { return position[x] < position[y]; });
    ViewBucket(b);
  }
}

int64_t GradientReducer::finished_backwards() const {
  std::lock_guard<std::mutex> lock(mu_);
  return finished_;
}

int64_t GradientReducer::last_allreduce_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_bytes_;
}

GradientReducer::~GradientReducer() {
  for (size_t i = 0; i < hook_handles_.size(); ++i) params_[i].remove_hook(hook_handles_[i]);
}

void GradientReducer::PrepareForBackward(bool sync) {
  std::lock_guard<std::mutex> lock(mu_);
  sync_ = sync;
  callback_queued_ = false;
  std::fill(ready_.begin(), ready_.end(), false);
  next_launch_ = 0;
  step_bytes_ = 0;
  for (Bucket& b : state_) {
    b.pending = b.layout.params.size();
    b.work.reset();
  }
}

void GradientReducer::OnGradient(size_t i, const at::Tensor& grad) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!sync_ || ready_[i]) return;
  if (options_.finish_in_backward && !callback_queued_) {
    callback_queued_ = true;
    torch::autograd::Engine::get_default_engine().queue_callback([this] { FinishFromCallback(); });
  }
  if (trace_) trace_->Record(ReducerTrace::Kind::kGradReady, static_cast<int64_t>(i));
  if (alone_) return;  // param.grad after AccumulateGrad is already the average.
  if (relayout_pending_) ready_order_.push_back(i);
  auto [b, slot] = locate_[i];
  Bucket& bucket = state_[b];
  at::Tensor& view = bucket.views[slot];
  // The hook runs before AccumulateGrad adds `grad` into param.grad, so the value
  // DDP reduces (param.grad after accumulation) is param.grad + grad.
  const at::Tensor& accumulated = params_[i].grad();
  if (!grad.defined()) {
    // A custom autograd Function returned no gradient for this parameter. PyTorch's
    // mark_variable_ready_dense reduces param.grad as it is, or zeros when it is
    // undefined ("Gradient is undefined ... bucket_view.zero_()").
    if (!accumulated.defined()) {
      view.zero_();
    } else if (comm_hook_) {
      view.copy_(accumulated);
    } else {
      at::mul_out(view, accumulated, scale_);
    }
  } else if (comm_hook_) {  // The hook divides (PyTorch copies the gradient as it is).
    if (accumulated.defined()) {
      at::add_out(view, accumulated, grad);
    } else {
      view.copy_(grad);
    }
  } else if (accumulated.defined()) {
    at::mul_out(view, accumulated + grad, scale_);
  } else {
    at::mul_out(view, grad, scale_);
  }
  ready_[i] = true;
  if (--bucket.pending == 0) LaunchReadyLocked();
  // Buckets already launched move on while backward computes the next gradients.
  if (next_launch_ > 0) comm_->Poll();
}

void GradientReducer::LaunchReadyLocked() {
  while (next_launch_ < state_.size() && state_[next_launch_].pending == 0) {
    Launch(state_[next_launch_], next_launch_);
    ++next_launch_;
  }
}

void GradientReducer::Launch(Bucket& bucket, size_t index) {
  if (trace_) trace_->Record(ReducerTrace::Kind::kLaunch, static_cast<int64_t>(index));
  if (!comm_hook_) {
    step_bytes_ += bucket.flat.numel() * static_cast<int64_t>(bucket.flat.element_size());
    bucket.work = comm_->StartSum(bucket.flat);
    return;
  }
  // The hook's collectives are synchronous: the bucket is reduced when it returns (an
  // exception leaves backward() with it).
  at::NoGradGuard no_grad;
  const int64_t before = comm_->all_reduce_sum_bytes();
  at::Tensor result = comm_hook_(index, state_.size(), bucket.flat, bucket.views, bucket.params);
  step_bytes_ += comm_->all_reduce_sum_bytes() - before;
  if (!result.is_same(bucket.flat)) bucket.flat.copy_(result);
  bucket.work = std::make_unique<DoneSum>();
}

void GradientReducer::FinishFromCallback() {
  absl::StatusOr<absl::Duration> waited = FinishBackward();
  std::lock_guard<std::mutex> lock(mu_);
  sync_ = false;  // A second backward without a forward in between reduces nothing.
  if (waited.ok()) {
    last_wait_ = *waited;
    return;
  }
  callback_error_ = waited.status();
  if (options_.throw_failure) options_.throw_failure(waited.status());
  throw std::runtime_error(std::string(waited.status().message()));
}

absl::Duration GradientReducer::last_wait() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_wait_;
}

std::optional<absl::Status> GradientReducer::TakeCallbackError() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(callback_error_, std::nullopt);
}

absl::StatusOr<absl::Duration> GradientReducer::FinishBackward() {
  if (trace_) trace_->Record(ReducerTrace::Kind::kBackwardEnd, -1);
  if (alone_) {
    // The same bits as the bucket path (x * 1.0 == x): only unused parameters need
    // their zeros.
    for (at::Tensor& p : params_) {
      if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
    }
    std::lock_guard<std::mutex> lock(mu_);
    last_bytes_ = 0;
    ++finished_;
    return absl::ZeroDuration();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Parameters that took no part in this forward get no hook call: reduce what
    // they accumulated (or zero), so every rank still launches every bucket.
    for (size_t i = 0; i < params_.size(); ++i) {
      if (ready_[i]) continue;
      auto [b, slot] = locate_[i];
      const at::Tensor& g = params_[i].grad();
      if (g.defined() && comm_hook_) {
        state_[b].views[slot].copy_(g);
      } else if (g.defined()) {
        at::mul_out(state_[b].views[slot], g, scale_);
      } else {
        state_[b].views[slot].zero_();
      }
      ready_[i] = true;
      if (relayout_pending_) ready_order_.push_back(i);
      --state_[b].pending;
    }
    LaunchReadyLocked();
  }
  const auto start = std::chrono::steady_clock::now();
  for (size_t b = 0; b < state_.size(); ++b) {
    if (absl::Status st = state_[b].work->Wait(); !st.ok()) {
      return absl::UnavailableError(
          absl::StrCat("gradient bucket ", b, ": ", st.message()));
    }
    if (trace_) trace_->Record(ReducerTrace::Kind::kWaitDone, static_cast<int64_t>(b));
  }
  const auto waited = std::chrono::steady_clock::now() - start;
  {
    std::lock_guard<std::mutex> lock(mu_);
    last_bytes_ = step_bytes_;
    ++finished_;
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    auto [b, slot] = locate_[i];
    at::Tensor& grad = params_[i].mutable_grad();
    if (grad.defined()) {
      grad.copy_(state_[b].views[slot]);
    } else {
      grad = state_[b].views[slot].clone();
    }
  }
  // PyTorch rebuilds its buckets in gradient-ready order after the first sync backward.
  std::lock_guard<std::mutex> lock(mu_);
  if (relayout_pending_) {
    std::vector<size_t> position(params_.size());
    for (size_t k = 0; k < ready_order_.size(); ++k) position[ready_order_[k]] = k;
    LayOutLocked(position);
    relayout_pending_ = false;
  }
  return absl::FromChrono(waited);
}

}  // namespace ddp
