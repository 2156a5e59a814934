// FusedAdamW, FusedAdam and FusedSGD (fused_optimizer.h): torch.optim's fused=True paths
// (_fused_adam and _fused_sgd in torch/optim/adam.py and sgd.py, PyTorch 2.x) on
// LibTorch's optimizer classes.
#include "ddp/fused_optimizer.h"

#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <torch/version.h>
#if TORCH_VERSION_MAJOR >= 2
#include <ATen/ops/_foreach_add.h>
#include <ATen/ops/_fused_adam.h>
#include <ATen/ops/_fused_adamw.h>
#include <ATen/ops/_fused_sgd.h>
#endif

#include <functional>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "libddp/src/api_bridge.h"

namespace ddp {
namespace {

using torch::optim::OptimizerParamGroup;
using torch::optim::OptimizerParamState;

[[noreturn]] void Invalid(const std::string& message) {
  ThrowIfError(absl::InvalidArgumentError(message));
  throw std::logic_error("unreachable");
}

// The key of a parameter's entry in Optimizer::state(): its TensorImpl's address,
// printed (LibTorch 1.13) or as a pointer (2.x).
template <typename Map>
typename Map::key_type StateKey(const at::Tensor& param) {
  if constexpr (std::is_same_v<typename Map::key_type, std::string>) {
    std::ostringstream s;  // c10::guts::to_string's form.
    s << param.unsafeGetTensorImpl();
    return s.str();
  } else {
    return param.unsafeGetTensorImpl();
  }
}

template <typename Opt>
auto& StateOf(Opt& opt, const at::Tensor& param) {
  using Map = std::remove_reference_t<decltype(opt.state())>;
  return opt.state()[StateKey<Map>(param)];
}

std::string Describe(const at::Tensor& t) {
  std::ostringstream s;
  s << t.scalar_type() << " " << t.sizes() << " on " << t.device();
  return s.str();
}

void RefuseWithoutKernels(const char* what, const char* torch_class) {
#if TORCH_VERSION_MAJOR < 2
  ThrowIfError(absl::FailedPreconditionError(absl::StrCat(
      what, " needs LibTorch 2.x: PyTorch's fused optimizer kernels came with 2.0, and this "
      "libddp is built against LibTorch ", TORCH_VERSION, ": use ", torch_class,
      " (torch.optim's arithmetic without fused=True), or build against a LibTorch 2.x")));
#endif
}

// What the kernels take: floating-point parameters (torch.optim's fused=True refuses
// the others too), with dense gradients.
void CheckParams(const char* what, const std::vector<OptimizerParamGroup>& groups) {
  for (size_t g = 0; g < groups.size(); ++g) {
    for (size_t i = 0; i < groups[g].params().size(); ++i) {
      const at::Tensor& p = groups[g].params()[i];
      if (!p.is_floating_point()) {
        Invalid(absl::StrCat(what, ": parameter ", i, " of param group ", g, " is ", Describe(p),
                             ": the fused kernels update floating-point parameters only (as "
                             "torch.optim's fused=True): leave it out of the optimizer"));
      }
    }
  }
}

template <typename Options>
void CheckAdamOptions(const char* what, const Options& o) {
  const double beta1 = std::get<0>(o.betas()), beta2 = std::get<1>(o.betas());
  if (!(o.lr() >= 0) || !(o.eps() >= 0) || !(o.weight_decay() >= 0) || !(beta1 >= 0) ||
      !(beta1 < 1) || !(beta2 >= 0) || !(beta2 < 1)) {
    Invalid(absl::StrCat(what, ": options lr ", o.lr(), ", eps ", o.eps(), ", weight_decay ",
                         o.weight_decay(), " (each must be >= 0) and betas (", beta1, ", ",
                         beta2, ") (each in [0, 1))"));
  }
}

void CheckSgdOptions(const char* what, const torch::optim::SGDOptions& o) {
  if (!(o.lr() >= 0) || !(o.momentum() >= 0) || !(o.weight_decay() >= 0)) {
    Invalid(absl::StrCat(what, ": options lr ", o.lr(), ", momentum ", o.momentum(),
                         " and weight_decay ", o.weight_decay(), ": each must be >= 0"));
  }
  if (o.nesterov() && (o.momentum() <= 0 || o.dampening() != 0)) {
    Invalid(absl::StrCat(what, ": nesterov needs momentum > 0 and dampening 0 (got momentum ",
                         o.momentum(), ", dampening ", o.dampening(), ")"));
  }
}

// The groups as given, after checking them and their options (`check`) and the defaults.
template <typename Options, typename Check>
std::vector<OptimizerParamGroup> Checked(const char* what,
                                         const std::vector<OptimizerParamGroup>& groups,
                                         const Options& defaults, Check check) {
  check(what, defaults);
  for (const OptimizerParamGroup& g : groups) {
    if (g.has_options()) {
      const auto* o = dynamic_cast<const Options*>(&g.options());
      if (o == nullptr) {
        Invalid(absl::StrCat(what, ": a param group carries options of another optimizer's "
                             "kind: give it this optimizer's options (or none)"));
      }
      check(what, *o);
    }
  }
  CheckParams(what, groups);
  return groups;
}

// set_lr_tensor's rules (fused_optimizer.h, decision 171), against every parameter.
void CheckLrTensor(const char* what, const std::vector<OptimizerParamGroup>& groups,
                   const at::Tensor& lr) {
  if (!lr.defined()) return;
  if (lr.numel() != 1 || !lr.is_floating_point()) {
    Invalid(absl::StrCat(what, ": set_lr_tensor takes a 0-dim floating-point tensor, got ",
                         Describe(lr)));
  }
  for (const OptimizerParamGroup& g : groups) {
    for (const at::Tensor& p : g.params()) {
      if (p.is_cuda() && (lr.device() != p.device() || lr.scalar_type() != at::kFloat)) {
        Invalid(absl::StrCat(
            what, ": set_lr_tensor got ", Describe(lr), ", but the parameters are on ",
            p.device().str(), ": give a float32 tensor on ", p.device().str(),
            " (the CUDA kernels read a float there; a CPU tensor would be read on the host, "
            "once, when a CUDA graph is captured)"));
      }
      if (!p.is_cuda() && lr.device() != p.device()) {
        Invalid(absl::StrCat(what, ": set_lr_tensor got ", Describe(lr),
                             ", but the parameters are on ", p.device().str(),
                             ": give a tensor there (float64 on the CPU for the bits of the "
                             "same lr as a number)"));
      }
    }
  }
}

#if TORCH_VERSION_MAJOR >= 2
// What step() needs (the kernels are LibTorch 2.x's).

void CheckGrad(const char* what, const at::Tensor& grad) {
  if (grad.is_sparse()) {
    Invalid(absl::StrCat(what, ": a parameter has a sparse gradient: the fused kernels take "
                         "dense ones (torch.optim's fused=True refuses them too): use "
                         "torch::optim's own optimizer for sparse gradients"));
  }
}

// The learning rate tensor for a kernel call on `device`.
const at::Tensor& LrFor(const char* what, const at::Tensor& lr, const at::Device& device) {
  if (lr.device() != device) {
    Invalid(absl::StrCat(what, ": the lr tensor is on ", lr.device().str(),
                         " but parameters are on ", device.str(),
                         ": set_lr_tensor again with one on their device"));
  }
  return lr;
}

// One kernel call's tensors: a param group's parameters of one device and dtype (as
// torch.optim's _group_tensors_by_device_and_dtype groups them, order kept).
struct Bucket {
  at::Device device;
  at::ScalarType dtype;
  std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps;
  std::vector<at::Tensor> fresh_params, fresh_grads, fresh_bufs;  // SGD: a first step.
};

Bucket& BucketOf(std::vector<Bucket>& buckets, const at::Tensor& p) {
  for (Bucket& b : buckets) {
    if (b.device == p.device() && b.dtype == p.scalar_type()) return b;
  }
  buckets.push_back(Bucket{p.device(), p.scalar_type(), {}, {}, {}, {}, {}, {}, {}, {}, {}});
  return buckets.back();
}

// One call of at::_fused_adamw_ or at::_fused_adam_ (`lr`: a double or a tensor).
template <bool kDecoupled, typename Lr, typename Options>
void FusedAdamKernel(Bucket& b, const Lr& lr, const Options& o, double beta1, double beta2) {
  if constexpr (kDecoupled) {
    at::_fused_adamw_(b.params, b.grads, b.exp_avgs, b.exp_avg_sqs, b.max_exp_avg_sqs, b.steps,
                      lr, beta1, beta2, o.weight_decay(), o.eps(), o.amsgrad(),
                      /*maximize=*/false);
  } else {
    at::_fused_adam_(b.params, b.grads, b.exp_avgs, b.exp_avg_sqs, b.max_exp_avg_sqs, b.steps,
                     lr, beta1, beta2, o.weight_decay(), o.eps(), o.amsgrad(),
                     /*maximize=*/false);
  }
}
#endif

// torch.optim's Adam.step with fused=True (AdamW: decoupled weight decay).
template <typename Options, bool kDecoupled>
void AdamStep(const char* what, torch::optim::Optimizer& opt, const at::Tensor& lr) {
#if TORCH_VERSION_MAJOR >= 2
  for (OptimizerParamGroup& group : opt.param_groups()) {
    const auto& o = static_cast<const Options&>(group.options());
    std::vector<Bucket> buckets;
    for (const at::Tensor& p : group.params()) {
      const at::Tensor& grad = p.grad();
      if (!grad.defined()) continue;
      CheckGrad(what, grad);
      auto& slot = StateOf(opt, p);
      if (slot == nullptr) {  // _init_group: the state of a parameter's first step.
        auto s = std::make_unique<FusedAdamParamState>();
        s->step(at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(p.device())));
        s->exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
        s->exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
        if (o.amsgrad()) s->max_exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
        slot = std::move(s);
      }
      auto& s = static_cast<FusedAdamParamState&>(*slot);
      if (o.amsgrad() && !s.max_exp_avg_sq().defined()) {  // amsgrad turned on later.
        s.max_exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
      }
      Bucket& b = BucketOf(buckets, p);
      b.params.push_back(p);
      b.grads.push_back(grad);
      b.exp_avgs.push_back(s.exp_avg());
      b.exp_avg_sqs.push_back(s.exp_avg_sq());
      if (o.amsgrad()) b.max_exp_avg_sqs.push_back(s.max_exp_avg_sq());
      b.steps.push_back(s.step());
    }
    const double beta1 = std::get<0>(o.betas()), beta2 = std::get<1>(o.betas());
    for (Bucket& b : buckets) {
      at::NoGradGuard no_grad;
      at::_foreach_add_(b.steps, 1);  // On the device: a captured step advances them too.
      if (lr.defined()) {
        FusedAdamKernel<kDecoupled>(b, LrFor(what, lr, b.device), o, beta1, beta2);
      } else {
        FusedAdamKernel<kDecoupled>(b, o.lr(), o, beta1, beta2);
      }
    }
  }
#endif
}

// load(): `read` fills opt.state() from an archive; a parameter that had a state keeps
// its tensors, the loaded values copied into them (a captured step goes on reading
// them); a new state is placed on its parameter's device (the step count as float32).
void LoadInPlace(torch::optim::Optimizer& opt, const std::function<void()>& read) {
  auto before = std::move(opt.state());
  opt.state().clear();
  read();
  auto loaded = std::move(opt.state());
  opt.state() = std::move(before);
  for (OptimizerParamGroup& group : opt.param_groups()) {
    for (const at::Tensor& p : group.params()) {
      using Map = std::remove_reference_t<decltype(opt.state())>;
      auto it = loaded.find(StateKey<Map>(p));
      if (it == loaded.end()) continue;
      auto& slot = StateOf(opt, p);
      at::NoGradGuard no_grad;
      auto into = [&](const at::Tensor& from, const at::Tensor& to) {
        return from.defined() && to.defined() && to.sizes() == from.sizes();
      };
      if (auto* fresh = dynamic_cast<FusedAdamParamState*>(it->second.get())) {
        auto* old = dynamic_cast<FusedAdamParamState*>(slot.get());
        if (old != nullptr && into(fresh->step(), old->step()) &&
            into(fresh->exp_avg(), old->exp_avg()) &&
            into(fresh->exp_avg_sq(), old->exp_avg_sq()) &&
            fresh->max_exp_avg_sq().defined() == old->max_exp_avg_sq().defined() &&
            (!fresh->max_exp_avg_sq().defined() ||
             into(fresh->max_exp_avg_sq(), old->max_exp_avg_sq()))) {
          old->step().copy_(fresh->step());
          old->exp_avg().copy_(fresh->exp_avg());
          old->exp_avg_sq().copy_(fresh->exp_avg_sq());
          if (old->max_exp_avg_sq().defined()) old->max_exp_avg_sq().copy_(fresh->max_exp_avg_sq());
          continue;
        }
        fresh->step(fresh->step().to(p.device(), at::kFloat));
        fresh->exp_avg(fresh->exp_avg().to(p.device()));
        fresh->exp_avg_sq(fresh->exp_avg_sq().to(p.device()));
        if (fresh->max_exp_avg_sq().defined()) {
          fresh->max_exp_avg_sq(fresh->max_exp_avg_sq().to(p.device()));
        }
      } else if (auto* fresh_sgd = dynamic_cast<torch::optim::SGDParamState*>(it->second.get())) {
        auto* old = dynamic_cast<torch::optim::SGDParamState*>(slot.get());
        if (old != nullptr && into(fresh_sgd->momentum_buffer(), old->momentum_buffer())) {
          old->momentum_buffer().copy_(fresh_sgd->momentum_buffer());
          continue;
        }
        if (fresh_sgd->momentum_buffer().defined()) {
          fresh_sgd->momentum_buffer(fresh_sgd->momentum_buffer().to(p.device()));
        }
      }
      slot = std::move(it->second);
    }
  }
}

}  // namespace

