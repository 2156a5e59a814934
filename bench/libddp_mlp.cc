// ddp-bench-libddp-mlp: bench/jobs/mlp85k.yaml's training written as a user's program on
// libddp's public API (64-256-256-10 MLP, Adam 1e-3, batch 32 per rank, 16,384
// synthetic samples, one intra-op thread): the "library over the built-in trainer"
// side of bench/libddp_bench.py. One rank per process (torchrun's environment); each
// rank prints {"samples":..., "train_s":...} for its training loop, as ddp-trainer's
// done event times it.
#include <ddp/ddp.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <iostream>

int main(int argc, char** argv) {
  try {
    const int64_t epochs = argc > 1 ? std::atoll(argv[1]) : 3;
    torch::set_num_threads(1);
    auto group = ddp::init_process_group();
    torch::manual_seed(0);
    const torch::Tensor x = torch::randn({16384, 64});
    const torch::Tensor y = torch::randint(0, 10, {16384});
    torch::nn::Sequential net(torch::nn::Flatten(), torch::nn::Linear(64, 256), torch::nn::ReLU(),
                              torch::nn::Linear(256, 256), torch::nn::ReLU(),
                              torch::nn::Linear(256, 10));
    ddp::DistributedDataParallel model(net, group);
    torch::optim::Adam opt(model.module()->parameters(), torch::optim::AdamOptions(1e-3));
    const std::vector<torch::Tensor> params = model.module()->parameters();
    ddp::DistributedSampler sampler(x.size(0), *group);
    double train_s = 0;
    int64_t samples = 0;
    for (int64_t epoch = 0; epoch < epochs; ++epoch) {
      sampler.set_epoch(epoch);
      const std::vector<int64_t> order = sampler.indices();
      const torch::Tensor all = torch::tensor(order);
      for (int64_t begin = 0; begin < static_cast<int64_t>(order.size()); begin += 32) {
        const auto t0 = std::chrono::steady_clock::now();
        const torch::Tensor idx = all.slice(0, begin, begin + 32);
        torch::Tensor loss = torch::nn::functional::cross_entropy(
            model(x.index_select(0, idx)), y.index_select(0, idx));
        loss.backward();
        (void)loss.item<double>();
        opt.step();
        for (torch::Tensor p : params) p.mutable_grad().reset();  // zero_grad(set_to_none)
        train_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        samples += idx.size(0);
      }
    }
    std::printf("{\"samples\":%lld,\"train_s\":%.6f}\n", static_cast<long long>(samples), train_s);
    group->barrier();
    return 0;
  } catch (const ddp::Error& e) {
    std::cerr << "ddp-bench-libddp-mlp: " << e.what() << "\n";
    return e.exit_code();
  }
}
