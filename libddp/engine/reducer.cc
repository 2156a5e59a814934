#include "libddp/engine/reducer.h"

#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <map>
#include <unordered_set>
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

// Runs after a parameter's AccumulateGrad node, as PyTorch's reducer hooks its
// grad_accumulators_: called also when the incoming gradient is undefined (a tensor
// hook is not, under LibTorch 1.13), with param.grad already accumulated.
// On the grad_fn of each of the forward's outputs: queues the end of the reduction
// from the backward that starts at the outputs (the outer one), where PyTorch's
// _DDPSink queues it. Harmless once the reducer is gone.
class QueueFinishPreHook : public torch::autograd::FunctionPreHook {
 public:
  explicit QueueFinishPreHook(std::shared_ptr<GradientReducer*> reducer)
      : reducer_(std::move(reducer)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override {
    if (*reducer_ != nullptr) (*reducer_)->QueueFinishFromOutputs();
    return grads;
  }

 private:
  std::shared_ptr<GradientReducer*> reducer_;
};

class GradReadyHook : public torch::autograd::FunctionPostHook {
 public:
  explicit GradReadyHook(std::function<void()> fn) : fn_(std::move(fn)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    fn_();
    return outputs;
  }

 private:
  std::function<void()> fn_;
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
  local_used_.assign(params_.size(), 0.0f);
  global_used_.assign(params_.size(), true);
  fires_.assign(params_.size(), 0);
  // Held, as PyTorch's reducer holds them: a parameter keeps only a weak reference to
  // its AccumulateGrad node (our post-hook lives there), and find_unused_parameters'
  // graph walk knows a parameter by its node's address.
  for (const at::Tensor& p : params_) {
    accumulators_.push_back(torch::autograd::impl::grad_accumulator(p));
  }
  self_ = std::make_shared<GradientReducer*>(this);
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
    hook_keys_.push_back(accumulators_[i]->add_post_hook(
        std::make_unique<GradReadyHook>([this, i] { OnGradient(i); })));
  }
}

