// A user's LibTorch program on libddp's public API only: sync_batch_norm_reference.py's
// setup, trained under DDP after convert_sync_batchnorm. Run one process per rank with
// torchrun's environment; it prints one JSON object (this rank's per-step losses, the
// final running statistics, the eval loss) on stdout.
//
//   sync_batch_norm_program --model mlp|conv|plain
//   sync_batch_norm_program --misuse   (world 1: prints each misuse's ddp::Error)
//
// Ranks hold different batch sizes (the global count is what counts); in step 2 the
// last rank holds a single row, in step 4 rank 0 none (its loss is NaN, as in PyTorch).
#include <ddp/ddp.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace {

constexpr int64_t kN = 200, kClasses = 3, kSteps = 6;

// Rank r's batch size in `step`.
int64_t BatchSize(int rank, int64_t step, int world) {
  if (step == 2 && rank == world - 1 && world > 1) return 1;
  if (step == 4 && rank == 0 && world > 1) return 0;
  return 5 + 2 * rank;
}

// Built one module after another (a constructor's arguments are made in no fixed order),
// so that the seeded initialisation matches PyTorch's.
torch::nn::Sequential MakeModel(const std::string& kind) {
  torch::nn::Sequential net;
  if (kind == "mlp") {
    net->push_back(torch::nn::Linear(10, 16));
    net->push_back(torch::nn::BatchNorm1d(16));
    net->push_back(torch::nn::ReLU());
    net->push_back(torch::nn::Linear(16, kClasses));
    return net;
  }
  if (kind == "plain") {  // No affine parameters, no running statistics: batch statistics always.
    net->push_back(torch::nn::Conv1d(torch::nn::Conv1dOptions(2, 4, 3).padding(1)));
    net->push_back(torch::nn::BatchNorm1d(
        torch::nn::BatchNormOptions(4).affine(false).track_running_stats(false)));
    net->push_back(torch::nn::ReLU());
    net->push_back(torch::nn::Flatten());
    net->push_back(torch::nn::Linear(4 * 6, kClasses));
    return net;
  }
  // momentum None: the cumulative average.
  net->push_back(torch::nn::Conv2d(torch::nn::Conv2dOptions(2, 4, 3).padding(1)));
  net->push_back(torch::nn::BatchNorm2d(torch::nn::BatchNormOptions(4).momentum(c10::nullopt)));
  net->push_back(torch::nn::ReLU());
  net->push_back(torch::nn::Flatten());
  net->push_back(torch::nn::Linear(4 * 5 * 5, kClasses));
  return net;
}

std::string Json(const std::vector<double>& v) {
  std::ostringstream out;
  out << std::setprecision(17) << "[";
  for (size_t i = 0; i < v.size(); ++i) {
    out << (i ? ", " : "");
    if (std::isnan(v[i])) {
      out << "NaN";  // As Python's json writes it.
    } else {
      out << v[i];
    }
  }
  return out.str() + "]";
}

