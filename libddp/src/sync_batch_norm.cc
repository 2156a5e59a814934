// SyncBatchNorm as PyTorch 2.x defines it: torch/nn/modules/batchnorm.py's module
// (momentum, num_batches_tracked, when to synchronise) and torch/nn/modules/_functions.py's
// autograd Function (what is gathered and summed, and when), over libddp's ProcessGroup.
// The five per-channel kernels are ATen's on CUDA; ATen has them on CUDA only, so on the
// CPU the same arithmetic runs in plain tensor ops (sums in double precision).
#include "ddp/sync_batch_norm.h"

#include <torch/autograd.h>
#include <torch/nn/functional/batchnorm.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "libddp/src/api_bridge.h"

namespace ddp {
namespace {

using torch::Tensor;

[[noreturn]] void Invalid(const std::string& message) {
  ThrowIfError(absl::InvalidArgumentError(message));
  throw std::logic_error("unreachable");
}

// The statistics' dtype: ATen's accumulate type for the input (float for half, bfloat16).
at::ScalarType StatType(const Tensor& input) {
  return input.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// Every dimension but the channels' (1).
std::vector<int64_t> ReduceDims(const Tensor& t) {
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < t.dim(); ++d) dims.push_back(d);
  return dims;
}

// A per-channel vector shaped to broadcast against (N, C, ...).
Tensor PerChannel(const Tensor& v, const Tensor& like) {
  std::vector<int64_t> shape(static_cast<size_t>(like.dim()), 1);
  shape[1] = -1;
  return v.view(shape);
}

// torch.batch_norm_stats: per-channel mean and 1/sqrt(biased var + eps).
std::tuple<Tensor, Tensor> Stats(const Tensor& input, double eps) {
  if (input.is_cuda()) return at::batch_norm_stats(input, eps);
  const Tensor x = input.to(at::kDouble);
  const auto dims = ReduceDims(x);
  const Tensor mean = x.mean(dims);
  const Tensor var = (x - PerChannel(mean, x)).pow(2).mean(dims);
  Tensor invstd = (var + eps).rsqrt();
  if (eps == 0) invstd = at::where(var == 0, at::zeros_like(invstd), invstd);
  return {mean.to(StatType(input)), invstd.to(StatType(input))};
}

// torch.batch_norm_gather_stats_with_counts: the global mean and invstd from every
// rank's (mean, invstd, count), and the running statistics' update with the unbiased
// global variance.
std::tuple<Tensor, Tensor> GatherStats(const Tensor& input, const Tensor& mean_all,
                                       const Tensor& invstd_all, const Tensor& running_mean,
                                       const Tensor& running_var, double momentum, double eps,
                                       const Tensor& counts) {
  if (input.is_cuda()) {
    return at::batch_norm_gather_stats_with_counts(input, mean_all, invstd_all, running_mean,
                                                   running_var, momentum, eps, counts);
  }
  const Tensor m = mean_all.to(at::kDouble);
  const Tensor sd = invstd_all.to(at::kDouble).reciprocal();
  const Tensor n_j = counts.to(at::kDouble).unsqueeze(1);
  const Tensor var_j = sd * sd - eps;
  const Tensor n = n_j.sum();
  const Tensor mean = (n_j * m).sum(0) / n;
  const Tensor var_n = (n_j * (var_j + (m - mean).pow(2))).sum(0);
  const Tensor invstd = (var_n / n + eps).rsqrt();
  if (running_mean.defined()) {
    running_mean.copy_(running_mean.to(at::kDouble) * (1 - momentum) + mean * momentum);
  }
  if (running_var.defined()) {
    running_var.copy_(running_var.to(at::kDouble) * (1 - momentum) +
                      var_n / (n - 1) * momentum);
  }
  return {mean.to(mean_all.scalar_type()), invstd.to(mean_all.scalar_type())};
}

// torch.batch_norm_elemt: (x - mean) * invstd * weight + bias.
Tensor Elemt(const Tensor& input, const Tensor& weight, const Tensor& bias, const Tensor& mean,
             const Tensor& invstd, double eps) {
  if (input.is_cuda()) return at::batch_norm_elemt(input, weight, bias, mean, invstd, eps);
  const Tensor x = input.to(mean.scalar_type());
  Tensor out = (x - PerChannel(mean, x)) * PerChannel(invstd, x);
  if (weight.defined()) out = out * PerChannel(weight.to(mean.scalar_type()), x);
  if (bias.defined()) out = out + PerChannel(bias.to(mean.scalar_type()), x);
  return out.to(input.scalar_type());
}

// torch.batch_norm_backward_reduce: this rank's sum(dy) and sum(dy * (x - mean)) per
// channel, and the weight's and bias's gradients from them.
std::tuple<Tensor, Tensor, Tensor, Tensor> BackwardReduce(const Tensor& grad_out,
                                                          const Tensor& input, const Tensor& mean,
                                                          const Tensor& invstd,
                                                          const Tensor& weight, bool input_g,
                                                          bool weight_g, bool bias_g) {
  if (input.is_cuda()) {
    return at::batch_norm_backward_reduce(grad_out, input, mean, invstd, weight, input_g,
                                          weight_g, bias_g);
  }
  const Tensor dy = grad_out.to(at::kDouble);
  const Tensor x = input.to(at::kDouble);
  const auto dims = ReduceDims(x);
  const Tensor sum_dy = dy.sum(dims);
  const Tensor sum_dy_xmu = (dy * (x - PerChannel(mean.to(at::kDouble), x))).sum(dims);
  Tensor grad_weight, grad_bias;
  const at::ScalarType wtype = weight.defined() ? weight.scalar_type() : input.scalar_type();
  if (weight_g) grad_weight = (sum_dy_xmu * invstd.to(at::kDouble)).to(wtype);
  if (bias_g) grad_bias = sum_dy.to(wtype);
  return {sum_dy.to(mean.scalar_type()), sum_dy_xmu.to(mean.scalar_type()), grad_weight,
          grad_bias};
}

// torch.batch_norm_backward_elemt: the input's gradient from the global sums, over the
// global count.
Tensor BackwardElemt(const Tensor& grad_out, const Tensor& input, const Tensor& mean,
                     const Tensor& invstd, const Tensor& weight, const Tensor& sum_dy,
                     const Tensor& sum_dy_xmu, const Tensor& count) {
  if (input.is_cuda()) {
    return at::batch_norm_backward_elemt(grad_out, input, mean, invstd, weight, sum_dy,
                                         sum_dy_xmu, count);
  }
  const at::ScalarType acc = mean.scalar_type();
  const double norm = 1.0 / count.sum().item<double>();
  const Tensor dy = grad_out.to(acc);
  const Tensor x = input.to(acc);
  const Tensor m_dy = sum_dy * norm;
  const Tensor factor_1 = invstd * invstd * sum_dy_xmu * norm;
  const Tensor factor_2 = weight.defined() ? weight.to(acc) * invstd : invstd;
  const Tensor grad = (dy - PerChannel(m_dy, x) - (x - PerChannel(mean, x)) *
                       PerChannel(factor_1, x)) * PerChannel(factor_2, x);
  return grad.to(input.scalar_type());
}

// Sums `t` over the group on the group's device; the result on `t`'s device.
Tensor AllReduceSum(ProcessGroup& group, const Tensor& t) {
  Tensor on_group = t.to(group.device()).contiguous().clone();
  group.all_reduce_sum(on_group);
  return on_group.to(t.device());
}

bool DenseLayout(const Tensor& t) {
  return t.is_contiguous(at::MemoryFormat::ChannelsLast) ||
         t.is_contiguous(at::MemoryFormat::ChannelsLast3d);
}

// LibTorch 1.13's custom Functions take no undefined tensors: a module without affine
// parameters passes this instead (num_features > 0, so a real one is never empty).
Tensor Absent(const Tensor& t, const Tensor& input) {
  return t.defined() ? t : at::empty({0}, input.options());
}
Tensor Present(const Tensor& t) { return t.numel() > 0 ? t : Tensor(); }

// torch.nn.modules._functions.SyncBatchNorm. The running statistics travel as
// non-differentiable arguments (they may be absent).
struct SyncBatchNormFunction : torch::autograd::Function<SyncBatchNormFunction> {
  static Tensor forward(torch::autograd::AutogradContext* ctx, Tensor input, Tensor weight_arg,
                        Tensor bias_arg, c10::optional<Tensor> running_mean_arg,
                        c10::optional<Tensor> running_var_arg, double eps, double momentum,
                        int64_t group_address) {
    auto* group = reinterpret_cast<ProcessGroup*>(group_address);
    Tensor weight = Present(weight_arg);
    const Tensor bias = Present(bias_arg);
    const Tensor running_mean = running_mean_arg.value_or(Tensor());
    const Tensor running_var = running_var_arg.value_or(Tensor());
    if (!DenseLayout(input)) input = input.contiguous();
    if (weight.defined()) weight = weight.contiguous();
    const int64_t channels = input.size(1);
    const int world = group->world_size();
    const at::TensorOptions stat_options = input.options().dtype(StatType(input));

    // Each rank's (mean, invstd, count), C + C + 1 values; zeros (count 0) for an empty
    // input, which still takes part in the collective.
    Tensor combined;
    if (input.numel() > 0) {
      auto [mean, invstd] = Stats(input, eps);
      const Tensor count = at::full({1}, static_cast<double>(input.numel() / channels),
                                    mean.options());
      combined = at::cat({mean, invstd, count}, 0);
    } else {
      combined = at::zeros({2 * channels + 1}, stat_options);
    }
    // All-gather (counts differ across ranks, so a plain sum would not do): every rank
    // fills its own row of zeros and the rows are summed, which adds only zeros.
    Tensor rows = at::zeros({world, 2 * channels + 1}, combined.options());
    rows[group->rank()].copy_(combined);
    rows = AllReduceSum(*group, rows);
    Tensor mean_all = rows.narrow(1, 0, channels);
    Tensor invstd_all = rows.narrow(1, channels, channels);
    Tensor count_all = rows.narrow(1, 2 * channels, 1);
    // Ranks with no rows leave the statistics out.
    const Tensor mask = count_all.squeeze(-1) >= 1;
    count_all = count_all.index({mask});
    mean_all = mean_all.index({mask});
    invstd_all = invstd_all.index({mask});

    Tensor counts = count_all.view(-1);
    if (running_mean.defined() && counts.scalar_type() != running_mean.scalar_type()) {
      counts = counts.to(running_mean.scalar_type());
    }
    auto [mean, invstd] = GatherStats(input, mean_all, invstd_all, running_mean, running_var,
                                      momentum, eps, counts);
    ctx->save_for_backward({input, Absent(weight, input), mean, invstd, count_all.to(at::kInt)});
    ctx->saved_data["group"] = group_address;
    if (input.numel() == 0) return at::empty_like(input);
    return Elemt(input, weight, bias, mean, invstd, eps);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    Tensor grad_output = grads[0];
    if (!DenseLayout(grad_output)) grad_output = grad_output.contiguous();
    const auto saved = ctx->get_saved_variables();
    const Tensor& input = saved[0];
    Tensor weight = Present(saved[1]);
    const Tensor& mean = saved[2];
    const Tensor& invstd = saved[3];
    const Tensor& count = saved[4];
    auto* group = reinterpret_cast<ProcessGroup*>(ctx->saved_data["group"].toInt());
    const bool input_g = ctx->needs_input_grad(0);
    const bool weight_g = ctx->needs_input_grad(1);
    const bool bias_g = ctx->needs_input_grad(2);
    Tensor grad_input, grad_weight, grad_bias;
    if (input.numel() > 0) {
      auto [sum_dy, sum_dy_xmu, gw, gb] =
          BackwardReduce(grad_output, input, mean, invstd, weight, input_g, weight_g, bias_g);
      if (input_g) {
        const int64_t channels = sum_dy.size(0);
        const Tensor sums = AllReduceSum(*group, at::cat({sum_dy, sum_dy_xmu}, 0));
        if (weight.defined() && weight.scalar_type() != mean.scalar_type()) {
          weight = weight.to(mean.scalar_type());
        }
        grad_input = BackwardElemt(grad_output, input, mean, invstd, weight,
                                   sums.narrow(0, 0, channels),
                                   sums.narrow(0, channels, channels), count);
      }
      // The parameters' gradients stay per rank: DDP averages them.
      if (weight.defined() && weight_g) grad_weight = gw;
      if (weight.defined() && bias_g) grad_bias = gb;
    } else {
      // No rows here: still take part in the peers' sum.
      if (input_g) AllReduceSum(*group, at::zeros({2 * input.size(1)}, input.options()));
      // PyTorch returns None for all three, which autograd reads as zeros; zeros proper,
      // so that gradient hooks (DDP's) see a defined gradient.
      if (input_g) grad_input = at::zeros_like(input);
      if (weight.defined() && weight_g) grad_weight = at::zeros_like(weight);
      if (weight.defined() && bias_g) grad_bias = at::zeros_like(weight);
    }
    return {grad_input, grad_weight, grad_bias, Tensor(), Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

std::optional<std::pair<torch::nn::BatchNormOptions, const char*>> BatchNormOf(
    const torch::nn::Module& m);

std::string Dims(const Tensor& t) {
  std::string out = "[";
  for (int64_t d = 0; d < t.dim(); ++d) absl::StrAppend(&out, d ? ", " : "", t.size(d));
  return out + "]";
}

}  // namespace

SyncBatchNormImpl::SyncBatchNormImpl(const torch::nn::BatchNormOptions& options_,
                                     std::shared_ptr<ProcessGroup> group)
    : options(options_), group_(std::move(group)) {
  if (group_ == nullptr) {
    Invalid("SyncBatchNorm: no process group; pass the one ddp::init_process_group() "
            "returned (with a single process, use torch::nn::BatchNorm1d/2d/3d)");
  }
  if (options.num_features() <= 0) {
    Invalid(absl::StrCat("SyncBatchNorm: num_features must be positive, got ",
                         options.num_features()));
  }
  reset();
}

void SyncBatchNormImpl::reset() {
  const int64_t c = options.num_features();
  if (options.affine()) {
    weight = register_parameter("weight", torch::ones({c}));
    bias = register_parameter("bias", torch::zeros({c}));
  } else {
    weight = register_parameter("weight", Tensor(), /*requires_grad=*/false);
    bias = register_parameter("bias", Tensor(), /*requires_grad=*/false);
  }
  if (options.track_running_stats()) {
    running_mean = register_buffer("running_mean", torch::zeros({c}));
    running_var = register_buffer("running_var", torch::ones({c}));
    num_batches_tracked =
        register_buffer("num_batches_tracked", torch::tensor(0, torch::dtype(torch::kLong)));
  } else {
    running_mean = register_buffer("running_mean", Tensor());
    running_var = register_buffer("running_var", Tensor());
    num_batches_tracked = register_buffer("num_batches_tracked", Tensor());
  }
}

void SyncBatchNormImpl::reset_running_stats() {
  if (options.track_running_stats()) {
    running_mean.zero_();
    running_var.fill_(1);
    num_batches_tracked.zero_();
  }
}

void SyncBatchNormImpl::reset_parameters() {
  reset_running_stats();
  if (options.affine()) {
    torch::NoGradGuard no_grad;
    weight.fill_(1);
    bias.zero_();
  }
}

void SyncBatchNormImpl::pretty_print(std::ostream& stream) const {
  stream << "ddp::SyncBatchNorm(" << options.num_features() << ", eps=" << options.eps()
         << ", momentum=";
  if (options.momentum().has_value()) {
    stream << *options.momentum();
  } else {
    stream << "None";
  }
  stream << ", affine=" << (options.affine() ? "true" : "false")
         << ", track_running_stats=" << (options.track_running_stats() ? "true" : "false")
         << ")";
}

Tensor SyncBatchNormImpl::forward(const Tensor& input) {
  if (input.dim() < 2) {
    Invalid(absl::StrCat("SyncBatchNorm: expected at least 2D input (got ", input.dim(),
                         "D input of shape ", Dims(input), "); it normalises (N, C, ...) over "
                         "C = num_features = ", options.num_features(),
                         " channels: add the batch dimension (x.unsqueeze(0))"));
  }
  if (input.size(1) == 0) {
    Invalid("SyncBatchNorm: number of input channels should be non-zero (input of shape " +
            Dims(input) + ")");
  }
  if (input.size(1) != options.num_features()) {
    Invalid(absl::StrCat("SyncBatchNorm: the input of shape ", Dims(input), " has ",
                         input.size(1), " channels (dim 1), but num_features is ",
                         options.num_features(), ": build it with num_features = ",
                         input.size(1), " or put the channels in dim 1"));
  }
  // batchnorm.py's SyncBatchNorm.forward.
  double factor = options.momentum().value_or(0.0);
  if (is_training() && options.track_running_stats()) {
    num_batches_tracked.add_(1);
    factor = options.momentum().has_value()
                 ? *options.momentum()
                 : 1.0 / static_cast<double>(num_batches_tracked.item<int64_t>());
  }
  const bool bn_training = is_training() || (!running_mean.defined() && !running_var.defined());
  const bool use_buffers = !is_training() || options.track_running_stats();
  const Tensor mean = use_buffers ? running_mean : Tensor();
  const Tensor var = use_buffers ? running_var : Tensor();
  // Statistics over the ranks in training only, and only with more than one rank: else
  // it is plain batch norm, as in PyTorch.
  if (!(bn_training && is_training() && group_->world_size() > 1)) {
    return torch::nn::functional::detail::batch_norm(input, mean, var, weight, bias, bn_training,
                                                     factor, options.eps());
  }
  auto optional = [](const Tensor& t) {
    return t.defined() ? c10::optional<Tensor>(t) : c10::optional<Tensor>();
  };
  return SyncBatchNormFunction::apply(input, Absent(weight, input), Absent(bias, input),
                                      optional(mean), optional(var), options.eps(), factor,
                                      reinterpret_cast<int64_t>(group_.get()));
}

namespace {

struct Swap {
  std::shared_ptr<torch::nn::Module> parent;  // Null: the root itself.
  std::string name;                           // Its path, for errors.
  std::string key;                            // Its name in the parent.
  std::shared_ptr<torch::nn::Module> old_module;
};

// The BatchNorm's options, with its flavour's name; nullopt for other modules.
std::optional<std::pair<torch::nn::BatchNormOptions, const char*>> BatchNormOf(
    const torch::nn::Module& m) {
  if (const auto* bn = dynamic_cast<const torch::nn::BatchNorm1dImpl*>(&m)) {
    return std::make_pair(bn->options, "torch::nn::BatchNorm1d");
  }
  if (const auto* bn = dynamic_cast<const torch::nn::BatchNorm2dImpl*>(&m)) {
    return std::make_pair(bn->options, "torch::nn::BatchNorm2d");
  }
  if (const auto* bn = dynamic_cast<const torch::nn::BatchNorm3dImpl*>(&m)) {
    return std::make_pair(bn->options, "torch::nn::BatchNorm3d");
  }
  return std::nullopt;
}

void FindBatchNorms(const std::shared_ptr<torch::nn::Module>& module, const std::string& path,
                    std::vector<Swap>& out) {
  for (const auto& item : module->named_children()) {
    const std::string child_path = path.empty() ? item.key() : path + "." + item.key();
    if (BatchNormOf(*item.value())) {
      out.push_back({module, child_path, item.key(), item.value()});
    } else {
      FindBatchNorms(item.value(), child_path, out);
    }
  }
}

SyncBatchNorm Converted(const torch::nn::Module& old, const std::shared_ptr<ProcessGroup>& group) {
  return SyncBatchNorm(std::make_shared<SyncBatchNormImpl>(old, group));
}

}  // namespace

SyncBatchNormImpl::SyncBatchNormImpl(const torch::nn::Module& batch_norm,
                                     std::shared_ptr<ProcessGroup> group)
    : options(BatchNormOf(batch_norm) ? BatchNormOf(batch_norm)->first
                                      : torch::nn::BatchNormOptions(1)),
      group_(std::move(group)) {
  const auto bn = BatchNormOf(batch_norm);
  if (!bn) {
    Invalid("SyncBatchNorm: '" + batch_norm.name() +
            "' is not a torch::nn::BatchNorm1d, BatchNorm2d or BatchNorm3d");
  }
  if (group_ == nullptr) {
    Invalid("SyncBatchNorm: no process group; pass the one ddp::init_process_group() "
            "returned");
  }
  const auto params = batch_norm.named_parameters(/*recurse=*/false);
  const auto buffers = batch_norm.named_buffers(/*recurse=*/false);
  auto param = [&](const char* n) { return params.contains(n) ? params[n] : Tensor(); };
  auto buffer = [&](const char* n) { return buffers.contains(n) ? buffers[n] : Tensor(); };
  // register_parameter sets requires_grad: keep each one's own (a frozen weight stays so).
  const Tensor w = param("weight"), b = param("bias");
  weight = register_parameter("weight", w, w.defined() && w.requires_grad());
  bias = register_parameter("bias", b, b.defined() && b.requires_grad());
  running_mean = register_buffer("running_mean", buffer("running_mean"));
  running_var = register_buffer("running_var", buffer("running_var"));
  num_batches_tracked = register_buffer("num_batches_tracked", buffer("num_batches_tracked"));
  train(batch_norm.is_training());
}

std::shared_ptr<torch::nn::Module> convert_sync_batchnorm(
    std::shared_ptr<torch::nn::Module> module, std::shared_ptr<ProcessGroup> group) {
  if (module == nullptr) Invalid("convert_sync_batchnorm: the module is null");
  if (group == nullptr) {
    Invalid("convert_sync_batchnorm: no process group; pass the one "
            "ddp::init_process_group() returned");
  }
  if (BatchNormOf(*module)) return Converted(*module, group).ptr();

  std::vector<Swap> swaps;
  FindBatchNorms(module, "", swaps);
  // Every BatchNorm must be reachable through the tree alone, before anything changes.
  for (const Swap& s : swaps) {
    const bool in_container =
        dynamic_cast<torch::nn::SequentialImpl*>(s.parent.get()) != nullptr ||
        dynamic_cast<torch::nn::ModuleListImpl*>(s.parent.get()) != nullptr;
    // Held by: this Swap, the parent's registration, and the container's list.
    const long expected = 2 + (in_container ? 1 : 0);
    if (s.old_module.use_count() > expected) {
      Invalid(absl::StrCat(
          "convert_sync_batchnorm: '", s.name, "' (", BatchNormOf(*s.old_module)->second,
          ") is also held outside the module tree, typically by a member of ", s.parent->name(),
          " that its forward() calls; LibTorch cannot re-point that member, so it would stay "
          "a plain BatchNorm. Declare the member as ddp::SyncBatchNorm, or build that part "
          "as a torch::nn::Sequential (nothing was converted)"));
    }
  }
  for (Swap& s : swaps) {
    SyncBatchNorm sync = Converted(*s.old_module, group);
    if (auto* seq = dynamic_cast<torch::nn::SequentialImpl*>(s.parent.get())) {
      for (auto& any : *seq) {
        if (any.ptr().get() == s.old_module.get()) any = torch::nn::AnyModule(sync);
      }
    } else if (auto* list = dynamic_cast<torch::nn::ModuleListImpl*>(s.parent.get())) {
      for (auto& m : *list) {
        if (m.get() == s.old_module.get()) m = sync.ptr();
      }
    }
    s.parent->replace_module(s.key, sync.ptr());
  }
  return module;
}

}  // namespace ddp
