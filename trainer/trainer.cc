#include "trainer/trainer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <new>
#include <optional>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "ddp/autocast.h"
#include "ddp/comm_hooks.h"
#include "ddp/distributed_data_parallel.h"
#include "ddp/lr_schedule.h"
#include "ddp/process_group.h"
#include "ddp/zero_redundancy_optimizer.h"
#include "libddp/engine/api_bridge.h"
#include "libddp/engine/checkpoint.h"
#include "libddp/engine/checkpoint_keeper.h"
#include "libddp/engine/comm.h"
#include "libddp/engine/cuda_graph.h"
#include "libddp/engine/gpu_memory.h"
#include "libddp/engine/optimizer.h"
#include "libddp/engine/recovery.h"
#include "libddp/engine/reducer.h"
#include "libddp/engine/sampler.h"
#include "libddp/engine/torch_compat.h"
#include "trainer/dataset.h"
#include "trainer/device_step.h"
#include "trainer/engine_options.h"
#include "trainer/model.h"

namespace ddp {
namespace {

using Clock = std::chrono::steady_clock;

double MillisSince(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

std::string FirstLine(const std::string& s) { return s.substr(0, s.find('\n')); }

// Mean loss of a batch (reduction "mean") or its sum ("sum", for validation).
// cross_entropy over a sequence's logits [B, T, V] (model.gpt: the only model with 3-D
// outputs, BuildModel holds the others to [N, classes]) is over its B * T tokens, as
// nanoGPT's F.cross_entropy(logits.view(-1, V), targets.view(-1)).
at::Tensor Loss(LossKind kind, const at::Tensor& out, const at::Tensor& target, bool sum) {
  const int64_t reduction = sum ? at::Reduction::Sum : at::Reduction::Mean;
  switch (kind) {
    case LossKind::kCrossEntropy:
      if (out.dim() == 3) {
        return at::cross_entropy_loss(out.view({-1, out.size(-1)}), target.view({-1}), {},
                                      reduction);
      }
      return at::cross_entropy_loss(out, target, {}, reduction);
    case LossKind::kMse:
      return at::mse_loss(out.reshape({-1}), target, reduction);
    case LossKind::kBceWithLogits:
      return at::binary_cross_entropy_with_logits(out.reshape({-1}), target, {}, {}, reduction);
  }
  return {};
}

// FNV-1a over every parameter's bytes: equal on all ranks iff they hold the same model.
std::string Fingerprint(const std::vector<at::Tensor>& params) {
  uint64_t h = 1469598103934665603ULL;
  for (const at::Tensor& p : params) {
    at::Tensor c = p.detach().cpu().contiguous();
    const auto* b = static_cast<const unsigned char*>(c.data_ptr());
    for (size_t i = 0; i < c.nbytes(); ++i) {
      h ^= b[i];
      h *= 1099511628211ULL;
    }
  }
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

JobSpec WithPlaceholders(JobSpec spec, const Environment& env) {
  spec.checkpoint.dir = CheckpointDirFor(spec.checkpoint.dir, env);
  return spec;
}

// train.optimizer's optimizer over `groups` (OptimizerParamGroups): PyTorch's fused
// kernels when `spec.fused` (resolved by ResolveFused) says so, else the engine's
// (decision 170). Throws ddp::Error as the fused constructors do.
std::unique_ptr<torch::optim::Optimizer> NewOptimizer(
    const OptimizerSpec& spec, std::vector<torch::optim::OptimizerParamGroup> groups,
    std::optional<bool> multi_tensor = std::nullopt) {
  if (spec.fused == FusedPolicy::kTrue) return MakeFusedOptimizer(spec, groups);
  return MakeOptimizer(spec, std::move(groups), multi_tensor);
}

}  // namespace

class TrainerImpl {
 public:
  TrainerImpl(JobSpec spec, Environment env, EventSink* events)
      : checkpoint_template_(spec.checkpoint.dir),
        spec_(WithPlaceholders(std::move(spec), env)),
        env_(env),
        events_(*events) {}

  absl::Status Run();

 private:
  absl::Status Setup();
  // Forms the process group of env_'s generation, takes a surviving rank's state when
  // this is a live recovery's generation (TakeLiveState), wraps the model in libddp's
  // engine and sets up the checkpoint keeper. The same collectives in the same order on
  // every rank: a replacement's Setup and the survivors' Recover both come here.
  absl::Status JoinGroup();
  // Live recovery (docs/recovery.md) after `cause` broke a collective: keeps the model,
  // optimizer and position, drops the process group, waits for the worker to announce
  // the next generation, and joins it. `cause` itself when recovery is off or cannot
  // cure it, or when no generation comes within recovery_timeout_s.
  absl::Status Recover(const absl::Status& cause);
  absl::Status TakeLiveState();
  // Rank 0 tells the coordinator that the generation formed and the state moved.
  void EmitRecovered(double wait_ms, double sync_ms);
  // The checkpoint-now notice (docs/recovery.md): every notice_every_ steps (about
  // 100 ms of training) the ranks agree whether any of them saw a new notice (one
  // small all-reduce); if so they checkpoint at once, at the same step, and then
  // hold their step until they are stopped (or the hold ends, and training goes on).
  // `step_ms`: the step just taken.
  absl::Status CheckNotice(double step_ms);
  // `state`'s model, optimizer and position into this rank's (`what` names it in errors).
  absl::Status LoadState(const TrainingState& state, const std::string& what);
  // What a checkpoint (or a live recovery's transfer) holds at `pos`.
  TrainingState StateAt(const Position& pos, const at::Tensor& rng,
                        const std::vector<double>& loss_totals) const;
  absl::Status Resume();
  absl::Status TrainEpoch(int64_t epoch, int64_t first_step);
  // `complete`: false when train.max_steps stopped the epoch early.
  absl::Status EndEpoch(int64_t epoch, bool complete, bool checkpoint_due);
  absl::Status Checkpoint(const Position& pos);
  // train.optimizer.zero_redundancy: the sharded optimizer over this group's ranks.
  absl::Status MakeZeroOptimizer();
  // With zero_: `state`'s optimizer state, this rank's shard of it, into zero_.
  absl::Status LoadZeroState(const c10::IValue& state);
  // One optimizer step at learning rate `lr`: forward and backward of each
  // micro-batch, the all-reduce, train.clip_grad_norm, the optimizer.
  absl::Status TakeStep(const std::vector<int64_t>& order, int64_t first_micro,
                        int64_t num_micro, double lr, double* loss, double* comm_ms,
                        int64_t* samples);
  // With device_step_: the same step, whole on the GPU (and in a CUDA graph once
  // captured); the loss is read only when an event needs it.
  absl::Status TakeDeviceStep(const std::vector<int64_t>& order, int64_t first_micro,
                              int64_t num_micro, int64_t epoch, int64_t step, double lr,
                              int64_t* samples);
  // train.cuda_graph (decision 173): makes device_step_ where the step can run whole on
  // the GPU; FAILED_PRECONDITION naming why when true asks for what cannot be.
  absl::Status SetUpDeviceStep();
  // The epoch's loss total so far on this rank (device_step_ keeps it on the device).
  // With device_step_ it waits for the GPU: UNAVAILABLE (a peer failure) past the
  // collective timeout.
  absl::StatusOr<double> EpochLossSum() {
    if (device_step_) return device_step_->EpochLossSum();
    return epoch_loss_sum_;
  }
  void SetEpochLossSum(double v) {
    epoch_loss_sum_ = v;
    if (device_step_) device_step_->SetEpochLossSum(v);
  }
  // train.lr_schedule's lr for the step after `global_step` steps, in `epoch`.
  double LrAt(int64_t epoch, int64_t global_step) const;
  int64_t StepsPerEpoch() const;
  // The world's collectives, behind the process group.
  Comm& comm() { return *group_->impl().comm; }
  // `values` summed over all ranks (one double all-reduce).
  absl::StatusOr<std::vector<double>> SumOverRanks(const std::vector<double>& values) {
    return group_->impl().Sum(values);
  }
  void EmitStart();
  void EmitTrace();
  // The inputs of this run's data order, as a checkpoint records them.
  SamplerState CurrentSampler() const {
    return {env_.world_size,           spec_.train.batch_size, spec_.train.grad_accum_steps,
            spec_.train.seed,          spec_.train.shuffle,    data_.train.size(),
            spec_.data.seed};
  }

  bool trace_enabled() const { return spec_.metrics.trace_buckets; }
  bool IsLastStep() const {
    return spec_.train.max_steps > 0 && pos_.global_step >= spec_.train.max_steps;
  }

  // checkpoint.dir as written ({node} and all): the keeper fences every node's.
  const std::string checkpoint_template_;
  const JobSpec spec_;  // With checkpoint.dir's placeholders replaced.
  Environment env_;     // A live recovery moves the store (master_addr, port, generation).
  EventSink& events_;

  TrainValData data_;
  std::unique_ptr<Model> model_;
  std::vector<at::Tensor> params_;  // All of them; the optimizer and checkpoints see these.
  DeviceChoice device_;
  // On a GPU: the trainer's own stream, current from before the model moves there (what
  // a CUDA graph needs: cuda_graph.h).
  std::unique_ptr<StreamScope> stream_;
  // libddp's process group and data-parallel engine (the public API's objects).
  std::shared_ptr<ProcessGroup> group_;
  std::unique_ptr<DataParallel> ddp_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  OptimizerSpec optimizer_spec_;  // train.optimizer, `fused` resolved (ResolveFused).
  // train.optimizer.zero_redundancy: optimizer_ itself, made in JoinGroup over the group.
  ZeroRedundancyOptimizer* zero_ = nullptr;
  std::vector<int> checkpoint_writers_;  // With zero_: the ranks that write checkpoints.
  std::unique_ptr<CheckpointKeeper> keeper_;  // With checkpoint.dir only.
  std::unique_ptr<BatchAssembler> train_batches_;
  std::unique_ptr<DeviceStep> device_step_;  // Made by SetUpDeviceStep, else null.
  ReducerTrace trace_;
  SamplerOptions sampler_;
  int64_t schedule_intervals_ = 0;  // train.lr_schedule's whole run (t_max 0).
  double last_lr_ = 0;              // Of the last optimizer step.

  Position pos_;
  bool resumed_ = false;
  Position resumed_from_;
  // Per-epoch running totals for the epoch event's train_loss (reset by EndEpoch;
  // restored by Resume, summed over ranks, on rank 0).
  double epoch_loss_sum_ = 0;
  int64_t epoch_steps_ = 0;
  // Throughput window since the last step event.
  int64_t window_samples_ = 0;
  int64_t window_steps_ = 0;
  Clock::time_point window_start_;
  Position last_saved_{-1, -1, -1};
  double last_val_accuracy_ = -1;  // Of the last validation; < 0 when there is none.
  double train_ms_ = 0;           // Time in training steps (no validation, no checkpoints).
  int64_t total_samples_ = 0;     // Samples this rank trained on in this run.
  // This process holds training state (false for a live recovery's replacement until
  // it took a survivor's).
  bool holds_state_ = false;
  // The checkpoint-now notice: the newest acted on, and when the ranks next check.
  int64_t notice_handled_ = 0;
  int64_t notice_every_ = 1;
  int64_t steps_since_notice_ = 0;
  double notice_window_ms_ = 0;
  // Of the last live recovery this rank took part in (rank 0 reports them).
  int recovery_source_ = 0;
  int64_t recovery_step_ = 0;
};

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
    DDP_LOG(INFO) << "train.cuda_graph: " << CudaGraphModeName(mode) << ": the step runs whole "
                  << "on the GPU"
                  << (mode == CudaGraphMode::kOff ? ", eagerly"
                                                  : ", captured in a CUDA graph after 3 eager steps");
  }
  return absl::OkStatus();
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
  DdpOptions ddp_options;
  ddp_options.bucket_cap_mb = spec_.train.bucket_cap_mb;
  ddp_options.first_bucket_cap_mb = spec_.train.first_bucket_cap_mb;
  DDP_ASSIGN_OR_RETURN(
      ddp_, DataParallel::Impl::Create(model_->Parameters(), model_->Buffers(), group_,
                                       ddp_options, trace_enabled() ? &trace_ : nullptr));
  // train.comm_hook: PyTorch's built-in communication hooks, as a user's program
  // registers them (docs/library.md, Communication hooks).
  if (spec_.train.comm_hook != CommHookKind::kNone) {
    try {
      const PowerSgdSpec& p = spec_.train.powersgd;
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
          hooks::PowerSGDOptions o;
          o.matrix_approximation_rank = p.rank;
          o.start_powerSGD_iter = p.start_iteration;
          o.min_compression_rate = p.min_compression_rate;
          o.use_error_feedback = p.error_feedback;
          o.warm_start = p.warm_start;
          o.orthogonalization_epsilon = p.orthogonalization_epsilon;
          o.random_seed = static_cast<uint32_t>(p.random_seed);
          o.batch_tensors_with_same_shape = p.batch_tensors_with_same_shape;
          auto state = std::make_shared<hooks::PowerSGDState>(group_, o);
          ddp_->register_comm_hook([state](GradBucket& b) { return hooks::powerSGD_hook(*state, b); });
          break;
        }
        case CommHookKind::kNone:
          break;
      }
    } catch (const Error& e) {
      return StatusFromError(e);
    }
  }
  if (!spec_.checkpoint.dir.empty()) {
    CheckpointSpec as_written = spec_.checkpoint;
    as_written.dir = checkpoint_template_;
    keeper_ = std::make_unique<CheckpointKeeper>(as_written, spec_.checkpoint.dir, env_, &comm(),
                                                 device_.device);
    DDP_RETURN_IF_ERROR(keeper_->Setup());
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

absl::Status TrainerImpl::LoadZeroState(const c10::IValue& state) {
  // The whole state into a plain optimizer over every parameter (the checkpoint's own
  // reader, whether ZeRO wrote it or not), then this rank's parameters' state moved on.
  std::unique_ptr<torch::optim::Optimizer> whole;
  try {
    whole = NewOptimizer(optimizer_spec_, OptimizerParamGroups(optimizer_spec_, params_),
                         /*multi_tensor=*/false);
  } catch (const Error& e) {
    return StatusFromError(e);
  }
  DDP_RETURN_IF_ERROR(LoadOptimizerStateDict(optimizer_spec_, *whole, state));
  torch::optim::Optimizer& local = zero_->local_optimizer();
  local.state().clear();
  zero_->state().clear();
  for (size_t i = 0; i < params_.size(); ++i) {
    if (zero_->owner(static_cast<int64_t>(i)) != env_.rank) continue;
    auto it = whole->state().find(OptimizerStateKey(*whole, params_[i]));
    if (it != whole->state().end()) {
      local.state()[OptimizerStateKey(local, params_[i])] = std::move(it->second);
    }
  }
  return absl::OkStatus();
}

absl::Status TrainerImpl::CheckNotice(double step_ms) {
  if (env_.notice_file.empty() || !keeper_) return absl::OkStatus();
  notice_window_ms_ += step_ms;
  if (++steps_since_notice_ < notice_every_) return absl::OkStatus();
  const Notice seen = ReadNotice(env_.notice_file);
  // [the newest notice any rank saw, the slowest rank's mean step time, the newest any
  // rank acted on (a replacement knows none)]: maxima, so every rank decides alike.
  DDP_ASSIGN_OR_RETURN(
      const std::vector<double> v,
      comm().MaxOverRanks({static_cast<double>(seen.seq),
                           notice_window_ms_ / static_cast<double>(steps_since_notice_),
                           static_cast<double>(notice_handled_)}));
  const int64_t newest = static_cast<int64_t>(v[0]);
  const double step = std::max(v[1], 1e-3);
  notice_handled_ = static_cast<int64_t>(v[2]);
  notice_every_ = std::clamp<int64_t>(static_cast<int64_t>(100.0 / step), 1, 1000);
  steps_since_notice_ = 0;
  notice_window_ms_ = 0;
  if (newest <= notice_handled_) return absl::OkStatus();
  notice_handled_ = newest;
  DDP_LOG(WARNING) << "rank " << env_.rank << ": checkpoint-now notice " << newest
                   << (seen.seq == newest ? " (" + seen.reason + ")" : "")
                   << ": checkpointing at step " << pos_.global_step;
  DDP_RETURN_IF_ERROR(Checkpoint(pos_));
  // Every step from here would be lost when the attempt moves: wait to be stopped.
  // Training goes on if that does not come (the move was called off).
  const absl::Duration hold =
      seen.deadline_ms > 0
          ? std::clamp(absl::FromUnixMillis(seen.deadline_ms) - absl::Now() + absl::Seconds(5),
                       absl::Seconds(5), absl::Seconds(30))
          : absl::Seconds(30);
  DDP_LOG(INFO) << "rank " << env_.rank << ": holding for up to " << hold
                << " while the job moves";
  absl::SleepFor(hold);
  return absl::OkStatus();
}

absl::Status TrainerImpl::TakeLiveState() {
  DDP_ASSIGN_OR_RETURN(const StateSource source,
                       ChooseSource(comm(), holds_state_ ? pos_.global_step : -1));
  recovery_source_ = source.rank;
  recovery_step_ = source.global_step;
  // Whether a position is saved already must be the same answer on every rank (the
  // save is collective): after a recovery none is.
  last_saved_ = {-1, -1, -1};
  std::vector<char> bytes;
  if (env_.rank == source.rank) {
    bytes = EncodeCheckpoint(StateAt(pos_, CpuRngState(), {0, 0}));
  }
  DDP_ASSIGN_OR_RETURN(bytes, comm().BroadcastBytesFrom(source.rank, bytes,
                                                        "live recovery: sending the state"));
  if (env_.rank == source.rank) return absl::OkStatus();
  const std::string what = absl::StrCat("rank ", source.rank, "'s live state");
  DDP_ASSIGN_OR_RETURN(const TrainingState state, DecodeCheckpoint(bytes, what));
  DDP_RETURN_IF_ERROR(LoadState(state, what));
  if (state.rng_state.defined()) RestoreRngState(state.rng_state);
  return absl::OkStatus();
}

absl::Status TrainerImpl::LoadState(const TrainingState& state, const std::string& what) {
  DDP_RETURN_IF_ERROR(RestoreModel(state, model_->StateDict(), what));
  if (zero_ != nullptr) {
    DDP_RETURN_IF_ERROR(LoadZeroState(state.optimizer));
  } else {
    DDP_RETURN_IF_ERROR(LoadOptimizerStateDict(optimizer_spec_, *optimizer_, state.optimizer));
  }
  pos_ = state.position;
  return absl::OkStatus();
}

absl::Status TrainerImpl::Recover(const absl::Status& cause) {
  if (spec_.max_recoveries == 0 || env_.generation_file.empty() || !PeerFailure(cause)) {
    return cause;
  }
  const auto t0 = Clock::now();
  DDP_LOG(WARNING) << "rank " << env_.rank << ": " << cause.message()
                   << "; keeping this rank's state at step " << pos_.global_step
                   << " and waiting up to recovery_timeout_s for a replacement";
  // Gone first, so that ranks still blocked on this one see it fail too. A CUDA graph
  // before them: it holds the group's collectives, and NCCL will not destroy a
  // communicator a graph still holds.
  if (device_step_) device_step_->DropGraph();
  ddp_.reset();
  keeper_.reset();
  group_.reset();
  for (at::Tensor& p : params_) p.mutable_grad().reset();  // The abandoned step's.
  DDP_ASSIGN_OR_RETURN(env_,
                       NextGeneration(env_, cause, absl::Seconds(spec_.recovery_timeout_s)));
  const double wait_ms = MillisSince(t0);
  const auto t1 = Clock::now();
  DDP_RETURN_IF_ERROR(JoinGroup());
  // A graph holds the old group's collectives: warm up and capture again on the new one.
  if (device_step_) device_step_->Rebind(ddp_.get());
  DDP_LOG(INFO) << "rank " << env_.rank << ": generation " << env_.generation << " formed on "
                << env_.master_addr << ":" << env_.master_port << "; took rank "
                << recovery_source_ << "'s state at step " << recovery_step_;
  EmitRecovered(wait_ms, MillisSince(t1));
  return absl::OkStatus();
}

void TrainerImpl::EmitRecovered(double wait_ms, double sync_ms) {
  if (env_.rank != 0) return;
  RecoveredEvent e;
  e.generation = env_.generation;
  e.source_rank = recovery_source_;
  e.global_step = recovery_step_;
  e.wait_ms = wait_ms;
  e.sync_ms = sync_ms;
  events_.Emit(e);
}

absl::Status TrainerImpl::Resume() {
  // The newest checkpoint any rank holds, sent by its holder to every rank (see
  // CheckpointKeeper): no shared filesystem needed.
  DDP_ASSIGN_OR_RETURN(std::optional<CheckpointKeeper::Restored> restored, keeper_->Restore());
  if (!restored.has_value()) return absl::OkStatus();
  const TrainingState& ckpt = restored->state;
  const std::string& path = restored->path;
  DDP_RETURN_IF_ERROR(LoadState(ckpt, path));
  if (!SameDataOrder(ckpt.sampler, CurrentSampler()) && pos_.step != 0) {
    DDP_LOG(WARNING) << "checkpoint was taken with another world size, batch size, sampler "
                        "seed or training set: epoch "
                     << pos_.epoch << " restarts from its first batch";
    pos_.step = 0;
  }
  // The interrupted epoch's loss totals so far (summed over ranks): rank 0 carries
  // them, so the epoch's train_loss covers all of its steps.
  if (pos_.step > 0 && env_.rank == 0) {
    epoch_loss_sum_ = ckpt.epoch_loss_sum;
    epoch_steps_ = ckpt.epoch_steps;
  }
  if (ckpt.rng_state.defined()) RestoreRngState(ckpt.rng_state);
  resumed_ = true;
  resumed_from_ = pos_;
  last_saved_ = pos_;
  DDP_LOG(INFO) << "resumed from " << path << " (held by rank " << restored->holder
                << ") at epoch " << pos_.epoch << " step " << pos_.step;
  return absl::OkStatus();
}

void TrainerImpl::EmitStart() {
  const int64_t per_rank = DistributedSamplerLength(data_.train.size(), sampler_);
  StartEvent e;
  e.world_size = env_.world_size;
  e.local_rank = env_.local_rank;
  e.group_rank = env_.group_rank;
  e.backend = device_.backend;
  e.intra_node_comm = group_->intra_node_comm();
  e.device = device_.device.str();
  e.precision = spec_.train.precision == Precision::kBf16 ? "bf16" : "fp32";
  e.model = model_->Describe();
  e.params = CountParameters(*model_);
  e.train_samples = data_.train.size();
  e.val_samples = data_.val.size();
  e.batch_size = spec_.train.batch_size;
  e.steps_per_epoch = StepsPerEpoch();
  e.epochs = spec_.train.epochs;
  e.threads = at::get_num_threads();
  if (resumed_) {
    e.resumed_from = PositionField{resumed_from_.epoch, resumed_from_.step,
                                   resumed_from_.global_step};
  }
  events_.Emit(e);
  DDP_LOG(INFO) << "rank " << env_.rank << "/" << env_.world_size << " on "
                << device_.device.str() << " (" << device_.backend << "): "
                << model_->Describe() << ", " << data_.train.size() << " training samples, "
                << per_rank << " per rank";
  if (env_.rank == 0) {
    BucketsEvent be;
    be.cap_mb = spec_.train.bucket_cap_mb;
    const std::vector<BucketInfo> buckets = ddp_->buckets();
    for (size_t i = 0; i < buckets.size(); ++i) {
      const BucketInfo& b = buckets[i];
      be.buckets.push_back({static_cast<int64_t>(i), b.params, b.numel, b.bytes});
    }
    events_.Emit(be);
  }
}

int64_t TrainerImpl::StepsPerEpoch() const {
  const int64_t per_rank = DistributedSamplerLength(data_.train.size(), sampler_);
  const int64_t micro = NumBatches(per_rank, spec_.train.batch_size, spec_.train.drop_last);
  return (micro + spec_.train.grad_accum_steps - 1) / spec_.train.grad_accum_steps;
}

double TrainerImpl::LrAt(int64_t epoch, int64_t global_step) const {
  const LrSchedule& s = spec_.train.lr_schedule;
  const int64_t count = s.interval == LrSchedule::Interval::kEpoch ? epoch : global_step;
  return scheduled_lr(s, spec_.train.optimizer.lr, count, schedule_intervals_);
}

absl::Status TrainerImpl::TakeStep(const std::vector<int64_t>& order, int64_t first_micro,
                                   int64_t num_micro, double lr, double* loss, double* comm_ms,
                                   int64_t* samples) {
  const int64_t bs = spec_.train.batch_size;
  const int64_t total = static_cast<int64_t>(order.size());
  if (trace_enabled()) trace_.Reset();
  double loss_sum = 0;
  *samples = 0;
  for (int64_t j = 0; j < num_micro; ++j) {
    const int64_t begin = (first_micro + j) * bs;
    const int64_t n = std::min(bs, total - begin);
    auto [x, y] = train_batches_->Gather(order.data() + begin, n);
    at::Tensor xd = x.to(device_.device, /*non_blocking=*/true);
    at::Tensor yd = y.to(device_.device, /*non_blocking=*/true);
    // Gradient accumulation: every micro-batch but the last runs under no_sync, and the
    // last one's backward all-reduces the accumulated sum (inside backward()).
    std::optional<DataParallel::NoSync> no_sync;
    if (j != num_micro - 1) no_sync.emplace(ddp_->no_sync());
    DDP_RETURN_IF_ERROR(ddp_->impl().PrepareForward());
    at::Tensor l;
    {
      // torch.autocast's scope: the forward and the loss; backward outside it.
      std::optional<Autocast> autocast;
      if (spec_.train.precision == Precision::kBf16) autocast.emplace(device_.device);
      at::Tensor out = model_->Forward(xd);
      l = Loss(spec_.train.loss, out, yd, /*sum=*/false);
    }
    try {
      if (num_micro == 1) {
        l.backward();
      } else {
        (l / static_cast<double>(num_micro)).backward();
      }
    } catch (const std::exception&) {
      // The all-reduce failed inside backward (a peer died or hung): its status.
      if (std::optional<absl::Status> st = ddp_->impl().TakeBackwardError()) return *st;
      throw;
    }
    loss_sum += l.item<double>();
    *samples += n;
  }
  // On the averaged gradients, as torch.nn.utils.clip_grad_norm_ after backward().
  if (spec_.train.clip_grad_norm > 0) ClipGradNorm(params_, spec_.train.clip_grad_norm);
  for (auto& group : optimizer_->param_groups()) group.options().set_lr(lr);
  last_lr_ = lr;
  try {
    optimizer_->step();  // With ZeRO: collective (the owners' updates broadcast).
  } catch (const Error& e) {
    return StatusFromError(e);
  }
  for (at::Tensor& p : params_) p.mutable_grad().reset();  // zero_grad(set_to_none=True)
  *loss = loss_sum / static_cast<double>(num_micro);
  *comm_ms = ddp_->last_backward().comm_wait_ms;
  return absl::OkStatus();
}

absl::Status TrainerImpl::TakeDeviceStep(const std::vector<int64_t>& order, int64_t first_micro,
                                         int64_t num_micro, int64_t epoch, int64_t step,
                                         double lr, int64_t* samples) {
  const int64_t bs = spec_.train.batch_size;
  const int64_t total = static_cast<int64_t>(order.size());
  std::vector<std::pair<at::Tensor, at::Tensor>> micro;
  *samples = 0;
  for (int64_t j = 0; j < num_micro; ++j) {
    const int64_t begin = (first_micro + j) * bs;
    const int64_t n = std::min(bs, total - begin);
    auto [x, y] = train_batches_->Gather(order.data() + begin, n);
    // Gather's buffers are reused by the next call: the step copies them first.
    micro.emplace_back(x.clone(), y.clone());
    *samples += n;
  }
  // The kernels read the learning rate from the device's table; the param groups keep it
  // too, for the checkpoint's optimizer state (as the eager step sets it).
  for (auto& group : optimizer_->param_groups()) group.options().set_lr(lr);
  last_lr_ = lr;
  return device_step_->Take(epoch, step, pos_.global_step, micro);
}

void TrainerImpl::EmitTrace() {
  TraceEvent e;
  e.epoch = pos_.epoch;
  e.global_step = pos_.global_step - 1;
  for (const ReducerTrace::Entry& t : trace_.Take()) {
    e.entries.push_back({ReducerTrace::KindName(t.kind), t.index, t.micros});
  }
  // The parameters after this step: equal on every rank, step by step.
  e.params_fingerprint = Fingerprint(params_);
  events_.Emit(e);
}

absl::Status TrainerImpl::TrainEpoch(int64_t epoch, int64_t first_step) {
  const std::vector<int64_t> order =
      DistributedSamplerIndices(data_.train.size(), sampler_, epoch);
  const int64_t accum = spec_.train.grad_accum_steps;
  const int64_t micro_total =
      NumBatches(static_cast<int64_t>(order.size()), spec_.train.batch_size, spec_.train.drop_last);
  const int64_t steps = (micro_total + accum - 1) / accum;
  window_samples_ = 0;
  window_steps_ = 0;
  window_start_ = Clock::now();
  model_->SetTraining(true);
  bool checkpoint_due = false;
  bool complete = true;
  for (int64_t step = first_step; step < steps; ++step) {
    const auto t0 = Clock::now();
    const int64_t first_micro = step * accum;
    const int64_t num_micro = std::min(accum, micro_total - first_micro);
    double loss = 0, comm_ms = 0;
    int64_t samples = 0;
    const double lr = LrAt(epoch, pos_.global_step);
    if (device_step_) {
      // Queued on the GPU; the loss is read below only when an event reports it.
      DDP_RETURN_IF_ERROR(TakeDeviceStep(order, first_micro, num_micro, epoch, step, lr, &samples));
    } else {
      DDP_RETURN_IF_ERROR(
          TakeStep(order, first_micro, num_micro, lr, &loss, &comm_ms, &samples));
      epoch_loss_sum_ += loss;
    }
    double step_ms = MillisSince(t0);
    total_samples_ += samples;
    pos_ = {epoch, step + 1, pos_.global_step + 1};
    ++epoch_steps_;
    window_samples_ += samples;
    ++window_steps_;
    const bool last_in_epoch = step + 1 == steps || IsLastStep();
    if (pos_.global_step % spec_.metrics.every_steps == 0 || last_in_epoch) {
      if (device_step_) {
        // The GPU's queue drains here, so the window counts its steps' GPU time; a step's
        // own time is the window's mean (the host only queued it).
        DDP_ASSIGN_OR_RETURN(loss, device_step_->LastLoss());
        step_ms = MillisSince(window_start_) / static_cast<double>(window_steps_);
      }
      const double window_s = MillisSince(window_start_) / 1000.0;
      StepEvent e;
      e.epoch = epoch;
      e.step = step;
      e.steps = steps;
      e.global_step = pos_.global_step - 1;
      e.loss = loss;
      e.samples_per_s = window_s > 0 ? window_samples_ / window_s : 0.0;
      e.step_ms = step_ms;
      e.comm_ms = comm_ms;
      e.lr = lr;
      if (device_.device.is_cuda()) {
        if (std::optional<GpuMemoryStats> m = GpuMemoryOf(device_.device.index())) {
          e.gpu_memory_allocated_mib = m->allocated_mib;
          e.gpu_memory_reserved_mib = m->reserved_mib;
          e.gpu_memory_peak_mib = m->peak_mib;
        }
      }
      events_.Emit(e);
      window_samples_ = 0;
      window_steps_ = 0;
      window_start_ = Clock::now();
    }
    if (spec_.metrics.trace_buckets) EmitTrace();
    // On the device, what the iteration took, waits for the GPU included: the host runs at
    // most a few steps ahead, so its iterations pace the GPU's steps.
    const double iteration_ms = device_step_ ? MillisSince(t0) : step_ms;
    train_ms_ += iteration_ms;
    DDP_RETURN_IF_ERROR(CheckNotice(iteration_ms));
    const bool step_ckpt = spec_.checkpoint.every_steps > 0 &&
                           pos_.global_step % spec_.checkpoint.every_steps == 0;
    if (last_in_epoch) {
      checkpoint_due = step_ckpt;
      complete = step + 1 == steps;
      break;
    }
    if (step_ckpt && !spec_.checkpoint.dir.empty()) DDP_RETURN_IF_ERROR(Checkpoint(pos_));
  }
  return EndEpoch(epoch, complete, checkpoint_due);
}

absl::Status TrainerImpl::EndEpoch(int64_t epoch, bool complete, bool checkpoint_due) {
  const auto t0 = Clock::now();
  // [train loss sum, train steps, val loss sum, val correct, val samples, val
  // predictions], summed over ranks. A sample makes one prediction, a token window
  // (model.gpt) one per token: loss and accuracy are per prediction.
  double val_loss = 0, correct = 0, count = 0, predictions = 0;
  if (data_.val.size() > 0) {
    at::NoGradGuard no_grad;
    model_->SetTraining(false);
    // DDP's buffer rule for validation's no-grad forwards: the first one broadcasts
    // if a syncing training forward came last, and the next training forward does
    // not. Decided here once for every rank, including one that has no validation
    // samples, so the broadcast stays collective.
    DDP_RETURN_IF_ERROR(ddp_->impl().PrepareForward());
    // Every rank evaluates val[rank::world] without padding, so the reduced totals
    // count each validation sample exactly once.
    std::vector<int64_t> idx;
    for (int64_t i = env_.rank; i < data_.val.size(); i += env_.world_size) idx.push_back(i);
    // Windows of a GPT's context make logits of seq_len x vocab each: as many as train.
    const int64_t bs = data_.val.tokens ? spec_.train.batch_size
                                        : std::max<int64_t>(spec_.train.batch_size, 256);
    BatchAssembler batches(data_.val, bs);
    for (size_t b = 0; b < idx.size(); b += static_cast<size_t>(bs)) {
      const int64_t n = std::min<int64_t>(bs, static_cast<int64_t>(idx.size() - b));
      auto [x, y] = batches.Gather(idx.data() + b, n);
      at::Tensor yd = y.to(device_.device);
      std::optional<Autocast> autocast;
      if (spec_.train.precision == Precision::kBf16) autocast.emplace(device_.device);
      at::Tensor out = model_->Forward(x.to(device_.device));
      val_loss += Loss(spec_.train.loss, out, yd, /*sum=*/true).item<double>();
      autocast.reset();
      if (spec_.train.loss == LossKind::kCrossEntropy) {
        correct += out.argmax(-1).eq(yd).sum().item<double>();
      } else if (spec_.train.loss == LossKind::kBceWithLogits) {
        correct += out.reshape({-1}).gt(0).eq(yd.gt(0.5)).sum().item<double>();
      }
      count += static_cast<double>(n);
      predictions += static_cast<double>(yd.numel());
    }
    model_->SetTraining(true);
  }
  DDP_ASSIGN_OR_RETURN(const double epoch_loss, EpochLossSum());
  DDP_ASSIGN_OR_RETURN(
      const std::vector<double> v,
      SumOverRanks({epoch_loss, static_cast<double>(epoch_steps_), val_loss, correct, count,
                    predictions}));
  SetEpochLossSum(0);
  epoch_steps_ = 0;
  if (env_.rank == 0) {
    EpochEvent e;
    e.epoch = epoch;
    e.train_loss = v[1] > 0 ? v[0] / v[1] : 0.0;
    if (v[4] > 0) {
      e.val_loss = v[2] / v[5];
      e.val_samples = static_cast<int64_t>(v[4]);
      if (spec_.train.loss != LossKind::kMse) e.val_accuracy = v[3] / v[5];
    }
    e.validate_ms = MillisSince(t0);
    events_.Emit(e);
  }
  last_val_accuracy_ = v[4] > 0 && spec_.train.loss != LossKind::kMse ? v[3] / v[5] : -1;
  if (complete) pos_ = {epoch + 1, 0, pos_.global_step};
  if (spec_.checkpoint.dir.empty()) return absl::OkStatus();
  const bool final_epoch = epoch + 1 == spec_.train.epochs || IsLastStep();
  const bool epoch_ckpt = spec_.checkpoint.every_epochs > 0 &&
                          (epoch + 1) % spec_.checkpoint.every_epochs == 0;
  if (checkpoint_due || epoch_ckpt || final_epoch) return Checkpoint(pos_);
  return absl::OkStatus();
}

absl::Status TrainerImpl::Checkpoint(const Position& pos) {
  // Every rank comes here at the same positions, so the collective below matches.
  if (pos.epoch == last_saved_.epoch && pos.step == last_saved_.step) return absl::OkStatus();
  last_saved_ = pos;
  const auto t0 = Clock::now();
  // Mid-epoch, the epoch's loss totals so far, summed over ranks, travel along.
  std::vector<double> loss_totals = {0, 0};
  if (pos.step > 0) {
    DDP_ASSIGN_OR_RETURN(const double epoch_loss, EpochLossSum());
    DDP_ASSIGN_OR_RETURN(loss_totals, SumOverRanks({epoch_loss, static_cast<double>(epoch_steps_)}));
  }
  // Every writer saves rank 0's generator state, as if rank 0 had written them all.
  DDP_ASSIGN_OR_RETURN(at::Tensor rng, RankZeroRngState(comm(), device_.device));
  // ZeRO: every writer gets the whole optimizer state (collective, writer by writer), so
  // the checkpoint is the one a run without ZeRO writes.
  // Each writer takes its copy as its consolidation ends (the next one clears it), and
  // drops the consolidated state then: between checkpoints a rank keeps its shard only.
  c10::IValue zero_state;
  if (zero_ != nullptr) {
    try {
      for (int w : checkpoint_writers_) {
        zero_->consolidate_state_dict(w);
        if (w != env_.rank) continue;
        zero_state = OptimizerStateDict(optimizer_spec_, *optimizer_);
        zero_->state().clear();
      }
    } catch (const Error& e) {
      return StatusFromError(e);
    }
  }
  if (!keeper_->writer()) return absl::OkStatus();
  TrainingState state = StateAt(pos, rng, loss_totals);
  if (zero_ != nullptr) state.optimizer = std::move(zero_state);
  DDP_ASSIGN_OR_RETURN(const std::string path, keeper_->Save(std::move(state)));
  if (env_.rank != 0) {
    DDP_LOG(INFO) << "checkpoint of step " << pos.global_step << " kept on this node: " << path;
    return absl::OkStatus();
  }
  CheckpointEvent e;
  e.path = std::filesystem::absolute(path).string();
  e.epoch = pos.epoch;
  e.step = pos.step;
  e.global_step = pos.global_step;
  e.write_ms = MillisSince(t0);
  events_.Emit(e);
  return absl::OkStatus();
}

TrainingState TrainerImpl::StateAt(const Position& pos, const at::Tensor& rng,
                                   const std::vector<double>& loss_totals) const {
  TrainingState state;
  state.identity.job = spec_.name;
  state.position = pos;
  state.sampler = CurrentSampler();
  state.epoch_loss_sum = loss_totals[0];
  state.epoch_steps = static_cast<int64_t>(loss_totals[1]);
  state.model = model_->StateDict();
  state.optimizer = OptimizerStateDict(optimizer_spec_, *optimizer_);
  if (spec_.train.lr_schedule.kind != LrSchedule::Kind::kConstant ||
      spec_.train.lr_schedule.warmup > 0) {
    const LrSchedule& ls = spec_.train.lr_schedule;
    c10::impl::GenericDict sched(c10::StringType::get(), c10::AnyType::get());
    sched.insert("name", std::string(LrScheduleName(ls.kind)));
    sched.insert("interval",
                 std::string(ls.interval == LrSchedule::Interval::kEpoch ? "epoch" : "step"));
    sched.insert("last_epoch", ls.interval == LrSchedule::Interval::kEpoch ? pos.epoch
                                                                               : pos.global_step);
    // One per param group (train.optimizer.weight_decay_params), as PyTorch's.
    const size_t groups = optimizer_->param_groups().size();
    sched.insert("base_lrs",
                 c10::List<double>(std::vector<double>(groups, spec_.train.optimizer.lr)));
    sched.insert("_last_lr", c10::List<double>(std::vector<double>(groups, last_lr_)));
    state.lr_scheduler = sched;
  }
  state.rng_state = rng;
  return state;
}

absl::Status TrainerImpl::Run() {
  const auto t0 = Clock::now();
  DDP_RETURN_IF_ERROR(Setup());
  EmitStart();
  // A replacement: its whole start (data, model, the group, the state) was the sync.
  if (env_.generation > 0) EmitRecovered(0, MillisSince(t0));
  while (pos_.epoch < spec_.train.epochs && !IsLastStep()) {
    // A peer's failure is recovered live when the job allows it; the interrupted step
    // (or epoch end) is then done again from the state every rank now holds.
    if (absl::Status st = TrainEpoch(pos_.epoch, pos_.step); !st.ok()) {
      DDP_RETURN_IF_ERROR(Recover(st));
    }
  }
  DoneEvent e;
  e.epochs = pos_.epoch;
  e.global_step = pos_.global_step;
  e.params_fingerprint = Fingerprint(params_);
  e.samples = total_samples_;
  e.train_s = train_ms_ / 1000.0;
  if (last_val_accuracy_ >= 0) e.val_accuracy = last_val_accuracy_;
  events_.Emit(e);
  DDP_LOG(INFO) << "finished: " << pos_.global_step << " steps, " << total_samples_
                << " samples in " << train_ms_ / 1000.0 << "s of training";
  // Let every rank finish before rank 0's store goes away with its process.
  return comm().Barrier();
}

int64_t ScheduleIntervals(const LrSchedule& s, int64_t epochs, int64_t steps_per_epoch,
                          int64_t max_steps) {
  if (s.interval == LrSchedule::Interval::kEpoch) return epochs;
  const int64_t steps = epochs * steps_per_epoch;
  return max_steps > 0 ? std::min(steps, max_steps) : steps;
}

Trainer::Trainer(JobSpec spec, Environment env, EventSink* events)
    : impl_(std::make_unique<TrainerImpl>(std::move(spec), env, events)) {}

Trainer::~Trainer() = default;

absl::Status Trainer::Run() {
  try {
    return impl_->Run();
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("out of memory (std::bad_alloc)");
  } catch (const std::exception& e) {
    // An allocation the spec makes impossible (a model larger than the device) is
    // permanent; one that failed for want of free memory now is worth a retry.
    const std::string what = e.what();
    if (what.find("allocate") != std::string::npos) {
      return AllocationFailure(what, HostMemoryBytes());
    }
    // LibTorch/c10d errors not already mapped: a collective that failed inside
    // backward. Worth a retry from the last checkpoint.
    return absl::InternalError(FirstLine(what));
  }
}

}  // namespace ddp
