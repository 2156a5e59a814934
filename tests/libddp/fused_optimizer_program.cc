// A user's LibTorch program on libddp's public API only: ddp::FusedAdamW, FusedAdam and
// FusedSGD over fused_optimizer_parity_test.py's parameters and gradients, which
// torch.optim with fused=True must match there. One case per run:
//
//   fused_optimizer_program --optimizer adamw|adam|sgd [--device cpu|cuda] [--steps N]
//       [--lr X] [--weight-decay X] [--amsgrad] [--momentum X] [--dampening X]
//       [--nesterov] [--matrices] [--lr-tensor none|float32|float64] [--capture]
//
// Parameter i (shapes kShapes) starts at sin(linspace(-1, 1) * (0.5 + 0.1 i)); its
// gradient at step s is cos(linspace(0.3, -0.7) * (s + 1 + i)) * 0.1 (i + 1); both made
// on the CPU, then moved to the device. The learning rate at step s is
// lr * (1 - 0.1 s), set on the param groups or, with --lr-tensor, written into a 0-dim
// tensor given to set_lr_tensor. --matrices: nanoGPT's two param groups (2 or more
// dimensions with the weight decay, the others without). --capture (CUDA): the first
// step eager, then one step captured in a CUDA graph and replayed for the others, each
// replay after the step's gradients and learning rate are written into the captured
// tensors; the same case run eagerly beside it must give the same bits.
//
// Prints one JSON object: the parameters after every step (flattened, in order), the
// final state per parameter index (torch.optim's numbering across the groups), where the
// step counts live; or {"refused": ...} when the optimizer refuses (LibTorch 1.13).
#include <ddp/ddp.h>
#include <torch/torch.h>
#if DDP_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#endif

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

namespace {

const std::vector<std::vector<int64_t>> kShapes = {{7, 5}, {13}, {3, 4, 2}, {1}, {64, 33}};

struct Args {
  std::string optimizer = "adamw";
  std::string device = "cpu";
  int steps = 6;
  double lr = 1e-3;
  double weight_decay = 0;
  bool amsgrad = false;
  double momentum = 0;
  double dampening = 0;
  bool nesterov = false;
  bool matrices = false;
  std::string lr_tensor = "none";
  bool capture = false;
};

Args Parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error(k + " needs a value");
      return argv[++i];
    };
    if (k == "--optimizer") a.optimizer = next();
    else if (k == "--device") a.device = next();
    else if (k == "--steps") a.steps = std::stoi(next());
    else if (k == "--lr") a.lr = std::stod(next());
    else if (k == "--weight-decay") a.weight_decay = std::stod(next());
    else if (k == "--amsgrad") a.amsgrad = true;
    else if (k == "--momentum") a.momentum = std::stod(next());
    else if (k == "--dampening") a.dampening = std::stod(next());
    else if (k == "--nesterov") a.nesterov = true;
    else if (k == "--matrices") a.matrices = true;
    else if (k == "--lr-tensor") a.lr_tensor = next();
    else if (k == "--capture") a.capture = true;
    else throw std::runtime_error("unknown argument " + k);
  }
  return a;
}

torch::Tensor Linspace(double from, double to, int64_t n) {
  return torch::linspace(from, to, n, torch::kFloat);
}

std::vector<torch::Tensor> MakeParams(const torch::Device& device) {
  std::vector<torch::Tensor> params;
  for (size_t i = 0; i < kShapes.size(); ++i) {
    int64_t n = 1;
    for (int64_t d : kShapes[i]) n *= d;
    torch::Tensor v = torch::sin(Linspace(-1, 1, n) * (0.5 + 0.1 * static_cast<double>(i)));
    params.push_back(v.reshape(kShapes[i]).to(device).set_requires_grad(true));
  }
  return params;
}

