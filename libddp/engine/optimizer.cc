#include "libddp/engine/optimizer.h"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <ATen/ops/_foreach_add.h>
#include <ATen/ops/_foreach_mul.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
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

// Adam and AdamW keep the same per-parameter state.
template <typename State>
IValue AdamState(const State& s) {
  GenericDict d = StringDict();
  // torch.optim.Adam keeps `step` as a float tensor since 1.12.
  d.insert("step", at::scalar_tensor(static_cast<double>(s.step()), at::kFloat));
  // On the CPU, as the model is saved, so a checkpoint from a GPU run loads anywhere.
  d.insert("exp_avg", s.exp_avg().cpu());
  d.insert("exp_avg_sq", s.exp_avg_sq().cpu());
  if (s.max_exp_avg_sq().defined()) d.insert("max_exp_avg_sq", s.max_exp_avg_sq().cpu());
  return d;
}

template <typename State>
absl::Status RestoreAdam(const GenericDict& d, const at::Tensor& p, State* s) {
  IValue step = Get(d, "step"), avg = Get(d, "exp_avg"), avg_sq = Get(d, "exp_avg_sq");
  if (!step.isTensor() || !avg.isTensor() || !avg_sq.isTensor() ||
      avg.toTensor().sizes() != p.sizes() || avg_sq.toTensor().sizes() != p.sizes()) {
    return absl::InvalidArgumentError("optimizer state does not fit adam for these parameters");
  }
  s->step(static_cast<int64_t>(step.toTensor().item<double>()));
  s->exp_avg(avg.toTensor().to(p.device()).clone());
  s->exp_avg_sq(avg_sq.toTensor().to(p.device()).clone());
  IValue max_sq = Get(d, "max_exp_avg_sq");
  if (max_sq.isTensor()) s->max_exp_avg_sq(max_sq.toTensor().to(p.device()).clone());
  return absl::OkStatus();
}

template <typename State>
void SaveStates(torch::optim::Optimizer& opt, const std::vector<at::Tensor>& params,
                const std::function<IValue(const State&)>& encode, GenericDict* state) {
  for (size_t i = 0; i < params.size(); ++i) {
    auto it = opt.state().find(OptimizerStateKey(opt, params[i]));
    if (it == opt.state().end()) continue;  // No step taken yet.
    state->insert(static_cast<int64_t>(i), encode(static_cast<const State&>(*it->second)));
  }
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

}  // namespace

absl::StatusOr<OptimizerSpec> OptimizerSpecOf(torch::optim::Optimizer& opt) {
  if (opt.param_groups().size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint: the optimizer has ", opt.param_groups().size(),
        " param groups; checkpoints support optimizers with one"));
  }
  const torch::optim::OptimizerOptions& options = opt.param_groups()[0].options();
  OptimizerSpec spec;
  if (dynamic_cast<torch::optim::SGD*>(&opt) != nullptr) {
    const auto& o = static_cast<const torch::optim::SGDOptions&>(options);
    spec.kind = OptimizerKind::kSgd;
    spec.lr = o.lr();
    spec.momentum = o.momentum();
    spec.nesterov = o.nesterov();
    spec.weight_decay = o.weight_decay();
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
  if (dynamic_cast<torch::optim::AdamW*>(&opt) != nullptr) {
    return adam_like(static_cast<const torch::optim::AdamWOptions&>(options),
                     OptimizerKind::kAdamW);
  }
  if (dynamic_cast<torch::optim::Adam*>(&opt) != nullptr) {
    return adam_like(static_cast<const torch::optim::AdamOptions&>(options), OptimizerKind::kAdam);
  }
  return absl::InvalidArgumentError(
      "checkpoint: the optimizer is not torch::optim::SGD, Adam or AdamW, whose state "
      "checkpoints know how to save");
}

std::unique_ptr<torch::optim::Optimizer> MakeOptimizer(const OptimizerSpec& spec,
                                                       const std::vector<at::Tensor>& params,
                                                       std::optional<bool> multi_tensor) {
  // PyTorch's default (torch.optim's _default_to_fused_or_foreach): the multi-tensor
  // path when every parameter is on a GPU.
  const bool foreach = multi_tensor.value_or(
      !params.empty() &&
      std::all_of(params.begin(), params.end(), [](const at::Tensor& p) { return p.is_cuda(); }));
  switch (spec.kind) {
    case OptimizerKind::kSgd: {
      auto options = torch::optim::SGDOptions(spec.lr)
                         .momentum(spec.momentum)
                         .nesterov(spec.nesterov)
                         .weight_decay(spec.weight_decay);
      if (foreach) return std::make_unique<MultiTensorSgd>(params, options);
      return std::make_unique<torch::optim::SGD>(params, options);
    }
    case OptimizerKind::kAdam:
      return std::make_unique<torch::optim::Adam>(
          params, torch::optim::AdamOptions(spec.lr)
                      .betas({spec.beta1, spec.beta2})
                      .eps(spec.eps)
                      .weight_decay(spec.weight_decay)
                      .amsgrad(spec.amsgrad));
    case OptimizerKind::kAdamW:
      return std::make_unique<torch::optim::AdamW>(
          params, torch::optim::AdamWOptions(spec.lr)
                      .betas({spec.beta1, spec.beta2})
                      .eps(spec.eps)
                      .weight_decay(spec.weight_decay)
                      .amsgrad(spec.amsgrad));
  }
  return nullptr;
}

