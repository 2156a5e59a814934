// A small residual CNN on Fashion-MNIST, trained data-parallel with libddp.
//
// An ordinary LibTorch program: its own model class, its own data reader, its own loop.
// libddp adds the process group (from torchrun's environment), DistributedDataParallel,
// the exact DistributedSampler (feeding LibTorch's data loader), a warm-up + cosine
// schedule, rank-0 checkpoints that a restart resumes, and live metrics for `ddpctl
// watch`. Run it as a ddp command job (job.yaml here) or by hand with torchrun's
// variables set (README.md).
//
//   fashion_resnet --data DIR [--epochs 2] [--limit N] [--batch-size 64]
//                  [--checkpoint-dir D] [--threads T] [--workers 1]
#include <ddp/ddp.h>
#include <torch/torch.h>
#include <zlib.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

namespace {

// ---- The model: conv stem, two residual stages, global pooling, a linear head. ----

struct ResidualBlockImpl : torch::nn::Module {
  ResidualBlockImpl(int64_t in, int64_t out, int64_t stride)
      : conv1(torch::nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false)),
        bn1(out),
        conv2(torch::nn::Conv2dOptions(out, out, 3).padding(1).bias(false)),
        bn2(out) {
    register_module("conv1", conv1);
    register_module("bn1", bn1);
    register_module("conv2", conv2);
    register_module("bn2", bn2);
    if (stride != 1 || in != out) {
      shortcut = register_module(
          "shortcut", torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 1).stride(stride).bias(false)));
    }
  }
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor h = torch::relu(bn1(conv1(x)));
    h = bn2(conv2(h));
    return torch::relu(h + (shortcut ? shortcut(x) : x));
  }
  torch::nn::Conv2d conv1;
  torch::nn::BatchNorm2d bn1;
  torch::nn::Conv2d conv2;
  torch::nn::BatchNorm2d bn2;
  torch::nn::Conv2d shortcut{nullptr};
};
TORCH_MODULE(ResidualBlock);

struct ResNetImpl : torch::nn::Module {
  ResNetImpl()
      : stem(torch::nn::Conv2dOptions(1, 16, 3).padding(1).bias(false)),
        bn(16),
        stage1(16, 16, 1),
        stage2(16, 32, 2),
        head(32, 10) {
    register_module("stem", stem);
    register_module("bn", bn);
    register_module("stage1", stage1);
    register_module("stage2", stage2);
    register_module("head", head);
  }
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor h = torch::relu(bn(stem(x)));
    h = stage2(stage1(torch::max_pool2d(h, 2)));
    return head(h.mean({2, 3}));
  }
  torch::nn::Conv2d stem;
  torch::nn::BatchNorm2d bn;
  ResidualBlock stage1, stage2;
  torch::nn::Linear head;
};
TORCH_MODULE(ResNet);

// ---- Data: the IDX files Debian's dataset-fashion-mnist ships, gzipped. ----

std::vector<uint8_t> ReadGz(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) throw std::runtime_error("cannot open " + path);
  std::vector<uint8_t> out;
  uint8_t buf[1 << 16];
  for (int n; (n = gzread(f, buf, sizeof(buf))) > 0;) out.insert(out.end(), buf, buf + n);
  gzclose(f);
  return out;
}

// Images as [N, 1, 28, 28] floats normalized as torchvision's FashionMNIST examples do,
// labels as [N] int64; the first `limit` samples (0: all).
std::pair<torch::Tensor, torch::Tensor> LoadSplit(const std::string& dir, const std::string& split,
                                                  int64_t limit) {
  std::vector<uint8_t> images = ReadGz(dir + "/" + split + "-images-idx3-ubyte.gz");
  std::vector<uint8_t> labels = ReadGz(dir + "/" + split + "-labels-idx1-ubyte.gz");
  int64_t n = static_cast<int64_t>(labels.size()) - 8;
  if (n <= 0 || images.size() != 16 + static_cast<size_t>(n) * 784) {
    throw std::runtime_error(dir + ": not Fashion-MNIST IDX files");
  }
  if (limit > 0) n = std::min(n, limit);
  torch::Tensor x = torch::from_blob(images.data() + 16, {n, 1, 28, 28}, torch::kUInt8)
                        .to(torch::kFloat32)
                        .div_(255.0)
                        .sub_(0.2860)
                        .div_(0.3530);
  torch::Tensor y = torch::from_blob(labels.data() + 8, {n}, torch::kUInt8).to(torch::kInt64);
  return {x, y};
}

// The training split as a torch::data dataset whose batch for a list of indices is one
// index_select of the images and one of the labels (no per-sample tensors to stack).
struct FashionBatches : torch::data::datasets::BatchDataset<FashionBatches, torch::data::Example<>,
                                                            std::vector<size_t>> {
  FashionBatches(torch::Tensor images, torch::Tensor labels)
      : images(std::move(images)), labels(std::move(labels)) {}
  torch::data::Example<> get_batch(std::vector<size_t> indices) override {
    torch::Tensor idx = torch::tensor(std::vector<int64_t>(indices.begin(), indices.end()));
    return {images.index_select(0, idx), labels.index_select(0, idx)};
  }
  torch::optional<size_t> size() const override { return images.size(0); }
  torch::Tensor images, labels;
};

std::string Flag(int argc, char** argv, const std::string& name, const std::string& fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (argv[i] == name) return argv[i + 1];
  }
  return fallback;
}

