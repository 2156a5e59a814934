#include "ddp/distributed_data_parallel.h"

#include <ATen/core/grad_mode.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "libddp/src/api_bridge.h"

namespace ddp {

absl::StatusOr<std::unique_ptr<DataParallel>> DataParallel::Impl::Create(
    NamedTensors parameters, NamedTensors buffers, std::shared_ptr<ProcessGroup> group,
    DdpOptions options, ReducerTrace* trace) {
  if (group == nullptr) return absl::InvalidArgumentError("DataParallel: no process group");
  if (!(options.bucket_cap_mb > 0) || !(options.first_bucket_cap_mb > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DdpOptions: bucket_cap_mb (", options.bucket_cap_mb, ") and first_bucket_cap_mb (",
        options.first_bucket_cap_mb, ") must be positive"));
  }
  const at::Device device = group->device();
  // As DDP does, only parameters that require grad are reduced; frozen ones are
  // broadcast once with the rest and then left alone.
  std::vector<at::Tensor> trainable;
  std::vector<std::string> trainable_names;
  std::string first_trainable;
  std::vector<at::Tensor> state;
  for (auto& [name, p] : parameters) {
    if (p.device() != device) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model: parameter '", name, "' is on ", p.device().str(), " but the process group's "
          "device is ", device.str(), ": move the model there first (model->to(group->device()))"));
    }
    state.push_back(p);
    if (!p.requires_grad()) continue;
    if (!trainable.empty() && p.scalar_type() != trainable[0].scalar_type()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model: parameter '", name, "' is ", c10::toString(p.scalar_type()), " but '",
          first_trainable, "' is ", c10::toString(trainable[0].scalar_type()),
          ": trainable parameters must share a dtype"));
    }
    if (trainable.empty()) first_trainable = name;
    trainable.push_back(p);
    trainable_names.push_back(name);
  }
  if (trainable.empty()) {
    return absl::InvalidArgumentError("model: no parameter requires grad: nothing to train");
  }
  auto impl = std::make_unique<Impl>();
  for (auto& [name, b] : buffers) {
    if (b.device() != device) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model: buffer '", name, "' is on ", b.device().str(), " but the process group's device "
          "is ", device.str(), ": move the model there first"));
    }
    impl->buffers.push_back(b);
    state.push_back(b);
  }
  GradientReducer::Options& ro = impl->reducer_options;
  ro.bucket_cap_bytes = static_cast<int64_t>(options.bucket_cap_mb * 1024 * 1024);
  ro.first_bucket_cap_bytes = static_cast<int64_t>(options.first_bucket_cap_mb * 1024 * 1024);
  ro.finish_in_backward = true;
  ro.find_unused_parameters = options.find_unused_parameters;
  ro.static_graph = options.static_graph;
  ro.names = std::move(trainable_names);
  // A failed all-reduce leaves backward() as the ddp::Error its status maps to.
  ro.throw_failure = [](const absl::Status& status) { ThrowIfError(status); };
  impl->state = std::move(state);
  impl->trainable = std::move(trainable);
  impl->trace = trace;
  impl->group = std::move(group);
  impl->options = options;
  DDP_RETURN_IF_ERROR(impl->Rebuild());
  return std::unique_ptr<DataParallel>(new DataParallel(std::move(impl)));
}

absl::Status DataParallel::Impl::Rebuild() {
  reducer.reset();
  Comm& comm = *group->impl().comm;
  // Every rank starts from rank 0's weights, as DDP's constructor does.
  DDP_RETURN_IF_ERROR(comm.Broadcast(state));
  reducer = std::make_unique<GradientReducer>(trainable, &comm, reducer_options, trace);
  if (comm_hook) reducer->SetCommHook(comm_hook);
  sync_buffers = true;
  return absl::OkStatus();
}

absl::Status DataParallel::Impl::PrepareForward() {
  const bool grad_enabled = at::GradMode::is_enabled();
  // The flight recorder's phase: forward and backward from here, unless the program
  // (or ddp-trainer) named another (evaluation, say).
  flight::Recorder* recorder = group->impl().comm->recorder();
  const flight::Phase phase = recorder->phase();
  if (grad_enabled && (phase == flight::Phase::kProgram || phase == flight::Phase::kStarting)) {
    recorder->SetPhase(flight::Phase::kCompute);
  }
  // PyTorch's rule (DDP._pre_forward / _post_forward): buffers are broadcast before
  // this forward when the previous one was a gradient-syncing training forward (or
  // none ran yet), and this forward decides for the next.
  if (join_pre_forward) {  // In a ddp::Join: its collectives, and the buffers' (join.cc).
    DDP_RETURN_IF_ERROR(join_pre_forward(*this));
  } else if (sync_buffers && options.broadcast_buffers && !buffers.empty()) {
    DDP_RETURN_IF_ERROR(group->impl().comm->Broadcast(buffers));
  }
  // PyTorch's ensure_prior_reduction_finished (a forward with grad enabled only).
  if (grad_enabled) DDP_RETURN_IF_ERROR(reducer->CheckPriorReduction());
  sync_buffers = grad_enabled && grad_sync;
  if (grad_enabled) reducer->PrepareForBackward(grad_sync);
  return absl::OkStatus();
}