// ---------------------------------------------------------------- FusedAdamW, FusedAdam

FusedAdamW::FusedAdamW(const std::vector<OptimizerParamGroup>& param_groups,
                       torch::optim::AdamWOptions defaults)
    : torch::optim::Optimizer(
          Checked("ddp::FusedAdamW", param_groups, defaults,
                  CheckAdamOptions<torch::optim::AdamWOptions>),
          std::make_unique<torch::optim::AdamWOptions>(defaults)) {
  RefuseWithoutKernels("ddp::FusedAdamW", "torch::optim::AdamW");
}

FusedAdamW::FusedAdamW(std::vector<at::Tensor> params, torch::optim::AdamWOptions defaults)
    : FusedAdamW(std::vector<OptimizerParamGroup>{OptimizerParamGroup(std::move(params))},
                 std::move(defaults)) {}

at::Tensor FusedAdamW::step(LossClosure closure) {
  at::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  AdamStep<torch::optim::AdamWOptions, true>("ddp::FusedAdamW", *this, lr_);
  return loss;
}

void FusedAdamW::save(torch::serialize::OutputArchive& archive) const {
  torch::optim::serialize<FusedAdamParamState, torch::optim::AdamWOptions>(archive, *this);
}

void FusedAdamW::load(torch::serialize::InputArchive& archive) {
  LoadInPlace(*this, [&] {
    torch::optim::serialize<FusedAdamParamState, torch::optim::AdamWOptions>(archive, *this);
  });
}

