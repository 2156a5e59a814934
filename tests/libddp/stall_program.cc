// A libddp program whose rank STALL_RANK hangs in its data path at step STALL_STEP, run
// as a command job by diagnosis_test: each step's batch is "read" inside a
// ddp::StepPhase(kData) scope, and that rank, at that step, reads FIFO there, which
// blocks until the test opens it for writing and then until it writes or closes (a data
// source that stopped answering: a hung network mount). The others go on into the
// step's all-reduce and wait there. Every rank reports every step.
//
//   stall_program STEPS STALL_RANK STALL_STEP FIFO
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>

#include <ddp/ddp.h>

int main(int argc, char** argv) {
  if (argc != 5) {
    std::cerr << "usage: stall_program STEPS STALL_RANK STALL_STEP FIFO\n";
    return 2;
  }
  const int64_t steps = std::atoll(argv[1]);
  const int stall_rank = std::atoi(argv[2]);
  const int64_t stall_step = std::atoll(argv[3]);
  const std::string fifo = argv[4];
  try {
    torch::set_num_threads(1);
    auto group = ddp::init_process_group();
    torch::manual_seed(5);
    torch::nn::Sequential net(torch::nn::Linear(16, 32), torch::nn::ReLU(),
                              torch::nn::Linear(32, 4));
    ddp::DistributedDataParallel model(net, group);
    torch::optim::SGD opt(model.module()->parameters(), torch::optim::SGDOptions(0.05));
    ddp::Reporter report;
    const int rank = group->rank();
    for (int64_t step = 0; step < steps; ++step) {
      torch::Tensor x, y;
      {
        ddp::StepPhase loading(*group, ddp::StepPhase::kData);
        if (rank == stall_rank && step == stall_step) {
          std::cout << "STALL rank " << rank << " reads " << fifo << " at step " << step
                    << std::endl;
          std::ifstream in(fifo);
          std::string line;
          std::getline(in, line);
        }
        at::Generator gen =
            at::detail::createCPUGenerator(static_cast<uint64_t>(step * 1000 + rank));
        x = torch::randn({32, 16}, gen);
        y = x.narrow(1, 0, 4).argmax(1);
      }
      opt.zero_grad();
      torch::Tensor loss = torch::nn::functional::cross_entropy(model(x), y);
      loss.backward();
      opt.step();
      ddp::StepReport r;
      r.loss = loss.item<double>();
      r.step = step;
      r.global_step = step;
      report.step(r);
    }
    group->barrier();
  } catch (const ddp::Error& e) {
    std::cerr << e.what() << "\n";
    return e.exit_code();
  }
  return 0;
}
