// ddp-trainer's checkpoints (trainer_impl.h): what one holds (model, optimizer in
// torch.optim's layout, ZeRO's consolidated, the position, the sampler, the epoch's
// loss totals, the schedule, rank 0's generator), saving it through the keeper's
// writers, and resuming from the newest any rank holds.
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "libddp/engine/optimizer.h"
#include "trainer/trainer_impl.h"

namespace ddp {

absl::Status TrainerImpl::Resume() {
  // The newest checkpoint any rank holds, sent by its holder to every rank (see
  // CheckpointKeeper): no shared filesystem needed.
  DDP_ASSIGN_OR_RETURN(std::optional<CheckpointKeeper::Restored> restored, keeper_->Restore());
  if (!restored.has_value()) return absl::OkStatus();
  const TrainingState& ckpt = restored->state;
  const std::string& path = restored->path;
  DDP_RETURN_IF_ERROR(LoadState(ckpt, path));
  const SamplerState now = CurrentSampler();
  if (pos_.step != 0 && !SameDataOrder(ckpt.sampler, now)) {
    if (SamePermutation(ckpt.sampler, now)) {
      // Another world size, batch size or accumulation over the same order (decision
      // 191): the rest of the epoch, from the samples the job has trained on, is
      // sharded over this world, and the epoch's steps go on counting.
      order_ = {ckpt.epoch_samples_done, pos_.step};
      DDP_LOG(INFO) << "checkpoint was taken at world size " << ckpt.sampler.world_size
                    << ", batch size " << ckpt.sampler.batch_size << " x "
                    << ckpt.sampler.grad_accum_steps << ": the " << now.train_samples - order_.offset
                    << " samples left of epoch " << pos_.epoch << " (of " << now.train_samples
                    << ") are sharded over world size " << now.world_size;
    } else {
      DDP_LOG(WARNING) << "checkpoint was taken with another sampler seed, shuffle or "
                          "training set: epoch "
                       << pos_.epoch << " restarts from its first batch";
      pos_.step = 0;
      order_ = {};
    }
  }
  // The interrupted epoch's loss totals so far (summed over ranks): rank 0 carries
  // them (with fold_loss_ every rank does), so the epoch's train_loss covers all of its
  // steps.
  if (pos_.step > 0 && (fold_loss_ || env_.rank == 0)) {
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

absl::Status TrainerImpl::LoadState(const TrainingState& state, const std::string& what) {
  DDP_RETURN_IF_ERROR(RestoreModel(state, model_->StateDict(), what));
  if (zero_ != nullptr) {
    DDP_RETURN_IF_ERROR(LoadZeroState(state.optimizer));
  } else {
    DDP_RETURN_IF_ERROR(LoadOptimizerStateDict(optimizer_spec_, *optimizer_, state.optimizer));
  }
  pos_ = state.position;
  order_ = state.order;
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

absl::Status TrainerImpl::Checkpoint(const Position& pos) {
  // Every rank comes here at the same positions, so the collective below matches.
  if (pos.epoch == last_saved_.epoch && pos.step == last_saved_.step) return absl::OkStatus();
  last_saved_ = pos;
  const auto t0 = TrainerClock::now();
  // Mid-epoch, the epoch's loss totals so far, summed over ranks, travel along.
  std::vector<double> loss_totals = {0, 0};
  if (pos.step > 0) {
    DDP_ASSIGN_OR_RETURN(const std::vector<double> share, EpochLossShare());
    DDP_ASSIGN_OR_RETURN(loss_totals, SumOverRanks(share));
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
  CheckpointEvent e;
  e.epoch = pos.epoch;
  e.step = pos.step;
  e.global_step = pos.global_step;
  if (saver_) {
    // checkpoint.async: training waits for a save still in flight (so memory holds one
    // copy at most) and for the copy of the state, not for the write.
    e.async = true;
    const auto w0 = TrainerClock::now();
    saver_->Wait();
    DDP_RETURN_IF_ERROR(ReapSave());
    e.wait_ms = MillisSince(w0);
    const auto s0 = TrainerClock::now();
    // On the CPU the writer thread copies the parameters and the optimizer state while
    // the next forward and backward run (they only read them): the next optimizer step
    // waits for the copy (TakeStep). What a forward may change, buffers (BatchNorm's
    // running statistics, DDP's broadcast) and the frozen parameters with them, is
    // copied here. On a GPU everything is copied here, on the trainer's stream.
    const bool copy_later = !device_.device.is_cuda();
    if (copy_later) {
      for (auto& named : state.model) {
        if (!named.second.requires_grad()) named.second = named.second.detach().clone();
      }
    } else {
      state = Snapshot(state);
    }
    e.snapshot_ms = MillisSince(s0);
    e.wait_ms += saver_->Submit(std::move(state), copy_later);
    inflight_ = e;
    return absl::OkStatus();
  }
  DDP_ASSIGN_OR_RETURN(const std::string path, keeper_->Save(std::move(state)));
  e.write_ms = MillisSince(t0);
  ReportCheckpoint(e, path);
  return absl::OkStatus();
}

absl::Status TrainerImpl::ReapSave() {
  if (!saver_) return absl::OkStatus();
  std::optional<BackgroundSaver::Finished> done = saver_->TakeFinished();
  if (!done.has_value()) return absl::OkStatus();
  CheckpointEvent e = inflight_.value_or(CheckpointEvent{});
  inflight_.reset();
  // A failed background save fails the run here, as a synchronous one would have.
  if (!done->path.ok()) return done->path.status();
  e.write_ms = done->write_ms;
  ReportCheckpoint(e, *done->path);
  return absl::OkStatus();
}

void TrainerImpl::ReportCheckpoint(CheckpointEvent e, const std::string& path) {
  if (env_.rank != 0) {
    DDP_LOG(INFO) << "checkpoint of step " << e.global_step << " kept on this node: " << path;
    return;
  }
  e.path = std::filesystem::absolute(path).string();
  events_.Emit(e);
}

TrainingState TrainerImpl::StateAt(const Position& pos, const at::Tensor& rng,
                                   const std::vector<double>& loss_totals) const {
  TrainingState state;
  state.identity.job = spec_.name;
  state.position = pos;
  state.sampler = CurrentSampler();
  // order_ belongs to pos_'s epoch; a position at an epoch's start has none.
  if (pos.epoch == pos_.epoch && pos.step > 0) state.order = order_;
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

}  // namespace ddp
