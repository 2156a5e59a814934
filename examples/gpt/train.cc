// GPT-2 trained data-parallel with libddp: whole-step CUDA graphs, PyTorch's fused AdamW,
// bf16 autocast and flash attention, on a flat file of token ids (nanoGPT's format).
// A starting point for your own LibTorch language model (README.md beside this file).
//
//   torchrun --nproc_per_node=8 --no-python ./ddp_gpt --train train.bin --val val.bin
//   ddp_gpt --train F [--val F] [--dtype uint16|uint32] [--layers 12 --heads 12 --dim 768
//           --seq-len 1024 --vocab 50304] [--batch 16] [--steps 1000] [--warmup 10]
//           [--lr 6e-4] [--lr-warmup 100] [--precision bf16|fp32] [--cuda-graph auto|on|off]
//           [--device auto|cuda|cpu] [--backend auto|nccl|gloo] [--seed 0]
//
// It takes --warmup untimed steps, then --steps timed ones. Every rank prints one JSON line
// at the end: {"rank", "tokens", "train_s", "losses", "val_loss", "cuda_graph"}: the tokens
// of the timed steps and the seconds they took (the GPU synchronized at both ends), every
// step's loss, and what
// the graph did ("captured after 3 eager steps", or "eager: why"). Rank 0 also reports
// each step to `ddpctl watch` when run as a ddp command job (DDP_EVENTS_FD).
#include <ddp/ddp.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

std::map<std::string, std::string> ParseArgs(int argc, char** argv) {
  std::map<std::string, std::string> a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k.rfind("--", 0) != 0 || i + 1 >= argc) {
      throw std::invalid_argument("expected --flag value, got '" + k + "'");
    }
    a[k.substr(2)] = argv[++i];
  }
  return a;
}

struct Args {
  std::map<std::string, std::string> a;
  std::string Str(const std::string& k, const std::string& def) const {
    auto it = a.find(k);
    return it == a.end() ? def : it->second;
  }
  int64_t Int(const std::string& k, int64_t def) const {
    auto it = a.find(k);
    return it == a.end() ? def : std::stoll(it->second);
  }
  double Num(const std::string& k, double def) const {
    auto it = a.find(k);
    return it == a.end() ? def : std::stod(it->second);
  }
};

// A flat little-endian file of token ids, as a 1-D int64 tensor on the CPU.
at::Tensor ReadTokens(const std::string& path, const std::string& dtype, int64_t vocab) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw std::runtime_error("cannot read token file " + path);
  const int64_t bytes = static_cast<int64_t>(in.tellg());
  const int64_t width = dtype == "uint32" ? 4 : 2;
  if (dtype != "uint16" && dtype != "uint32") throw std::invalid_argument("--dtype: uint16 or uint32");
  if (bytes % width != 0) {
    throw std::runtime_error(path + ": " + std::to_string(bytes) + " bytes is not a whole number of " +
                             dtype + " token ids");
  }
  std::vector<char> raw(static_cast<size_t>(bytes));
  in.seekg(0);
  in.read(raw.data(), bytes);
  at::Tensor t = width == 2
                     ? torch::from_blob(raw.data(), {bytes / 2}, torch::kInt16).clone()
                           .to(torch::kInt32).bitwise_and(int64_t{0xFFFF}).to(torch::kLong)
                     : torch::from_blob(raw.data(), {bytes / 4}, torch::kInt32).clone()
                           .to(torch::kLong).bitwise_and(int64_t{0xFFFFFFFF});
  if (t.numel() > 0 && t.max().item<int64_t>() >= vocab) {
    throw std::runtime_error(path + ": a token id is >= --vocab " + std::to_string(vocab));
  }
  return t;
}

