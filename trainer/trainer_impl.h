// The inside of ddp-trainer's Trainer (trainer.h): one rank's state and its methods,
// defined by concern, one file each:
//   trainer.cc              the run (set-up, the epochs, the end), what it reports
//                           (start, buckets, traces, recoveries, done); the public Trainer
//   trainer_setup.cc        data, model, device, optimizer, process group, comm hooks,
//                           ZeRO, the checkpoint keeper, the device step
//   trainer_loop.cc         the step and the epoch: micro-batches, the all-reduce, the
//                           optimizer, validation, when to checkpoint
//   trainer_recovery.cc     faults: the checkpoint-now notice, live recovery (the next
//                           generation, a survivor's state)
//   trainer_checkpoints.cc  what a checkpoint holds, saving it, resuming from one
// Private to trainer/: nothing outside it includes this header.
#ifndef DDP_TRAINER_TRAINER_IMPL_H_
#define DDP_TRAINER_TRAINER_IMPL_H_

#include <ATen/core/ivalue.h>
#include <torch/optim/optimizer.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/contract/events.h"
#include "common/jobspec/job_spec.h"
#include "common/status_macros.h"
#include "ddp/distributed_data_parallel.h"
#include "ddp/process_group.h"
#include "ddp/zero_redundancy_optimizer.h"
#include "libddp/engine/background_saver.h"
#include "libddp/engine/checkpoint.h"
#include "libddp/engine/checkpoint_keeper.h"
#include "libddp/engine/comm.h"
#include "libddp/engine/cuda_graph.h"
#include "libddp/engine/environment.h"
#include "libddp/engine/reducer.h"
#include "libddp/engine/sampler.h"
#include "libddp/src/api_bridge.h"
#include "trainer/dataset.h"
#include "trainer/device_step.h"
#include "trainer/model.h"

namespace ddp {

using TrainerClock = std::chrono::steady_clock;

// Where a step on the CPU spent its time (decision 190).
struct StepTimes {
  double data_ms = 0;     // Gathering the micro-batches and moving them to the device.
  double compute_ms = 0;  // Forward and backward, the communication wait taken out.
  double comm_ms = 0;     // Waiting for all-reduces (and the loss fold) not hidden.
  double optimizer_ms = 0;  // Clipping, the optimizer (ZeRO's broadcasts too), zero_grad.
};

inline double MillisSince(TrainerClock::time_point t) {
  return std::chrono::duration<double, std::milli>(TrainerClock::now() - t).count();
}

// Mean loss of a batch (reduction "mean") or its sum ("sum", for validation).
// cross_entropy over a sequence's logits [B, T, V] (model.gpt: the only model with 3-D
// outputs, BuildModel holds the others to [N, classes]) is over its B * T tokens, as
// nanoGPT's F.cross_entropy(logits.view(-1, V), targets.view(-1)). (trainer_loop.cc)
at::Tensor Loss(LossKind kind, const at::Tensor& out, const at::Tensor& target, bool sum);

// train.optimizer's optimizer over `groups` (OptimizerParamGroups): PyTorch's fused
// kernels when `spec.fused` (resolved by ResolveFused) says so, else the engine's
// (decision 170). Throws ddp::Error as the fused constructors do. (trainer_setup.cc)
std::unique_ptr<torch::optim::Optimizer> NewOptimizer(
    const OptimizerSpec& spec, std::vector<torch::optim::OptimizerParamGroup> groups,
    std::optional<bool> multi_tensor = std::nullopt);

class TrainerImpl {
 public:
  TrainerImpl(JobSpec spec, Environment env, EventSink* events);

  absl::Status Run();

 private:
  // --- Set-up (trainer_setup.cc).
  absl::Status Setup();
  // Forms the process group of env_'s generation, takes a surviving rank's state when
  // this is a live recovery's generation (TakeLiveState), wraps the model in libddp's
  // engine and sets up the checkpoint keeper. The same collectives in the same order on
  // every rank: a replacement's Setup and the survivors' Recover both come here.
  absl::Status JoinGroup();
  // train.comm_hook: PyTorch's built-in communication hooks on ddp_.
  absl::Status RegisterCommHook();
  // train.optimizer.zero_redundancy: the sharded optimizer over this group's ranks.
  absl::Status MakeZeroOptimizer();
  // train.cuda_graph (decision 173): makes device_step_ where the step can run whole on
  // the GPU; FAILED_PRECONDITION naming why when true asks for what cannot be.
  absl::Status SetUpDeviceStep();

