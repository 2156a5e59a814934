// A user's LibTorch program on libddp's public API only: ddp_graph_reference.py's setup
// (a model whose autograd graph varies by step and by rank, and a custom autograd
// Function that returns no gradient for a parameter), trained under
// ddp::DistributedDataParallel. Run one process per rank with torchrun's environment;
// it prints one JSON object on stdout: this rank's per-step losses, which gradients were
// defined after each backward, the final parameters and the last step's gradients,
// or, when a forward throws, the ddp::Error's message as "error".
//
//   ddp_graph_program --case undefined|unused|static|error|static_error|checkpoint|no_outputs
//
// no_outputs (a misuse): find_unused_parameters through DataParallel without
// prepare_for_backward(outputs); backward() must throw a ddp::Error naming it.
#include <ddp/ddp.h>
#include <torch/torch.h>

#include <iomanip>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace {

constexpr int64_t kSteps = 5, kBatch = 6;

// PyTorch's Gate (ddp_graph_reference.py): x * g, and no gradient (an undefined tensor)
// for g unless `give`.
struct Gate : torch::autograd::Function<Gate> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& g, bool give) {
    ctx->save_for_backward({x, g});
    ctx->saved_data["give"] = give;
    return x * g;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const bool give = ctx->saved_data["give"].toBool();
    const torch::Tensor& grad = grads[0];
    return {grad * saved[1], give ? (grad * saved[0]).sum(0) : torch::Tensor(), torch::Tensor()};
  }
};

// torch.utils.checkpoint(fn, h, use_reentrant=True): fn runs without grad in the
// forward and again in the backward, whose own (nested, reentrant) backward accumulates
// the gradients of fn's parameters. `fn` is a NetImpl's Segment, passed by address.
struct NetImpl;
torch::Tensor Segment(NetImpl* net, const torch::Tensor& h);
struct Checkpoint : torch::autograd::Function<Checkpoint> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& h,
                               int64_t net) {
    ctx->save_for_backward({h});
    ctx->saved_data["net"] = net;
    return Segment(reinterpret_cast<NetImpl*>(net), h);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    torch::Tensor h = ctx->get_saved_variables()[0].detach().requires_grad_(true);
    torch::Tensor out;
    {
      torch::AutoGradMode enable(true);
      out = Segment(reinterpret_cast<NetImpl*>(ctx->saved_data["net"].toInt()), h);
    }
    torch::autograd::backward({out}, {grads[0]});
    return {h.grad(), torch::Tensor()};
  }
};

torch::Tensor FormulaParam(int64_t numel, int64_t k) {
  return (torch::sin(torch::arange(numel, torch::kDouble) * 0.37 + k) * 0.5).to(torch::kFloat);
}

struct NetImpl : torch::nn::Module {
  explicit NetImpl(std::string c) : kind(std::move(c)) {
    a = register_module("a", torch::nn::Linear(4, 8));
    b = register_module("b", torch::nn::Linear(8, 3));
    even = register_module("even", torch::nn::Linear(8, 3));
    rank1 = register_module("rank1", torch::nn::Linear(8, 3));
    never = register_module("never", torch::nn::Linear(8, 3));
    gate = register_parameter("gate", torch::ones({3}));
    torch::NoGradGuard no_grad;
    int64_t k = 0;
    for (torch::Tensor& p : parameters()) {
      p.copy_(FormulaParam(p.numel(), k++).view(p.sizes()));
    }
  }
  torch::Tensor forward(const torch::Tensor& x, int64_t step, int64_t rank) {
    torch::Tensor h = torch::relu(a(x));
    torch::Tensor out = b(h);
    // One operation per statement: C++ leaves the order of a + b's operands open, and
    // the order autograd records them in decides how h's gradient is summed.
    if (kind == "undefined") {
      out = out + even(h);
      out = out + rank1(h);
      out = out + never(h);
      return Gate::apply(out, gate, (step + rank) % 3 == 0);
    }
    if (kind == "checkpoint") {
      out = Checkpoint::apply(h, reinterpret_cast<int64_t>(this));
      out = out + even(h);
      if (rank == 1) out = out + rank1(h);
      return Gate::apply(out, gate, true);
    }
    if (kind == "error") {
      out = out + even(h);
      return out + rank1(h);
    }
    if ((kind == "unused" || kind == "static_error") && step % 2 == 0) out = out + even(h);
    if (kind == "static") out = out + even(h);
    if (rank == 1) out = out + rank1(h);
    const bool give = kind.rfind("static", 0) == 0 || (step + rank) % 3 == 0;
    return Gate::apply(out, gate, give);
  }
  torch::Tensor SegmentOf(const torch::Tensor& h) {
    torch::Tensor out = b(h);
    return out + even(h);
  }
  std::string kind;
  torch::nn::Linear a{nullptr}, b{nullptr}, even{nullptr}, rank1{nullptr}, never{nullptr};
  torch::Tensor gate;
};

