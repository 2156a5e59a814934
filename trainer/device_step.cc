#include "trainer/device_step.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "ddp/autocast.h"
#include "ddp/fused_optimizer.h"
#include "libddp/src/api_bridge.h"

namespace ddp {

std::optional<FusedLr> FusedLrOf(torch::optim::Optimizer& optimizer, const at::Device& device) {
  auto* fused = dynamic_cast<FusedOptimizer*>(&optimizer);
  if (fused == nullptr) return std::nullopt;
  FusedLr out;
  out.set_lr_tensor = [fused](const at::Tensor& lr) { fused->set_lr_tensor(lr); };
  // What the kernels read (decision 171): a float on a GPU, a double on the CPU.
  out.lr_dtype = device.is_cuda() ? at::kFloat : at::kDouble;
  return out;
}

std::vector<std::string> CudaGraphBlockers(const JobSpec& spec, const DeviceChoice& device,
                                           bool optimizer_fused) {
  std::vector<std::string> why;
  const TrainSpec& t = spec.train;
  if (!CudaGraphsBuilt()) {
    why.push_back("this ddp-trainer has no CUDA graphs (it needs a CUDA LibTorch 2.x)");
  }
  if (!device.device.is_cuda()) {
    why.push_back(absl::StrCat("the rank trains on ", device.device.str(),
                               " (train.device, backend): graphs capture GPU work"));
  } else if (device.backend != "nccl") {
    why.push_back(absl::StrCat("backend ", device.backend,
                               ": its collectives run on the host, which a graph cannot hold "
                               "(NCCL's run on the GPU)"));
  }
  if (t.comm_hook != CommHookKind::kNone) {
    why.push_back("train.comm_hook: a hook's collectives wait on the host between buckets");
  }
  if (t.optimizer.zero_redundancy) {
    why.push_back("train.optimizer.zero_redundancy: ZeRO's broadcasts wait on the host");
  }
  if (!optimizer_fused) {
    why.push_back(
        "train.optimizer: not fused (train.optimizer.fused false, or a LibTorch without the "
        "fused kernels): its step counts and learning rate live on the host");
  }
  if (spec.metrics.trace_buckets) {
    why.push_back("metrics.trace_buckets: the reducer's timeline is taken by host hooks, which "
                  "a replayed graph does not run");
  }
  return why;
}

DeviceStep::DeviceStep(Parts parts, const TrainSpec& train, const at::Device& device,
                       LrOf lr_of, int64_t steps_per_epoch, bool capture, bool required,
                       int warmup)
    : parts_(std::move(parts)),
      train_(train),
      device_(device),
      lr_of_(std::move(lr_of)),
      steps_per_epoch_(std::max<int64_t>(steps_per_epoch, 1)),
      lr_([this](int64_t g) { return lr_of_(epoch_ + (g - epoch_start_) / steps_per_epoch_, g); },
          device, parts_.lr_dtype),
      graph_([this](const std::vector<at::Tensor>& in) { return Run(in); }, device, warmup,
             capture, required),
      capture_(capture),
      epoch_loss_(at::zeros({}, at::TensorOptions().device(device).dtype(at::kDouble))) {
  parts_.set_lr_tensor(lr_.lr());
}

DeviceStep::~DeviceStep() = default;

std::vector<at::Tensor> DeviceStep::Run(const std::vector<at::Tensor>& inputs) {
  const size_t k = inputs.size() / 2;
  // As after every step (and a capture that failed halfway may have left some).
  for (at::Tensor& p : parts_.params) p.mutable_grad().reset();
  at::Tensor loss;
  for (size_t j = 0; j < k; ++j) {
    // Gradient accumulation: the last micro-batch's backward all-reduces the sum.
    std::optional<DataParallel::NoSync> no_sync;
    if (j + 1 != k) no_sync.emplace(parts_.ddp->no_sync());
    ThrowIfError(parts_.ddp->impl().PrepareForward());
    at::Tensor l;
    {
      std::optional<Autocast> autocast;
      if (train_.precision == Precision::kBf16) autocast.emplace(device_);
      l = parts_.loss(parts_.model->Forward(inputs[j]), inputs[k + j]);
    }
    if (k == 1) {
      l.backward();
    } else {
      (l / static_cast<double>(k)).backward();
    }
    // The host's sum of l.item() in double, kept on the device.
    at::Tensor ld = l.detach().to(at::kDouble);
    loss = j == 0 ? ld : loss + ld;
  }
  if (train_.clip_grad_norm > 0) ClipGradNorm(parts_.params, train_.clip_grad_norm);
  lr_.Advance();
  parts_.optimizer->step();
  for (at::Tensor& p : parts_.params) p.mutable_grad().reset();  // zero_grad(set_to_none)
  if (k > 1) loss = loss / static_cast<double>(k);
  epoch_loss_.add_(loss);
  return {loss};
}

absl::Status DeviceStep::Take(int64_t epoch, int64_t step_in_epoch, int64_t global_step,
                              const std::vector<std::pair<at::Tensor, at::Tensor>>& micro) {
  // Where this epoch began: the table's later entries count epochs from here (an epoch
  // schedule's value changes at epoch boundaries, and a resume may move them).
  if (epoch != epoch_ || global_step - step_in_epoch != epoch_start_) {
    epoch_ = epoch;
    epoch_start_ = global_step - step_in_epoch;
    lr_.Invalidate();
  }
  lr_.Prepare(global_step);
  std::vector<at::Tensor> inputs;
  for (const auto& m : micro) inputs.push_back(m.first);
  for (const auto& m : micro) inputs.push_back(m.second);
  bool regular = static_cast<int64_t>(micro.size()) == train_.grad_accum_steps;
  for (const auto& m : micro) regular = regular && m.first.size(0) == train_.batch_size;
  absl::StatusOr<std::vector<at::Tensor>> out;
  try {
    out = graph_.Run(inputs, regular);
  } catch (const Error& e) {
    lr_.Invalidate();
    return StatusFromError(e);
  } catch (const std::exception&) {
    lr_.Invalidate();
    // The all-reduce failed inside backward (a peer died or hung): its status.
    if (std::optional<absl::Status> st = parts_.ddp->impl().TakeBackwardError()) return *st;
    throw;
  }
  if (!out.ok()) {
    lr_.Invalidate();
    return absl::FailedPreconditionError(absl::StrCat(
        "train.cuda_graph: true, but ", out.status().message(),
        " (train.cuda_graph: auto would train eagerly)"));
  }
  loss_ = (*out)[0];
  lr_.Next();
  // What a gradient-syncing training forward leaves on the host, which a replay does not
  // run: the next forward (a validation's) broadcasts the buffers, as after an eager step.
  parts_.ddp->impl().sync_buffers = true;
  if (capture_ && !logged_ && (graph_.captured() || graph_.Describe().rfind("eager", 0) == 0)) {
    logged_ = true;
    if (graph_.captured()) {
      DDP_LOG(INFO) << "train.cuda_graph: the step is " << graph_.Describe()
                    << "; it is replayed from here on";
    } else {
      DDP_LOG(WARNING) << "train.cuda_graph: auto: the step runs eagerly, " << graph_.Describe();
    }
  }
  return absl::OkStatus();
}

absl::Status DeviceStep::Drain() {
  return WaitForDevice(device_, absl::Milliseconds(static_cast<int64_t>(
                                    train_.collective_timeout_s * 1000)));
}

absl::StatusOr<double> DeviceStep::LastLoss() {
  DDP_RETURN_IF_ERROR(Drain());
  return loss_.defined() ? loss_.item<double>() : 0.0;
}

absl::StatusOr<double> DeviceStep::EpochLossSum() {
  DDP_RETURN_IF_ERROR(Drain());
  return epoch_loss_.item<double>();
}

void DeviceStep::SetEpochLossSum(double value) { epoch_loss_.fill_(value); }

void DeviceStep::DropGraph() {
  graph_.Reset();
  loss_ = at::Tensor();
  lr_.Invalidate();
  logged_ = false;
}

void DeviceStep::Rebind(DataParallel* ddp) {
  parts_.ddp = ddp;
  DropGraph();
}

}  // namespace ddp