int Train(int argc, char** argv) {
  const std::string data = Flag(argc, argv, "--data", "/usr/share/datasets/fashion-mnist");
  const int64_t epochs = std::stoll(Flag(argc, argv, "--epochs", "2"));
  const int64_t limit = std::stoll(Flag(argc, argv, "--limit", "0"));
  const int64_t batch = std::stoll(Flag(argc, argv, "--batch-size", "64"));
  const std::string ckpt_dir = Flag(argc, argv, "--checkpoint-dir", "");
  const int threads = std::stoi(Flag(argc, argv, "--threads", "0"));
  // Loader threads: they gather the next batches while the model trains on this one.
  const int64_t workers = std::stoll(Flag(argc, argv, "--workers", "1"));
  if (threads > 0) torch::set_num_threads(threads);

  auto group = ddp::init_process_group();  // torchrun's environment: RANK, WORLD_SIZE, ...
  torch::manual_seed(0);
  auto [x_train, y_train] = LoadSplit(data, "train", limit);
  auto [x_val, y_val] = LoadSplit(data, "t10k", limit > 0 ? limit / 4 : 0);

  ddp::DistributedDataParallel model(ResNet(), group);  // rank 0's weights everywhere
  torch::optim::SGD opt(model.module()->parameters(),
                        torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(5e-4));
  ddp::DistributedSampler sampler(x_train.size(0), *group, /*shuffle=*/true, /*seed=*/0);
  const int64_t steps = (sampler.size() + batch - 1) / batch;
  // The loader holds a copy of the sampler; set_epoch on this one reaches it.
  auto loader = torch::data::make_data_loader(
      FashionBatches(x_train, y_train), sampler,
      torch::data::DataLoaderOptions().batch_size(batch).workers(workers));
  ddp::LrSchedule schedule;
  schedule.kind = ddp::LrSchedule::Kind::kCosine;
  schedule.warmup = std::min<int64_t>(steps, 50);
  ddp::LrScheduler lr(opt, schedule, epochs * steps);

  std::optional<ddp::Checkpointer> ckpt;
  ddp::Position pos;
  if (!ckpt_dir.empty()) {
    ckpt.emplace(group, ddp::CheckpointOptions{ckpt_dir + "/{job_id}"});
    if (auto resumed = ckpt->load(*model.module(), opt)) pos = *resumed;
    lr.set_count(pos.global_step);
  }
  ddp::Reporter report;
  int64_t global_step = pos.global_step;
  for (int64_t epoch = pos.epoch; epoch < epochs; ++epoch) {
    sampler.set_epoch(epoch);  // Before the loop: the loader draws the epoch's order then.
    model.train();
    double loss_sum = 0;
    const auto epoch_start = std::chrono::steady_clock::now();
    auto t0 = epoch_start;  // A step's time includes waiting for its batch.
    int64_t step = 0;
    for (torch::data::Example<>& b : *loader) {
      torch::Tensor loss = torch::nn::functional::cross_entropy(model(b.data), b.target);
      opt.zero_grad();
      loss.backward();  // The gradients are averaged over all ranks when this returns.
      const double step_lr = lr.lr();
      opt.step();
      lr.step();
      ++global_step;
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      ddp::StepReport r;
      r.loss = loss.item<double>();
      r.epoch = epoch;
      r.step = step;
      r.steps = steps;
      r.global_step = global_step - 1;
      r.samples_per_s = b.target.size(0) / (ms / 1000.0);
      r.step_ms = ms;
      r.comm_ms = model.last_backward().comm_wait_ms;
      r.lr = step_lr;
      report.step(r);
      loss_sum += r.loss;
      ++step;
      t0 = std::chrono::steady_clock::now();
    }
    const double epoch_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_start).count();
    // Validation: each rank takes every world_size-th sample; the sums are all-reduced.
    model.eval();
    torch::NoGradGuard no_grad;
    torch::Tensor xs = x_val.slice(0, group->rank(), x_val.size(0), group->world_size());
    torch::Tensor ys = y_val.slice(0, group->rank(), y_val.size(0), group->world_size());
    torch::Tensor out = model(xs);
    const std::vector<double> sums = group->sum(
        {torch::nn::functional::cross_entropy(out, ys, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum)).item<double>(),
         out.argmax(1).eq(ys).sum().item<double>(), static_cast<double>(ys.size(0)), loss_sum,
         static_cast<double>(steps)});
    if (group->rank() == 0) {
      ddp::EpochReport e;
      e.epoch = epoch;
      e.train_loss = sums[3] / sums[4];
      e.val_loss = sums[0] / sums[2];
      e.val_accuracy = sums[1] / sums[2];
      report.epoch(e);
      std::cout << "epoch " << epoch << ": train_loss " << e.train_loss << ", val_loss "
                << e.val_loss << ", val_accuracy " << e.val_accuracy << ", " << epoch_s
                << " s" << std::endl;
    }
    if (ckpt) {
      const std::string path = ckpt->save(*model.module(), opt, {epoch + 1, 0, global_step});
      if (group->rank() == 0) report.checkpoint(path, epoch + 1, 0, global_step);
    }
  }
  report.done(epochs, global_step);
  group->barrier();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return Train(argc, argv);
  } catch (const ddp::Error& e) {  // Exit 1: ddp restarts the job; 2: it never will.
    std::cerr << "fashion_resnet: " << e.what() << std::endl;
    return e.exit_code();
  } catch (const std::exception& e) {
    std::cerr << "fashion_resnet: " << e.what() << std::endl;
    return 1;
  }
}
