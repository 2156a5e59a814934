// A user's LibTorch program on libddp's public API only: join_reference.py's setup
// (rank r trains on 5 + 2r batches) under ddp::DistributedDataParallel inside
// ddp::join, once per mode (divide, nodivide, throw) on one process group; then the
// misuse cases, whose ddp::Error messages it records. Run one process per rank with
// torchrun's environment; it prints one JSON object on stdout:
//   {"modes": {mode: {"losses", "params", "buffers", "error", "after", "params_after"}},
//    "misuse": {case: message}}
// ("after", "params_after": one even step on every rank after the Join; not in throw.)
//
//   join_program
#include <ddp/ddp.h>
#include <torch/torch.h>

#include <functional>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace {

constexpr int64_t kBatch = 6;

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

std::string Train(const std::shared_ptr<ddp::ProcessGroup>& group, const std::string& mode) {
  const int64_t rank = group->rank();
  Net net;
  ddp::DistributedDataParallel model(net, group);
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  ddp::JoinOptions options;
  options.throw_on_early_termination = mode == "throw";
  options.divide_by_initial_world_size = mode != "nodivide";
  std::vector<double> losses;
  std::string error = "null";
  try {
    ddp::join({ddp::joinable(model)}, [&] {
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
        opt.step();
        for (torch::Tensor& p : net->parameters()) p.mutable_grad() = torch::Tensor();
      }
    }, options);
  } catch (const ddp::Error& e) {
    error = Quote(e.what());
  }
  std::ostringstream out;
  out << std::setprecision(17) << "{\"losses\": [";
  for (size_t s = 0; s < losses.size(); ++s) out << (s ? ", " : "") << losses[s];
  out << "], \"params\": " << JsonList(net->parameters())
      << ", \"buffers\": " << JsonList(net->buffers()) << ", \"error\": " << error;
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
    opt.step();
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
  return out + "}";
}

}  // namespace

int main() {
  try {
    torch::set_num_threads(1);
    auto group = ddp::init_process_group();
    std::string out = "{\"modes\": {";
    const char* modes[] = {"divide", "nodivide", "throw"};
    for (int m = 0; m < 3; ++m) {
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
