#include "ddp/process_group.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "libddp/src/api_bridge.h"

namespace ddp {

ProcessGroup::ProcessGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ProcessGroup::~ProcessGroup() = default;

absl::StatusOr<std::shared_ptr<ProcessGroup>> ProcessGroup::Impl::Create(
    const Environment& env, const DeviceChoice& device, const CommOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->env = env;
  impl->device = device;
  impl->options = options;
  DDP_ASSIGN_OR_RETURN(Comm comm, Comm::Connect(env, device, options));
  impl->comm.emplace(std::move(comm));
  return std::shared_ptr<ProcessGroup>(new ProcessGroup(std::move(impl)));
}

absl::Status ProcessGroup::Impl::Reconnect(const Environment& next) {
  comm.reset();
  DDP_ASSIGN_OR_RETURN(Comm c, Comm::Connect(next, device, options));
  comm.emplace(std::move(c));
  env = next;
  return absl::OkStatus();
}

std::shared_ptr<ProcessGroup> ProcessGroup::create(const Environment& env,
                                                   const ProcessGroupOptions& options) {
  DeviceRequest request;
  if (options.backend == "auto") {
    request.backend = DeviceRequest::Backend::kAuto;
  } else if (options.backend == "gloo") {
    request.backend = DeviceRequest::Backend::kGloo;
  } else if (options.backend == "nccl") {
    request.backend = DeviceRequest::Backend::kNccl;
  } else {
    ThrowIfError(absl::InvalidArgumentError(absl::StrCat(
        "ProcessGroupOptions.backend: '", options.backend, "' is not one of auto, gloo, nccl")));
  }
  if (options.device == "auto") {
    request.device = DeviceRequest::Device::kAuto;
  } else if (options.device == "cpu") {
    request.device = DeviceRequest::Device::kCpu;
  } else if (options.device == "cuda") {
    request.device = DeviceRequest::Device::kCuda;
  } else {
    ThrowIfError(absl::InvalidArgumentError(absl::StrCat(
        "ProcessGroupOptions.device: '", options.device, "' is not one of auto, cpu, cuda")));
  }
  CommOptions co;
  if (options.intra_node_comm == "auto") {
    co.intra_node = CommOptions::IntraNode::kAuto;
  } else if (options.intra_node_comm == "shm") {
    co.intra_node = CommOptions::IntraNode::kShm;
  } else if (options.intra_node_comm == "gloo") {
    co.intra_node = CommOptions::IntraNode::kGloo;
  } else {
    ThrowIfError(absl::InvalidArgumentError(
        absl::StrCat("ProcessGroupOptions.intra_node_comm: '", options.intra_node_comm,
                     "' is not one of auto, shm, gloo")));
  }
  if (options.rdzv_timeout.count() <= 0 || options.collective_timeout.count() <= 0) {
    ThrowIfError(absl::InvalidArgumentError(
        "ProcessGroupOptions: rdzv_timeout and collective_timeout must be positive"));
  }
  co.rdzv_timeout = options.rdzv_timeout;
  co.collective_timeout = options.collective_timeout;
  const DeviceChoice choice = ValueOrThrow(ChooseDevice(request, env));
  return ValueOrThrow(Impl::Create(env, choice, co));
}

std::shared_ptr<ProcessGroup> init_process_group(const ProcessGroupOptions& options) {
  return ProcessGroup::create(read_environment(), options);
}

int ProcessGroup::rank() const { return impl_->env.rank; }
int ProcessGroup::world_size() const { return impl_->env.world_size; }
int ProcessGroup::local_rank() const { return impl_->env.local_rank; }
const Environment& ProcessGroup::environment() const { return impl_->env; }
at::Device ProcessGroup::device() const { return impl_->device.device; }
const std::string& ProcessGroup::backend() const { return impl_->device.backend; }
std::string ProcessGroup::intra_node_comm() const { return impl_->comm->intra_node_comm(); }

void ProcessGroup::all_reduce_sum(at::Tensor& tensor) {
  ThrowIfError(impl_->comm->AllReduceSum(tensor));
}

absl::StatusOr<std::vector<double>> ProcessGroup::Impl::Sum(const std::vector<double>& values) {
  at::Tensor totals = at::tensor(values, at::TensorOptions().dtype(at::kDouble)).to(device.device);
  DDP_RETURN_IF_ERROR(comm->AllReduceSum(totals));
  at::Tensor t = totals.cpu();
  return std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
}

std::vector<double> ProcessGroup::sum(const std::vector<double>& values) {
  return ValueOrThrow(impl_->Sum(values));
}

void ProcessGroup::broadcast(const std::vector<at::Tensor>& tensors) {
  ThrowIfError(impl_->comm->Broadcast(tensors));
}

void ProcessGroup::barrier() { ThrowIfError(impl_->comm->Barrier()); }

namespace {
flight::Recorder* RecorderOf(ProcessGroup* group) {
  ProcessGroup::Impl& impl = group->impl();
  return impl.comm.has_value() ? impl.comm->recorder() : nullptr;
}
}  // namespace

StepPhase::StepPhase(ProcessGroup& group, Phase phase) : group_(&group), before_(-1) {
  if (flight::Recorder* r = RecorderOf(group_)) {
    before_ = static_cast<int>(r->SetPhase(static_cast<flight::Phase>(phase)));
  }
}

StepPhase::~StepPhase() {
  flight::Recorder* r = RecorderOf(group_);
  if (r != nullptr && before_ >= 0) r->SetPhase(static_cast<flight::Phase>(before_));
}

}  // namespace ddp
