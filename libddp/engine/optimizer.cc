#include "libddp/engine/optimizer.h"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <ATen/ops/_foreach_add.h>
#include <ATen/ops/_foreach_mul.h>
#include <torch/version.h>
#if TORCH_VERSION_MAJOR >= 2
#include <ATen/ops/_foreach_addcdiv.h>
#include <ATen/ops/_foreach_addcmul.h>
#include <ATen/ops/_foreach_div.h>
#include <ATen/ops/_foreach_lerp.h>
#include <ATen/ops/_foreach_maximum.h>
#include <ATen/ops/_foreach_sqrt.h>
#include <ATen/ops/maximum.h>
#endif

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "ddp/fused_optimizer.h"
#include "libddp/engine/torch_compat.h"

namespace ddp {
namespace {

using c10::IValue;
using GenericDict = c10::impl::GenericDict;

GenericDict StringDict() { return GenericDict(c10::StringType::get(), c10::AnyType::get()); }

IValue Get(const GenericDict& d, const std::string& key) {
  auto it = d.find(key);
  return it == d.end() ? IValue() : it->value();
}

// A parameter's state as torch.optim keeps it, on the CPU (as the model is saved, so a
// checkpoint from a GPU run loads anywhere): Adam's step count as a float tensor (as
// torch.optim.Adam keeps it since 1.12), fused or not.
IValue EncodeState(const torch::optim::OptimizerParamState& state) {
  GenericDict d = StringDict();
  auto adam = [&d](double step, const at::Tensor& avg, const at::Tensor& avg_sq,
                   const at::Tensor& max_sq) {
    d.insert("step", at::scalar_tensor(step, at::kFloat));
    d.insert("exp_avg", avg.cpu());
    d.insert("exp_avg_sq", avg_sq.cpu());
    if (max_sq.defined()) d.insert("max_exp_avg_sq", max_sq.cpu());
  };
  if (const auto* f = dynamic_cast<const FusedAdamParamState*>(&state)) {
    // One read of the device's count, at a checkpoint (never inside a step).
    adam(f->step().item<double>(), f->exp_avg(), f->exp_avg_sq(), f->max_exp_avg_sq());
  } else if (const auto* a = dynamic_cast<const torch::optim::AdamParamState*>(&state)) {
    adam(static_cast<double>(a->step()), a->exp_avg(), a->exp_avg_sq(), a->max_exp_avg_sq());
  } else if (const auto* w = dynamic_cast<const torch::optim::AdamWParamState*>(&state)) {
    adam(static_cast<double>(w->step()), w->exp_avg(), w->exp_avg_sq(), w->max_exp_avg_sq());
  } else if (const auto* g = dynamic_cast<const torch::optim::SGDParamState*>(&state)) {
    d.insert("momentum_buffer",
             g->momentum_buffer().defined() ? IValue(g->momentum_buffer().cpu()) : IValue());
  }
  return d;
}

// `from` (a checkpoint's) into `*to`: written into the tensor there when it has the
// parameter's shape already (in place: a captured step goes on reading it), else into
// a new one like the parameter (its dtype, device and layout: torch.optim's
// load_state_dict casts the state as its parameter, and the fused kernels want the
// parameter's strides).
void Restore(const at::Tensor& from, const at::Tensor& p, at::Tensor* to) {
  at::NoGradGuard no_grad;
  if (to->defined() && to->sizes() == p.sizes()) {
    to->copy_(from);
  } else {
    *to = at::empty_like(p, at::MemoryFormat::Preserve).copy_(from);
  }
}

// Restores one parameter's Adam state (`State`: LibTorch's Adam(W)ParamState with an
// integer count, or FusedAdamParamState with a tensor one).
template <typename State>
absl::Status RestoreAdam(const GenericDict& d, const at::Tensor& p,
                         std::unique_ptr<torch::optim::OptimizerParamState>* slot) {
  IValue step = Get(d, "step"), avg = Get(d, "exp_avg"), avg_sq = Get(d, "exp_avg_sq");
  if (!step.isTensor() || !avg.isTensor() || !avg_sq.isTensor() ||
      avg.toTensor().sizes() != p.sizes() || avg_sq.toTensor().sizes() != p.sizes()) {
    return absl::InvalidArgumentError("optimizer state does not fit adam for these parameters");
  }
  IValue max_sq = Get(d, "max_exp_avg_sq");
  if (max_sq.isTensor() && max_sq.toTensor().sizes() != p.sizes()) {
    return absl::InvalidArgumentError("optimizer state does not fit adam for these parameters");
  }
  auto* s = dynamic_cast<State*>(slot->get());
  if (s == nullptr) {
    *slot = std::make_unique<State>();
    s = static_cast<State*>(slot->get());
  }
  at::Tensor t = s->exp_avg();
  Restore(avg.toTensor(), p, &t);
  s->exp_avg(t);
  t = s->exp_avg_sq();
  Restore(avg_sq.toTensor(), p, &t);
  s->exp_avg_sq(t);
  if (max_sq.isTensor()) {
    t = s->max_exp_avg_sq();
    Restore(max_sq.toTensor(), p, &t);
    s->max_exp_avg_sq(t);
  }
  if constexpr (std::is_same_v<State, FusedAdamParamState>) {
    at::NoGradGuard no_grad;
    if (!s->step().defined()) {
      s->step(at::empty({}, at::TensorOptions().dtype(at::kFloat).device(p.device())));
    }
    s->step().copy_(step.toTensor().reshape({}));
  } else {
    s->step(static_cast<int64_t>(step.toTensor().item<double>()));
  }
  return absl::OkStatus();
}

// The parameters of `opt`'s param groups, in their order: torch.optim's numbering.
std::vector<at::Tensor> AllParams(torch::optim::Optimizer& opt) {
  std::vector<at::Tensor> out;
  for (const auto& group : opt.param_groups()) {
    out.insert(out.end(), group.params().begin(), group.params().end());
  }
  return out;
}

// The options of one param group of `spec`'s optimizer, with `weight_decay`.
std::unique_ptr<torch::optim::OptimizerOptions> OptionsOf(const OptimizerSpec& spec,
                                                          double weight_decay) {
  switch (spec.kind) {
    case OptimizerKind::kSgd:
      return std::make_unique<torch::optim::SGDOptions>(torch::optim::SGDOptions(spec.lr)
                                                            .momentum(spec.momentum)
                                                            .nesterov(spec.nesterov)
                                                            .weight_decay(weight_decay));
    case OptimizerKind::kAdam:
      return std::make_unique<torch::optim::AdamOptions>(torch::optim::AdamOptions(spec.lr)
                                                             .betas({spec.beta1, spec.beta2})
                                                             .eps(spec.eps)
                                                             .weight_decay(weight_decay)
                                                             .amsgrad(spec.amsgrad));
    case OptimizerKind::kAdamW:
      return std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(spec.lr)
                                                              .betas({spec.beta1, spec.beta2})
                                                              .eps(spec.eps)
                                                              .weight_decay(weight_decay)
                                                              .amsgrad(spec.amsgrad));
  }
  return nullptr;
}

// torch.optim.SGD's multi-tensor path (_multi_tensor_sgd), which PyTorch takes by default
// when every parameter is on a GPU: the same update, element for element, as
// torch::optim::SGD's loop over the parameters, in a few kernel launches for all of them
// instead of two or three per parameter. Its state is SGD's own (SGDParamState), so
// checkpoints and OptimizerStateDict see a torch::optim::SGD.
class MultiTensorSgd final : public torch::optim::SGD {
 public:
  using torch::optim::SGD::SGD;

