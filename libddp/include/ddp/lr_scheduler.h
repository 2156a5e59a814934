// ddp::LrScheduler: drives a torch::optim optimizer's learning rate with an LrSchedule
// (lr_schedule.h), as torch.optim.lr_scheduler does in Python:
//
//   ddp::LrScheduler sched(opt, {ddp::LrSchedule::Kind::kCosine, ..., /*warmup=*/100}, total_steps);
//   for (...) { ...; opt.step(); sched.step(); }
//
// Construction sets every param group's lr to the schedule's first value (PyTorch's
// scheduler does the same); step() advances by one; set_count() after a resume.
#ifndef DDP_LR_SCHEDULER_H_
#define DDP_LR_SCHEDULER_H_

#include <torch/optim/optimizer.h>

#include <cstdint>
#include <vector>

#include "ddp/lr_schedule.h"

namespace ddp {

class LrScheduler {
 public:
  // `total`: scheduler steps in the whole run (used when t_max is 0). Each param
  // group's current lr is its base lr.
  LrScheduler(torch::optim::Optimizer& optimizer, LrSchedule schedule, int64_t total);
  void step();
  // Jump to `count` steps done (PyTorch's last_epoch), e.g. the global step resumed.
  void set_count(int64_t count);
  int64_t count() const { return count_; }
  // get_last_lr()[0].
  double lr() const;
  const std::vector<double>& base_lrs() const { return base_lrs_; }

 private:
  void Apply();
  torch::optim::Optimizer& optimizer_;
  LrSchedule schedule_;
  int64_t total_;
  int64_t count_ = 0;
  std::vector<double> base_lrs_;
};

// torch.nn.utils.clip_grad_norm_: scales the gradients of `parameters` so their total
// 2-norm is at most `max_norm`; returns the norm before clipping. Call it after
// backward() (the gradients are already averaged over ranks) and before the optimizer.
double clip_grad_norm(const std::vector<at::Tensor>& parameters, double max_norm);

}  // namespace ddp

#endif  // DDP_LR_SCHEDULER_H_
