#include "ddp/lr_scheduler.h"

#include <torch/types.h>  // clip_grad.h uses torch::Tensor without including it.
#include <torch/nn/utils/clip_grad.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "libddp/src/api_bridge.h"

namespace ddp {

double scheduled_lr(const LrSchedule& s, double base_lr, int64_t count, int64_t total) {
  using Kind = LrSchedule::Kind;
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

LrScheduler::LrScheduler(torch::optim::Optimizer& optimizer, LrSchedule schedule, int64_t total)
    : optimizer_(optimizer), schedule_(schedule), total_(total) {
  if (schedule.warmup < 0 || schedule.t_max < 0 || schedule.step_size < 1 ||
      !(schedule.warmup_start_factor > 0 && schedule.warmup_start_factor <= 1)) {
    ThrowIfError(absl::InvalidArgumentError(absl::StrCat(
        "LrSchedule: warmup (", schedule.warmup, ") and t_max (", schedule.t_max,
        ") must be >= 0, step_size (", schedule.step_size, ") >= 1 and warmup_start_factor (",
        schedule.warmup_start_factor, ") in (0, 1]")));
  }
  if (optimizer.param_groups().empty()) {
    ThrowIfError(absl::InvalidArgumentError("LrScheduler: the optimizer has no param group"));
  }
  for (auto& group : optimizer.param_groups()) base_lrs_.push_back(group.options().get_lr());
  Apply();
}

void LrScheduler::step() {
  ++count_;
  Apply();
}

void LrScheduler::set_count(int64_t count) {
  count_ = count;
  Apply();
}

double LrScheduler::lr() const { return optimizer_.param_groups()[0].options().get_lr(); }

void LrScheduler::Apply() {
  auto& groups = optimizer_.param_groups();
  for (size_t i = 0; i < groups.size() && i < base_lrs_.size(); ++i) {
    groups[i].options().set_lr(scheduled_lr(schedule_, base_lrs_[i], count_, total_));
  }
}

double clip_grad_norm(const std::vector<at::Tensor>& parameters, double max_norm) {
  return torch::nn::utils::clip_grad_norm_(parameters, max_norm);
}

}  // namespace ddp