  at::Tensor step(LossClosure closure = nullptr) override {
    at::NoGradGuard no_grad;
    at::Tensor loss = {};
    if (closure != nullptr) {
      at::AutoGradMode enable_grad(true);
      loss = closure();
    }
    for (auto& group : param_groups_) {
      const auto& o = static_cast<const torch::optim::SGDOptions&>(group.options());
      std::vector<at::Tensor> params, grads;
      for (const at::Tensor& p : group.params()) {
        if (!p.grad().defined()) continue;
        params.push_back(p);
        grads.push_back(p.grad());
      }
      if (params.empty()) continue;
      if (o.weight_decay() != 0) grads = at::_foreach_add(grads, params, o.weight_decay());
      std::vector<at::Tensor> steps = grads;  // What each parameter moves by, times -lr.
      if (o.momentum() != 0) {
        // A parameter's first step takes its gradient as the buffer (as SGD's loop does);
        // the others update theirs together.
        std::vector<at::Tensor> bufs, buf_grads;
        std::vector<at::Tensor> all_bufs(params.size());
        for (size_t i = 0; i < params.size(); ++i) {
          auto key = OptimizerStateKey(*this, params[i]);
          auto it = state_.find(key);
          if (it == state_.end()) {
            auto s = std::make_unique<torch::optim::SGDParamState>();
            s->momentum_buffer(at::clone(grads[i]).detach());
            all_bufs[i] = s->momentum_buffer();
            state_[key] = std::move(s);
          } else {
            all_bufs[i] =
                static_cast<torch::optim::SGDParamState&>(*it->second).momentum_buffer();
            bufs.push_back(all_bufs[i]);
            buf_grads.push_back(grads[i]);
          }
        }
        if (!bufs.empty()) {
          at::_foreach_mul_(bufs, o.momentum());
          at::_foreach_add_(bufs, buf_grads, 1 - o.dampening());
        }
        steps = o.nesterov() ? at::_foreach_add(grads, all_bufs, o.momentum()) : all_bufs;
      }
      at::_foreach_add_(params, steps, -o.lr());
    }
    return loss;
  }
};

#if TORCH_VERSION_MAJOR >= 2
// torch.optim.Adam and AdamW as PyTorch 2.x computes them. LibTorch's own
// torch::optim::Adam(W) decays the first moment with mul_ and add_, as torch.optim did up
// to 1.13; since 2.0 torch.optim does it with one lerp_, which rounds differently in the
// last bit. Those bits are enough for a bf16 run to leave PyTorch's: a weight whose fp32
// value moves by one ulp can round to another bf16 value in the next forward (seen on
// an H100 at NCCL world 1, 3.7e-4 apart after 60 steps). Each path below is the one
// torch.optim takes: the loop over parameters (_single_tensor_adam, its default on the
// CPU) or the multi-tensor one (_multi_tensor_adam, its default when every parameter is
// on a GPU), op for op. The state stays LibTorch's (AdamParamState, AdamWParamState), so
// checkpoints and OptimizerStateDict see a torch::optim::Adam(W). 1.13's torch.optim is
// LibTorch's arithmetic, so there the LibTorch classes are used as they are.
template <typename Base, typename Options, typename State, bool kDecoupled>
class PyTorchAdam final : public Base {
 public:
  PyTorchAdam(const std::vector<torch::optim::OptimizerParamGroup>& groups,
              const Options& options, bool multi_tensor)
      : Base(groups, options), multi_tensor_(multi_tensor) {}

