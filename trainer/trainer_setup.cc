// ddp-trainer's set-up (trainer_impl.h): data, model and device, the optimizer, the
// process group of a generation with its comm hook, ZeRO and checkpoint keeper, and the
// step whole on the GPU where the job allows it.
#include <ATen/Parallel.h>
#include <torch/version.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "ddp/comm_hooks.h"
#include "ddp/zero_redundancy_optimizer.h"
#include "libddp/engine/failure.h"
#include "libddp/engine/optimizer.h"
#include "trainer/engine_options.h"
#include "trainer/trainer.h"
#include "trainer/trainer_impl.h"

namespace ddp {

std::unique_ptr<torch::optim::Optimizer> NewOptimizer(
    const OptimizerSpec& spec, std::vector<torch::optim::OptimizerParamGroup> groups,
    std::optional<bool> multi_tensor) {
  if (spec.fused == FusedPolicy::kTrue) return MakeFusedOptimizer(spec, groups);
  return MakeOptimizer(spec, std::move(groups), multi_tensor);
}

absl::Status TrainerImpl::Setup() {
  const int64_t threads =
      spec_.train.threads > 0   ? spec_.train.threads
      : env_.omp_num_threads > 0 ? env_.omp_num_threads
                                 : std::max<int64_t>(1, std::thread::hardware_concurrency() /
                                                            env_.local_world_size);
  at::set_num_threads(static_cast<int>(threads));

  DDP_ASSIGN_OR_RETURN(data_, LoadData(spec_.data, spec_.train.loss, spec_.model));
  at::manual_seed(static_cast<uint64_t>(spec_.train.seed));
  DDP_ASSIGN_OR_RETURN(model_, BuildModel(spec_.model, data_, spec_.train.loss));
  auto device = ChooseDevice(DeviceRequestOf(spec_), env_);
  // The device the job asks for is not on this node (or not in this build): another
  // node may have it. (A bad pairing, cpu with nccl, is the job's: job.yaml refuses it.)
  if (!device.ok()) {
    return device.status().code() == absl::StatusCode::kFailedPrecondition
               ? AsNodeFault(device.status())
               : device.status();
  }
  device_ = *device;
  if (device_.device.is_cuda()) stream_ = std::make_unique<StreamScope>(device_.device);
  model_->To(device_.device);
  for (auto& [name, p] : model_->Parameters()) params_.push_back(p);

  DDP_ASSIGN_OR_RETURN(optimizer_spec_, ResolveFused(spec_.train.optimizer, params_));
  if (env_.rank == 0 && optimizer_spec_.fused == FusedPolicy::kTrue) {
    DDP_LOG(INFO) << "train.optimizer: " << OptimizerName(optimizer_spec_.kind)
                  << " through PyTorch's fused kernels (train.optimizer.fused)";
  }
  if (!spec_.train.optimizer.zero_redundancy) {
    try {
      optimizer_ = NewOptimizer(optimizer_spec_, OptimizerParamGroups(optimizer_spec_, params_));
    } catch (const Error& e) {
      return StatusFromError(e);
    }
  }
  sampler_.num_replicas = env_.world_size;
  sampler_.rank = env_.rank;
  sampler_.shuffle = spec_.train.shuffle;
  sampler_.seed = spec_.train.seed;
  sampler_.drop_last = false;  // The sampler pads (as PyTorch's); train.drop_last drops batches.
  if (const char* dir = std::getenv("DDP_SAMPLE_LOG"); dir != nullptr && *dir != '\0') {
    // Appended to across attempts: each line names its attempt.
    const std::string path = absl::StrCat(dir, "/samples.rank", env_.rank, ".txt");
    sample_log_.open(path, std::ios::app);
    if (!sample_log_) {
      return absl::FailedPreconditionError(
          absl::StrCat("DDP_SAMPLE_LOG: cannot append to ", path, ": ", std::strerror(errno)));
    }
  }
  if (const char* v = std::getenv("DDP_DEBUG_DATA_STALL"); v != nullptr && *v != '\0') {
    // RANK:GLOBAL_STEP:FIFO (tests only).
    std::vector<std::string> parts = absl::StrSplit(v, absl::MaxSplits(':', 2));
    DebugDataStallAt at;
    if (parts.size() != 3 || !absl::SimpleAtoi(parts[0], &at.rank) ||
        !absl::SimpleAtoi(parts[1], &at.global_step) || parts[2].empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "DDP_DEBUG_DATA_STALL=", v, ": expected RANK:GLOBAL_STEP:FIFO"));
    }
    at.fifo = parts[2];
    debug_data_stall_ = at;
  }
  fold_loss_ = spec_.max_recoveries > 0 && !env_.generation_file.empty() &&
               !device_.device.is_cuda();
  DDP_RETURN_IF_ERROR(JoinGroup());
  // A replacement took a survivor's state; the attempt's first ranks resume from the
  // newest checkpoint, if any.
  if (keeper_ && env_.generation == 0) DDP_RETURN_IF_ERROR(Resume());
  holds_state_ = true;
  train_batches_ = std::make_unique<BatchAssembler>(data_.train, spec_.train.batch_size);
  schedule_intervals_ = ScheduleIntervals(spec_.train.lr_schedule, spec_.train.epochs,
                                          StepsPerEpoch(), spec_.train.max_steps);
  const int64_t per_rank = DistributedSamplerLength(data_.train.size(), sampler_);
  if (NumBatches(per_rank, spec_.train.batch_size, spec_.train.drop_last) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "train.batch_size: ", spec_.train.batch_size, " is more than the ", per_rank,
        " samples each of ", env_.world_size, " ranks gets, and train.drop_last drops the "
        "only batch"));
  }
  return SetUpDeviceStep();
}

