// ddp-trainer's step and epoch (trainer_impl.h): micro-batches in the sampler's order,
// forward and backward with the all-reduce inside it, train.clip_grad_norm, the
// optimizer at train.lr_schedule's rate, step events, validation reduced over ranks, and
// when to checkpoint.
#include <algorithm>
#include <array>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "ddp/autocast.h"
#include "ddp/lr_schedule.h"
#include "libddp/engine/gpu_memory.h"
#include "libddp/engine/torch_compat.h"
#include "trainer/trainer_impl.h"

namespace ddp {

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

absl::Status TrainerImpl::TrainEpoch(int64_t epoch, int64_t first_step) {
  // The epoch's order from where its present sharding began (decision 191): the whole
  // epoch, unless a world of another size trained its first samples.
  const std::vector<int64_t> order =
      DistributedSamplerIndices(data_.train.size(), sampler_, epoch, order_.offset);
  const int64_t accum = spec_.train.grad_accum_steps;
  const int64_t micro_total =
      NumBatches(static_cast<int64_t>(order.size()), spec_.train.batch_size, spec_.train.drop_last);
  const int64_t steps = order_.first_step + (micro_total + accum - 1) / accum;
  window_samples_ = 0;
  window_steps_ = 0;
  window_start_ = TrainerClock::now();
  model_->SetTraining(true);
  bool checkpoint_due = false;
  bool complete = true;
  for (int64_t step = first_step; step < steps; ++step) {
    const auto t0 = TrainerClock::now();
    const int64_t first_micro = (step - order_.first_step) * accum;
    const int64_t num_micro = std::min(accum, micro_total - first_micro);
    double loss = 0;
    std::optional<StepTimes> times;  // Measured on the CPU path only.
    int64_t samples = 0;
    std::array<double, 2> totals = {0, 1};
    const double lr = LrAt(epoch, pos_.global_step);
    comm().recorder()->SetStep(pos_.global_step);
    if (device_step_) {
      // Queued on the GPU; the loss is read below only when an event reports it.
      DDP_RETURN_IF_ERROR(TakeDeviceStep(order, first_micro, num_micro, epoch, step, lr, &samples));
    } else {
      times.emplace();
      DDP_RETURN_IF_ERROR(
          TakeStep(order, first_micro, num_micro, lr, &loss, &*times, &samples, &totals));
      epoch_loss_sum_ += totals[0];
    }
    double step_ms = MillisSince(t0);
    if (sample_log_.is_open()) LogSamples(order, first_micro, num_micro, epoch, step);
    total_samples_ += samples;
    pos_ = {epoch, step + 1, pos_.global_step + 1};
    epoch_steps_ += static_cast<int64_t>(totals[1]);
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
      if (times.has_value()) {
        e.comm_ms = times->comm_ms;
        e.data_ms = times->data_ms;
        e.compute_ms = times->compute_ms;
        e.optimizer_ms = times->optimizer_ms;
      }
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
      window_start_ = TrainerClock::now();
    }
    if (spec_.metrics.trace_buckets) EmitTrace();
    // On the device, what the iteration took, waits for the GPU included: the host runs at
    // most a few steps ahead, so its iterations pace the GPU's steps.
    const double iteration_ms = device_step_ ? MillisSince(t0) : step_ms;
    train_ms_ += iteration_ms;
    DDP_RETURN_IF_ERROR(CheckNotice(iteration_ms));
    DDP_RETURN_IF_ERROR(ReapSave());
    const bool step_ckpt = spec_.checkpoint.every_steps > 0 &&
                           pos_.global_step % spec_.checkpoint.every_steps == 0;
    if (last_in_epoch) {
      checkpoint_due = step_ckpt;
      complete = step + 1 == steps;
      break;
    }
    if (step_ckpt && !spec_.checkpoint.dir.empty()) {
      flight::PhaseScope phase(comm().recorder(), flight::Phase::kCheckpoint);
      DDP_RETURN_IF_ERROR(Checkpoint(pos_));
    }
  }
  return EndEpoch(epoch, complete, checkpoint_due);
}

