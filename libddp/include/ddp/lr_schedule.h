// Learning-rate schedules as torch.optim.lr_scheduler computes them, in closed form.
//
//   kStep:     StepLR(step_size, gamma)
//   kCosine:   CosineAnnealingLR(T_max = t_max, eta_min)
//   kLinear:   LinearLR(start_factor 1, end_factor, total_iters = t_max)
//   warmup N:  LinearLR(warmup_start_factor -> 1 over N steps) first, joined to the
//              schedule by SequentialLR(milestones=[N])
// A pure function of the count of scheduler steps, so a resumed run recomputes the lr
// from its position and nothing drifts. Torch-free (job.yaml's train.lr_schedule is
// this struct); ddp::LrScheduler (lr_scheduler.h) drives an optimizer with it.
#ifndef DDP_LR_SCHEDULE_H_
#define DDP_LR_SCHEDULE_H_

#include <cstdint>

namespace ddp {

struct LrSchedule {
  enum class Kind { kConstant, kStep, kCosine, kLinear };
  // Whether the scheduler steps after every optimizer step or every epoch (job.yaml's
  // train.lr_schedule.interval; the library's LrScheduler steps when told).
  enum class Interval { kStep, kEpoch };
  Kind kind = Kind::kConstant;
  Interval interval = Interval::kStep;
  int64_t warmup = 0;
  double warmup_start_factor = 0.1;
  int64_t step_size = 1;  // kStep
  double gamma = 0.1;     // kStep
  int64_t t_max = 0;      // kCosine, kLinear; 0: the rest of training (total - warmup)
  double eta_min = 0.0;   // kCosine
  double end_factor = 0.0;  // kLinear
};

// The lr after `count` scheduler steps from `base_lr`: PyTorch's param_groups[i]["lr"]
// once scheduler.step() has run `count` times. `total`: the intervals of the whole run,
// for t_max 0 (then T_max = max(1, total - warmup)).
double scheduled_lr(const LrSchedule& schedule, double base_lr, int64_t count, int64_t total);

}  // namespace ddp

#endif  // DDP_LR_SCHEDULE_H_