absl::Status TrainerImpl::JoinGroup() {
  DDP_ASSIGN_OR_RETURN(group_, ProcessGroup::Impl::Create(env_, device_, CommOptionsOf(spec_)));
  if (spec_.train.optimizer.zero_redundancy) DDP_RETURN_IF_ERROR(MakeZeroOptimizer());
  // The notice check is collective: every rank of the new group counts from here.
  notice_every_ = 1;
  steps_since_notice_ = 0;
  notice_window_ms_ = 0;
  if (env_.generation > 0) DDP_RETURN_IF_ERROR(TakeLiveState());
  // libddp's DistributedDataParallel engine: every rank starts from rank 0's weights;
  // trainable parameters are reduced in buckets during backward, frozen ones left alone.
  DDP_ASSIGN_OR_RETURN(
      ddp_, DataParallel::Impl::Create(model_->Parameters(), model_->Buffers(), group_,
                                       DdpOptionsOf(spec_), trace_enabled() ? &trace_ : nullptr));
  DDP_RETURN_IF_ERROR(RegisterCommHook());
  if (!spec_.checkpoint.dir.empty()) {
    keeper_ = std::make_unique<CheckpointKeeper>(
        KeeperOptionsOf(spec_.checkpoint, checkpoint_template_), env_, &comm(), device_.device);
    DDP_RETURN_IF_ERROR(keeper_->Setup());
    // checkpoint.async (decision 192): a writer's saves go to a thread of their own.
    if (spec_.checkpoint.async && keeper_->writer()) {
      saver_ = std::make_unique<BackgroundSaver>(keeper_.get());
    }
    if (zero_ != nullptr) {
      // Which ranks write: each needs the whole optimizer state at a checkpoint.
      std::vector<double> writes(static_cast<size_t>(env_.world_size), 0.0);
      writes[static_cast<size_t>(env_.rank)] = keeper_->writer() ? 1.0 : 0.0;
      DDP_ASSIGN_OR_RETURN(writes, SumOverRanks(writes));
      checkpoint_writers_.clear();
      for (int r = 0; r < env_.world_size; ++r) {
        if (writes[static_cast<size_t>(r)] > 0) checkpoint_writers_.push_back(r);
      }
    }
  }
  return absl::OkStatus();
}

absl::Status TrainerImpl::RegisterCommHook() {
  // As a user's program registers them (docs/library.md, Communication hooks).
  if (spec_.train.comm_hook == CommHookKind::kNone) return absl::OkStatus();
  try {
    switch (spec_.train.comm_hook) {
      case CommHookKind::kFp16:
        ddp_->register_comm_hook([g = group_](GradBucket& b) {
          return hooks::fp16_compress_hook(*g, b);
        });
        break;
      case CommHookKind::kBf16:
#if TORCH_VERSION_MAJOR < 2
        return absl::FailedPreconditionError(
            "train.comm_hook: bf16 needs a LibTorch 2.x build of ddp-trainer (Gloo in "
            "LibTorch 1.13 cannot sum bfloat16, nor can PyTorch 1.13's): use fp16");
#endif
        ddp_->register_comm_hook([g = group_](GradBucket& b) {
          return hooks::bf16_compress_hook(*g, b);
        });
        break;
      case CommHookKind::kPowerSgd: {
        auto state = std::make_shared<hooks::PowerSGDState>(
            group_, PowerSgdOptionsOf(spec_.train.powersgd));
        ddp_->register_comm_hook(
            [state](GradBucket& b) { return hooks::powerSGD_hook(*state, b); });
        break;
      }
      case CommHookKind::kNone:
        break;
    }
  } catch (const Error& e) {
    return StatusFromError(e);
  }
  return absl::OkStatus();
}