std::vector<double> Values(const torch::Tensor& t) {
  if (!t.defined()) return {};
  const torch::Tensor d = t.to(torch::kDouble).contiguous().view(-1);
  return std::vector<double>(d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
}

int Train(const std::string& kind) {
  torch::set_num_threads(1);
  auto group = ddp::init_process_group();
  const int rank = group->rank(), world = group->world_size();
  torch::manual_seed(0);
  torch::nn::Sequential net = MakeModel(kind);
  ddp::convert_sync_batchnorm(net.ptr(), group);
  torch::manual_seed(1);
  const torch::Tensor x_all = kind == "mlp"     ? torch::randn({kN, 10})
                              : kind == "plain" ? torch::randn({kN, 2, 6})
                                                : torch::randn({kN, 2, 5, 5});
  const torch::Tensor y_all = torch::randint(0, kClasses, {kN});

  ddp::DistributedDataParallel model(net, group);
  torch::optim::SGD opt(model.module()->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  std::vector<double> losses;
  int64_t offset = 0;
  model.train();
  for (int64_t step = 0; step < kSteps; ++step) {
    int64_t begin = offset;
    for (int r = 0; r < rank; ++r) begin += BatchSize(r, step, world);
    for (int r = 0; r < world; ++r) offset += BatchSize(r, step, world);
    const int64_t n = BatchSize(rank, step, world);
    torch::Tensor loss = torch::nn::functional::cross_entropy(
        model(x_all.narrow(0, begin, n)), y_all.narrow(0, begin, n));
    loss.backward();
    opt.step();
    opt.zero_grad();
    losses.push_back(loss.item<double>());
  }
  model.eval();
  double eval_loss = 0;
  {
    torch::NoGradGuard no_grad;
    eval_loss = torch::nn::functional::cross_entropy(model(x_all), y_all).item<double>();
  }
  auto bn = model.module()->named_children()["1"]->as<ddp::SyncBatchNormImpl>();
  if (bn == nullptr) {
    std::cerr << "sync_batch_norm_program: the BatchNorm was not converted\n";
    return 3;
  }
  std::cout << std::setprecision(17) << "{\"losses\": " << Json(losses)
            << ", \"running_mean\": " << Json(Values(bn->running_mean))
            << ", \"running_var\": " << Json(Values(bn->running_var))
            << ", \"num_batches_tracked\": "
            << (bn->num_batches_tracked.defined() ? bn->num_batches_tracked.item<int64_t>() : -1)
            << ", \"eval_loss\": " << eval_loss << "}" << std::endl;
  group->barrier();
  return 0;
}

// A module whose forward calls its BatchNorm through a typed member.
struct MemberNetImpl : torch::nn::Module {
  MemberNetImpl() { bn = register_module("bn", torch::nn::BatchNorm1d(4)); }
  torch::Tensor forward(const torch::Tensor& x) { return bn(x); }
  torch::nn::BatchNorm1d bn{nullptr};
};
TORCH_MODULE(MemberNet);

// BatchNorms inside a member Sequential and a ModuleList: converted in place.
struct OuterImpl : torch::nn::Module {
  OuterImpl() {
    body = register_module("body", torch::nn::Sequential());
    body->push_back(torch::nn::Linear(3, 4));
    body->push_back(torch::nn::BatchNorm1d(4));
    list = register_module("list", torch::nn::ModuleList());
    list->push_back(torch::nn::BatchNorm3d(2));
  }
  torch::nn::Sequential body{nullptr};
  torch::nn::ModuleList list{nullptr};
};
TORCH_MODULE(Outer);

// Each misuse on one line: "<case>: <code> <exit code>: <message>".
int Misuse() {
  auto group = ddp::init_process_group();
  auto expect_error = [](const std::string& name, const std::function<void()>& f) {
    try {
      f();
      std::cout << name << ": no error\n";
    } catch (const ddp::Error& e) {
      std::cout << name << ": " << static_cast<int>(e.code()) << " " << e.exit_code() << ": "
                << e.what() << "\n";
    }
  };
  ddp::SyncBatchNorm bn(8, group);
  expect_error("1d_input", [&] { bn(torch::randn({8})); });
  expect_error("channels", [&] { bn(torch::randn({4, 6})); });
  expect_error("zero_channels", [&] { bn(torch::randn({4, 0})); });
  expect_error("no_group", [&] { ddp::SyncBatchNorm(8, nullptr); });
  MemberNet member;
  expect_error("member", [&] { ddp::convert_sync_batchnorm(member.ptr(), group); });
  std::cout << "member_unchanged: "
            << (member->named_children()["bn"]->as<torch::nn::BatchNorm1dImpl>() != nullptr)
            << "\n";
  // A BatchNorm at the root comes back converted, with the same tensors.
  torch::nn::BatchNorm2d root(3);
  auto converted = ddp::convert_sync_batchnorm(root.ptr(), group);
  auto* sync = converted->as<ddp::SyncBatchNormImpl>();
  std::cout << "root_converted: "
            << (sync != nullptr && sync->weight.is_same(root->weight) &&
                sync->running_var.is_same(root->running_var))
            << "\n";
  // Nested: the same tensors, requires_grad and the eval flag kept; forward goes through.
  Outer outer;
  auto old_bn = outer->body->ptr(1)->as<torch::nn::BatchNorm1dImpl>();
  old_bn->weight.set_requires_grad(false);
  const torch::Tensor old_weight = old_bn->weight, old_mean = old_bn->running_mean;
  const torch::Tensor old_list_var = outer->list->ptr(0)->as<torch::nn::BatchNorm3dImpl>()->running_var;
  outer->eval();
  ddp::convert_sync_batchnorm(outer.ptr(), group);
  auto* body_bn = outer->body->ptr(1)->as<ddp::SyncBatchNormImpl>();
  auto* list_bn = outer->list->ptr(0)->as<ddp::SyncBatchNormImpl>();
  const bool nested =
      body_bn != nullptr && list_bn != nullptr &&
      outer->body->named_children()["1"]->as<ddp::SyncBatchNormImpl>() == body_bn &&
      outer->list->named_children()["0"]->as<ddp::SyncBatchNormImpl>() == list_bn &&
      body_bn->weight.is_same(old_weight) && !body_bn->weight.requires_grad() &&
      body_bn->bias.requires_grad() && body_bn->running_mean.is_same(old_mean) &&
      list_bn->running_var.is_same(old_list_var) && !body_bn->is_training() &&
      outer->body->forward(torch::randn({5, 3})).size(1) == 4 &&
      outer->named_parameters().size() == 6;
  std::cout << "nested_converted: " << nested << "\n";
  // World 1 in training: plain batch norm, whose one-value-per-channel check applies.
  expect_error("one_value", [&] {
    try {
      bn(torch::randn({1, 8}));
    } catch (const c10::Error& e) {
      throw ddp::Error(ddp::ErrorCode::kInvalidArgument, e.what_without_backtrace(), 2);
    }
  });
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model = "mlp";
  bool misuse = false;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--model" && i + 1 < argc) model = argv[++i];
    if (flag == "--misuse") misuse = true;
  }
  try {
    return misuse ? Misuse() : Train(model);
  } catch (const ddp::Error& e) {
    std::cerr << "sync_batch_norm_program: " << e.what() << "\n";
    return e.exit_code();
  }
}
