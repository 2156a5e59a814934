// A libddp program with live recovery (ddp::LiveRecovery), run as a command job by
// recovery_test: an MLP on data made from the position alone (batch `step` of rank r
// is drawn from a generator seeded by both), its loop written over one tracked
// counter. At the end each rank prints its step count and an FNV-1a hash of its
// parameters: "LIVE-RESULT rank R steps N params HASH". Every 50 steps it asks whether
// ddp wants a checkpoint now (ddp::checkpoint_requested), and if so prints "NOTICE
// rank R at step N" and reports one; with NOTICE_DIR it also appends "N" to
// NOTICE_DIR/notice-rankR at once (a rank stopped right after its line may not have the
// line reach the job's log, and the test needs every rank's); rank 0 reports the
// checkpoint after a barrier, once every rank has written.
//
//   recovery_program [TOTAL_STEPS [NOTICE_DIR]]   (default 3000)
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <fstream>
#include <string>

#include <cstdio>
#include <cstdlib>
#include <iostream>

#include <ddp/ddp.h>

int main(int argc, char** argv) {
  const int64_t total = argc > 1 ? std::atoll(argv[1]) : 3000;
  const std::string notice_dir = argc > 2 ? argv[2] : "";
  try {
    torch::set_num_threads(1);
    auto group = ddp::init_process_group();
    torch::manual_seed(11);
    torch::nn::Sequential net(torch::nn::Linear(16, 32), torch::nn::ReLU(),
                              torch::nn::Linear(32, 4));
    ddp::DistributedDataParallel model(net, group);
    torch::optim::SGD opt(model.module()->parameters(),
                          torch::optim::SGDOptions(0.05).momentum(0.9));
    int64_t step = 0;
    ddp::LiveRecovery live(group, model.core());
    live.track(ddp::detail::Named(model.module()->named_parameters()));
    live.track(ddp::detail::Named(model.module()->named_buffers()));
    live.track(opt);
    live.track("step", &step);
    live.start();
    ddp::Reporter report;
    const int rank = group->rank();
    while (step < total) {
      const bool done = live.run([&] {
        at::Generator gen = at::detail::createCPUGenerator(
            static_cast<uint64_t>(step * 1000 + rank));
        torch::Tensor x = torch::randn({32, 16}, gen);
        torch::Tensor y = (x.narrow(1, 0, 4).argmax(1));
        opt.zero_grad();
        torch::Tensor loss = torch::nn::functional::cross_entropy(model(x), y);
        loss.backward();
        opt.step();
        if (step % 20 == 0) {
          ddp::StepReport r;
          r.loss = loss.item<double>();
          r.global_step = step;
          report.step(r);
        }
      });
      if (done) ++step;
      // The checkpoint-now notice, checked every 50 steps (collective): this program
      // keeps its "checkpoint" in memory, and reports it so that ddp moves the job.
      if (done && step % 50 == 0 && ddp::checkpoint_requested(*group)) {
        std::cout << "NOTICE rank " << rank << " at step " << step << std::endl;
        if (!notice_dir.empty()) {
          std::ofstream(notice_dir + "/notice-rank" + std::to_string(rank), std::ios::app)
              << step << "\n";
        }
        // The checkpoint is complete once every rank has done its part (a real save is
        // collective too): rank 0 reports it, and so lets ddp move the job, only then.
        // Without the barrier a fast rank 0 had the job preempted while a slow rank had
        // not yet written its file (seen on a loaded machine).
        group->barrier();
        if (rank == 0) report.checkpoint("in-memory", 0, step, step);
      }
    }
    std::cout << "LIVE-RESULT rank " << rank << " steps " << step << " params "
              << ddp::fingerprint(model.module()->parameters()) << " recoveries "
              << live.recoveries() << std::endl;
    group->barrier();
  } catch (const ddp::Error& e) {
    std::cerr << e.what() << "\n";
    return e.exit_code();
  }
  return 0;
}