void FusedAdamW::set_lr_tensor(at::Tensor lr) {
  CheckLrTensor("ddp::FusedAdamW", param_groups(), lr);
  lr_ = std::move(lr);
}

FusedAdam::FusedAdam(const std::vector<OptimizerParamGroup>& param_groups,
                     torch::optim::AdamOptions defaults)
    : torch::optim::Optimizer(
          Checked("ddp::FusedAdam", param_groups, defaults,
                  CheckAdamOptions<torch::optim::AdamOptions>),
          std::make_unique<torch::optim::AdamOptions>(defaults)) {
  RefuseWithoutKernels("ddp::FusedAdam", "torch::optim::Adam");
}

FusedAdam::FusedAdam(std::vector<at::Tensor> params, torch::optim::AdamOptions defaults)
    : FusedAdam(std::vector<OptimizerParamGroup>{OptimizerParamGroup(std::move(params))},
                std::move(defaults)) {}

at::Tensor FusedAdam::step(LossClosure closure) {
  at::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  AdamStep<torch::optim::AdamOptions, false>("ddp::FusedAdam", *this, lr_);
  return loss;
}

void FusedAdam::save(torch::serialize::OutputArchive& archive) const {
  torch::optim::serialize<FusedAdamParamState, torch::optim::AdamOptions>(archive, *this);
}

