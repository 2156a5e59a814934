// ddp-bench-comm-hooks: bench/jobs/mlp85k.yaml's model (64-256-256-10 MLP, Adam 1e-3,
// batch 32 per rank, one intra-op thread) on libddp's public API with a communication
// hook: none, fp16 (fp16_compress_hook) or powersgd (powerSGD_hook, rank 1, plain
// all-reduce for the first 10 iterations). bench/comm_hooks.py runs it beside PyTorch's
// DDP with the same hook (bench/comm_hooks_pytorch.py). One rank per process
// (torchrun's environment); each prints {"steps", "step_ms" (median), "bytes" (per step,
// after the first 10)}.
#include <ddp/ddp.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  try {
    const std::string hook = argc > 1 ? argv[1] : "none";
    const int64_t steps = argc > 2 ? std::atoll(argv[2]) : 300;
    torch::set_num_threads(1);
    auto group = ddp::init_process_group();
    torch::manual_seed(0);
    const torch::Tensor x = torch::randn({16384, 64});
    const torch::Tensor y = torch::randint(0, 10, {16384});
    torch::nn::Sequential net(torch::nn::Linear(64, 256), torch::nn::ReLU(),
                              torch::nn::Linear(256, 256), torch::nn::ReLU(),
                              torch::nn::Linear(256, 10));
    ddp::DistributedDataParallel model(net, group);
    if (hook == "fp16") {
      model.register_comm_hook(group, ddp::hooks::fp16_compress_hook);
    } else if (hook == "powersgd") {
      ddp::hooks::PowerSGDOptions o;
      o.matrix_approximation_rank = 1;
      o.start_powerSGD_iter = 10;
      model.register_comm_hook(std::make_shared<ddp::hooks::PowerSGDState>(group, o),
                               ddp::hooks::powerSGD_hook);
    }
    torch::optim::Adam opt(model.module()->parameters(), torch::optim::AdamOptions(1e-3));
    const std::vector<torch::Tensor> params = model.module()->parameters();
    ddp::DistributedSampler sampler(x.size(0), *group);
    const torch::Tensor all = torch::tensor(sampler.indices());
    std::vector<double> ms;
    int64_t bytes = 0;
    for (int64_t step = 0; step < steps; ++step) {
      const int64_t begin = (step * 32) % (all.size(0) - 32);
      const auto t0 = std::chrono::steady_clock::now();
      const torch::Tensor idx = all.slice(0, begin, begin + 32);
      torch::Tensor loss = torch::nn::functional::cross_entropy(model(x.index_select(0, idx)),
                                                                y.index_select(0, idx));
      loss.backward();
      (void)loss.item<double>();
      opt.step();
      for (torch::Tensor p : params) p.mutable_grad().reset();
      if (step >= 10) {
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
        bytes = model.last_backward().allreduce_bytes;
      }
    }
    std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
    std::printf("{\"steps\":%lld,\"step_ms\":%.4f,\"bytes\":%lld}\n", static_cast<long long>(steps),
                ms[ms.size() / 2], static_cast<long long>(bytes));
    group->barrier();
    return 0;
  } catch (const ddp::Error& e) {
    std::cerr << "ddp-bench-comm-hooks: " << e.what() << "\n";
    return e.exit_code();
  }
}