void GradientReducer::SetCommHook(BucketHook hook) {
  std::lock_guard<std::mutex> lock(mu_);
  comm_hook_ = std::move(hook);
  // A hook runs on a world of 1 too (PowerSGD changes the gradients there as well).
  alone_ = comm_hook_ == nullptr && comm_->world_size() == 1;
  if (!alone_ && hook_keys_.empty()) RegisterHooks();
  if (comm_hook_ && finished_ == 0) {
    std::vector<size_t> registration(params_.size());
    for (size_t i = 0; i < registration.size(); ++i) registration[i] = i;
    LayOutLocked(registration);
    // PyTorch rebuilds buckets only when static_graph or not find_unused_parameters.
    relayout_pending_ = options_.static_graph || !options_.find_unused_parameters;
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
  *self_ = nullptr;
  for (size_t i = 0; i < hook_keys_.size(); ++i) accumulators_[i]->del_post_hook(hook_keys_[i]);
}

void GradientReducer::PrepareForBackward(bool sync) {
  std::lock_guard<std::mutex> lock(mu_);
  sync_ = sync;
  // A parameter whose data was replaced (Module::load's set_ or set_data) may have a
  // new AccumulateGrad node, which this forward's graph will use: hook it instead.
  for (size_t i = 0; i < hook_keys_.size(); ++i) {
    std::shared_ptr<torch::autograd::Node> acc =
        torch::autograd::impl::grad_accumulator(params_[i]);
    if (acc == accumulators_[i]) continue;
    accumulators_[i]->del_post_hook(hook_keys_[i]);
    accumulators_[i] = std::move(acc);
    hook_keys_[i] = accumulators_[i]->add_post_hook(
        std::make_unique<GradReadyHook>([this, i] { OnGradient(i); }));
  }
  callback_queued_ = false;
  std::fill(ready_.begin(), ready_.end(), false);
  next_launch_ = 0;
  step_bytes_ = 0;
  outputs_given_ = false;
  finish_from_outputs_ = false;
  hooks_fired_ = false;
  marked_unused_ = false;
  unused_.clear();
  std::fill(fires_.begin(), fires_.end(), 0);
  std::fill(local_used_.begin(), local_used_.end(), 0.0f);
  if (options_.static_graph && finished_ > 0) {
    // Known from the first backward, with no graph walk.
    for (size_t i = 0; i < params_.size(); ++i) {
      if (expected_fires_[i] == 0) unused_.push_back(i);
    }
  }
  for (Bucket& b : state_) {
    b.pending = b.layout.params.size();
    b.work.reset();
  }
}

void GradientReducer::OnGradient(size_t i) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!sync_) return;
  hooks_fired_ = true;
  // PyTorch's local_used_map: used when param.grad is defined after accumulation.
  if (params_[i].grad().defined()) local_used_[i] = 1.0f;
  ++fires_[i];
  const bool static_first = options_.static_graph && finished_ == 0;
  if (ready_[i] || static_first ||
      (options_.static_graph && fires_[i] != expected_fires_[i])) {
    if (static_first) {
      if (fires_[i] == 1 && relayout_pending_) ready_order_.push_back(i);
      QueueFinishLocked();
      return;  // The first static backward reduces everything at its end.
    }
    if (options_.static_graph) {
      // Not the last of the recorded calls yet (a reentrant backward's first), or
      // more calls than the first backward made.
      if (fires_[i] > expected_fires_[i]) graph_changed_ = true;
      return;
    }
    // A second gradient for a parameter whose bucket may be gone already.
    lock.unlock();
    const absl::Status status = absl::FailedPreconditionError(absl::StrCat(
        "Expected to mark a variable ready only once (PyTorch's DDP error). Parameter ",
        ParamName(i), " got a second gradient in one backward: a parameter used in more "
        "than one reentrant backward (activation checkpointing), or used outside the "
        "module's forward. Set DdpOptions::static_graph = true when the graph is the same "
        "every iteration (it supports reentrant backward), or use the parameter once."));
    if (options_.throw_failure) options_.throw_failure(status);
    throw std::runtime_error(std::string(status.message()));
  }
  if (options_.find_unused_parameters && !options_.static_graph && !outputs_given_) {
    lock.unlock();
    const absl::Status status = absl::FailedPreconditionError(
        "find_unused_parameters: this backward's forward gave no outputs: call "
        "prepare_for_backward(outputs) with the forward's output tensors after each "
        "forward (DistributedDataParallel::forward does it for a forward that returns a "
        "tensor, a std::vector or a std::tuple of tensors)");
    if (options_.throw_failure) options_.throw_failure(status);
    throw std::runtime_error(std::string(status.message()));
  }
  QueueFinishLocked();
  if (trace_) trace_->Record(ReducerTrace::Kind::kGradReady, static_cast<int64_t>(i));
  if (alone_) {  // param.grad after AccumulateGrad is already the average.
    ready_[i] = true;
    return;
  }
  if (!marked_unused_) MarkUnusedLocked();
  // The hook runs after AccumulateGrad: DDP reduces param.grad as it is now, or zeros
  // when it is undefined (a custom autograd Function returned no gradient), as
  // PyTorch's mark_variable_ready_dense does.
  MarkFromGradLocked(i);
  if (state_[locate_[i].first].pending == 0) LaunchReadyLocked();
  // Buckets already launched move on while backward computes the next gradients.
  if (next_launch_ > 0) comm_->Poll();
}

void GradientReducer::QueueFinishFromOutputs() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!sync_ || callback_queued_) return;
  callback_queued_ = true;
  torch::autograd::Engine::get_default_engine().queue_callback([this] { FinishFromCallback(); });
}

void GradientReducer::QueueFinishLocked() {
  // With the outputs known, their grad_fn's pre-hook queues it in the outer backward: a
  // hook may run inside a reentrant (nested) backward, whose end is too early.
  if (options_.finish_in_backward && !callback_queued_ && !finish_from_outputs_) {
    callback_queued_ = true;
    torch::autograd::Engine::get_default_engine().queue_callback([this] { FinishFromCallback(); });
  }
}