void FusedAdam::load(torch::serialize::InputArchive& archive) {
  LoadInPlace(*this, [&] {
    torch::optim::serialize<FusedAdamParamState, torch::optim::AdamOptions>(archive, *this);
  });
}

void FusedAdam::set_lr_tensor(at::Tensor lr) {
  CheckLrTensor("ddp::FusedAdam", param_groups(), lr);
  lr_ = std::move(lr);
}

// ---------------------------------------------------------------- FusedSGD

FusedSGD::FusedSGD(const std::vector<OptimizerParamGroup>& param_groups,
                   torch::optim::SGDOptions defaults)
    : torch::optim::SGD(Checked("ddp::FusedSGD", param_groups, defaults, CheckSgdOptions),
                        defaults) {
  RefuseWithoutKernels("ddp::FusedSGD", "torch::optim::SGD");
}

FusedSGD::FusedSGD(std::vector<at::Tensor> params, torch::optim::SGDOptions defaults)
    : FusedSGD(std::vector<OptimizerParamGroup>{OptimizerParamGroup(std::move(params))},
               std::move(defaults)) {}

// torch.optim's SGD.step with fused=True. torch.optim decides is_first_step for all of a
// group's parameters at once (all without a buffer); a parameter whose first gradient
// comes later, while the others have buffers, gets a kernel call of its own here.
at::Tensor FusedSGD::step(LossClosure closure) {
  at::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
#if TORCH_VERSION_MAJOR >= 2
  constexpr const char* kWhat = "ddp::FusedSGD";
  for (OptimizerParamGroup& group : param_groups()) {
    const auto& o = static_cast<const torch::optim::SGDOptions&>(group.options());
    const bool momentum = o.momentum() != 0;
    std::vector<Bucket> buckets;
    for (const at::Tensor& p : group.params()) {
      const at::Tensor& grad = p.grad();
      if (!grad.defined()) continue;
      CheckGrad(kWhat, grad);
      Bucket& b = BucketOf(buckets, p);
      if (!momentum) {
        b.params.push_back(p);
        b.grads.push_back(grad);
        continue;
      }
      auto& slot = StateOf(*this, p);
      if (slot == nullptr) {
        auto s = std::make_unique<torch::optim::SGDParamState>();
        s->momentum_buffer(at::empty_like(grad));  // Written by the kernel's first step.
        b.fresh_params.push_back(p);
        b.fresh_grads.push_back(grad);
        b.fresh_bufs.push_back(s->momentum_buffer());
        slot = std::move(s);
        continue;
      }
      b.params.push_back(p);
      b.grads.push_back(grad);
      b.exp_avgs.push_back(static_cast<torch::optim::SGDParamState&>(*slot).momentum_buffer());
    }
    for (Bucket& b : buckets) {
      at::NoGradGuard no_grad;
      auto run = [&](const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                     const std::vector<at::Tensor>& bufs, bool first) {
        if (params.empty()) return;
        if (lr_.defined()) {
          at::_fused_sgd_(params, grads, bufs, o.weight_decay(), o.momentum(),
                          LrFor(kWhat, lr_, b.device), o.dampening(), o.nesterov(),
                          /*maximize=*/false, first);
        } else {
          at::_fused_sgd_(params, grads, bufs, o.weight_decay(), o.momentum(), o.lr(),
                          o.dampening(), o.nesterov(), /*maximize=*/false, first);
        }
      };
      run(b.params, b.grads, b.exp_avgs, false);
      run(b.fresh_params, b.fresh_grads, b.fresh_bufs, true);
    }
  }
#endif
  return loss;
}