  // --- The step and the epoch (trainer_loop.cc).
  absl::Status TrainEpoch(int64_t epoch, int64_t first_step);
  // `complete`: false when train.max_steps stopped the epoch early.
  absl::Status EndEpoch(int64_t epoch, bool complete, bool checkpoint_due);
  // One optimizer step at learning rate `lr`: forward and backward of each
  // micro-batch, the all-reduce, train.clip_grad_norm, the optimizer.
  // `totals`: what the step adds to the epoch's train-loss totals (its loss and 1 step
  // on this rank; with fold_loss_, both summed over ranks).
  // `times`: where the step's time went (the step event's phases).
  absl::Status TakeStep(const std::vector<int64_t>& order, int64_t first_micro,
                        int64_t num_micro, double lr, double* loss, StepTimes* times,
                        int64_t* samples, std::array<double, 2>* totals);
  // With device_step_: the same step, whole on the GPU (and in a CUDA graph once
  // captured); the loss is read only when an event needs it.
  absl::Status TakeDeviceStep(const std::vector<int64_t>& order, int64_t first_micro,
                              int64_t num_micro, int64_t epoch, int64_t step, double lr,
                              int64_t* samples);
  // DDP_SAMPLE_LOG: one line per step taken, "attempt rank epoch step global_step
  // id...", the training samples of the step's micro-batches in order.
  void LogSamples(const std::vector<int64_t>& order, int64_t first_micro, int64_t num_micro,
                  int64_t epoch, int64_t step);
  // train.lr_schedule's lr for the step after `global_step` steps, in `epoch`.
  double LrAt(int64_t epoch, int64_t global_step) const;
  int64_t StepsPerEpoch() const;
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
  // This rank's share of the epoch's train-loss totals [loss sum, steps], for a sum
  // over ranks (the epoch event, a checkpoint): its own totals, or with fold_loss_ the
  // world's on rank 0 and nothing elsewhere.
  absl::StatusOr<std::vector<double>> EpochLossShare() {
    if (fold_loss_) {
      if (env_.rank != 0) return std::vector<double>{0, 0};
      return std::vector<double>{epoch_loss_sum_, static_cast<double>(epoch_steps_)};
    }
    DDP_ASSIGN_OR_RETURN(const double sum, EpochLossSum());
    return std::vector<double>{sum, static_cast<double>(epoch_steps_)};
  }
  bool IsLastStep() const {
    return spec_.train.max_steps > 0 && pos_.global_step >= spec_.train.max_steps;
  }

  // --- Faults (trainer_recovery.cc).
  // Live recovery (docs/recovery.md) after `cause` broke a collective: keeps the model,
  // optimizer and position, drops the process group, waits for the worker to announce
  // the next generation, and joins it. `cause` itself when recovery is off or cannot
  // cure it, or when no generation comes within recovery_timeout_s.
  absl::Status Recover(const absl::Status& cause);
  absl::Status TakeLiveState();
  // The checkpoint-now notice (docs/recovery.md): every notice_every_ steps (about
  // 100 ms of training) the ranks agree whether any of them saw a new notice (one
  // small all-reduce); if so they checkpoint at once, at the same step, and then
  // hold their step until they are stopped (or the hold ends, and training goes on).
  // `step_ms`: the step just taken.
  absl::Status CheckNotice(double step_ms);

