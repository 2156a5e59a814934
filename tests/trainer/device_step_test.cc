// The trainer's whole-step device path (trainer/device_step.h) run eagerly on the CPU,
// against the trainer's original step written out here: the same losses, epoch total and
// parameters bit for bit, with gradient accumulation, clipping, a changing learning rate
// from the device table and a short last step. (Its CUDA-graph capture is held to this same
// eager path on a GPU, by bench/gpu/parity.py and libddp_cuda_test.) And the reasons a job's
// step stays out of a graph, one per cause.
#include "trainer/device_step.h"

#include <torch/nn.h>
#include <torch/types.h>  // clip_grad.h (1.13) uses torch::Tensor without including it.
#include <torch/nn/utils/clip_grad.h>
#include <torch/version.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "ddp/fused_optimizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libddp/src/api_bridge.h"
#include "tests/common/ports.h"

namespace ddp {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;

// An 8-16-3 MLP whose parameters come from a formula (no generator).
class Mlp : public Model {
 public:
  Mlp() : net_(torch::nn::Linear(8, 16), torch::nn::Tanh(), torch::nn::Linear(16, 3)) {
    torch::NoGradGuard no_grad;
    int i = 0;
    for (auto& p : net_->parameters()) {
      p.copy_(at::linspace(-0.5, 0.5, p.numel()).reshape(p.sizes()) * (1 + i++ % 3));
    }
  }
  at::Tensor Forward(const at::Tensor& x) override { return net_->forward(x); }
  void SetTraining(bool training) override { net_->train(training); }
  std::vector<NamedTensor> Parameters() override {
    std::vector<NamedTensor> out;
    for (const auto& item : net_->named_parameters()) out.emplace_back(item.key(), item.value());
    return out;
  }
  std::vector<NamedTensor> Buffers() override { return {}; }
  void To(const at::Device& device) override { net_->to(device); }
  std::string Describe() override { return "mlp 8-16-3"; }

