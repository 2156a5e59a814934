#include "ddp/cuda_graph.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "libddp/engine/cuda_graph.h"
#include "libddp/src/api_bridge.h"

namespace ddp {

struct CudaStreamScope::Impl {
  explicit Impl(const at::Device& device) : scope(device) {}
  StreamScope scope;
};

CudaStreamScope::CudaStreamScope(const at::Device& device)
    : impl_(std::make_unique<Impl>(device)) {}
CudaStreamScope::~CudaStreamScope() = default;

struct DeviceLrSchedule::Impl {
  Impl(LrSchedule schedule, double base_lr, int64_t total, const at::Device& device,
       at::ScalarType dtype)
      : table(
            [schedule, base_lr, total](int64_t count) {
              return scheduled_lr(schedule, base_lr, count, total);
            },
            device, dtype) {}
  LrTable table;
  bool pending = false;  // before_step without its after_step.
};

DeviceLrSchedule::DeviceLrSchedule(LrSchedule schedule, double base_lr, int64_t total,
                                   const at::Device& device, at::ScalarType dtype)
    : impl_(std::make_unique<Impl>(schedule, base_lr, total, device, dtype)) {}
DeviceLrSchedule::~DeviceLrSchedule() = default;
const at::Tensor& DeviceLrSchedule::lr() const { return impl_->table.lr(); }
void DeviceLrSchedule::advance() { impl_->table.Advance(); }
void DeviceLrSchedule::before_step() {
  // A step that began and never ended (it threw) may have moved the device's counter:
  // refill rather than trust it.
  if (impl_->pending) impl_->table.Invalidate();
  impl_->pending = true;
  impl_->table.Prepare(count_);
}
void DeviceLrSchedule::after_step() {
  impl_->table.Next();
  impl_->pending = false;
  ++count_;
}
void DeviceLrSchedule::set_count(int64_t count) {
  count_ = count;
  impl_->table.Invalidate();
}

std::string cuda_graph_blocker(const DataParallel& model) {
  const DataParallel::Impl& impl = const_cast<DataParallel&>(model).impl();
  const DeviceChoice& device = impl.group->impl().device;
  if (!CudaGraphsBuilt()) return "this libddp has no CUDA graphs (it needs a CUDA LibTorch 2.x)";
  if (!device.device.is_cuda()) {
    return absl::StrCat("the model trains on ", device.device.str(),
                        ": CUDA graphs capture GPU work");
  }
  if (device.backend != "nccl") {
    return absl::StrCat("backend ", device.backend,
                        ": its collectives run on the host, which a graph cannot hold");
  }
  if (impl.comm_hook) return "a communication hook is registered: its collectives wait on the host";
  if (impl.options.find_unused_parameters && !impl.options.static_graph) {
    return "find_unused_parameters: each step walks the autograd graph and reads the used-"
           "parameter map on the host (static_graph does not)";
  }
  return "";
}

struct GraphedStep::Impl {
  Impl(DataParallel& model, StepFn fn, GraphedStepOptions options, const std::string& blocker)
      : model(model),
        options(options),
        graph(std::move(fn), model.impl().group->impl().device.device, options.warmup_steps,
              /*capture=*/options.capture && blocker.empty(), options.required),
        blocker(blocker) {}
  DataParallel& model;
  GraphedStepOptions options;
  StepGraph graph;
  std::string blocker;
};

GraphedStep::GraphedStep(DataParallel& model, StepFn step, GraphedStepOptions options) {
  const std::string blocker = cuda_graph_blocker(model);
  if (!blocker.empty() && options.required) {
    ThrowIfError(absl::FailedPreconditionError(
        absl::StrCat("GraphedStep: the step cannot be captured in a CUDA graph: ", blocker)));
  }
  impl_ = std::make_unique<Impl>(model, std::move(step), options, blocker);
}

GraphedStep::~GraphedStep() = default;

std::vector<at::Tensor> GraphedStep::operator()(const std::vector<at::Tensor>& inputs) {
  if (impl_->model.impl().join_pre_forward) {
    ThrowIfError(absl::FailedPreconditionError(
        "GraphedStep: the model is in an enabled ddp::Join, whose collectives a graph cannot "
        "hold: run the Join's steps eagerly"));
  }
  if (impl_->options.lr != nullptr) impl_->options.lr->before_step();
  std::vector<at::Tensor> out = ValueOrThrow(impl_->graph.Run(inputs));
  if (impl_->options.lr != nullptr) impl_->options.lr->after_step();
  // What a gradient-syncing training forward leaves on the host, which a replay does not
  // run: the next forward broadcasts the buffers (DDP's broadcast_buffers rule).
  impl_->model.impl().sync_buffers = true;
  return out;
}

bool GraphedStep::captured() const { return impl_->graph.captured(); }

std::string GraphedStep::status() const {
  if (!impl_->options.capture) return "eager: GraphedStepOptions::capture is false";
  if (!impl_->blocker.empty()) return absl::StrCat("eager: ", impl_->blocker);
  return impl_->graph.Describe();
}

at::Tensor clip_grad_norm_(const std::vector<at::Tensor>& parameters, double max_norm) {
  return ClipGradNorm(parameters, max_norm);
}

}  // namespace ddp