void GradientReducer::MarkFromGradLocked(size_t i) {
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

void GradientReducer::MarkUnusedLocked() {
  marked_unused_ = true;
  for (size_t i : unused_) {
    if (!ready_[i]) MarkFromGradLocked(i);
  }
  LaunchReadyLocked();
}

void GradientReducer::SetOutputs(const std::vector<at::Tensor>& outputs) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!sync_) return;
  outputs_given_ = true;
  if (options_.finish_in_backward && !callback_queued_) {
    std::unordered_set<const void*> hooked;
    for (const at::Tensor& t : outputs) {
      if (!t.defined() || !t.requires_grad()) continue;
      const std::shared_ptr<torch::autograd::Node>& fn = t.grad_fn();
      if (fn == nullptr || !hooked.insert(fn.get()).second) continue;
      fn->add_pre_hook(std::make_unique<QueueFinishPreHook>(self_));
      finish_from_outputs_ = true;
    }
  }
  if (!options_.find_unused_parameters || options_.static_graph) return;
  // PyTorch's search_unused_parameters: every node autograd reaches from the outputs.
  std::unordered_set<const void*> seen;
  std::vector<torch::autograd::Node*> stack;
  for (const at::Tensor& t : outputs) {
    if (!t.defined() || !t.requires_grad()) continue;
    torch::autograd::Node* fn = torch::autograd::impl::gradient_edge(t).function.get();
    if (fn != nullptr && seen.insert(fn).second) stack.push_back(fn);
  }
  while (!stack.empty()) {
    torch::autograd::Node* fn = stack.back();
    stack.pop_back();
    for (const torch::autograd::Edge& edge : fn->next_edges()) {
      torch::autograd::Node* next = edge.function.get();
      if (next != nullptr && seen.insert(next).second) stack.push_back(next);
    }
  }
  unused_.clear();
  for (size_t i = 0; i < params_.size(); ++i) {
    if (seen.count(accumulators_[i].get()) == 0) unused_.push_back(i);
  }
}

std::string GradientReducer::ParamName(size_t i) const {
  if (i < options_.names.size()) return absl::StrCat(i, " ('", options_.names[i], "')");
  return absl::StrCat(i);
}