 private:
  torch::nn::Sequential net_;
};

double LrOf(int64_t step) { return 0.01 * (1 + std::cos(0.3 * static_cast<double>(step))) / 2; }

struct Setup {
  std::shared_ptr<ProcessGroup> group;
  Mlp model;
  std::unique_ptr<DataParallel> ddp;
  std::vector<at::Tensor> params;
  std::unique_ptr<FusedAdamW> opt;
};

std::unique_ptr<Setup> MakeSetup() {
  auto s = std::make_unique<Setup>();
  Environment env;
  env.master_addr = "127.0.0.1";
  env.master_port = *::ddp::testing::ClaimPort();
  env.job_id = "device-step-test";
  s->group = *ProcessGroup::Impl::Create(env, DeviceChoice{at::kCPU, "gloo"}, CommOptions{});
  s->ddp = *DataParallel::Impl::Create(s->model.Parameters(), {}, s->group, DdpOptions{}, nullptr);
  for (auto& [name, p] : s->model.Parameters()) s->params.push_back(p);
  s->opt = std::make_unique<FusedAdamW>(s->params,
                                        torch::optim::AdamWOptions(0.01).weight_decay(0.1));
  return s;
}

// Step k's micro-batches: two of 4 rows, the last step one of 4 and one of 3.
std::vector<std::pair<at::Tensor, at::Tensor>> Micro(int64_t k, bool last) {
  const at::Tensor x = at::linspace(-2.0, 2.0, 64 * 8).reshape({64, 8}).sin();
  const at::Tensor y = at::arange(64).remainder(3);
  std::vector<std::pair<at::Tensor, at::Tensor>> out;
  for (int64_t j = 0; j < 2; ++j) {
    const int64_t n = last && j == 1 ? 3 : 4;
    const at::Tensor rows = at::arange(8 * k + 4 * j, 8 * k + 4 * j + n).remainder(64);
    out.emplace_back(x.index_select(0, rows), y.index_select(0, rows));
  }
  return out;
}

TEST(DeviceStepTest, EagerOnTheCpuEqualsTheTrainersOwnStepBitForBit) {
#if TORCH_VERSION_MAJOR < 2
  GTEST_SKIP() << "LibTorch 1.13 has no fused optimizer kernels (the device step's optimizer)";
#endif
  TrainSpec train;
  train.batch_size = 4;
  train.grad_accum_steps = 2;
  train.clip_grad_norm = 0.5;
  const int64_t steps = 7;

  // The device step (capture off: the CPU).
  auto ours = MakeSetup();
  DeviceStep::Parts parts;
  parts.model = &ours->model;
  parts.ddp = ours->ddp.get();
  parts.optimizer = ours->opt.get();
  parts.set_lr_tensor = [&](const at::Tensor& lr) { ours->opt->set_lr_tensor(lr); };
  parts.lr_dtype = at::kDouble;
  parts.params = ours->params;
  parts.loss = [](const at::Tensor& out, const at::Tensor& y) { return at::cross_entropy_loss(out, y); };
  // An epoch of 4 steps, then the next: the table's entries follow the epochs.
  DeviceStep step(parts, train, at::kCPU,
                  [](int64_t epoch, int64_t g) { return LrOf(g) + 1e-3 * epoch; },
                  /*steps_per_epoch=*/4, /*capture=*/false, /*required=*/false);
  std::vector<double> losses;
  for (int64_t k = 0; k < steps; ++k) {
    ASSERT_TRUE(step.Take(k / 4, k % 4, k, Micro(k, k + 1 == steps)).ok());
    auto loss = step.LastLoss();
    ASSERT_TRUE(loss.ok()) << loss.status();
    losses.push_back(*loss);
  }
  auto epoch_total = step.EpochLossSum();
  ASSERT_TRUE(epoch_total.ok());
  EXPECT_FALSE(step.captured());

  // The trainer's original step (TakeStep), written out.
  auto ref = MakeSetup();
  double total = 0;
  for (int64_t k = 0; k < steps; ++k) {
    double loss_sum = 0;
    const auto micro = Micro(k, k + 1 == steps);
    for (size_t j = 0; j < micro.size(); ++j) {
      std::optional<DataParallel::NoSync> no_sync;
      if (j + 1 != micro.size()) no_sync.emplace(ref->ddp->no_sync());
      ASSERT_TRUE(ref->ddp->impl().PrepareForward().ok());
      at::Tensor l = at::cross_entropy_loss(ref->model.Forward(micro[j].first), micro[j].second);
      (l / static_cast<double>(micro.size())).backward();
      loss_sum += l.item<double>();
    }
    torch::nn::utils::clip_grad_norm_(ref->params, train.clip_grad_norm);
    for (auto& g : ref->opt->param_groups()) g.options().set_lr(LrOf(k) + 1e-3 * (k / 4));
    ref->opt->step();
    for (at::Tensor& p : ref->params) p.mutable_grad().reset();
    const double loss = loss_sum / static_cast<double>(micro.size());
    EXPECT_EQ(losses[static_cast<size_t>(k)], loss) << "step " << k;
    total += loss;
  }
  EXPECT_EQ(*epoch_total, total);
  for (size_t i = 0; i < ours->params.size(); ++i) {
    EXPECT_TRUE(at::equal(ours->params[i], ref->params[i])) << "parameter " << i;
  }
  step.SetEpochLossSum(1.5);
  EXPECT_EQ(*step.EpochLossSum(), 1.5);
}

TEST(CudaGraphBlockersTest, NameEveryCauseAndNoneForACapturableJob) {
  JobSpec spec;
  const DeviceChoice gpu{at::Device(at::kCUDA, 0), "nccl"};
  std::vector<std::string> why = CudaGraphBlockers(spec, gpu, /*optimizer_fused=*/true);
  if (CudaGraphsBuilt()) {
    EXPECT_THAT(why, IsEmpty());
  } else {
    ASSERT_EQ(why.size(), 1u);
    EXPECT_THAT(why[0], HasSubstr("no CUDA graphs"));
  }
  const size_t base = why.size();
  auto one_more = [&](const JobSpec& s, const DeviceChoice& d, bool fused, const char* what) {
    const std::vector<std::string> w = CudaGraphBlockers(s, d, fused);
    ASSERT_EQ(w.size(), base + 1) << what;
    EXPECT_THAT(w.back(), HasSubstr(what));
  };
  one_more(spec, DeviceChoice{at::kCPU, "gloo"}, true, "graphs capture GPU work");
  one_more(spec, DeviceChoice{at::Device(at::kCUDA, 0), "gloo"}, true, "backend gloo");
  one_more(spec, gpu, false, "train.optimizer: not fused");
  JobSpec hook = spec;
  hook.train.comm_hook = CommHookKind::kFp16;
  one_more(hook, gpu, true, "train.comm_hook");
  JobSpec zero = spec;
  zero.train.optimizer.zero_redundancy = true;
  one_more(zero, gpu, true, "train.optimizer.zero_redundancy");
  JobSpec trace = spec;
  trace.metrics.trace_buckets = true;
  one_more(trace, gpu, true, "metrics.trace_buckets");
}

}  // namespace
}  // namespace ddp
