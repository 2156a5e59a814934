// ddp-trainer's faults (trainer_impl.h, docs/recovery.md): the checkpoint-now notice,
// and live recovery: the survivors keep their state, join the next generation, and a
// replacement takes a survivor's state.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "libddp/engine/failure.h"
#include "libddp/engine/recovery.h"
#include "trainer/trainer_impl.h"

namespace ddp {

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
  // Written (and reported) before the hold: the move waits for this checkpoint.
  if (saver_) {
    saver_->Wait();
    DDP_RETURN_IF_ERROR(ReapSave());
  }
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

absl::Status TrainerImpl::Recover(const absl::Status& cause) {
  if (spec_.max_recoveries == 0 || env_.generation_file.empty() || !PeerFailure(cause)) {
    return cause;
  }
  const auto t0 = TrainerClock::now();
  DDP_LOG(WARNING) << "rank " << env_.rank << ": " << cause.message()
                   << "; keeping this rank's state at step " << pos_.global_step
                   << " and waiting up to recovery_timeout_s for a replacement";
  // Gone first, so that ranks still blocked on this one see it fail too. A CUDA graph
  // before them: it holds the group's collectives, and NCCL will not destroy a
  // communicator a graph still holds.
  if (device_step_) device_step_->DropGraph();
  ddp_.reset();
  if (saver_) {
    // Its save in flight finishes first (local I/O, no collective) and is reported.
    saver_->Wait();
    if (absl::Status st = ReapSave(); !st.ok()) {
      DDP_LOG(WARNING) << "rank " << env_.rank << ": " << st;
    }
  }
  saver_.reset();
  keeper_.reset();
  group_.reset();
  for (at::Tensor& p : params_) p.mutable_grad().reset();  // The abandoned step's.
  DDP_ASSIGN_OR_RETURN(env_,
                       NextGeneration(env_, cause, absl::Seconds(spec_.recovery_timeout_s)));
  const double wait_ms = MillisSince(t0);
  const auto t1 = TrainerClock::now();
  DDP_RETURN_IF_ERROR(JoinGroup());
  // A graph holds the old group's collectives: warm up and capture again on the new one.
  if (device_step_) device_step_->Rebind(ddp_.get());
  DDP_LOG(INFO) << "rank " << env_.rank << ": generation " << env_.generation << " formed on "
                << env_.master_addr << ":" << env_.master_port << "; took rank "
                << recovery_source_ << "'s state at step " << recovery_step_;
  EmitRecovered(wait_ms, MillisSince(t1));
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
    // With fold_loss_ the epoch's train-loss totals are the world's: they go along.
    bytes = EncodeCheckpoint(StateAt(
        pos_, CpuRngState(),
        fold_loss_ ? std::vector<double>{epoch_loss_sum_, static_cast<double>(epoch_steps_)}
                   : std::vector<double>{0, 0}));
  }
  DDP_ASSIGN_OR_RETURN(bytes, comm().BroadcastBytesFrom(source.rank, bytes,
                                                        "live recovery: sending the state"));
  if (env_.rank == source.rank) return absl::OkStatus();
  const std::string what = absl::StrCat("rank ", source.rank, "'s live state");
  DDP_ASSIGN_OR_RETURN(const TrainingState state, DecodeCheckpoint(bytes, what));
  DDP_RETURN_IF_ERROR(LoadState(state, what));
  if (fold_loss_) {
    epoch_loss_sum_ = state.epoch_loss_sum;
    epoch_steps_ = state.epoch_steps;
  }
  if (state.rng_state.defined()) RestoreRngState(state.rng_state);
  return absl::OkStatus();
}

}  // namespace ddp