  at::Tensor step(torch::optim::Optimizer::LossClosure closure = nullptr) override {
    at::NoGradGuard no_grad;
    at::Tensor loss = {};
    if (closure != nullptr) {
      at::AutoGradMode enable_grad(true);
      loss = closure();
    }
    for (auto& group : this->param_groups_) {
      const auto& o = static_cast<const Options&>(group.options());
      std::vector<at::Tensor> params, grads, avgs, avg_sqs, max_sqs;
      std::vector<int64_t> steps;
      for (const at::Tensor& p : group.params()) {
        if (!p.grad().defined()) continue;
        auto key = OptimizerStateKey(*this, p);
        auto it = this->state_.find(key);
        if (it == this->state_.end()) {  // As LibTorch's Adam starts a parameter's state.
          auto s = std::make_unique<State>();
          s->step(0);
          s->exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
          s->exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
          if (o.amsgrad()) s->max_exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
          it = this->state_.emplace(key, std::move(s)).first;
        }
        auto& s = static_cast<State&>(*it->second);
        s.step(s.step() + 1);
        params.push_back(p);
        grads.push_back(p.grad());
        avgs.push_back(s.exp_avg());
        avg_sqs.push_back(s.exp_avg_sq());
        if (o.amsgrad()) max_sqs.push_back(s.max_exp_avg_sq());
        steps.push_back(s.step());
      }
      if (params.empty()) continue;
      if (multi_tensor_) {
        MultiTensorStep(o, params, grads, avgs, avg_sqs, max_sqs, steps);
      } else {
        for (size_t i = 0; i < params.size(); ++i) {
          SingleTensorStep(o, params[i], grads[i], avgs[i], avg_sqs[i],
                           o.amsgrad() ? max_sqs[i] : at::Tensor(), steps[i]);
        }
      }
    }
    return loss;
  }