DataParallel::DataParallel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

DataParallel::DataParallel(NamedTensors parameters, NamedTensors buffers,
                           std::shared_ptr<ProcessGroup> group, DdpOptions options)
    : impl_(std::move(ValueOrThrow(Impl::Create(std::move(parameters), std::move(buffers),
                                                std::move(group), options, nullptr))
                          ->impl_)) {}

DataParallel::~DataParallel() = default;

void DataParallel::prepare_forward() { ThrowIfError(impl_->PrepareForward()); }

void DataParallel::prepare_for_backward(const std::vector<at::Tensor>& outputs) {
  if (at::GradMode::is_enabled()) impl_->reducer->SetOutputs(outputs);
}

bool DataParallel::needs_outputs() const {
  return impl_->options.find_unused_parameters && !impl_->options.static_graph;
}

namespace detail {
void ThrowNoOutputs(const char* type_name) {
  ThrowIfError(absl::InvalidArgumentError(absl::StrCat(
      "find_unused_parameters: DistributedDataParallel::forward cannot find the tensors in "
      "the module's result (", type_name, "): return a tensor, a std::vector or a std::tuple "
      "of tensors, or call the module yourself between model.core().prepare_forward() and "
      "model.core().prepare_for_backward(outputs)")));
  std::abort();  // Not reached: ThrowIfError throws for an error status.
}
}  // namespace detail

DataParallel::NoSync DataParallel::no_sync() {
  const bool prev = impl_->grad_sync;
  impl_->grad_sync = false;
  return NoSync(this, prev);
}

DataParallel::NoSync::~NoSync() {
  if (dp_ != nullptr) dp_->impl_->grad_sync = prev_;
}

bool DataParallel::require_backward_grad_sync() const { return impl_->grad_sync; }

BackwardStats DataParallel::last_backward() const {
  return {absl::ToDoubleMilliseconds(impl_->reducer->last_wait()),
          impl_->reducer->last_allreduce_bytes()};
}

void DataParallel::register_comm_hook(CommHook hook) {
  if (!hook) {
    ThrowIfError(absl::InvalidArgumentError(
        "register_comm_hook: the hook is empty: pass a function of a GradBucket& that returns "
        "the bucket's averaged gradients (e.g. ddp::hooks::fp16_compress_hook with the group)"));
  }
  if (impl_->comm_hook) {
    ThrowIfError(absl::InvalidArgumentError(
        "register_comm_hook: a communication hook is already registered, and a model takes "
        "one (as PyTorch's DDP): register a single hook that does both"));
  }
  if (impl_->reducer->finished_backwards() > 0) {
    ThrowIfError(absl::InvalidArgumentError(
        "register_comm_hook: the model already ran a gradient-syncing backward: register the "
        "hook right after constructing DistributedDataParallel, before training"));
  }
  impl_->comm_hook = [hook = std::move(hook)](size_t index, size_t count, const at::Tensor& buffer,
                                              const std::vector<at::Tensor>& views,
                                              const std::vector<at::Tensor>& params) {
    GradBucket bucket(static_cast<int64_t>(index), index + 1 == count, buffer, views, params);
    at::Tensor out = hook(bucket);
    if (!out.defined() || out.sizes() != buffer.sizes() ||
        out.scalar_type() != buffer.scalar_type() || out.device() != buffer.device()) {
      ThrowIfError(absl::InvalidArgumentError(absl::StrCat(
          "communication hook: bucket ", index, ": the hook returned ",
          out.defined() ? absl::StrCat("a ", c10::toString(out.scalar_type()), " tensor of shape ",
                                       c10::str(out.sizes()), " on ", out.device().str())
                        : std::string("an undefined tensor"),
          ", but it must return the bucket's averaged gradients shaped like bucket.buffer(): "
          "a ", c10::toString(buffer.scalar_type()), " tensor of shape ", c10::str(buffer.sizes()),
          " on ", buffer.device().str(), " (e.g. the buffer itself, reduced in place; cast a "
          "compressed result back with buffer.copy_(result))")));
    }
    return out;
  };
  impl_->reducer->SetCommHook(impl_->comm_hook);
}

std::vector<BucketInfo> DataParallel::buckets() const {
  std::vector<BucketInfo> out;
  for (const BucketLayout& b : impl_->reducer->buckets()) {
    out.push_back({static_cast<int64_t>(b.params.size()), b.numel, b.bytes});
  }
  return out;
}

ProcessGroup& DataParallel::process_group() const { return *impl_->group; }

}  // namespace ddp
