// train.lr_schedule's learning rates, in closed form: what torch.optim.lr_scheduler's
// StepLR, CosineAnnealingLR and LinearLR (after a LinearLR warm-up, joined by
// SequentialLR) set on the optimizer, step for step (checked against PyTorch's own
// schedulers: tests/fixtures/lr_schedules.json). A pure function of the scheduler's
// count (optimizer steps or epochs done), so a resumed run recomputes it from the
// checkpoint's position and nothing drifts. No LibTorch here.
#ifndef DDP_WORKER_TRAINER_LR_SCHEDULE_H_
#define DDP_WORKER_TRAINER_LR_SCHEDULE_H_

#include <cstdint>

#include "common/jobspec/job_spec.h"

namespace ddp {

// The lr for the optimizer step (interval step) or epoch (interval epoch) that comes
// after `count` scheduler steps, i.e. what PyTorch's param_groups[0]["lr"] holds then
// with scheduler.step() called `count` times. `total`: the intervals of the whole run,
// for t_max 0 (t_max = max(1, total - warmup)).
double ScheduledLr(const LrScheduleSpec& schedule, double base_lr, int64_t count, int64_t total);

// The intervals of a whole run: epochs, or optimizer steps (epochs x steps per epoch,
// capped by max_steps when it is > 0).
int64_t ScheduleIntervals(const LrScheduleSpec& schedule, int64_t epochs, int64_t steps_per_epoch,
                          int64_t max_steps);

}  // namespace ddp

#endif  // DDP_WORKER_TRAINER_LR_SCHEDULE_H_