 private:
  static double Lr(const Options& o) { return o.lr(); }
  static double Beta1(const Options& o) { return std::get<0>(o.betas()); }
  static double Beta2(const Options& o) { return std::get<1>(o.betas()); }

  // _single_tensor_adam, capturable and differentiable off.
  static void SingleTensorStep(const Options& o, at::Tensor& p, at::Tensor grad,
                               at::Tensor& exp_avg, at::Tensor& exp_avg_sq, at::Tensor max_sq,
                               int64_t step) {
    const double lr = Lr(o), beta1 = Beta1(o), beta2 = Beta2(o), wd = o.weight_decay();
    if (wd != 0) {
      if (kDecoupled) {
        p.mul_(1 - lr * wd);
      } else {
        grad = grad.add(p, wd);
      }
    }
    exp_avg.lerp_(grad, 1 - beta1);
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1 - beta2);
    const double bias_correction1 = 1 - std::pow(beta1, static_cast<double>(step));
    const double bias_correction2 = 1 - std::pow(beta2, static_cast<double>(step));
    const double step_size = lr / bias_correction1;
    const double bias_correction2_sqrt = std::pow(bias_correction2, 0.5);  // Python's **0.5.
    at::Tensor denom;
    if (o.amsgrad()) {
      at::maximum_out(max_sq, max_sq, exp_avg_sq);
      denom = (max_sq.sqrt() / bias_correction2_sqrt).add_(o.eps());
    } else {
      denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(o.eps());
    }
    p.addcdiv_(exp_avg, denom, -step_size);
  }

  // _multi_tensor_adam, capturable off (one device and dtype: a GPU's fp32 parameters).
  static void MultiTensorStep(const Options& o, std::vector<at::Tensor>& params,
                              std::vector<at::Tensor> grads, std::vector<at::Tensor>& avgs,
                              std::vector<at::Tensor>& avg_sqs, std::vector<at::Tensor>& max_sqs,
                              const std::vector<int64_t>& steps) {
    const double lr = Lr(o), beta1 = Beta1(o), beta2 = Beta2(o), wd = o.weight_decay();
    if (wd != 0) {
      if (kDecoupled) {
        at::_foreach_mul_(params, 1 - lr * wd);
      } else {
        grads = at::_foreach_add(grads, params, wd);
      }
    }
    at::_foreach_lerp_(avgs, grads, 1 - beta1);
    at::_foreach_mul_(avg_sqs, beta2);
    at::_foreach_addcmul_(avg_sqs, grads, grads, 1 - beta2);
    std::vector<c10::Scalar> step_sizes, bias_correction2_sqrts;
    for (int64_t step : steps) {
      const double bias_correction1 = 1 - std::pow(beta1, static_cast<double>(step));
      const double bias_correction2 = 1 - std::pow(beta2, static_cast<double>(step));
      step_sizes.emplace_back((lr / bias_correction1) * -1);
      bias_correction2_sqrts.emplace_back(std::pow(bias_correction2, 0.5));
    }
    std::vector<at::Tensor> denoms;
    if (o.amsgrad()) {
      at::_foreach_maximum_(max_sqs, avg_sqs);
      denoms = at::_foreach_sqrt(max_sqs);
    } else {
      denoms = at::_foreach_sqrt(avg_sqs);
    }
    at::_foreach_div_(denoms, bias_correction2_sqrts);
    at::_foreach_add_(denoms, o.eps());
    at::_foreach_addcdiv_(params, avgs, denoms, step_sizes);
  }

  bool multi_tensor_;
};
#endif

}  // namespace

