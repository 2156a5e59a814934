// A user's LibTorch program on libddp's public API only (<ddp/ddp.h>): the setup of
// parity_reference.py, whose PyTorch DDP losses it must reproduce. Run one process per
// rank with torchrun's environment; each step's loss goes out through ddp::Reporter.
//
//   parity_program [--checkpoint-dir D] [--stop-after-epoch E] [--collective-timeout-s S]
//
// With --checkpoint-dir it saves at the end of every epoch and resumes from the newest
// checkpoint at start; --stop-after-epoch E exits after epoch E's checkpoint, so a second
// run resumes where the first stopped.
#include <ddp/ddp.h>
#include <torch/torch.h>

#include <cstdlib>
#include <iostream>
#include <string>

#include "test_model.h"

namespace {

using ddp_test::kN;  // The model and data: test_model.h.
constexpr int64_t kBatch = 6, kAccum = 2, kEpochs = 3;

int Run(int argc, char** argv) {
  std::string ckpt_dir;
  int64_t stop_after = -1;
  ddp::ProcessGroupOptions options;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--checkpoint-dir") ckpt_dir = argv[i + 1];
    else if (flag == "--stop-after-epoch") stop_after = std::atoll(argv[i + 1]);
    else if (flag == "--collective-timeout-s") options.collective_timeout = std::chrono::seconds(std::atoll(argv[i + 1]));
  }
  torch::set_num_threads(1);
  auto group = ddp::init_process_group(options);
  auto [net, x_all, y_all] = ddp_test::SeededNetAndData();

  ddp::DistributedDataParallel model(net, group);
  torch::optim::SGD opt(model.module()->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  ddp::DistributedSampler sampler(kN, *group, /*shuffle=*/true, /*seed=*/0);
  const int64_t micro = (sampler.size() + kBatch - 1) / kBatch;
  const int64_t steps = (micro + kAccum - 1) / kAccum;
  ddp::LrSchedule schedule;
  schedule.kind = ddp::LrSchedule::Kind::kCosine;
  schedule.warmup = 2;
  schedule.warmup_start_factor = 0.1;
  schedule.eta_min = 0.001;
  ddp::LrScheduler sched(opt, schedule, steps * kEpochs);

  std::unique_ptr<ddp::Checkpointer> ckpt;
  ddp::Position pos;
  if (!ckpt_dir.empty()) {
    ckpt = std::make_unique<ddp::Checkpointer>(group, ddp::CheckpointOptions{ckpt_dir});
    if (auto loaded = ckpt->load(*model.module(), opt)) pos = *loaded;
    sched.set_count(pos.global_step);
  }
  ddp::Reporter report;
  for (int64_t epoch = pos.epoch; epoch < kEpochs; ++epoch) {
    sampler.set_epoch(epoch);
    const std::vector<int64_t> order = sampler.indices();
    model.train();
    for (int64_t step = 0; step < steps; ++step) {
      const int64_t first = step * kAccum;
      const int64_t n = std::min(kAccum, micro - first);
      double total = 0;
      for (int64_t j = 0; j < n; ++j) {
        const int64_t begin = (first + j) * kBatch;
        const int64_t end = std::min<int64_t>(begin + kBatch, static_cast<int64_t>(order.size()));
        torch::Tensor idx = torch::tensor(std::vector<int64_t>(order.begin() + begin,
                                                               order.begin() + end));
        auto no_sync = j < n - 1 ? std::optional(model.no_sync()) : std::nullopt;
        torch::Tensor loss = torch::nn::functional::cross_entropy(model(x_all.index_select(0, idx)),
                                                                  y_all.index_select(0, idx));
        (loss / static_cast<double>(n)).backward();
        total += loss.item<double>();
      }
      ddp::clip_grad_norm(model.module()->parameters(), 1.0);
      const double lr = sched.lr();
      opt.step();
      sched.step();
      opt.zero_grad();
      ddp::StepReport r;
      r.loss = total / static_cast<double>(n);
      r.epoch = epoch;
      r.step = step;
      r.steps = steps;
      r.global_step = epoch * steps + step;
      r.lr = lr;
      r.comm_ms = model.last_backward().comm_wait_ms;
      report.step(r);
    }
    model.eval();
    {
      torch::NoGradGuard no_grad;
      ddp::EpochReport e;
      e.epoch = epoch;
      e.val_loss = torch::nn::functional::cross_entropy(model(x_all), y_all).item<double>();
      report.epoch(e);
    }
    if (ckpt != nullptr) {
      const std::string path = ckpt->save(*model.module(), opt, {epoch + 1, 0, (epoch + 1) * steps});
      if (!path.empty()) report.checkpoint(path, epoch + 1, 0, (epoch + 1) * steps);
      if (epoch == stop_after) return 0;
    }
  }
  report.done(kEpochs, kEpochs * steps);
  group->barrier();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return Run(argc, argv);
  } catch (const ddp::Error& e) {
    std::cerr << "parity_program: " << e.what() << "\n";
    return e.exit_code();
  }
}
