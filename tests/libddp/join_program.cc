// A user's LibTorch program on libddp's public API only: join_reference.py's setup
// (rank r trains on 5 + 2r batches) under ddp::DistributedDataParallel inside
// ddp::join, once per mode (divide, nodivide, throw; zero_sgd and zero_adam with a
// ddp::ZeroRedundancyOptimizer in the Join after the model) on one process group; then
// the misuse cases, whose ddp::Error messages it records. Run one process per rank with
// torchrun's environment; it prints one JSON object on stdout:
//   {"modes": {mode: {"losses", "params", "buffers", "error", "after", "params_after",
//                     "state"}},
//    "misuse": {case: message}}
// ("after", "params_after": one even step after the Join on every rank; not in throw.
// "state": in the zero modes on rank 0, the state consolidated there after the Join.)
//
//   join_program
#include <ddp/ddp.h>
#include <torch/torch.h>

#include <functional>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

namespace {

constexpr int64_t kBatch = 6;
constexpr double kAdamLr = 0.01;   // join_reference.py's ADAM_LR and ADAM_EPS.
constexpr double kAdamEps = 1e-3;

torch::Tensor FormulaParam(int64_t numel, int64_t k) {
  return (torch::sin(torch::arange(numel, torch::kDouble) * 0.37 + k) * 0.5).to(torch::kFloat);
}

struct NetImpl : torch::nn::Module {
  NetImpl() {
    l1 = register_module("l1", torch::nn::Linear(4, 8));
    bn = register_module("bn", torch::nn::BatchNorm1d(8));
    l2 = register_module("l2", torch::nn::Linear(8, 3));
    torch::NoGradGuard no_grad;
    int64_t k = 0;
    for (torch::Tensor& p : parameters()) p.copy_(FormulaParam(p.numel(), k++).view(p.sizes()));
  }
  torch::Tensor forward(const torch::Tensor& x) { return l2(torch::relu(bn(l1(x)))); }
  torch::nn::Linear l1{nullptr}, l2{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};
TORCH_MODULE(Net);

std::string Json(const torch::Tensor& t) {
  const torch::Tensor d = t.detach().to(torch::kDouble).contiguous().view(-1);
  std::ostringstream out;
  out << std::setprecision(17) << "[";
  for (int64_t i = 0; i < d.numel(); ++i) out << (i ? ", " : "") << d[i].item<double>();
  return out.str() + "]";
}

std::string JsonList(const std::vector<torch::Tensor>& items) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + Json(items[i]);
  return out + "]";
}

std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out + "\"";
}

// A parameter's optimizer state as (name, tensor) pairs, in torch.optim's names.
std::map<std::string, torch::Tensor> StateOf(const torch::optim::OptimizerParamState& s) {
  if (auto* a = dynamic_cast<const torch::optim::AdamParamState*>(&s)) {
    return {{"step", torch::tensor(static_cast<double>(a->step()))},
            {"exp_avg", a->exp_avg()},
            {"exp_avg_sq", a->exp_avg_sq()}};
  }
  if (auto* a = dynamic_cast<const torch::optim::SGDParamState*>(&s)) {
    return {{"momentum_buffer", a->momentum_buffer()}};
  }
  throw std::runtime_error("unknown optimizer state");
}

// Parameter p's entry in an optimizer's state(), or null (keyed by the TensorImpl:
// printed in LibTorch 1.13, the pointer in 2.x).
template <typename Map>
const torch::optim::OptimizerParamState* Find(const Map& state, const torch::Tensor& p) {
  for (const auto& [key, value] : state) {
    if constexpr (std::is_same_v<std::decay_t<decltype(key)>, std::string>) {
      std::ostringstream s;
      s << p.unsafeGetTensorImpl();
      if (key == s.str()) return value.get();
    } else {
      if (key == p.unsafeGetTensorImpl()) return value.get();
    }
  }
  return nullptr;
}

// {index: {name: values}} of every parameter with a state in `zero`'s consolidated state.
std::string StateJson(ddp::ZeroRedundancyOptimizer& zero, const std::vector<torch::Tensor>& params) {
  std::string out = "{";
  bool first = true;
  for (size_t i = 0; i < params.size(); ++i) {
    const torch::optim::OptimizerParamState* s = Find(zero.state(), params[i]);
    if (s == nullptr) continue;
    out += (first ? "\"" : ", \"") + std::to_string(i) + "\": {";
    first = false;
    bool first_key = true;
    for (const auto& [k, v] : StateOf(*s)) {
      out += (first_key ? "\"" : ", \"") + k + "\": " + Json(v);
      first_key = false;
    }
    out += "}";
  }
  return out + "}";
}