absl::StatusOr<OptimizerSpec> OptimizerSpecOf(torch::optim::Optimizer& opt) {
  if (opt.param_groups().size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint: the optimizer has ", opt.param_groups().size(),
        " param groups; checkpoints support optimizers with one"));
  }
  const bool fused = dynamic_cast<FusedOptimizer*>(&opt) != nullptr;
  if (!fused && dynamic_cast<torch::optim::SGD*>(&opt) == nullptr &&
      dynamic_cast<torch::optim::Adam*>(&opt) == nullptr &&
      dynamic_cast<torch::optim::AdamW*>(&opt) == nullptr) {
    return absl::InvalidArgumentError(
        "checkpoint: the optimizer is not torch::optim::SGD, Adam or AdamW (or libddp's "
        "FusedSGD, FusedAdam or FusedAdamW), whose state checkpoints know how to save");
  }
  const torch::optim::OptimizerOptions& options = opt.param_groups()[0].options();
  OptimizerSpec spec;
  spec.fused = fused ? FusedPolicy::kTrue : FusedPolicy::kFalse;
  if (const auto* o = dynamic_cast<const torch::optim::SGDOptions*>(&options)) {
    spec.kind = OptimizerKind::kSgd;
    spec.lr = o->lr();
    spec.momentum = o->momentum();
    spec.nesterov = o->nesterov();
    spec.weight_decay = o->weight_decay();
    return spec;
  }
  auto adam_like = [&](const auto& o, OptimizerKind kind) {
    spec.kind = kind;
    spec.lr = o.lr();
    spec.beta1 = std::get<0>(o.betas());
    spec.beta2 = std::get<1>(o.betas());
    spec.eps = o.eps();
    spec.weight_decay = o.weight_decay();
    spec.amsgrad = o.amsgrad();
    return spec;
  };
  if (const auto* o = dynamic_cast<const torch::optim::AdamWOptions*>(&options)) {
    return adam_like(*o, OptimizerKind::kAdamW);
  }
  if (const auto* o = dynamic_cast<const torch::optim::AdamOptions*>(&options)) {
    return adam_like(*o, OptimizerKind::kAdam);
  }
  return absl::InvalidArgumentError(
      "checkpoint: the optimizer's param group has options of another kind than SGD's, "
      "Adam's or AdamW's");
}

absl::StatusOr<OptimizerSpec> ResolveFused(OptimizerSpec spec,
                                           const std::vector<at::Tensor>& params) {
  constexpr bool kHasKernels = TORCH_VERSION_MAJOR >= 2;
  switch (spec.fused) {
    case FusedPolicy::kFalse:
      break;
    case FusedPolicy::kTrue:
      if (!kHasKernels) {
        return absl::FailedPreconditionError(absl::StrCat(
            "train.optimizer.fused: true needs LibTorch 2.x (PyTorch's fused optimizer kernels "
            "came with 2.0), and this ddp-trainer is built against LibTorch ", TORCH_VERSION,
            ": set fused to auto (here: not fused) or false, or run the job on workers whose "
            "ddp-trainer is built against LibTorch 2.x (docs/torch.md)"));
      }
      break;
    case FusedPolicy::kAuto:
      spec.fused = kHasKernels && !params.empty() &&
                           std::all_of(params.begin(), params.end(),
                                       [](const at::Tensor& p) { return p.is_cuda(); })
                       ? FusedPolicy::kTrue
                       : FusedPolicy::kFalse;
      break;
  }
  return spec;
}

std::vector<torch::optim::OptimizerParamGroup> OptimizerParamGroups(
    const OptimizerSpec& spec, const std::vector<at::Tensor>& params) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  if (spec.weight_decay_params == WeightDecayParams::kAll) {
    groups.emplace_back(params, OptionsOf(spec, spec.weight_decay));
    return groups;
  }
  std::vector<at::Tensor> decay, no_decay;
  for (const at::Tensor& p : params) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  groups.emplace_back(decay, OptionsOf(spec, spec.weight_decay));
  groups.emplace_back(no_decay, OptionsOf(spec, 0.0));
  return groups;
}

