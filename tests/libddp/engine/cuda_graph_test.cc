// The engine's CUDA-graph pieces (libddp/engine/cuda_graph.h). On the CPU (every build):
// the learning-rate table serves the host's schedule bit for bit across windows, resumes and
// skips; ClipGradNorm is LibTorch's clip_grad_norm_ bit for bit; StepGraph without capture
// runs the step eagerly on its static inputs, and other shapes on their own. On a GPU (label
// gpu; the GPU tests skip themselves elsewhere): a capture replays what it captured, reads
// the static inputs anew each replay, holds the schedule and an NCCL all-reduce, refuses
// the default stream, and names what broke a capture.
#include "libddp/engine/cuda_graph.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <torch/cuda.h>
#include <torch/types.h>  // clip_grad.h (1.13) uses torch::Tensor without including it.
#include <torch/nn/utils/clip_grad.h>
#include <torch/torch.h>
#include <torch/version.h>
#include <unistd.h>

#include <cmath>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libddp/engine/comm.h"

namespace ddp {
namespace {

using ::testing::HasSubstr;

#define REQUIRE_GPU()                                                                    \
  if (!CudaGraphsBuilt() || !torch::cuda::is_available()) {                              \
    GTEST_SKIP() << "no CUDA GPU visible to this process (or a build without CUDA graphs)"; \
  }

double Schedule(int64_t step) { return 1e-3 * std::cos(0.01 * static_cast<double>(step)) + 1e-5; }

TEST(LrTableTest, ServesTheScheduleAcrossWindowsResumesAndSkips) {
  LrTable table(Schedule, at::kCPU, at::kDouble, /*window=*/4);
  std::vector<int64_t> steps;
  for (int64_t s = 0; s < 11; ++s) steps.push_back(s);  // Three windows.
  steps.push_back(40);                                   // A resume elsewhere.
  steps.push_back(41);
  steps.push_back(7);                                    // And back.
  for (int64_t s : steps) {
    table.Prepare(s);
    table.Advance();
    EXPECT_EQ(table.lr().item<double>(), Schedule(s)) << "step " << s;
    table.Next();
  }
}

TEST(LrTableTest, AFloatTableRoundsAsAPythonFloatWould) {
  LrTable table(Schedule, at::kCPU, at::kFloat, /*window=*/8);
  table.Prepare(3);
  table.Advance();
  EXPECT_EQ(table.lr().item<float>(), static_cast<float>(Schedule(3)));
  EXPECT_EQ(table.lr().scalar_type(), at::kFloat);
}

std::vector<at::Tensor> ParamsWithGrads(double scale) {
  torch::manual_seed(7);
  std::vector<at::Tensor> params;
  for (const std::vector<int64_t>& shape :
       std::vector<std::vector<int64_t>>{{16, 8}, {16}, {3, 16}, {3}}) {
    at::Tensor p = torch::randn(shape).requires_grad_(true);
    p.mutable_grad() = torch::randn(shape) * scale;
    params.push_back(p);
  }
  return params;
}

TEST(ClipGradNormTest, IsLibTorchsClipGradNormBitForBitOnTheCpu) {
  for (double scale : {0.01, 1.0, 50.0}) {  // Below and above max_norm.
    std::vector<at::Tensor> ours = ParamsWithGrads(scale), theirs = ParamsWithGrads(scale);
    const at::Tensor norm = ClipGradNorm(ours, 1.0);
    const double expected = torch::nn::utils::clip_grad_norm_(theirs, 1.0);
    EXPECT_EQ(norm.item<double>(), expected) << scale;
    for (size_t i = 0; i < ours.size(); ++i) {
      EXPECT_TRUE(at::equal(ours[i].grad(), theirs[i].grad())) << "scale " << scale << " param " << i;
    }
  }
}

TEST(ClipGradNormTest, SkipsParametersWithoutAGradient) {
  std::vector<at::Tensor> params = ParamsWithGrads(10.0);
  params[1].mutable_grad().reset();
  const at::Tensor norm = ClipGradNorm(params, 1.0);
  EXPECT_FALSE(params[1].grad().defined());
  double total = 0;
  for (const at::Tensor& p : params) {
    if (p.grad().defined()) total += std::pow(p.grad().norm().item<double>(), 2);
  }
  EXPECT_NEAR(std::sqrt(total), 1.0, 1e-5);  // Clipped to max_norm.
  EXPECT_GT(norm.item<double>(), 1.0);
  for (at::Tensor& p : params) p.mutable_grad().reset();
  EXPECT_FALSE(ClipGradNorm(params, 1.0).defined());
}

TEST(StepGraphTest, WithoutCaptureRunsEagerlyOnTheStaticInputsAndOtherShapesOnTheirOwn) {
  std::vector<std::vector<int64_t>> seen;
  std::vector<const void*> storages;
  StepGraph step(
      [&](const std::vector<at::Tensor>& in) {
        seen.push_back(in[0].sizes().vec());
        storages.push_back(in[0].data_ptr());
        return std::vector<at::Tensor>{in[0].sum()};
      },
      at::kCPU, /*warmup=*/0, /*capture=*/false, /*required=*/false);
  auto out = step.Run({at::ones({4, 2})});
  ASSERT_TRUE(out.ok());
  EXPECT_EQ((*out)[0].item<double>(), 8.0);
  out = step.Run({at::full({4, 2}, 2.0)});
  ASSERT_TRUE(out.ok());
  EXPECT_EQ((*out)[0].item<double>(), 16.0);  // The new values, in the same buffer.
  EXPECT_EQ(storages[0], storages[1]);
  out = step.Run({at::ones({3, 2})});  // A short batch: eager, on its own tensor.
  ASSERT_TRUE(out.ok());
  EXPECT_EQ((*out)[0].item<double>(), 6.0);
  EXPECT_EQ(seen.back(), (std::vector<int64_t>{3, 2}));
  EXPECT_NE(storages.back(), storages[0]);
  // Not regular (the caller says so): eager on its own tensor even with the static shapes.
  out = step.Run({at::full({4, 2}, 3.0)}, /*regular=*/false);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ((*out)[0].item<double>(), 24.0);
  EXPECT_NE(storages.back(), storages[0]);
  out = step.Run({at::full({4, 2}, 0.5)});
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(storages.back(), storages[0]);  // Regular again: the static buffer.
  EXPECT_FALSE(step.captured());
  EXPECT_THAT(step.Describe(), HasSubstr("eager: capture is off"));
}

TEST(CudaGraphsTest, AreBuiltIntoEveryCudaLibTorch2Build) {
#if DDP_WITH_CUDA && TORCH_VERSION_MAJOR >= 2
  EXPECT_TRUE(CudaGraphsBuilt());  // The capture code is compiled and linked here.
#else
  EXPECT_FALSE(CudaGraphsBuilt());
#endif
}

TEST(CapturedGraphTest, WithoutAGpuCaptureIsRefused) {
  if (CudaGraphsBuilt() && torch::cuda::is_available()) GTEST_SKIP() << "a GPU is visible";
  auto graph = CapturedGraph::Capture(at::kCPU, [] {});
  EXPECT_FALSE(graph.ok());
  EXPECT_EQ(graph.status().code(), absl::StatusCode::kFailedPrecondition);
}

// ---------------------------------------------------------------------------------------
// On a GPU.

TEST(CapturedGraphTest, ReplaysWhatItCapturedOnTheStaticInputs) {
  REQUIRE_GPU();
  const at::Device gpu(at::kCUDA, 0);
  StreamScope stream(gpu);
  at::Tensor x = torch::zeros({1024}, torch::TensorOptions().device(gpu));
  at::Tensor y;
  auto graph = CapturedGraph::Capture(gpu, [&] { y = x * 2 + 1; });
  ASSERT_TRUE(graph.ok()) << graph.status();
  for (int i = 1; i <= 3; ++i) {
    x.fill_(static_cast<double>(i));
    (*graph)->Replay();
    EXPECT_TRUE(at::allclose(y.cpu(), torch::full({1024}, 2.0 * i + 1))) << "replay " << i;
  }
}

TEST(CapturedGraphTest, RefusesTheDefaultStream) {
  REQUIRE_GPU();
  auto graph = CapturedGraph::Capture(at::Device(at::kCUDA, 0), [] {});
  ASSERT_FALSE(graph.ok());
  EXPECT_THAT(std::string(graph.status().message()), HasSubstr("default stream"));
}

TEST(CapturedGraphTest, NamesWhatBrokeTheCaptureAndTheStreamWorksAfter) {
  REQUIRE_GPU();
  const at::Device gpu(at::kCUDA, 0);
  StreamScope stream(gpu);
  at::Tensor x = torch::ones({16}, torch::TensorOptions().device(gpu));
  auto graph = CapturedGraph::Capture(gpu, [&] { (void)x.sum().item<double>(); });
  ASSERT_FALSE(graph.ok());
  EXPECT_EQ(graph.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(graph.status().message()), HasSubstr("CUDA graph capture failed"));
  EXPECT_EQ((x * 3).sum().item<double>(), 48.0);
}

TEST(CapturedGraphTest, HoldsTheLearningRateScheduleAcrossWindows) {
  REQUIRE_GPU();
  const at::Device gpu(at::kCUDA, 0);
  StreamScope stream(gpu);
  LrTable table(Schedule, gpu, at::kDouble, /*window=*/4);
  at::Tensor seen = torch::zeros({}, torch::TensorOptions().device(gpu).dtype(at::kDouble));
  table.Prepare(0);
  auto graph = CapturedGraph::Capture(gpu, [&] {
    table.Advance();
    seen.copy_(table.lr());
  });
  ASSERT_TRUE(graph.ok()) << graph.status();
  for (int64_t s = 0; s < 10; ++s) {  // Replays cross two window refills.
    table.Prepare(s);
    (*graph)->Replay();
    EXPECT_EQ(seen.item<double>(), Schedule(s)) << "step " << s;
    table.Next();
  }
}

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  close(fd);
  return ok ? ntohs(a.sin_port) : -1;
}

TEST(CapturedGraphTest, HoldsAnNcclAllReduceAndReplaysIt) {
  REQUIRE_GPU();
  const at::Device gpu(at::kCUDA, 0);
  StreamScope stream(gpu);
  Environment env;
  env.rank = env.local_rank = 0;
  env.world_size = env.local_world_size = 1;
  env.master_addr = "127.0.0.1";
  env.master_port = FreePort();
  env.job_id = "cuda-graph-test";
  auto comm = Comm::Connect(env, DeviceChoice{gpu, "nccl"}, CommOptions{});
  ASSERT_TRUE(comm.ok()) << comm.status();
  at::Tensor t = torch::ones({4096}, torch::TensorOptions().device(gpu));
  auto allreduce = [&] {
    std::vector<at::Tensor> tensors = {t};
    c10d::AllreduceOptions o;
    o.reduceOp = c10d::ReduceOp::SUM;
    comm->backend().allreduce(tensors, o)->wait();  // Stream-ordered: the GPU waits.
  };
  allreduce();  // NCCL's communicator is made outside the capture, as the warm-up does.
  auto graph = CapturedGraph::Capture(gpu, [&] {
    t.mul_(2);
    allreduce();
    t.add_(1);
  });
  ASSERT_TRUE(graph.ok()) << graph.status();
  double expected = 1;
  for (int i = 0; i < 3; ++i) {
    (*graph)->Replay();
    expected = expected * 2 + 1;  // A world of one sums to itself.
    EXPECT_TRUE(at::allclose(t.cpu(), torch::full({4096}, expected))) << "replay " << i;
  }
}

}  // namespace
}  // namespace ddp
