#include "worker/trainer/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace ddp {

double ScheduledLr(const LrScheduleSpec& s, double base_lr, int64_t count, int64_t total) {
  using Kind = LrScheduleSpec::Kind;
  if (s.kind == Kind::kConstant && s.warmup == 0) return base_lr;
  count = std::max<int64_t>(0, count);
  if (count < s.warmup) {  // LinearLR(warmup_start_factor, 1.0, total_iters=warmup)
    return base_lr * (s.warmup_start_factor + (1.0 - s.warmup_start_factor) *
                                                  static_cast<double>(count) /
                                                  static_cast<double>(s.warmup));
  }
  const int64_t j = count - s.warmup;  // The main schedule's own count.
  const int64_t t_max = s.t_max > 0 ? s.t_max : std::max<int64_t>(1, total - s.warmup);
  switch (s.kind) {
    case Kind::kConstant:
      return base_lr;
    case Kind::kStep:  // StepLR: gamma ** (count // step_size)
      return base_lr * std::pow(s.gamma, static_cast<double>(j / s.step_size));
    case Kind::kCosine: {  // CosineAnnealingLR's closed form (periodic past T_max, as PyTorch's)
      const double pi = std::acos(-1.0);
      return s.eta_min + (base_lr - s.eta_min) *
                             (1.0 + std::cos(pi * static_cast<double>(j) /
                                             static_cast<double>(t_max))) /
                             2.0;
    }
    case Kind::kLinear:  // LinearLR(1.0, end_factor, total_iters=t_max)
      return base_lr * (1.0 + (s.end_factor - 1.0) * static_cast<double>(std::min(j, t_max)) /
                                  static_cast<double>(t_max));
  }
  return base_lr;
}

int64_t ScheduleIntervals(const LrScheduleSpec& s, int64_t epochs, int64_t steps_per_epoch,
                          int64_t max_steps) {
  if (s.interval == LrScheduleSpec::Interval::kEpoch) return epochs;
  const int64_t steps = epochs * steps_per_epoch;
  return max_steps > 0 ? std::min(steps, max_steps) : steps;
}

}  // namespace ddp