std::unique_ptr<torch::optim::Optimizer> MakeOptimizer(
    const OptimizerSpec& spec, std::vector<torch::optim::OptimizerParamGroup> groups,
    std::optional<bool> multi_tensor) {
  // PyTorch's default (torch.optim's _default_to_fused_or_foreach): the multi-tensor
  // path when every parameter is on a GPU.
  bool any = false, all_cuda = true;
  for (const auto& group : groups) {
    for (const at::Tensor& p : group.params()) {
      any = true;
      all_cuda = all_cuda && p.is_cuda();
    }
  }
  const bool foreach = multi_tensor.value_or(any && all_cuda);
  const std::unique_ptr<torch::optim::OptimizerOptions> defaults =
      OptionsOf(spec, spec.weight_decay);
  switch (spec.kind) {
    case OptimizerKind::kSgd: {
      const auto& options = static_cast<const torch::optim::SGDOptions&>(*defaults);
      if (foreach) return std::make_unique<MultiTensorSgd>(groups, options);
      return std::make_unique<torch::optim::SGD>(groups, options);
    }
    case OptimizerKind::kAdam: {
      const auto& options = static_cast<const torch::optim::AdamOptions&>(*defaults);
#if TORCH_VERSION_MAJOR >= 2
      return std::make_unique<PyTorchAdam<torch::optim::Adam, torch::optim::AdamOptions,
                                          torch::optim::AdamParamState, false>>(groups, options,
                                                                                foreach);
#else
      return std::make_unique<torch::optim::Adam>(groups, options);
#endif
    }
    case OptimizerKind::kAdamW: {
      const auto& options = static_cast<const torch::optim::AdamWOptions&>(*defaults);
#if TORCH_VERSION_MAJOR >= 2
      return std::make_unique<PyTorchAdam<torch::optim::AdamW, torch::optim::AdamWOptions,
                                          torch::optim::AdamWParamState, true>>(groups, options,
                                                                                foreach);
#else
      return std::make_unique<torch::optim::AdamW>(groups, options);
#endif
    }
  }
  return nullptr;
}

std::unique_ptr<torch::optim::Optimizer> MakeOptimizer(const OptimizerSpec& spec,
                                                       const std::vector<at::Tensor>& params,
                                                       std::optional<bool> multi_tensor) {
  return MakeOptimizer(spec, OptimizerParamGroups(spec, params), multi_tensor);
}

c10::IValue OptimizerStateDict(const OptimizerSpec& spec, torch::optim::Optimizer& opt) {
  GenericDict state(c10::IntType::get(), c10::AnyType::get());
  c10::impl::GenericList groups(c10::AnyType::get());
  int64_t index = 0;
  for (const auto& group : opt.param_groups()) {
    GenericDict g = StringDict();
    // The lr now in force (train.lr_schedule moves it), as torch.optim saves it.
    g.insert("lr", group.options().get_lr());
    switch (spec.kind) {
      case OptimizerKind::kSgd: {
        const auto& o = static_cast<const torch::optim::SGDOptions&>(group.options());
        g.insert("weight_decay", o.weight_decay());
        g.insert("momentum", o.momentum());
        g.insert("dampening", o.dampening());
        g.insert("nesterov", o.nesterov());
        break;
      }
      case OptimizerKind::kAdam:
      case OptimizerKind::kAdamW: {
        auto adam = [&g](const auto& o) {
          g.insert("weight_decay", o.weight_decay());
          g.insert("betas",
                   c10::ivalue::Tuple::create({std::get<0>(o.betas()), std::get<1>(o.betas())}));
          g.insert("eps", o.eps());
          g.insert("amsgrad", o.amsgrad());
        };
        if (spec.kind == OptimizerKind::kAdam) {
          adam(static_cast<const torch::optim::AdamOptions&>(group.options()));
        } else {
          adam(static_cast<const torch::optim::AdamWOptions&>(group.options()));
        }
        g.insert("capturable", false);
        break;
      }
    }
    g.insert("maximize", false);
    g.insert("foreach", IValue());
    g.insert("differentiable", false);
    g.insert("fused", spec.fused == FusedPolicy::kTrue);
    c10::List<int64_t> ids;
    for (const at::Tensor& p : group.params()) {
      auto it = opt.state().find(OptimizerStateKey(opt, p));
      if (it != opt.state().end()) state.insert(index, EncodeState(*it->second));
      ids.push_back(index++);
    }
    g.insert("params", ids);
    groups.push_back(g);
  }
  GenericDict out = StringDict();
  out.insert("state", state);
  out.insert("param_groups", groups);
  return out;
}