// Windows i*T .. (i+1)*T+1 of `tokens` (ddp-trainer's data.tokens, decision 167): inputs and
// targets of the windows in `idx`.
std::pair<at::Tensor, at::Tensor> Batch(const at::Tensor& tokens, const std::vector<int64_t>& idx,
                                        int64_t T) {
  at::Tensor starts = torch::tensor(idx, torch::kLong) * T;
  at::Tensor offsets = torch::arange(T + 1, torch::kLong);
  at::Tensor w = tokens.index_select(0, (starts.unsqueeze(1) + offsets).reshape({-1}))
                     .reshape({static_cast<int64_t>(idx.size()), T + 1});
  return {w.narrow(1, 0, T).contiguous(), w.narrow(1, 1, T).contiguous()};
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args args{ParseArgs(argc, argv)};
    if (!args.a.count("train")) throw std::invalid_argument("--train is required");
    ddp::GPTConfig cfg;
    cfg.layers = args.Int("layers", 12);
    cfg.heads = args.Int("heads", 12);
    cfg.dim = args.Int("dim", 768);
    cfg.seq_len = args.Int("seq-len", 1024);
    cfg.vocab = args.Int("vocab", 50304);
    const int64_t batch = args.Int("batch", 16), warmup = args.Int("warmup", 10);
    const int64_t steps = warmup + args.Int("steps", 1000), seed = args.Int("seed", 0);
    const double lr = args.Num("lr", 6e-4);
    const bool bf16 = args.Str("precision", "bf16") == "bf16";
    const std::string graph_mode = args.Str("cuda-graph", "auto");
    const std::string dtype = args.Str("dtype", "uint16");

    ddp::ProcessGroupOptions po;
    po.backend = args.Str("backend", "auto");
    po.device = args.Str("device", "auto");
    auto group = ddp::init_process_group(po);
    const at::Device device = group->device();
    // First: the model moves to the GPU, and every step runs, on this stream.
    ddp::CudaStreamScope stream(device);

    const at::Tensor train = ReadTokens(args.a.at("train"), dtype, cfg.vocab);
    const int64_t windows = (train.numel() - 1) / cfg.seq_len;
    if (windows < 1) throw std::runtime_error("--train holds fewer tokens than one window");
    std::optional<at::Tensor> val;
    if (args.a.count("val")) val = ReadTokens(args.a.at("val"), dtype, cfg.vocab);

    torch::manual_seed(static_cast<uint64_t>(seed));  // The same weights as ddp-trainer's.
    ddp::GPT gpt(cfg);  // <ddp/gpt.h>: nanoGPT's GPT-2, built on the CPU
    gpt.to(device);
    // DDP over the model's named tensors (ddp::DataParallel: any model, not only a
    // torch::nn::Module): rank 0's weights broadcast, gradients all-reduced in backward.
    ddp::DataParallel model(gpt.named_parameters(), {}, group);

    // nanoGPT's groups: matrices decay, biases and LayerNorm weights do not.
    std::vector<at::Tensor> decay, no_decay, params;
    for (const auto& [name, p] : gpt.named_parameters()) {
      (p.dim() >= 2 ? decay : no_decay).push_back(p);
      params.push_back(p);
    }
    auto options = torch::optim::AdamWOptions(lr).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.1);
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(options));
    auto no_decay_options = options;
    no_decay_options.weight_decay(0.0);
    groups.emplace_back(no_decay, std::make_unique<torch::optim::AdamWOptions>(no_decay_options));
    ddp::FusedAdamW opt(groups, options);

    // Linear warm-up, then cosine to 0 over the run; the lr of each step lives on the GPU.
    ddp::LrSchedule schedule;
    schedule.kind = ddp::LrSchedule::Kind::kCosine;
    schedule.warmup = args.Int("lr-warmup", std::min<int64_t>(100, steps / 10));
    ddp::DeviceLrSchedule lr_schedule(schedule, lr, steps, device,
                                      device.is_cuda() ? torch::kFloat32 : torch::kFloat64);
    opt.set_lr_tensor(lr_schedule.lr());

    const int64_t V = cfg.vocab;
    auto train_step = [&](const std::vector<at::Tensor>& in) {
      at::Tensor loss;
      {
        std::optional<ddp::Autocast> autocast;
        if (bf16) autocast.emplace(device);
        model.prepare_forward();
        at::Tensor logits = gpt.forward(in[0]);
        loss = torch::nn::functional::cross_entropy(logits.view({-1, V}), in[1].view({-1}));
      }
      loss.backward();
      ddp::clip_grad_norm_(params, 1.0);
      lr_schedule.advance();
      opt.step();
      opt.zero_grad();
      return std::vector<at::Tensor>{loss.detach()};
    };
    ddp::GraphedStepOptions go;
    go.lr = &lr_schedule;
    go.capture = graph_mode != "off";
    go.required = graph_mode == "on";
    ddp::GraphedStep step(model, train_step, go);

    ddp::DistributedSampler sampler(windows, *group, /*shuffle=*/true, seed);
    ddp::Reporter report;
    std::vector<at::Tensor> losses;  // On the device: read once, at the end.
    auto start = std::chrono::steady_clock::now();
    int64_t epoch = 0, done = 0, timed_tokens = 0;
    while (done < steps) {
      sampler.set_epoch(epoch++);
      const std::vector<int64_t> order = sampler.indices();
      for (size_t b = 0; b + batch <= order.size() && done < steps; b += batch, ++done) {
        if (done == warmup) {  // The clock starts with the GPU idle.
          if (device.is_cuda()) torch::cuda::synchronize();
          start = std::chrono::steady_clock::now();
        }
        auto [x, y] = Batch(train, std::vector<int64_t>(order.begin() + b, order.begin() + b + batch),
                            cfg.seq_len);
        losses.push_back(step({x, y})[0].clone());
        if (done >= warmup) timed_tokens += batch * cfg.seq_len;
      }
    }
    if (device.is_cuda()) torch::cuda::synchronize();
    const double train_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const at::Tensor all = torch::stack(losses).to(torch::kCPU);

    double val_loss = -1;
    if (val && (val->numel() - 1) / cfg.seq_len > 0) {
      torch::NoGradGuard no_grad;
      gpt.train(false);
      const int64_t n = std::min<int64_t>((val->numel() - 1) / cfg.seq_len, batch);
      std::vector<int64_t> idx;
      for (int64_t i = 0; i < n; ++i) idx.push_back(i);
      auto [x, y] = Batch(*val, idx, cfg.seq_len);
      std::optional<ddp::Autocast> autocast;
      if (bf16) autocast.emplace(device);
      val_loss = torch::nn::functional::cross_entropy(
                     gpt.forward(x.to(device)).view({-1, V}), y.to(device).view({-1}))
                     .item<double>();
    }
    std::ostringstream line;
    line << "{\"rank\": " << group->rank() << ", \"tokens\": " << timed_tokens
         << ", \"train_s\": " << train_s << ", \"losses\": [";
    for (int64_t i = 0; i < all.numel(); ++i) {
      char buf[32];
      std::snprintf(buf, sizeof(buf), "%.9g", all[i].item<double>());
      line << (i ? ", " : "") << buf;
    }
    line << "], \"val_loss\": " << val_loss << ", \"cuda_graph\": \"" << step.status() << "\"}";
    std::cout << line.str() << std::endl;
    ddp::StepReport r;
    r.loss = all[all.numel() - 1].item<double>();
    r.step = steps - 1;
    report.step(r);
    return 0;
  } catch (const ddp::Error& e) {
    std::cerr << "ddp_gpt: " << e.what() << std::endl;
    return e.exit_code();
  } catch (const std::exception& e) {
    std::cerr << "ddp_gpt: " << e.what() << std::endl;
    return 2;
  }
}
