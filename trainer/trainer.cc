// ddp-trainer's run (trainer.h): set-up, the epochs with live recovery around them,
// the end; what the run reports (start, buckets, traces, recoveries, done). The rest of
// TrainerImpl is defined by concern beside it (trainer_impl.h).
#include "trainer/trainer.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <new>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "ddp/fingerprint.h"
#include "libddp/engine/checkpoint_keeper.h"
#include "libddp/engine/failure.h"
#include "trainer/trainer_impl.h"

namespace ddp {
namespace {

std::string FirstLine(const std::string& s) { return s.substr(0, s.find('\n')); }

JobSpec WithPlaceholders(JobSpec spec, const Environment& env) {
  spec.checkpoint.dir = CheckpointDirFor(spec.checkpoint.dir, env);
  return spec;
}

}  // namespace

TrainerImpl::TrainerImpl(JobSpec spec, Environment env, EventSink* events)
    : checkpoint_template_(spec.checkpoint.dir),
      spec_(WithPlaceholders(std::move(spec), env)),
      env_(env),
      events_(*events) {}

absl::Status TrainerImpl::Run() {
  const auto t0 = TrainerClock::now();
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
  // The last checkpoint is written and reported before the run says it is done.
  if (saver_) {
    saver_->Wait();
    DDP_RETURN_IF_ERROR(ReapSave());
  }
  EmitDone();
  comm().recorder()->SetPhase(flight::Phase::kDone);
  // Let every rank finish before rank 0's store goes away with its process.
  return comm().Barrier();
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

void TrainerImpl::EmitTrace() {
  TraceEvent e;
  e.epoch = pos_.epoch;
  e.global_step = pos_.global_step - 1;
  for (const ReducerTrace::Entry& t : trace_.Take()) {
    e.entries.push_back({ReducerTrace::KindName(t.kind), t.index, t.micros});
  }
  // The parameters after this step: equal on every rank, step by step.
  e.params_fingerprint = fingerprint(params_);
  events_.Emit(e);
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

void TrainerImpl::EmitDone() {
  DoneEvent e;
  e.epochs = pos_.epoch;
  e.global_step = pos_.global_step;
  e.params_fingerprint = fingerprint(params_);
  e.samples = total_samples_;
  e.train_s = train_ms_ / 1000.0;
  if (last_val_accuracy_ >= 0) e.val_accuracy = last_val_accuracy_;
  events_.Emit(e);
  DDP_LOG(INFO) << "finished: " << pos_.global_step << " steps, " << total_samples_
                << " samples in " << train_ms_ / 1000.0 << "s of training";
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