torch::Tensor GradOf(size_t i, int step, const torch::Tensor& p) {
  return (torch::cos(Linspace(0.3, -0.7, p.numel()) * static_cast<double>(step + 1 + i)) *
          (0.1 * static_cast<double>(i + 1)))
      .reshape(p.sizes())
      .to(p.device());
}

double LrAt(const Args& a, int step) { return a.lr * (1.0 - 0.1 * step); }

std::vector<torch::optim::OptimizerParamGroup> Groups(const Args& a,
                                                      const std::vector<torch::Tensor>& params) {
  auto options = [&](double wd) -> std::unique_ptr<torch::optim::OptimizerOptions> {
    if (a.optimizer == "sgd") {
      return std::make_unique<torch::optim::SGDOptions>(torch::optim::SGDOptions(a.lr)
                                                            .momentum(a.momentum)
                                                            .dampening(a.dampening)
                                                            .nesterov(a.nesterov)
                                                            .weight_decay(wd));
    }
    if (a.optimizer == "adam") {
      return std::make_unique<torch::optim::AdamOptions>(
          torch::optim::AdamOptions(a.lr).weight_decay(wd).amsgrad(a.amsgrad));
    }
    return std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(a.lr).weight_decay(wd).amsgrad(a.amsgrad));
  };
  if (!a.matrices) return {torch::optim::OptimizerParamGroup(params, options(a.weight_decay))};
  std::vector<torch::Tensor> decay, rest;
  for (const auto& p : params) (p.dim() >= 2 ? decay : rest).push_back(p);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, options(a.weight_decay));
  groups.emplace_back(rest, options(0.0));
  return groups;
}

std::unique_ptr<torch::optim::Optimizer> Make(const Args& a,
                                              const std::vector<torch::Tensor>& params) {
  auto groups = Groups(a, params);
  if (a.optimizer == "sgd") {
    return std::make_unique<ddp::FusedSGD>(groups, torch::optim::SGDOptions(a.lr));
  }
  if (a.optimizer == "adam") return std::make_unique<ddp::FusedAdam>(groups);
  if (a.optimizer == "adamw") return std::make_unique<ddp::FusedAdamW>(groups);
  throw std::runtime_error("unknown --optimizer " + a.optimizer);
}

// The key of a parameter's entry in Optimizer::state() (a string in LibTorch 1.13).
template <typename Map>
typename Map::key_type StateKey(const torch::Tensor& p) {
  if constexpr (std::is_same_v<typename Map::key_type, std::string>) {
    std::ostringstream s;
    s << p.unsafeGetTensorImpl();
    return s.str();
  } else {
    return p.unsafeGetTensorImpl();
  }
}

std::string Floats(const torch::Tensor& t) {
  torch::Tensor c = t.detach().to(torch::kCPU, torch::kFloat).contiguous().reshape({-1});
  std::string out = "[";
  const float* v = c.data_ptr<float>();
  char buf[32];
  for (int64_t i = 0; i < c.numel(); ++i) {
    std::snprintf(buf, sizeof(buf), "%s%.9g", i ? "," : "", static_cast<double>(v[i]));
    out += buf;
  }
  return out + "]";
}

std::string AllParams(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> flat;
  for (const auto& p : params) flat.push_back(p.detach().reshape({-1}));
  return Floats(torch::cat(flat));
}

// Runs the case; returns the parameters after each step (JSON lists) and fills `state`.
std::vector<std::string> Run(const Args& a, bool capture, std::string* state,
                             std::string* step_where) {
  const torch::Device device(a.device);
  std::vector<torch::Tensor> params = MakeParams(device);
  std::unique_ptr<torch::optim::Optimizer> opt = Make(a, params);
  auto* fused = dynamic_cast<ddp::FusedOptimizer*>(opt.get());
  torch::Tensor lr;
  if (a.lr_tensor != "none") {
    lr = torch::full({}, a.lr, torch::TensorOptions().device(device).dtype(
                                   a.lr_tensor == "float64" ? torch::kDouble : torch::kFloat));
    fused->set_lr_tensor(lr);
  }
  auto prepare = [&](int s) {  // The step's gradients and learning rate, in place.
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) {
      if (!params[i].grad().defined()) params[i].mutable_grad() = torch::zeros_like(params[i]);
      params[i].mutable_grad().copy_(GradOf(i, s, params[i]));
    }
    if (lr.defined()) {
      lr.fill_(LrAt(a, s));
    } else {
      for (auto& g : opt->param_groups()) g.options().set_lr(LrAt(a, s));
    }
  };
  std::vector<std::string> out;