torch::Tensor Segment(NetImpl* net, const torch::Tensor& h) { return net->SegmentOf(h); }

std::string Json(const torch::Tensor& t) {
  if (!t.defined()) return "null";
  const torch::Tensor d = t.to(torch::kDouble).contiguous().view(-1);
  std::ostringstream out;
  out << std::setprecision(17) << "[";
  for (int64_t i = 0; i < d.numel(); ++i) out << (i ? ", " : "") << d[i].item<double>();
  return out.str() + "]";
}

template <typename T, typename F>
std::string JsonList(const std::vector<T>& items, F each) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + each(items[i]);
  return out + "]";
}

int Run(const std::string& kind) {
  torch::set_num_threads(1);
  auto group = ddp::init_process_group();
  const int64_t rank = group->rank();
  auto net = std::make_shared<NetImpl>(kind);
  ddp::DdpOptions options;
  options.find_unused_parameters = kind == "unused" || kind == "no_outputs";
  options.static_graph = kind.rfind("static", 0) == 0 || kind == "checkpoint";
  if (kind == "no_outputs") {
    ddp::NamedTensors named;
    for (const auto& item : net->named_parameters()) named.emplace_back(item.key(), item.value());
    ddp::DataParallel dp(named, {}, group, options);
    dp.prepare_forward();
    torch::Tensor out = net->forward(torch::ones({kBatch, 4}), 0, rank);
    try {
      out.sum().backward();
      std::cout << "{\"error\": \"no error\"}\n";
    } catch (const ddp::Error& e) {
      std::cout << "{\"error_code\": " << static_cast<int>(e.code()) << ", \"message\": \""
                << (std::string(e.what()).find("call prepare_for_backward(outputs)") !=
                            std::string::npos
                        ? "names prepare_for_backward"
                        : "other")
                << "\"}\n";
    }
    return 0;
  }
  ddp::DistributedDataParallel model(net, group, options);
  const std::vector<torch::Tensor> params = net->parameters();
  torch::optim::SGD opt(params, torch::optim::SGDOptions(0.1).momentum(0.9));
  std::vector<double> losses;
  std::vector<std::string> defined;
  std::string grads = "null", error;
  try {
    for (int64_t step = 0; step < kSteps; ++step) {
      const torch::Tensor i = torch::arange(kBatch * 4, torch::kDouble);
      const torch::Tensor x =
          torch::cos(i * 0.3 + step * 7 + rank * 13).to(torch::kFloat).view({kBatch, 4});
      const torch::Tensor j = torch::arange(kBatch * 3, torch::kDouble);
      const torch::Tensor y =
          torch::sin(j * 0.21 + step * 5 + rank * 3).to(torch::kFloat).view({kBatch, 3});
      torch::Tensor loss = (model(x, step, rank) - y).pow(2).mean();
      loss.backward();
      losses.push_back(loss.item<double>());
      defined.push_back(JsonList(params, [](const torch::Tensor& p) {
        return std::string(p.grad().defined() ? "1" : "0");
      }));
      if (step == kSteps - 1) grads = JsonList(params, [](const torch::Tensor& p) { return Json(p.grad()); });
      opt.step();
      for (const torch::Tensor& p : params) p.mutable_grad() = torch::Tensor();
    }
  } catch (const ddp::Error& e) {
    error = e.what();
  }
  std::ostringstream out;
  out << std::setprecision(17) << "{\"losses\": [";
  for (size_t s = 0; s < losses.size(); ++s) out << (s ? ", " : "") << losses[s];
  out << "], \"defined\": " << JsonList(defined, [](const std::string& d) { return d; })
      << ", \"grads\": " << grads
      << ", \"params\": " << JsonList(params, [](const torch::Tensor& p) { return Json(p); });
  if (!error.empty()) {
    std::string quoted;
    for (char c : error) {
      if (c == '"' || c == '\\') quoted += '\\';
      if (c == '\n') {
        quoted += "\\n";
        continue;
      }
      quoted += c;
    }
    out << ", \"error\": \"" << quoted << "\"";
  }
  std::cout << out.str() << "}\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string kind = "undefined";
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--case") kind = argv[++i];
  }
  try {
    return Run(kind);
  } catch (const ddp::Error& e) {
    std::cerr << "ddp_graph_program: " << e.what() << "\n";
    return e.exit_code();
  }
}
