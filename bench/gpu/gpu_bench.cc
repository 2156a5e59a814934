// ddp-bench-gpu: the libddp side of bench/gpu/bench.py, written as a user's program on the
// public API (linked against libddp.so). One rank per process (torchrun's environment).
//
//   ddp-bench-gpu --model M.pt --features F --classes C --batch B --steps N --warmup W
//                 --backend nccl|gloo --device cuda|cpu [--samples S] [--loss-every K]
//                 [--cuda-graph off|on]
//
// Trains the TorchScript module M (bench/gpu/models.py writes it; PyTorch's side trains
// the same architecture) with SGD (lr 0.01, momentum 0.9) on S synthetic samples held on
// the CPU, each batch copied to the device as a DataLoader's would be, and prints one
// JSON line: {"rank", "samples", "train_s", "backend", "device", "cuda_graph"}, the
// training loop's samples and seconds over the steps after the first W (the GPU
// synchronized at both ends; loss.item() every K steps, as the other sides read it).
// --cuda-graph on: the whole step (forward, backward, the fused SGD) in a CUDA graph
// (ddp::GraphedStep, <ddp/cuda_graph.h>) after 3 eager steps; "cuda_graph" says what it
// did ("on: captured after 3 eager steps", or "off: why").
#include <ddp/ddp.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>

namespace {

std::map<std::string, std::string> Args(int argc, char** argv) {
  std::map<std::string, std::string> a;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k.rfind("--", 0) != 0) throw std::invalid_argument("expected --flag value, got " + k);
    a[k.substr(2)] = argv[i + 1];
  }
  return a;
}

int64_t Int(const std::map<std::string, std::string>& a, const std::string& k, int64_t def) {
  auto it = a.find(k);
  return it == a.end() ? def : std::stoll(it->second);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const auto a = Args(argc, argv);
    if (!a.count("model")) throw std::invalid_argument("--model is required");
    const int64_t features = Int(a, "features", 64), classes = Int(a, "classes", 10);
    const int64_t batch = Int(a, "batch", 64), steps = Int(a, "steps", 50);
    const int64_t warmup = Int(a, "warmup", 10);
    torch::set_num_threads(1);
    ddp::ProcessGroupOptions o;
    o.backend = a.count("backend") ? a.at("backend") : "auto";
    o.device = a.count("device") ? a.at("device") : "auto";
    auto group = ddp::init_process_group(o);
    const int64_t world = group->world_size();
    const int64_t samples = Int(a, "samples", (warmup + steps) * batch * world);
    torch::manual_seed(0);
    const torch::Tensor x = torch::randn({samples, features});
    const torch::Tensor y = torch::randint(0, classes, {samples});

    const bool graphed = a.count("cuda-graph") && a.at("cuda-graph") == "on";
    const int64_t loss_every = std::max<int64_t>(1, Int(a, "loss-every", 1));
    // Before the model moves to the GPU: every step's work runs on this stream.
    std::optional<ddp::CudaStreamScope> stream;
    if (graphed) stream.emplace(group->device());
    torch::jit::Module module = torch::jit::load(a.at("model"));
    module.to(group->device());
    module.train();
    ddp::NamedTensors params, buffers;
    for (const auto& p : module.named_parameters()) params.emplace_back(p.name, p.value);
    for (const auto& b : module.named_buffers()) buffers.emplace_back(b.name, b.value);
    ddp::DataParallel dp(params, buffers, group);
    std::vector<torch::Tensor> tensors;
    for (const auto& p : params) tensors.push_back(p.second);
    const auto sgd = torch::optim::SGDOptions(0.01).momentum(0.9);
    std::unique_ptr<torch::optim::Optimizer> opt;
    std::optional<ddp::DeviceLrSchedule> lr;
    if (graphed) {
      auto fused = std::make_unique<ddp::FusedSGD>(tensors, sgd);
      lr.emplace(ddp::LrSchedule{}, 0.01, warmup + steps, group->device(), torch::kFloat32);
      fused->set_lr_tensor(lr->lr());
      opt = std::move(fused);
    } else {
      opt = std::make_unique<torch::optim::SGD>(tensors, sgd);
    }
    auto train_step = [&](const std::vector<torch::Tensor>& in) {
      dp.prepare_forward();
      const torch::Tensor out = module.forward({in[0]}).toTensor();
      torch::Tensor loss = torch::nn::functional::cross_entropy(out, in[1]);
      for (torch::Tensor& p : tensors) p.mutable_grad().reset();  // zero_grad(set_to_none)
      loss.backward();
      if (lr) lr->advance();
      opt->step();
      return std::vector<torch::Tensor>{loss.detach()};
    };
    ddp::GraphedStepOptions go;
    go.capture = graphed;
    go.required = graphed;
    if (lr) go.lr = &*lr;
    ddp::GraphedStep graph(dp, train_step, go);
    const bool cuda = group->device().is_cuda();

    auto start = std::chrono::steady_clock::now();
    for (int64_t step = 0; step < warmup + steps; ++step) {
      if (step == warmup) {  // The clock starts with the GPU idle.
        if (cuda) torch::cuda::synchronize();
        start = std::chrono::steady_clock::now();
      }
      const int64_t begin = ((step * world + group->rank()) * batch) % (samples - batch + 1);
      const torch::Tensor xb = x.slice(0, begin, begin + batch);
      const torch::Tensor yb = y.slice(0, begin, begin + batch);
      torch::Tensor loss;
      if (graphed) {
        loss = graph({xb, yb})[0];
      } else {
        loss = train_step({xb.to(group->device()), yb.to(group->device())})[0];
      }
      if ((step + 1) % loss_every == 0 || step + 1 == warmup + steps) (void)loss.item<double>();
    }
    if (cuda) torch::cuda::synchronize();
    const double train_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const int64_t timed = steps * batch;
    const std::string graph_said =
        graphed ? (graph.captured() ? "on: " : "off: ") + graph.status() : "off: --cuda-graph off";
    std::printf("{\"rank\":%d,\"samples\":%lld,\"train_s\":%.6f,\"backend\":\"%s\",\"device\":\"%s\","
                "\"cuda_graph\":\"%s\"}\n",
                group->rank(), static_cast<long long>(timed), train_s, group->backend().c_str(),
                group->device().str().c_str(), graph_said.c_str());
    std::fflush(stdout);
    group->barrier();
    return 0;
  } catch (const ddp::Error& e) {
    std::cerr << "ddp-bench-gpu: " << e.what() << "\n";
    return e.exit_code();
  } catch (const std::exception& e) {
    std::cerr << "ddp-bench-gpu: " << e.what() << "\n";
    return 2;
  }
}