absl::Status TrainerImpl::TakeStep(const std::vector<int64_t>& order, int64_t first_micro,
                                   int64_t num_micro, double lr, double* loss, StepTimes* times,
                                   int64_t* samples, std::array<double, 2>* totals) {
  const int64_t bs = spec_.train.batch_size;
  const int64_t total = static_cast<int64_t>(order.size());
  if (trace_enabled()) trace_.Reset();
  double loss_sum = 0;
  *samples = 0;
  std::unique_ptr<PendingSum> fold;
  for (int64_t j = 0; j < num_micro; ++j) {
    const int64_t begin = (first_micro + j) * bs;
    const int64_t n = std::min(bs, total - begin);
    const auto data_start = TrainerClock::now();
    flight::Recorder* const recorder = comm().recorder();
    recorder->SetPhase(flight::Phase::kData);
    if (debug_data_stall_.has_value()) DebugDataStall();
    auto [x, y] = train_batches_->Gather(order.data() + begin, n);
    at::Tensor xd = x.to(device_.device, /*non_blocking=*/true);
    at::Tensor yd = y.to(device_.device, /*non_blocking=*/true);
    times->data_ms += MillisSince(data_start);
    recorder->SetPhase(flight::Phase::kCompute);
    const auto compute_start = TrainerClock::now();
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
    if (fold_loss_ && j == num_micro - 1) {
      // The step's loss summed over ranks, started before the gradients' all-reduce
      // and waited for after it, before the optimizer: it travels beside them, and a
      // step whose fold failed changed no parameter, so the next generation takes it
      // again and it counts once (decision 186).
      fold_ = at::tensor({(loss_sum + l.item<double>()) / static_cast<double>(num_micro), 1.0},
                         at::kDouble);
      fold = comm().StartSum(fold_);
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
    times->compute_ms += MillisSince(compute_start);
  }
  const double backward_wait_ms = ddp_->last_backward().comm_wait_ms;
  const auto fold_start = TrainerClock::now();
  if (fold) DDP_RETURN_IF_ERROR(fold->Wait());
  times->comm_ms = backward_wait_ms + (fold ? MillisSince(fold_start) : 0.0);
  times->compute_ms = std::max(0.0, times->compute_ms - backward_wait_ms);
  const auto optimizer_start = TrainerClock::now();
  comm().recorder()->SetPhase(flight::Phase::kOptimizer);
  // On the averaged gradients, as torch.nn.utils.clip_grad_norm_ after backward().
  if (spec_.train.clip_grad_norm > 0) ClipGradNorm(params_, spec_.train.clip_grad_norm);
  for (auto& group : optimizer_->param_groups()) group.options().set_lr(lr);
  last_lr_ = lr;
  // checkpoint.async: the writer thread may still be copying what this step changes.
  if (inflight_.has_value()) inflight_->snapshot_ms += saver_->WaitForCopy();
  try {
    optimizer_->step();  // With ZeRO: collective (the owners' updates broadcast).
  } catch (const Error& e) {
    return StatusFromError(e);
  }
  for (at::Tensor& p : params_) p.mutable_grad().reset();  // zero_grad(set_to_none=True)
  times->optimizer_ms = MillisSince(optimizer_start);
  *loss = loss_sum / static_cast<double>(num_micro);
  *totals = fold ? std::array<double, 2>{fold_[0].item<double>(), fold_[1].item<double>()}
                 : std::array<double, 2>{*loss, 1};
  return absl::OkStatus();
}

absl::Status TrainerImpl::TakeDeviceStep(const std::vector<int64_t>& order, int64_t first_micro,
                                         int64_t num_micro, int64_t epoch, int64_t step,
                                         double lr, int64_t* samples) {
  const int64_t bs = spec_.train.batch_size;
  const int64_t total = static_cast<int64_t>(order.size());
  std::vector<std::pair<at::Tensor, at::Tensor>> micro;
  *samples = 0;
  comm().recorder()->SetPhase(flight::Phase::kData);
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
  comm().recorder()->SetPhase(flight::Phase::kCompute);  // Forward to the optimizer, queued.
  return device_step_->Take(epoch, step, pos_.global_step, micro);
}

void TrainerImpl::DebugDataStall() {
  const DebugDataStallAt& at = *debug_data_stall_;
  if (env_.rank != at.rank || pos_.global_step != at.global_step) return;
  DDP_LOG(WARNING) << "DDP_DEBUG_DATA_STALL: rank " << at.rank << " reads " << at.fifo
                   << " in its data path at global step " << at.global_step;
  // Blocks in open(2) until a writer opens the FIFO, then in read(2) until it writes or
  // closes: a data source that stopped answering (a hung network mount).
  std::ifstream fifo(at.fifo);
  std::string line;
  std::getline(fifo, line);
}

void TrainerImpl::LogSamples(const std::vector<int64_t>& order, int64_t first_micro,
                             int64_t num_micro, int64_t epoch, int64_t step) {
  const int64_t total = static_cast<int64_t>(order.size());
  const int64_t bs = spec_.train.batch_size;
  std::string line = absl::StrCat(env_.attempt, " ", env_.rank, " ", epoch, " ", step, " ",
                                  pos_.global_step);
  for (int64_t j = 0; j < num_micro; ++j) {
    const int64_t begin = (first_micro + j) * bs;
    for (int64_t i = begin; i < std::min(total, begin + bs); ++i) {
      absl::StrAppend(&line, " ", order[static_cast<size_t>(i)]);
    }
  }
  line += '\n';
  sample_log_.write(line.data(), static_cast<std::streamsize>(line.size()));
  sample_log_.flush();
}

absl::Status TrainerImpl::EndEpoch(int64_t epoch, bool complete, bool checkpoint_due) {
  const auto t0 = TrainerClock::now();
  // [train loss sum, train steps, val loss sum, val correct, val samples, val
  // predictions], summed over ranks. A sample makes one prediction, a token window
  // (model.gpt) one per token: loss and accuracy are per prediction.
  double val_loss = 0, correct = 0, count = 0, predictions = 0;
  comm().recorder()->SetPhase(flight::Phase::kEvaluate);
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
  DDP_ASSIGN_OR_RETURN(const std::vector<double> share, EpochLossShare());
  DDP_ASSIGN_OR_RETURN(
      const std::vector<double> v,
      SumOverRanks({share[0], share[1], val_loss, correct, count, predictions}));
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
  if (complete) {
    pos_ = {epoch + 1, 0, pos_.global_step};
    order_ = {};
  }
  if (spec_.checkpoint.dir.empty()) return absl::OkStatus();
  comm().recorder()->SetPhase(flight::Phase::kCheckpoint);
  const bool final_epoch = epoch + 1 == spec_.train.epochs || IsLastStep();
  const bool epoch_ckpt = spec_.checkpoint.every_epochs > 0 &&
                          (epoch + 1) % spec_.checkpoint.every_epochs == 0;
  if (checkpoint_due || epoch_ckpt || final_epoch) return Checkpoint(pos_);
  return absl::OkStatus();
}

}  // namespace ddp
