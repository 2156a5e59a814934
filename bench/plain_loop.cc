// ddp-bench-plain-loop: a job's training loop in plain LibTorch, with no reducer and
// no process group: the baseline for "DDP overhead at world 1" (bench/suite.py).
//
//   ddp-bench-plain-loop --spec job.yaml [--max-steps N]
//
// Same data, model, sampler order, batches, optimizer and threads as ddp-trainer at
// world 1; prints one JSON line {samples, steps, train_s} timed like ddp-trainer's
// `done` event (the training loop only).
#include <ATen/Parallel.h>
#include <torch/optim/optimizer.h>

#include <chrono>
#include <cstdio>
#include <iostream>

#include "common/flags.h"
#include "common/jobspec/job_spec.h"
#include "libddp/engine/optimizer.h"
#include "libddp/engine/sampler.h"
#include "trainer/dataset.h"
#include "trainer/model.h"

namespace {

at::Tensor Loss(ddp::LossKind kind, const at::Tensor& out, const at::Tensor& target) {
  switch (kind) {
    case ddp::LossKind::kCrossEntropy: return at::cross_entropy_loss(out, target);
    case ddp::LossKind::kMse: return at::mse_loss(out.reshape({-1}), target);
    case ddp::LossKind::kBceWithLogits:
      return at::binary_cross_entropy_with_logits(out.reshape({-1}), target);
  }
  return {};
}

int Fail(const absl::Status& st) {
  std::cerr << "ddp-bench-plain-loop: " << st.message() << "\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string spec_path;
  int64_t max_steps = 0;
  ddp::FlagSet flags("ddp-bench-plain-loop", "A job's training loop without DDP.");
  flags.String("spec", &spec_path, "job.yaml");
  flags.Int("max-steps", &max_steps, "stop after this many steps (0: train.max_steps)");
  auto rest = flags.Parse(argc, argv);
  if (!rest.ok()) return Fail(rest.status());
  auto spec = ddp::LoadJobSpecFile(spec_path);
  if (!spec.ok()) return Fail(spec.status());
  const ddp::TrainSpec& train = spec->train;
  if (max_steps == 0) max_steps = train.max_steps;
  at::set_num_threads(static_cast<int>(train.threads > 0 ? train.threads : 1));

  auto data = ddp::LoadData(spec->data, train.loss);
  if (!data.ok()) return Fail(data.status());
  at::manual_seed(static_cast<uint64_t>(train.seed));
  auto model = ddp::BuildModel(spec->model, *data, train.loss);
  if (!model.ok()) return Fail(model.status());
  std::vector<at::Tensor> params;
  for (auto& [name, p] : (*model)->Parameters()) params.push_back(p);
  auto optimizer = ddp::MakeOptimizer(train.optimizer, params);
  ddp::BatchAssembler batches(data->train, train.batch_size);
  ddp::SamplerOptions sampler{1, 0, train.shuffle, train.seed, false};
  (*model)->SetTraining(true);

  double train_s = 0;
  int64_t samples = 0, steps = 0;
  for (int64_t epoch = 0; epoch < train.epochs && (max_steps == 0 || steps < max_steps); ++epoch) {
    const std::vector<int64_t> order =
        ddp::DistributedSamplerIndices(data->train.size(), sampler, epoch);
    const int64_t micro = ddp::NumBatches(static_cast<int64_t>(order.size()), train.batch_size,
                                          train.drop_last);
    for (int64_t b = 0; b < micro && (max_steps == 0 || steps < max_steps); ++b) {
      const auto t0 = std::chrono::steady_clock::now();
      const int64_t begin = b * train.batch_size;
      const int64_t n = std::min<int64_t>(train.batch_size, static_cast<int64_t>(order.size()) - begin);
      auto [x, y] = batches.Gather(order.data() + begin, n);
      at::Tensor loss = Loss(train.loss, (*model)->Forward(x), y);
      loss.backward();
      (void)loss.item<double>();
      optimizer->step();
      for (at::Tensor& p : params) p.mutable_grad().reset();
      train_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      samples += n;
      ++steps;
    }
  }
  std::printf("{\"samples\":%lld,\"steps\":%lld,\"train_s\":%.6f}\n",
              static_cast<long long>(samples), static_cast<long long>(steps), train_s);
  return 0;
}
