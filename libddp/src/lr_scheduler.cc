#include "ddp/lr_scheduler.h"

#include <torch/types.h>  // clip_grad.h uses torch::Tensor without including it.
#include <torch/nn/utils/clip_grad.h>

#include "absl/strings/str_cat.h"
#include "libddp/src/internal.h"
#include "worker/trainer/lr_schedule.h"

namespace ddp {

double scheduled_lr(const LrSchedule& schedule, double base_lr, int64_t count, int64_t total) {
  return ScheduledLr(schedule, base_lr, count, total);
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
    groups[i].options().set_lr(ScheduledLr(schedule_, base_lrs_[i], count_, total_));
  }
}

double clip_grad_norm(const std::vector<at::Tensor>& parameters, double max_norm) {
  return torch::nn::utils::clip_grad_norm_(parameters, max_norm);
}

}  // namespace ddp