absl::Status TrainerImpl::MakeZeroOptimizer() {
  const OptimizerSpec spec = optimizer_spec_;
  try {
    // Each rank's shard gets the optimizer the trainer makes without ZeRO (SGD's
    // multi-tensor path on a GPU included, or the fused kernels), over its share of
    // each param group, so a parameter's update is the same.
    auto zero = std::make_unique<ZeroRedundancyOptimizer>(
        OptimizerParamGroups(spec, params_), group_,
        OptimizerFactory([spec](std::vector<torch::optim::OptimizerParamGroup> groups) {
          return NewOptimizer(spec, std::move(groups));
        }));
    zero_ = zero.get();
    optimizer_ = std::move(zero);
  } catch (const Error& e) {
    return StatusFromError(e);
  }
  // The optimizer state this rank keeps: its shard's parameters (Adam's two moments,
  // SGD's momentum buffer, each the size of its parameters).
  int64_t mine = 0, all = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    all += params_[i].numel();
    if (zero_->owner(static_cast<int64_t>(i)) == env_.rank) mine += params_[i].numel();
  }
  DDP_LOG(INFO) << "rank " << env_.rank << ": train.optimizer.zero_redundancy: this rank keeps "
                << "the optimizer state of " << mine << " of " << all << " parameter elements ("
                << (all > 0 ? 100.0 * static_cast<double>(mine) / static_cast<double>(all) : 0.0)
                << "%)";
  return absl::OkStatus();
}

absl::Status TrainerImpl::SetUpDeviceStep() {
  const CudaGraphMode mode = spec_.train.cuda_graph;
  std::optional<FusedLr> fused;
  if (zero_ == nullptr) fused = FusedLrOf(*optimizer_, device_.device);
  const std::vector<std::string> blockers = CudaGraphBlockers(spec_, device_, fused.has_value());
  if (!blockers.empty()) {
    const std::string why = absl::StrJoin(blockers, "; ");
    if (mode == CudaGraphMode::kOn) {
      // No GPU here (the device left to auto), or a ddp-trainer without CUDA graphs: a node
      // with both may run the job. What the job file rules out was refused at submission.
      if ((!device_.device.is_cuda() || !CudaGraphsBuilt()) &&
          spec_.train.device != Device::kCpu) {
        return AsNodeFault(absl::FailedPreconditionError(absl::StrCat(
            "train.cuda_graph: true, but this node cannot capture the step: ", why,
            " (it needs a GPU and a ddp-trainer built against a CUDA LibTorch 2.x)")));
      }
      return absl::FailedPreconditionError(
          absl::StrCat("train.cuda_graph: true, but the step cannot be captured here: ", why));
    }
    if (device_.device.is_cuda() && mode == CudaGraphMode::kAuto && env_.rank == 0) {
      DDP_LOG(INFO) << "train.cuda_graph: auto: eager steps, because " << why;
    }
    return absl::OkStatus();
  }
  // Captured or not, the same step on the device (a graphed and an eager run launch the
  // same kernels).
  DeviceStep::Parts parts;
  parts.model = model_.get();
  parts.ddp = ddp_.get();
  parts.optimizer = optimizer_.get();
  parts.set_lr_tensor = fused->set_lr_tensor;
  parts.lr_dtype = fused->lr_dtype;
  parts.params = params_;
  parts.loss = [kind = spec_.train.loss](const at::Tensor& out, const at::Tensor& target) {
    return Loss(kind, out, target, /*sum=*/false);
  };
  device_step_ = std::make_unique<DeviceStep>(
      std::move(parts), spec_.train, device_.device,
      [this](int64_t epoch, int64_t global_step) { return LrAt(epoch, global_step); },
      StepsPerEpoch(), /*capture=*/mode != CudaGraphMode::kOff,
      /*required=*/mode == CudaGraphMode::kOn);
  device_step_->SetEpochLossSum(epoch_loss_sum_);
  if (env_.rank == 0) {
    const char* how =
        mode == CudaGraphMode::kOff ? ", eagerly" : ", captured in a CUDA graph after 3 eager steps";
    DDP_LOG(INFO) << "train.cuda_graph: " << CudaGraphModeName(mode)
                  << ": the step runs whole on the GPU" << how;
  }
  return absl::OkStatus();
}

}  // namespace ddp