  // --- Checkpoints (trainer_checkpoints.cc).
  absl::Status Resume();
  absl::Status Checkpoint(const Position& pos);
  // A finished save of `e`'s position at `path`: rank 0's checkpoint event, a log line
  // elsewhere.
  void ReportCheckpoint(CheckpointEvent e, const std::string& path);
  // checkpoint.async: reports the background save that finished, if one did (its
  // error, when it failed). Called after each step and wherever the save is waited for.
  absl::Status ReapSave();
  // `state`'s model, optimizer and position into this rank's (`what` names it in errors).
  absl::Status LoadState(const TrainingState& state, const std::string& what);
  // With zero_: `state`'s optimizer state, this rank's shard of it, into zero_.
  absl::Status LoadZeroState(const c10::IValue& state);
  // What a checkpoint (or a live recovery's transfer) holds at `pos`.
  TrainingState StateAt(const Position& pos, const at::Tensor& rng,
                        const std::vector<double>& loss_totals) const;
  // The inputs of this run's data order, as a checkpoint records them.
  SamplerState CurrentSampler() const {
    return {env_.world_size,           spec_.train.batch_size, spec_.train.grad_accum_steps,
            spec_.train.seed,          spec_.train.shuffle,    data_.train.size(),
            spec_.data.seed};
  }

  // --- Events (trainer.cc).
  void EmitStart();
  void EmitTrace();
  // Rank 0 tells the coordinator that the generation formed and the state moved.
  void EmitRecovered(double wait_ms, double sync_ms);
  void EmitDone();
  bool trace_enabled() const { return spec_.metrics.trace_buckets; }

  // The world's collectives, behind the process group.
  Comm& comm() { return *group_->impl().comm; }
  // `values` summed over all ranks (one double all-reduce).
  absl::StatusOr<std::vector<double>> SumOverRanks(const std::vector<double>& values) {
    return group_->impl().Sum(values);
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
  // checkpoint.async on a writer: saves keeper_'s checkpoints in the background.
  // Declared after keeper_, so it is gone (its save finished) before keeper_ is.
  std::unique_ptr<BackgroundSaver> saver_;
  // The save in flight's event, its waits so far (its copy's wait added by TakeStep).
  std::optional<CheckpointEvent> inflight_;
  std::unique_ptr<BatchAssembler> train_batches_;
  std::unique_ptr<DeviceStep> device_step_;  // Made by SetUpDeviceStep, else null.
  ReducerTrace trace_;
  SamplerOptions sampler_;
  int64_t schedule_intervals_ = 0;  // train.lr_schedule's whole run (t_max 0).
  double last_lr_ = 0;              // Of the last optimizer step.

  Position pos_;
  // How pos_'s epoch is sharded: from an offset of its order, when an earlier world of
  // another size trained its first samples (decision 191); {} from the next epoch on.
  EpochOrder order_;
  std::ofstream sample_log_;  // DDP_SAMPLE_LOG's file, when set.
  // DDP_DEBUG_DATA_STALL=RANK:GLOBAL_STEP:FIFO (tests only): that rank reads the FIFO in
  // its data path at that step, and blocks until the test writes to it.
  struct DebugDataStallAt {
    int rank = -1;
    int64_t global_step = -1;
    std::string fifo;
  };
  std::optional<DebugDataStallAt> debug_data_stall_;
  void DebugDataStall();
  bool resumed_ = false;
  Position resumed_from_;
  // Per-epoch running totals for the epoch event's train_loss (reset by EndEpoch;
  // restored by Resume, summed over ranks, on rank 0). With fold_loss_ they are the
  // world's totals on every rank, restored on every rank, and a live recovery's
  // state carries them (decision 186).
  double epoch_loss_sum_ = 0;
  int64_t epoch_steps_ = 0;
  // Live recovery on a CPU: each step's loss is summed over ranks beside its gradients,
  // so a rank that dies takes none of the epoch's losses with it. (On a GPU the loss
  // stays on the device between events; folding it would sync every step.)
  bool fold_loss_ = false;
  // The last step's fold [loss, 1], kept past the step: a sum abandoned by a failed
  // step may still be written until the group is dropped.
  at::Tensor fold_;
  // Throughput window since the last step event.
  int64_t window_samples_ = 0;
  int64_t window_steps_ = 0;
  TrainerClock::time_point window_start_;
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

}  // namespace ddp

#endif  // DDP_TRAINER_TRAINER_IMPL_H_