#if DDP_WITH_CUDA
  std::unique_ptr<at::cuda::CUDAGraph> graph;
#endif
  for (int s = 0; s < a.steps; ++s) {
    prepare(s);
    if (!capture || s == 0) {
      opt->step();
    } else {
#if DDP_WITH_CUDA
      if (graph == nullptr) {  // Captured once, on a side stream, then replayed.
        graph = std::make_unique<at::cuda::CUDAGraph>();
        c10::cuda::device_synchronize();  // This step's gradients and lr are written.
        {
          at::cuda::CUDAStreamGuard guard(at::cuda::getStreamFromPool());
          graph->capture_begin();
          opt->step();
          graph->capture_end();
        }
        c10::cuda::device_synchronize();
      }
      graph->replay();
#else
      throw std::runtime_error("--capture needs a CUDA build");
#endif
    }
    out.push_back(AllParams(params));
  }
  // The state, numbered across the param groups as torch.optim numbers it.
  using Map = std::remove_reference_t<decltype(opt->state())>;
  std::ostringstream js;
  js << "{";
  int64_t index = 0;
  bool first = true;
  for (const auto& group : opt->param_groups()) {
    for (const auto& p : group.params()) {
      auto it = opt->state().find(StateKey<Map>(p));
      if (it != opt->state().end()) {
        js << (first ? "" : ",") << "\"" << index << "\":{";
        first = false;
        if (auto* s = dynamic_cast<ddp::FusedAdamParamState*>(it->second.get())) {
          js << "\"step\":" << Floats(s->step()) << ",\"exp_avg\":" << Floats(s->exp_avg())
             << ",\"exp_avg_sq\":" << Floats(s->exp_avg_sq());
          if (s->max_exp_avg_sq().defined()) {
            js << ",\"max_exp_avg_sq\":" << Floats(s->max_exp_avg_sq());
          }
          std::ostringstream where;
          where << s->step().device() << " " << s->step().scalar_type() << " "
                << s->step().dim();
          *step_where = where.str();
        } else if (auto* g = dynamic_cast<torch::optim::SGDParamState*>(it->second.get())) {
          js << "\"momentum_buffer\":" << Floats(g->momentum_buffer());
        }
        js << "}";
      }
      ++index;
    }
  }
  js << "}";
  *state = js.str();
  return out;
}

std::string List(const std::vector<std::string>& rows) {
  std::string out = "[";
  for (size_t i = 0; i < rows.size(); ++i) out += (i ? "," : "") + rows[i];
  return out + "]";
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args a = Parse(argc, argv);
    std::string state, where, ignored_state, ignored_where;
    std::vector<std::string> params;
    try {
      params = Run(a, a.capture, &state, &where);
    } catch (const ddp::Error& e) {
      std::string msg = e.what();
      for (char& c : msg) {
        if (c == '"' || c == '\\' || c == '\n') c = ' ';
      }
      std::cout << "{\"refused\":\"" << msg << "\",\"exit_code\":" << e.exit_code() << "}\n";
      return 0;
    }
    std::cout << "{\"params\":" << List(params) << ",\"state\":" << state
              << ",\"step_where\":\"" << where << "\"";
    if (a.capture) {
      std::cout << ",\"eager_params\":" << List(Run(a, false, &ignored_state, &ignored_where));
    }
    std::cout << "}\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "fused_optimizer_program: " << e.what() << "\n";
    return 1;
  }
}