void FusedSGD::load(torch::serialize::InputArchive& archive) {
  LoadInPlace(*this, [&] { torch::optim::SGD::load(archive); });
}

void FusedSGD::set_lr_tensor(at::Tensor lr) {
  CheckLrTensor("ddp::FusedSGD", param_groups(), lr);
  lr_ = std::move(lr);
}

// ---------------------------------------------------------------- the trainer's

std::unique_ptr<torch::optim::Optimizer> MakeFusedOptimizer(
    const OptimizerSpec& spec, const std::vector<OptimizerParamGroup>& groups) {
  switch (spec.kind) {
    case OptimizerKind::kSgd:
      return std::make_unique<FusedSGD>(groups, torch::optim::SGDOptions(spec.lr)
                                                    .momentum(spec.momentum)
                                                    .nesterov(spec.nesterov)
                                                    .weight_decay(spec.weight_decay));
    case OptimizerKind::kAdam:
      return std::make_unique<FusedAdam>(groups, torch::optim::AdamOptions(spec.lr)
                                                     .betas({spec.beta1, spec.beta2})
                                                     .eps(spec.eps)
                                                     .weight_decay(spec.weight_decay)
                                                     .amsgrad(spec.amsgrad));
    case OptimizerKind::kAdamW:
      return std::make_unique<FusedAdamW>(groups, torch::optim::AdamWOptions(spec.lr)
                                                      .betas({spec.beta1, spec.beta2})
                                                      .eps(spec.eps)
                                                      .weight_decay(spec.weight_decay)
                                                      .amsgrad(spec.amsgrad));
  }
  return nullptr;
}

}  // namespace ddp
