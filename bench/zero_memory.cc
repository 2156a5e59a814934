// bench/zero_memory.py's rank program: optimizer state bytes per rank with
// ddp::ZeroRedundancyOptimizer against the plain optimizer, on libddp's public API.
//
//   ddp-bench-zero-memory --optimizer zero|plain [--steps 20]
//
// A 784-1024-512-10 MLP (1,333,770 parameters, 5.3 MB of float32) under
// ddp::DistributedDataParallel with Adam (lr 1e-3), batch 32 per rank of random data,
// one intra-op thread. After the steps each rank prints one JSON line: the bytes of the
// tensors in its optimizer's state (for ZeRO its local optimizer's: Adam's exp_avg and
// exp_avg_sq of the parameters it owns), the parameters it owns, the process's peak RSS
// and the median step time after 3 warm-up steps.
#include <ddp/ddp.h>
#include <sys/resource.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <iostream>
#include <map>
#include <string>

int main(int argc, char** argv) {
  std::map<std::string, std::string> flags = {{"--optimizer", "zero"}, {"--steps", "20"}};
  for (int i = 1; i + 1 < argc; i += 2) flags[argv[i]] = argv[i + 1];
  const bool zero = flags["--optimizer"] == "zero";
  const int steps = std::stoi(flags["--steps"]);
  torch::set_num_threads(1);
  try {
    auto group = ddp::init_process_group();
    torch::manual_seed(0);
    torch::nn::Sequential net(torch::nn::Linear(784, 1024), torch::nn::ReLU(),
                              torch::nn::Linear(1024, 512), torch::nn::ReLU(),
                              torch::nn::Linear(512, 10));
    ddp::DistributedDataParallel model(net, group);
    std::unique_ptr<torch::optim::Optimizer> opt;
    torch::optim::Optimizer* local = nullptr;
    if (zero) {
      auto z = std::make_unique<ddp::ZeroRedundancyOptimizer>(model.module()->parameters(), group,
                                                              torch::optim::AdamOptions(1e-3));
      local = &z->local_optimizer();
      opt = std::move(z);
    } else {
      opt = std::make_unique<torch::optim::Adam>(model.module()->parameters(),
                                                 torch::optim::AdamOptions(1e-3));
      local = opt.get();
    }
    torch::manual_seed(1 + group->rank());
    std::vector<double> ms;
    for (int s = 0; s < steps; ++s) {
      torch::Tensor x = torch::randn({32, 784});
      torch::Tensor y = torch::randint(0, 10, {32});
      const auto t0 = std::chrono::steady_clock::now();
      torch::nn::functional::cross_entropy(model(x), y).backward();
      opt->step();
      opt->zero_grad();
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                       .count());
    }
    int64_t state_bytes = 0, owned = 0;
    for (const auto& group_params : local->param_groups()) {
      for (const auto& p : group_params.params()) owned += p.numel();
    }
    for (const auto& entry : local->state()) {
      const auto& s = static_cast<const torch::optim::AdamParamState&>(*entry.second);
      state_bytes += s.exp_avg().nbytes() + s.exp_avg_sq().nbytes();
      if (s.max_exp_avg_sq().defined()) state_bytes += s.max_exp_avg_sq().nbytes();
    }
    std::vector<double> timed(ms.begin() + std::min<size_t>(3, ms.size()), ms.end());
    std::sort(timed.begin(), timed.end());
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    std::cout << "{\"rank\": " << group->rank() << ", \"world\": " << group->world_size()
              << ", \"optimizer\": \"" << (zero ? "zero" : "plain") << "\", \"state_bytes\": "
              << state_bytes << ", \"owned_params\": " << owned
              << ", \"max_rss_kb\": " << usage.ru_maxrss
              << ", \"step_ms\": " << (timed.empty() ? 0.0 : timed[timed.size() / 2]) << "}"
              << std::endl;
    group->barrier();
  } catch (const ddp::Error& e) {
    std::cerr << "ddp-bench-zero-memory: " << e.what() << "\n";
    return e.exit_code();
  }
  return 0;
}
