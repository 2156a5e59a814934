// ddp::DistributedDataParallel: PyTorch's torch.nn.parallel.DistributedDataParallel
// for a LibTorch module.
//
//   auto group = ddp::init_process_group();
//   Net net;                                        // any torch::nn::Module holder
//   ddp::DistributedDataParallel model(net, group); // broadcasts rank 0's state
//   torch::optim::SGD opt(model.module()->parameters(), 0.1);
//   auto loss = loss_fn(model.forward(x), y);       // or model(x)
//   loss.backward();                                // all-reduces the gradients
//   opt.step();
//
// What it does, as PyTorch's DDP does:
//   - construction moves the module to the group's device and copies rank 0's
//     parameters and buffers to every rank;
//   - parameters that require grad are grouped into buckets in reverse registration
//     order (the first closes at first_bucket_cap_mb, later ones at bucket_cap_mb);
//     during backward() a hook on each parameter copies its gradient into its bucket,
//     and a full bucket's all-reduce starts at once, overlapping the rest of backward;
//     when backward ends, the averaged gradients are in param.grad(). Nothing to call
//     between backward() and the optimizer;
//   - parameters with requires_grad false (frozen) are broadcast once and left alone;
//   - a parameter that gets no gradient in a backward (this forward did not use it)
//     is, as in PyTorch, an error at the next forward ("Expected to have finished
//     reduction in the prior iteration ...", naming the parameters) unless
//     DdpOptions::find_unused_parameters or static_graph says how to handle it; a
//     parameter a custom autograd Function gave no gradient (an undefined tensor)
//     counts as zeros, as PyTorch's reducer does;
//   - buffers (BatchNorm's running statistics) are broadcast from rank 0 before a
//     forward that follows a gradient-syncing training forward (broadcast_buffers);
//   - inside no_sync() backward only accumulates locally; the next backward outside it
//     all-reduces the accumulated sum (gradient accumulation);
//   - module() is the wrapped module itself (PyTorch's model.module): its state dicts
//     carry no prefix;
//   - register_comm_hook(state, hook) hands each bucket to a communication hook
//     instead of the all-reduce (<ddp/comm_hooks.h>: fp16/bf16 compression, PowerSGD).
// A backward whose all-reduce fails (a peer died, a collective timed out) throws, and
// the error's message names the bucket and the cause.
#ifndef DDP_DISTRIBUTED_DATA_PARALLEL_H_
#define DDP_DISTRIBUTED_DATA_PARALLEL_H_

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <ATen/core/grad_mode.h>

#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include "ddp/comm_hooks.h"
#include "ddp/process_group.h"

