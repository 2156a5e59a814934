// libddp on a GPU, through the public API (label gpu). Every test skips itself, saying
// so, where no CUDA GPU is visible (CPU machines, CPU-only LibTorch builds); on the GPU
// machine bench/gpu/run.sh runs them.
//
// The ranks are threads of this process, each with its own process group on one
// loopback TCPStore, so one GPU serves both ranks of a world of 2 (Gloo's CUDA path; NCCL
// refuses two ranks on one device). The CPU path over Gloo is the reference: the same
// model, parameters, data and steps must give the same losses within float tolerance.
#include <ddp/ddp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <torch/torch.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace {

using ::testing::HasSubstr;

#define REQUIRE_GPU()                                                          \
  if (!torch::cuda::is_available()) {                                          \
    GTEST_SKIP() << "no CUDA GPU visible to this process (or a CPU-only build)"; \
  }

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    close(fd);
    return -1;
  }
  close(fd);
  return ntohs(a.sin_port);
}

struct TrainRun {
  std::vector<double> losses;  // Mean over ranks, per step.
  std::string backend;
  at::Device device = at::kCPU;
  std::vector<std::string> errors;
};

// `world` ranks (threads) train a 8-16-3 MLP with SGD for `steps` steps, rank r on rows
// r, r + world, ... of fixed data. Parameters are set from a formula (no random
// generator: threads would race on it), and DDP broadcasts rank 0's anyway.
TrainRun Train(int world, const std::string& backend, const std::string& device, int steps) {
  const at::Tensor x = at::linspace(-2.0, 2.0, 64 * 8).reshape({64, 8}).sin();
  const at::Tensor y = at::arange(64).remainder(3);
  const int port = FreePort();
  TrainRun run;
  std::vector<std::vector<double>> losses(world);
  std::vector<std::string> errors(world);
  std::vector<std::string> backends(world);
  std::vector<at::Device> devices(world, at::kCPU);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        ddp::Environment env;
        env.rank = env.local_rank = r;
        env.world_size = env.local_world_size = world;
        env.master_addr = "127.0.0.1";
        env.master_port = port;
        env.node = "cuda-test";
        ddp::ProcessGroupOptions o;
        o.backend = backend;
        o.device = device;
        o.intra_node_comm = "gloo";  // The backend's own path, on either device.
        auto group = ddp::ProcessGroup::create(env, o);
        backends[r] = group->backend();
        devices[r] = group->device();
        torch::nn::Sequential net(torch::nn::Linear(8, 16), torch::nn::Tanh(),
                                  torch::nn::Linear(16, 3));
        {
          torch::NoGradGuard no_grad;
          int i = 0;
          for (auto& p : net->parameters()) {
            p.copy_(at::linspace(-0.5, 0.5, p.numel()).reshape(p.sizes()) * (1 + i++ % 3));
          }
        }
        ddp::DistributedDataParallel model(net, group);
        torch::optim::SGD opt(model.module()->parameters(), torch::optim::SGDOptions(0.1));
        for (int step = 0; step < steps; ++step) {
          const at::Tensor rows = at::arange(r, 64, world);
          const at::Tensor xb = x.index_select(0, rows).to(group->device());
          const at::Tensor yb = y.index_select(0, rows).to(group->device());
          at::Tensor loss = torch::nn::functional::cross_entropy(model(xb), yb);
          opt.zero_grad();
          loss.backward();
          opt.step();
          losses[r].push_back(group->sum({loss.item<double>()})[0] / world);
        }
        group->barrier();
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) {
    if (!errors[r].empty()) run.errors.push_back("rank " + std::to_string(r) + ": " + errors[r]);
  }
  run.losses = losses[0];
  run.backend = backends[0];
  run.device = devices[0];
  return run;
}

void ExpectSameLosses(const TrainRun& gpu, const TrainRun& cpu, int steps) {
  ASSERT_THAT(gpu.errors, ::testing::IsEmpty());
  ASSERT_THAT(cpu.errors, ::testing::IsEmpty());
  ASSERT_EQ(gpu.losses.size(), static_cast<size_t>(steps));
  ASSERT_EQ(cpu.losses.size(), static_cast<size_t>(steps));
  for (int i = 0; i < steps; ++i) {
    EXPECT_NEAR(gpu.losses[i], cpu.losses[i], 1e-4 * std::max(1.0, std::abs(cpu.losses[i])))
        << "step " << i;
  }
  EXPECT_LT(cpu.losses.back(), cpu.losses.front()) << "the model did not learn";
}

TEST(CudaTest, AutoPicksNcclOnTheGpu) {
  REQUIRE_GPU();
  const TrainRun run = Train(1, "auto", "auto", 1);
  ASSERT_THAT(run.errors, ::testing::IsEmpty());
  EXPECT_EQ(run.backend, "nccl");
  EXPECT_TRUE(run.device.is_cuda()) << run.device;
}

TEST(CudaTest, NcclAtWorldOneTrainsAsTheCpuPathDoes) {
  REQUIRE_GPU();
  const TrainRun gpu = Train(1, "nccl", "cuda", 20);
  EXPECT_EQ(gpu.backend, "nccl");
  EXPECT_TRUE(gpu.device.is_cuda()) << gpu.device;
  ExpectSameLosses(gpu, Train(1, "gloo", "cpu", 20), 20);
}

TEST(CudaTest, TwoRanksShareOneGpuOverGloo) {
  REQUIRE_GPU();
  const TrainRun gpu = Train(2, "gloo", "cuda", 20);
  EXPECT_EQ(gpu.backend, "gloo");
  EXPECT_TRUE(gpu.device.is_cuda()) << gpu.device;
  ExpectSameLosses(gpu, Train(2, "gloo", "cpu", 20), 20);
}

TEST(CudaTest, TheCpuReferenceRunsEverywhere) {
  // The reference the GPU tests hold the GPU to, on this machine: two ranks learn, in
  // step, and a world of 2 equals a world of 1 on the same rows (DDP averages gradients).
  const TrainRun two = Train(2, "gloo", "cpu", 20);
  ASSERT_THAT(two.errors, ::testing::IsEmpty());
  EXPECT_EQ(two.backend, "gloo");
  EXPECT_TRUE(two.device.is_cpu());
  ASSERT_EQ(two.losses.size(), 20u);
  EXPECT_LT(two.losses.back(), two.losses.front());
  const TrainRun one = Train(1, "gloo", "cpu", 20);
  ASSERT_THAT(one.errors, ::testing::IsEmpty());
  for (int i = 0; i < 20; ++i) EXPECT_NEAR(two.losses[i], one.losses[i], 1e-5) << "step " << i;
}

TEST(CudaTest, WithoutAGpuCudaIsRefusedByName) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "a GPU is visible: the other tests cover it";
  const TrainRun run = Train(1, "gloo", "cuda", 1);
  ASSERT_EQ(run.errors.size(), 1u);
  EXPECT_THAT(run.errors[0], HasSubstr("on device cuda needs"));
}

}  // namespace