absl::Status GradientReducer::CheckPriorReduction() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (sync_ && hooks_fired_ && finish_from_outputs_ && !callback_queued_) {
    return absl::FailedPreconditionError(
        "Expected to have finished reduction in the prior iteration before starting a new "
        "one: the last backward computed gradients of the parameters without starting from "
        "the outputs of the model's forward, so libddp could not average them. Call "
        "backward() on a loss computed from the forward's result.");
  }
  if (unmarked_.empty() && !graph_changed_) return absl::OkStatus();
  // PyTorch's ensure_prior_reduction_finished, in substance.
  std::string message =
      "Expected to have finished reduction in the prior iteration before starting a new one. ";
  if (options_.static_graph) {
    absl::StrAppend(&message,
                    "This error indicates that your training graph has changed in this "
                    "iteration, e.g., one parameter is used in first iteration, but then got "
                    "unused in the second iteration. this is not compatible with static_graph "
                    "set to True (DdpOptions::static_graph).");
  } else {
    absl::StrAppend(&message,
                    "This error indicates that your module has parameters that were not used "
                    "in producing loss. ");
    if (!options_.find_unused_parameters) {
      absl::StrAppend(&message,
                      "You can enable unused parameter detection by setting "
                      "DdpOptions::find_unused_parameters = true (PyTorch: the keyword "
                      "argument `find_unused_parameters=True` to "
                      "`torch.nn.parallel.DistributedDataParallel`), and by \n");
    } else {
      absl::StrAppend(&message,
                      "Since `find_unused_parameters` is enabled, this likely  means that not "
                      "all `forward` outputs participate in computing loss. You can fix this "
                      "by ");
    }
    absl::StrAppend(&message,
                    "making sure all `forward` function outputs participate in calculating "
                    "loss. \nIf you already have done the above, then libddp wasn't able to "
                    "locate the output tensors in the return value of your module's `forward` "
                    "function: with DataParallel, pass them to prepare_for_backward(outputs).");
  }
  absl::StrAppend(&message, "\nParameter indices which did not receive grad for rank ",
                  comm_->rank(), ":");
  for (size_t i : unmarked_) absl::StrAppend(&message, " ", i);
  if (!options_.names.empty() && !unmarked_.empty()) {
    absl::StrAppend(&message, "\nParameters which did not receive grad for rank ",
                    comm_->rank(), ":");
    for (size_t k = 0; k < unmarked_.size(); ++k) {
      absl::StrAppend(&message, k ? ", " : " ", options_.names[unmarked_[k]]);
    }
  }
  return absl::FailedPreconditionError(message);
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
    bucket.work = comm_->StartSum(bucket.flat, static_cast<int>(index));
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
  // Backward is done: what runs next is the program's (the flight recorder's phase),
  // unless it named a phase of its own meanwhile.
  flight::Recorder* recorder = comm_->recorder();
  const flight::Phase phase = recorder->phase();
  if (phase == flight::Phase::kCompute || phase == flight::Phase::kCommWait) {
    recorder->SetPhase(flight::Phase::kProgram);
  }
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
  bool tracks_usage = false;
  std::unique_ptr<PendingSum> used_work;
  at::Tensor used_map;
  {
    std::lock_guard<std::mutex> lock(mu_);
    tracks_usage = TracksUsageLocked();
    // Parameters whose gradient nothing produced, and that nothing marked unused (the
    // graph walk, static_graph's record): PyTorch would never finish this reduction
    // and fails the next forward; CheckPriorReduction() says so there.
    unmarked_.clear();
    const bool static_first = options_.static_graph && finished_ == 0;
    if (!static_first) {
      std::vector<bool> unused(params_.size(), false);
      for (size_t i : unused_) unused[i] = true;
      for (size_t i = 0; i < params_.size(); ++i) {
        if (!ready_[i] && !unused[i]) unmarked_.push_back(i);
      }
    }
    if (static_first) expected_fires_ = fires_;
  }
  if (alone_) {
    // The same bits as the bucket path (x * 1.0 == x): only unused parameters need
    // their zeros, unless no rank (this one) used them and usage is tracked.
    std::lock_guard<std::mutex> lock(mu_);
    // An unfinished reduction (see below) leaves the gradients as they are.
    const size_t n = unmarked_.empty() && !graph_changed_ ? params_.size() : 0;
    for (size_t i = 0; i < n; ++i) {
      if (tracks_usage) global_used_[i] = local_used_[i] > 0;
      if (!global_used_[i] && (tracks_usage || options_.static_graph)) continue;
      if (!params_[i].grad().defined()) params_[i].mutable_grad() = at::zeros_like(params_[i]);
    }
    last_bytes_ = 0;
    ++finished_;
    return absl::ZeroDuration();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Parameters that got no hook call (unused in this forward, or waiting for the
    // end in static_graph's first backward): reduce what they accumulated (or zero),
    // so every rank still launches every bucket.
    for (size_t i = 0; i < params_.size(); ++i) {
      if (!ready_[i]) MarkFromGradLocked(i);
    }
    LaunchReadyLocked();
    if (tracks_usage) {  // PyTorch's all-reduce of local_used_map, after the buckets.
      used_map = at::tensor(local_used_, at::TensorOptions().dtype(at::kFloat))
                     .to(params_[0].device());
      used_work = comm_->StartSum(used_map);
    }
  }
  const auto start = std::chrono::steady_clock::now();
  for (size_t b = 0; b < state_.size(); ++b) {
    if (absl::Status st = state_[b].work->Wait(); !st.ok()) {
      return absl::UnavailableError(
          absl::StrCat("gradient bucket ", b, ": ", st.message()));
    }
    if (trace_) trace_->Record(ReducerTrace::Kind::kWaitDone, static_cast<int64_t>(b));
  }
  if (used_work) {
    if (absl::Status st = used_work->Wait(); !st.ok()) {
      return absl::UnavailableError(absl::StrCat("the used-parameter map: ", st.message()));
    }
    const at::Tensor counts = used_map.to(at::kCPU);
    for (size_t i = 0; i < params_.size(); ++i) {
      global_used_[i] = counts[static_cast<int64_t>(i)].item<float>() > 0;
    }
  }
  const auto waited = std::chrono::steady_clock::now() - start;
  bool unfinished = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    last_bytes_ = step_bytes_;
    ++finished_;
    unfinished = !unmarked_.empty() || graph_changed_;
  }
  // PyTorch never finalizes a reduction that some parameter left unfinished: the
  // gradients stay this rank's own (the buckets were still all-reduced here, so that
  // no peer waits on a collective), and the next forward fails.
  for (size_t i = 0; i < params_.size() && !unfinished; ++i) {
    // PyTorch keeps the gradient of a parameter no rank used untouched.
    if ((tracks_usage || options_.static_graph) && !global_used_[i]) continue;
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
    std::vector<size_t> position(params_.size(), params_.size());
    size_t next = 0;
    for (size_t i : ready_order_) {
      if (position[i] == params_.size()) position[i] = next++;
    }
    LayOutLocked(position);
    relayout_pending_ = false;
  }
  return absl::FromChrono(waited);
}

}  // namespace ddp