namespace ddp {

struct DdpOptions {
  double bucket_cap_mb = 25.0;       // PyTorch's bucket_cap_mb.
  double first_bucket_cap_mb = 1.0;  // PyTorch's first bucket (1 MiB).
  bool broadcast_buffers = true;     // PyTorch's broadcast_buffers.
  // PyTorch's find_unused_parameters: after each forward, the autograd graph is walked
  // from the forward's outputs; parameters it does not reach are ready at once (their
  // buckets do not wait for them), and an all-reduced "locally used" map decides their
  // gradients: a parameter no rank used (or whose gradient was undefined on every rank)
  // keeps its gradient as it is (undefined stays undefined, so SGD's momentum skips it);
  // one some rank used gets the average, the others' counted as zeros.
  // DistributedDataParallel::forward finds the outputs in a returned tensor,
  // std::vector or std::tuple of tensors; with DataParallel (or another return type)
  // call prepare_for_backward(outputs) after each forward. Costs a graph walk per
  // forward and one small all-reduce per backward.
  bool find_unused_parameters = false;
  // PyTorch's static_graph (DDP(static_graph=True), _set_static_graph): the set of used
  // parameters and how many gradients each gets per backward are the same every
  // iteration. The first backward reduces everything at its end and records them;
  // later ones need no graph walk and no usage all-reduce, take the unused parameters
  // as ready at once, and handle a parameter whose gradient arrives more than once in a
  // backward (reentrant activation checkpointing). A graph that changes is the error
  // "your training graph has changed" at the next forward. Takes precedence over
  // find_unused_parameters, as in PyTorch.
  bool static_graph = false;
};

struct BucketInfo {
  int64_t params = 0;  // Parameters in the bucket.
  int64_t numel = 0;
  int64_t bytes = 0;
};

// What one backward cost: time spent waiting for all-reduces that backward's
// computation did not hide.
struct BackwardStats {
  double comm_wait_ms = 0;
  // Bytes of the tensors this rank all-reduced for the gradients: the buckets, or with
  // a communication hook what the hook passed to ProcessGroup::all_reduce_sum.
  int64_t allreduce_bytes = 0;
};

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// The engine behind DistributedDataParallel, for models that are not a
// torch::nn::Module (a TorchScript module, hand-held tensors): give it the model's
// parameters and buffers and call prepare_forward() before every forward.
class DataParallel {
 public:
  // Collective (broadcasts rank 0's values). The tensors must already be on
  // group->device(). Throws kInvalidArgument when no parameter requires grad or the
  // trainable ones do not share a dtype and device.
  DataParallel(NamedTensors parameters, NamedTensors buffers, std::shared_ptr<ProcessGroup> group,
               DdpOptions options = {});
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // What DDP.forward does before calling the module: broadcasts buffers when due, and
  // arms the gradient hooks when grad mode is on (syncing unless inside no_sync()).
  void prepare_forward();
  // The forward's output tensors, after each forward with grad enabled (PyTorch's
  // reducer.prepare_for_backward(outputs)). Needed with find_unused_parameters:
  // parameters autograd cannot reach from them are unused in this iteration. Optional
  // otherwise; given, the reduction ends with the backward that starts from them, so a
  // reentrant backward inside it (activation checkpointing) is handled as in PyTorch.
  void prepare_for_backward(const std::vector<at::Tensor>& outputs);
  // Whether prepare_for_backward needs the outputs (find_unused_parameters without
  // static_graph).
  bool needs_outputs() const;

  // RAII: backward passes of forwards made while it lives only accumulate locally.
  class NoSync {
   public:
    NoSync(NoSync&& other) noexcept : dp_(std::exchange(other.dp_, nullptr)), prev_(other.prev_) {}
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;
    NoSync& operator=(NoSync&&) = delete;
    ~NoSync();

   private:
    friend class DataParallel;
    NoSync(DataParallel* dp, bool prev) : dp_(dp), prev_(prev) {}
    DataParallel* dp_;
    bool prev_;
  };
  [[nodiscard]] NoSync no_sync();
  // PyTorch's require_backward_grad_sync: false inside no_sync().
  bool require_backward_grad_sync() const;

  // PyTorch's register_comm_hook: from the next backward on, every bucket goes through
  // `hook` (<ddp/comm_hooks.h>). Once per model, before the first gradient-syncing
  // backward; throws ddp::Error (kInvalidArgument) otherwise, for a null hook, and
  // (out of backward()) when the hook returns a tensor that is not shaped like
  // bucket.buffer() with its dtype and device.
  void register_comm_hook(CommHook hook);

