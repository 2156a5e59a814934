// Learning-rate schedules as torch.optim.lr_scheduler computes them, in closed form.
//
// ddp::LrSchedule (the struct, <ddp/contract/lr_schedule.h>) says which schedule;
// scheduled_lr() is its lr after a count of scheduler steps: a pure function, so a
// resumed run recomputes the lr from its position and nothing drifts. Torch-free;
// ddp::LrScheduler (lr_scheduler.h) drives an optimizer with it.
#ifndef DDP_LR_SCHEDULE_H_
#define DDP_LR_SCHEDULE_H_

#include <cstdint>

#include "ddp/contract/lr_schedule.h"

namespace ddp {

// The lr after `count` scheduler steps from `base_lr`: PyTorch's param_groups[i]["lr"]
// once scheduler.step() has run `count` times. `total`: the intervals of the whole run,
// for t_max 0 (then T_max = max(1, total - warmup)).
double scheduled_lr(const LrSchedule& schedule, double base_lr, int64_t count, int64_t total);

}  // namespace ddp

#endif  // DDP_LR_SCHEDULE_H_