absl::Status LoadOptimizerStateDict(const OptimizerSpec& spec, torch::optim::Optimizer& opt,
                                    const c10::IValue& state_dict) {
  if (!state_dict.isGenericDict()) {
    return absl::InvalidArgumentError("checkpoint: optimizer entry is not a state dict");
  }
  IValue state_iv = Get(state_dict.toGenericDict(), "state");
  if (!state_iv.isGenericDict()) {
    return absl::InvalidArgumentError("checkpoint: optimizer state dict has no 'state'");
  }
  // The param groups must be this optimizer's: the parameters are numbered across them.
  IValue groups_iv = Get(state_dict.toGenericDict(), "param_groups");
  if (groups_iv.isList()) {
    const auto saved = groups_iv.toList();
    std::vector<size_t> want, got;
    for (const auto& group : opt.param_groups()) want.push_back(group.params().size());
    for (size_t g = 0; g < saved.size(); ++g) {
      const IValue ids = saved.get(g).isGenericDict()
                             ? Get(saved.get(g).toGenericDict(), "params")
                             : IValue();
      got.push_back(ids.isList() ? ids.toList().size() : 0);
    }
    if (got != want) {
      auto sizes = [](const std::vector<size_t>& v) {
        std::string out;
        for (size_t n : v) absl::StrAppend(&out, out.empty() ? "" : ", ", n);
        return out;
      };
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint: the optimizer state has ", got.size(), " param group(s) of [",
          sizes(got), "] parameters, this run's optimizer ", want.size(), " of [", sizes(want),
          "] (train.optimizer.weight_decay_params, or the model, changed?)"));
    }
  }
  const std::vector<at::Tensor> params = AllParams(opt);
  const bool fused = spec.fused == FusedPolicy::kTrue;
  for (const auto& entry : state_iv.toGenericDict()) {
    if (!entry.key().isInt()) {
      return absl::InvalidArgumentError(
          "checkpoint: optimizer state is keyed by something other than parameter indices");
    }
    const int64_t i = entry.key().toInt();
    if (i < 0 || i >= static_cast<int64_t>(params.size()) || !entry.value().isGenericDict()) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint: optimizer state for parameter ", i, " does not fit"));
    }
    const GenericDict d = entry.value().toGenericDict();
    const at::Tensor& p = params[static_cast<size_t>(i)];
    auto& slot = opt.state()[OptimizerStateKey(opt, p)];
    switch (spec.kind) {
      case OptimizerKind::kSgd: {
        IValue buf = Get(d, "momentum_buffer");
        if (buf.isTensor() && buf.toTensor().sizes() != p.sizes()) {
          return absl::InvalidArgumentError("checkpoint: sgd momentum does not fit the model");
        }
        if (!buf.isTensor() && !d.contains("momentum_buffer")) {
          return absl::InvalidArgumentError(
              "checkpoint: optimizer state is not sgd's (train.optimizer changed?)");
        }
        auto* s = dynamic_cast<torch::optim::SGDParamState*>(slot.get());
        if (s == nullptr) {
          slot = std::make_unique<torch::optim::SGDParamState>();
          s = static_cast<torch::optim::SGDParamState*>(slot.get());
        }
        if (buf.isTensor()) {
          at::Tensor t = s->momentum_buffer();
          Restore(buf.toTensor(), p, &t);
          s->momentum_buffer(t);
        }
        break;
      }
      case OptimizerKind::kAdam:
        DDP_RETURN_IF_ERROR(fused ? RestoreAdam<FusedAdamParamState>(d, p, &slot)
                                  : RestoreAdam<torch::optim::AdamParamState>(d, p, &slot));
        break;
      case OptimizerKind::kAdamW:
        DDP_RETURN_IF_ERROR(fused ? RestoreAdam<FusedAdamParamState>(d, p, &slot)
                                  : RestoreAdam<torch::optim::AdamWParamState>(d, p, &slot));
        break;
    }
  }
  return absl::OkStatus();
}

}  // namespace ddp
