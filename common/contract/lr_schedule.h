// ddp::LrSchedule: a learning-rate schedule as torch.optim.lr_scheduler defines it.
//
//   kStep:     StepLR(step_size, gamma)
//   kCosine:   CosineAnnealingLR(T_max = t_max, eta_min)
//   kLinear:   LinearLR(start_factor 1, end_factor, total_iters = t_max)
//   warmup N:  LinearLR(warmup_start_factor -> 1 over N steps) first, joined to the
//              schedule by SequentialLR(milestones=[N])
// A contract type: torch-free, defined here once. job.yaml's train.lr_schedule is this
// struct (common/jobspec); libddp publishes this same file as
// <ddp/contract/lr_schedule.h>, which <ddp/lr_schedule.h> includes with scheduled_lr(),
// the closed form both the built-in trainer and ddp::LrScheduler use.
#ifndef DDP_CONTRACT_LR_SCHEDULE_H_
#define DDP_CONTRACT_LR_SCHEDULE_H_

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

}  // namespace ddp

#endif  // DDP_CONTRACT_LR_SCHEDULE_H_