c10::IValue OptimizerStateDict(const OptimizerSpec& spec, torch::optim::Optimizer& opt,
                               const std::vector<at::Tensor>& params) {
  GenericDict state(c10::IntType::get(), c10::AnyType::get());
  GenericDict group = StringDict();
  // The lr now in force (train.lr_schedule moves it), as torch.optim saves it.
  group.insert("lr", opt.param_groups().empty() ? spec.lr
                                                : opt.param_groups()[0].options().get_lr());
  group.insert("weight_decay", spec.weight_decay);
  group.insert("maximize", false);
  group.insert("foreach", IValue());
  group.insert("differentiable", false);
  switch (spec.kind) {
    case OptimizerKind::kSgd:
      group.insert("momentum", spec.momentum);
      group.insert("dampening", 0.0);
      group.insert("nesterov", spec.nesterov);
      SaveStates<torch::optim::SGDParamState>(
          opt, params,
          [](const torch::optim::SGDParamState& s) -> IValue {
            GenericDict d = StringDict();
            d.insert("momentum_buffer",
                     s.momentum_buffer().defined() ? IValue(s.momentum_buffer().cpu()) : IValue());
            return d;
          },
          &state);
      break;
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW:
      group.insert("betas", c10::ivalue::Tuple::create({spec.beta1, spec.beta2}));
      group.insert("eps", spec.eps);
      group.insert("amsgrad", spec.amsgrad);
      group.insert("capturable", false);
      if (spec.kind == OptimizerKind::kAdam) {
        SaveStates<torch::optim::AdamParamState>(
            opt, params, [](const torch::optim::AdamParamState& s) { return AdamState(s); },
            &state);
      } else {
        SaveStates<torch::optim::AdamWParamState>(
            opt, params, [](const torch::optim::AdamWParamState& s) { return AdamState(s); },
            &state);
      }
      break;
  }
  c10::List<int64_t> ids;
  for (size_t i = 0; i < params.size(); ++i) ids.push_back(static_cast<int64_t>(i));
  group.insert("params", ids);
  c10::impl::GenericList groups(c10::AnyType::get());
  groups.push_back(group);
  GenericDict out = StringDict();
  out.insert("state", state);
  out.insert("param_groups", groups);
  return out;
}

absl::Status LoadOptimizerStateDict(const OptimizerSpec& spec, torch::optim::Optimizer& opt,
                                    const std::vector<at::Tensor>& params,
                                    const c10::IValue& state_dict) {
  if (!state_dict.isGenericDict()) {
    return absl::InvalidArgumentError("checkpoint: optimizer entry is not a state dict");
  }
  IValue state_iv = Get(state_dict.toGenericDict(), "state");
  if (!state_iv.isGenericDict()) {
    return absl::InvalidArgumentError("checkpoint: optimizer state dict has no 'state'");
  }
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
    auto key = OptimizerStateKey(opt, p);
    switch (spec.kind) {
      case OptimizerKind::kSgd: {
        auto s = std::make_unique<torch::optim::SGDParamState>();
        IValue buf = Get(d, "momentum_buffer");
        if (buf.isTensor()) {
          if (buf.toTensor().sizes() != p.sizes()) {
            return absl::InvalidArgumentError("checkpoint: sgd momentum does not fit the model");
          }
          s->momentum_buffer(buf.toTensor().to(p.device()).clone());
        } else if (!d.contains("momentum_buffer")) {
          return absl::InvalidArgumentError(
              "checkpoint: optimizer state is not sgd's (train.optimizer changed?)");
        }
        opt.state()[key] = std::move(s);
        break;
      }
      case OptimizerKind::kAdam: {
        auto s = std::make_unique<torch::optim::AdamParamState>();
        absl::Status st = RestoreAdam(d, p, s.get());
        if (!st.ok()) return st;
        opt.state()[key] = std::move(s);
        break;
      }
      case OptimizerKind::kAdamW: {
        auto s = std::make_unique<torch::optim::AdamWParamState>();
        absl::Status st = RestoreAdam(d, p, s.get());
        if (!st.ok()) return st;
        opt.state()[key] = std::move(s);
        break;
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace ddp