std::string Train(const std::shared_ptr<ddp::ProcessGroup>& group, const std::string& mode) {
  const int64_t rank = group->rank();
  Net net;
  ddp::DistributedDataParallel model(net, group);
  const bool zero = mode == "zero_sgd" || mode == "zero_adam";
  std::unique_ptr<torch::optim::Optimizer> opt;
  ddp::ZeroRedundancyOptimizer* zero_opt = nullptr;
  if (mode == "zero_adam") {
    opt = std::make_unique<ddp::ZeroRedundancyOptimizer>(net->parameters(), group,
                                                         torch::optim::AdamOptions(kAdamLr).eps(kAdamEps));
  } else if (mode == "zero_sgd") {
    opt = std::make_unique<ddp::ZeroRedundancyOptimizer>(
        net->parameters(), group, torch::optim::SGDOptions(0.1).momentum(0.9));
  } else {
    opt = std::make_unique<torch::optim::SGD>(net->parameters(),
                                              torch::optim::SGDOptions(0.1).momentum(0.9));
  }
  if (zero) zero_opt = static_cast<ddp::ZeroRedundancyOptimizer*>(opt.get());
  ddp::JoinOptions options;
  options.throw_on_early_termination = mode == "throw";
  options.divide_by_initial_world_size = mode != "nodivide";
  std::vector<double> losses;
  std::string error = "null";
  std::vector<std::shared_ptr<ddp::Joinable>> joinables;
  joinables.push_back(ddp::joinable(model));
  if (zero) joinables.push_back(ddp::joinable(*zero_opt));  // PyTorch's [model, optimizer].
  try {
    ddp::join(joinables, [&] {
      for (int64_t step = 0; step < 5 + 2 * rank; ++step) {
        const torch::Tensor i = torch::arange(kBatch * 4, torch::kDouble);
        const torch::Tensor x =
            torch::cos(i * 0.3 + step * 7 + rank * 13).to(torch::kFloat).view({kBatch, 4});
        const torch::Tensor j = torch::arange(kBatch * 3, torch::kDouble);
        const torch::Tensor y =
            torch::sin(j * 0.21 + step * 5 + rank * 3).to(torch::kFloat).view({kBatch, 3});
        torch::Tensor loss = (model(x) - y).pow(2).mean();
        loss.backward();
        losses.push_back(loss.item<double>());
        opt->step();
        for (torch::Tensor& p : net->parameters()) {  // zero_grad(set_to_none)
          if (mode != "zero_sgd") {
            p.mutable_grad() = torch::Tensor();
          } else if (p.grad().defined()) {
            p.mutable_grad().detach_();
            p.mutable_grad().zero_();
          }
        }
      }
    }, options);
  } catch (const ddp::Error& e) {
    error = Quote(e.what());
  }
  joinables.clear();
  std::ostringstream out;
  out << std::setprecision(17) << "{\"losses\": [";
  for (size_t s = 0; s < losses.size(); ++s) out << (s ? ", " : "") << losses[s];
  out << "], \"params\": " << JsonList(net->parameters())
      << ", \"buffers\": " << JsonList(net->buffers()) << ", \"error\": " << error;
  if (zero) {
    zero_opt->consolidate_state_dict(0);
    if (rank == 0) out << ", \"state\": " << StateJson(*zero_opt, net->parameters());
  }
  if (mode != "throw") {  // One even step after the Join: divided by the world size again.
    const torch::Tensor i = torch::arange(kBatch * 4, torch::kDouble);
    const torch::Tensor x =
        torch::cos(i * 0.3 + 100 * 7 + rank * 13).to(torch::kFloat).view({kBatch, 4});
    const torch::Tensor j = torch::arange(kBatch * 3, torch::kDouble);
    const torch::Tensor y =
        torch::sin(j * 0.21 + 100 * 5 + rank * 3).to(torch::kFloat).view({kBatch, 3});
    torch::Tensor loss = (model(x) - y).pow(2).mean();
    loss.backward();
    out << ", \"after\": " << loss.item<double>();
    opt->step();
    out << ", \"params_after\": " << JsonList(net->parameters());
  }
  out << "}";
  return out.str();
}

// The ddp::Error message of `f`, or null when it throws none.
std::string ErrorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const ddp::Error& e) {
    return Quote(e.what());
  }
  return "null";
}

std::string Misuse(const std::shared_ptr<ddp::ProcessGroup>& group) {
  std::string out = "{\"no_joinables\": " + ErrorOf([] { ddp::Join join({}); });
  {
    Net net;
    ddp::DistributedDataParallel model(net, group);
    model.register_comm_hook(group, ddp::hooks::fp16_compress_hook);
    out += ", \"comm_hook\": " + ErrorOf([&] { ddp::Join join({ddp::joinable(model)}); });
  }
  for (const char* option : {"find_unused_parameters", "static_graph"}) {
    Net net;
    ddp::DdpOptions options;
    (std::string(option) == "static_graph" ? options.static_graph
                                           : options.find_unused_parameters) = true;
    ddp::DistributedDataParallel model(net, group, options);
    out += std::string(", \"") + option + "\": " +
           ErrorOf([&] { ddp::Join join({ddp::joinable(model)}); });
  }
  {
    Net net;
    ddp::DistributedDataParallel model(net, group);
    auto first = ddp::joinable(model);
    out += ", \"two_joinables\": " + ErrorOf([&] { ddp::joinable(model); });
    ddp::Join join({first});
    out += ", \"nested\": " + ErrorOf([&] { ddp::Join inner({first}); });
    join.finish();  // Every rank joins at once: no iteration to shadow.
    out += ", \"finish_twice\": " + ErrorOf([&] { join.finish(); });
  }
  {
    Net net;
    ddp::DistributedDataParallel model(net, group);
    ddp::ZeroRedundancyOptimizer zero(net->parameters(), group, torch::optim::SGDOptions(0.1));
    auto first = ddp::joinable(zero);
    out += ", \"zero_two_joinables\": " + ErrorOf([&] { ddp::joinable(zero); });
    out += ", \"zero_first\": " +
           ErrorOf([&] { ddp::Join join({first, ddp::joinable(model)}); });
  }
  return out + "}";
}

}  // namespace

int main() {
  try {
    torch::set_num_threads(1);
    auto group = ddp::init_process_group();
    std::string out = "{\"modes\": {";
    const char* modes[] = {"divide", "nodivide", "throw", "zero_sgd", "zero_adam"};
    for (int m = 0; m < 5; ++m) {
      out += std::string(m ? ", " : "") + "\"" + modes[m] + "\": " + Train(group, modes[m]);
    }
    out += "}, \"misuse\": " + Misuse(group) + "}";
    std::cout << out << "\n";
    return 0;
  } catch (const ddp::Error& e) {
    std::cerr << "join_program: " << e.what() << "\n";
    return e.exit_code();
  }
}