  // Of the last gradient-syncing backward.
  BackwardStats last_backward() const;
  std::vector<BucketInfo> buckets() const;
  ProcessGroup& process_group() const;

  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  explicit DataParallel(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

namespace detail {
inline NamedTensors Named(const torch::OrderedDict<std::string, at::Tensor>& items) {
  NamedTensors out;
  out.reserve(items.size());
  for (const auto& item : items) out.emplace_back(item.key(), item.value());
  return out;
}
// The tensors of a forward's result, for find_unused_parameters: a tensor, a
// std::vector or a std::tuple / std::pair of tensors (nested); nullopt for anything else.
inline std::optional<std::vector<at::Tensor>> OutputTensors(const at::Tensor& t) {
  return std::vector<at::Tensor>{t};
}
inline std::optional<std::vector<at::Tensor>> OutputTensors(const std::vector<at::Tensor>& v) {
  return v;
}
template <typename T>
std::optional<std::vector<at::Tensor>> OutputTensors(const T&) {
  return std::nullopt;
}
template <typename... Ts>
std::optional<std::vector<at::Tensor>> OutputTensors(const std::tuple<Ts...>& t);
template <typename A, typename B>
std::optional<std::vector<at::Tensor>> OutputTensors(const std::pair<A, B>& p) {
  return OutputTensors(std::tie(p.first, p.second));
}
template <typename... Ts>
std::optional<std::vector<at::Tensor>> OutputTensors(const std::tuple<Ts...>& t) {
  std::optional<std::vector<at::Tensor>> all(std::in_place);
  std::apply(
      [&](const auto&... items) {
        auto add = [&](const auto& item) {
          auto part = OutputTensors(item);
          if (!part) {
            all.reset();
          } else if (all) {
            all->insert(all->end(), part->begin(), part->end());
          }
        };
        (add(items), ...);
      },
      t);
  return all;
}
// Throws ddp::Error: find_unused_parameters with a forward result it cannot look into.
[[noreturn]] void ThrowNoOutputs(const char* type_name);

// The module moved to `device` first, as DDP(model.to(device)) expects.
template <typename M>
M& OnDevice(M& module, const at::Device& device) {
  module->to(device);
  return module;
}
}  // namespace detail

// M: a module holder (TORCH_MODULE(Net) -> Net) or a std::shared_ptr<NetImpl>;
// anything with ->forward(...), ->named_parameters() and ->named_buffers().
template <typename M>
class DistributedDataParallel {
 public:
  DistributedDataParallel(M module, std::shared_ptr<ProcessGroup> group, DdpOptions options = {})
      : module_(std::move(module)),
        core_(detail::Named(detail::OnDevice(module_, group->device())->named_parameters()),
              detail::Named(module_->named_buffers()), group, options) {}

  // With find_unused_parameters, the result's tensors go to
  // core().prepare_for_backward (a tensor, a std::vector or a std::tuple of tensors;
  // another result type is an error naming what to do).
  template <typename... Args>
  decltype(auto) forward(Args&&... args) {
    core_.prepare_forward();
    using R = decltype(module_->forward(std::forward<Args>(args)...));
    if constexpr (std::is_void_v<R> || std::is_reference_v<R>) {
      return module_->forward(std::forward<Args>(args)...);
    } else {
      R out = module_->forward(std::forward<Args>(args)...);
      if (at::GradMode::is_enabled()) {
        auto tensors = detail::OutputTensors(out);
        if (tensors) {
          core_.prepare_for_backward(*tensors);
        } else if (core_.needs_outputs()) {
          detail::ThrowNoOutputs(typeid(R).name());
        }
      }
      return out;
    }
  }
  template <typename... Args>
  decltype(auto) operator()(Args&&... args) {
    return forward(std::forward<Args>(args)...);
  }

  // The wrapped module (PyTorch's model.module).
  M& module() { return module_; }
  const M& module() const { return module_; }
  [[nodiscard]] DataParallel::NoSync no_sync() { return core_.no_sync(); }
  // PyTorch's model.register_comm_hook(state, hook): `hook(*state, bucket)` for every
  // bucket, e.g. (group, ddp::hooks::fp16_compress_hook) or
  // (std::make_shared<ddp::hooks::PowerSGDState>(group, options), ddp::hooks::powerSGD_hook).
  template <typename State, typename Hook>
  void register_comm_hook(std::shared_ptr<State> state, Hook hook) {
    core_.register_comm_hook(
        [state = std::move(state), hook = std::move(hook)](GradBucket& bucket) -> at::Tensor {
          return hook(*state, bucket);
        });
  }
  void register_comm_hook(CommHook hook) { core_.register_comm_hook(std::move(hook)); }
  void train(bool on = true) { module_->train(on); }
  void eval() { module_->eval(); }
  DataParallel& core() { return core_; }
  BackwardStats last_backward() const { return core_.last_backward(); }

 private:
  M module_;
  DataParallel core_;
};

template <typename M>
DistributedDataParallel(M, std::shared_ptr<ProcessGroup>) -> DistributedDataParallel<M>;
template <typename M>
DistributedDataParallel(M, std::shared_ptr<ProcessGroup>, DdpOptions) -> DistributedDataParallel<M>;

}  // namespace ddp

#endif  // DDP_DISTRIBUTED_DATA_PARALLEL_H_
