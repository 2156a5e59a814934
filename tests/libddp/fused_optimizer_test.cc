// ddp::FusedAdamW, FusedAdam and FusedSGD (<ddp/fused_optimizer.h>) in one process, on
// the CPU: what a CUDA graph capture relies on (the learning rate as a tensor against the
// same as a number, step counts as float32 tensors on their parameter's device made once,
// load() writing into the state in place), the refusals, and the engine's torch.optim
// state dicts of them (fused into LibTorch's optimizers and back, nanoGPT's two param
// groups). Their values against torch.optim's fused=True: fused_optimizer_parity_test.py.
#include <ddp/ddp.h>
#include <torch/serialize.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libddp/engine/optimizer.h"
#include "libddp/engine/torch_compat.h"
#include "libddp/src/api_bridge.h"

namespace ddp {
namespace {

using ::testing::HasSubstr;

constexpr bool kHasKernels = TORCH_VERSION_MAJOR >= 2;

// Parameters of several shapes (two matrices, a vector, a scalar-like one, a 3-d one),
// with deterministic values.
std::vector<at::Tensor> MakeParams() {
  std::vector<at::Tensor> params;
  const std::vector<std::vector<int64_t>> shapes = {{6, 5}, {5}, {4, 6}, {1}, {2, 3, 4}};
  for (size_t i = 0; i < shapes.size(); ++i) {
    int64_t n = 1;
    for (int64_t d : shapes[i]) n *= d;
    params.push_back(at::linspace(-1, 1, n).mul(0.7 + 0.1 * static_cast<double>(i)).sin()
                         .reshape(shapes[i]).set_requires_grad(true));
  }
  return params;
}

void SetGrads(std::vector<at::Tensor>& params, int step) {
  for (size_t i = 0; i < params.size(); ++i) {
    params[i].mutable_grad() = at::linspace(0.3, -0.7, params[i].numel())
                                   .mul(static_cast<double>(step + 1 + i))
                                   .cos()
                                   .reshape(params[i].sizes());
  }
}

double LrAt(int step) { return 0.01 * (1.0 - 0.1 * step); }

enum class Kind { kAdamW, kAdam, kSgd, kSgdNesterov };

std::unique_ptr<torch::optim::Optimizer> Make(Kind kind, const std::vector<at::Tensor>& params) {
  switch (kind) {
    case Kind::kAdamW:
      return std::make_unique<FusedAdamW>(
          params, torch::optim::AdamWOptions(0.01).weight_decay(0.1).amsgrad(true));
    case Kind::kAdam:
      return std::make_unique<FusedAdam>(params,
                                         torch::optim::AdamOptions(0.01).weight_decay(0.01));
    case Kind::kSgd:
      return std::make_unique<FusedSGD>(params, torch::optim::SGDOptions(0.01).momentum(0.9));
    case Kind::kSgdNesterov:
      return std::make_unique<FusedSGD>(
          params, torch::optim::SGDOptions(0.01).momentum(0.9).nesterov(true).weight_decay(1e-3));
  }
  return nullptr;
}

const char* NameOf(Kind kind) {
  switch (kind) {
    case Kind::kAdamW: return "adamw";
    case Kind::kAdam: return "adam";
    case Kind::kSgd: return "sgd";
    case Kind::kSgdNesterov: return "sgd nesterov";
  }
  return "?";
}

FusedAdamParamState& AdamStateOf(torch::optim::Optimizer& opt, const at::Tensor& p) {
  return static_cast<FusedAdamParamState&>(*opt.state().at(OptimizerStateKey(opt, p)));
}

double MaxDiff(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, (a[i] - b[i]).abs().max().item<double>());
  }
  return worst;
}

// The capture contract (decision 171): six steps with the learning rate changing every
// step, given as a number to one optimizer and as a 0-dim tensor to another. float64 on
// the CPU: the same bits for every kernel (the CPU kernels read it as a double); float32:
// the same bits for SGD (its CPU kernel rounds lr to float32 either way), and a
// difference of a few ulp for Adam(W), whose CPU kernel divides lr by the bias
// correction in double before rounding.
TEST(FusedOptimizerTest, AnLrTensorStepsAsTheSameLrGivenAsANumber) {
  if (!kHasKernels) GTEST_SKIP() << "LibTorch " << TORCH_VERSION << " has no fused kernels";
  for (Kind kind : {Kind::kAdamW, Kind::kAdam, Kind::kSgd, Kind::kSgdNesterov}) {
    for (at::ScalarType dtype : {at::kDouble, at::kFloat}) {
      SCOPED_TRACE(::testing::Message() << NameOf(kind) << " lr tensor " << dtype);
      std::vector<at::Tensor> a = MakeParams(), b = MakeParams();
      auto by_number = Make(kind, a), by_tensor = Make(kind, b);
      at::Tensor lr = at::zeros({}, at::TensorOptions().dtype(dtype));
      dynamic_cast<FusedOptimizer&>(*by_tensor).set_lr_tensor(lr);
      EXPECT_TRUE(dynamic_cast<FusedOptimizer&>(*by_tensor).lr_tensor().is_same(lr));
      double worst = 0;
      for (int step = 0; step < 6; ++step) {
        SetGrads(a, step);
        SetGrads(b, step);
        for (auto& g : by_number->param_groups()) g.options().set_lr(LrAt(step));
        lr.fill_(LrAt(step));
        by_number->step();
        by_tensor->step();
        worst = std::max(worst, MaxDiff(a, b));
      }
      const bool sgd = kind == Kind::kSgd || kind == Kind::kSgdNesterov;
      if (dtype == at::kDouble || sgd) {
        EXPECT_EQ(worst, 0.0);
      } else {
        EXPECT_LT(worst, 1e-6);  // Seen: 1.5e-8 (AdamW), 6e-8 (Adam): an ulp or two.
      }
      std::cerr << NameOf(kind) << ", lr as a " << dtype << " tensor: largest difference "
                << "from the lr as a number " << worst << "\n";
    }
  }
}

// A step count is a float32 0-dim tensor on its parameter's device, advanced inside
// step(); the state is made at a parameter's first step and the same tensors serve every
// later one (a captured step keeps their addresses).
TEST(FusedOptimizerTest, StepCountsAreFloat32TensorsOnTheDeviceMadeOnceAndAdvancedByStep) {
  if (!kHasKernels) GTEST_SKIP() << "LibTorch " << TORCH_VERSION << " has no fused kernels";
  for (Kind kind : {Kind::kAdamW, Kind::kAdam}) {
    SCOPED_TRACE(NameOf(kind));
    std::vector<at::Tensor> params = MakeParams();
    auto opt = Make(kind, params);
    EXPECT_TRUE(opt->state().empty()) << "the state is made at the first step";
    std::vector<const void*> addresses;
    for (int step = 0; step < 4; ++step) {
      SetGrads(params, step);
      opt->step();
      for (size_t i = 0; i < params.size(); ++i) {
        const FusedAdamParamState& s = AdamStateOf(*opt, params[i]);
        EXPECT_EQ(s.step().scalar_type(), at::kFloat);
        EXPECT_EQ(s.step().dim(), 0);
        EXPECT_EQ(s.step().device(), params[i].device());
        EXPECT_EQ(s.step().item<float>(), static_cast<float>(step + 1));
        const std::vector<const void*> mine = {s.step().data_ptr(), s.exp_avg().data_ptr(),
                                               s.exp_avg_sq().data_ptr()};
        if (step == 0) {
          addresses.insert(addresses.end(), mine.begin(), mine.end());
        } else {
          EXPECT_EQ(std::vector<const void*>(addresses.begin() + 3 * i,
                                             addresses.begin() + 3 * i + 3),
                    mine)
              << "parameter " << i << "'s state was made again at step " << step;
        }
      }
    }
  }
}

// SGD: a parameter whose first gradient comes while the others have momentum buffers
// gets the first-step update (the buffer is its gradient), exactly as an optimizer over
// it alone that starts then; the buffers, once made, are not made again.
TEST(FusedOptimizerTest, SgdTakesALateFirstGradientAsItsOwnFirstStep) {
  if (!kHasKernels) GTEST_SKIP() << "LibTorch " << TORCH_VERSION << " has no fused kernels";
  std::vector<at::Tensor> params = MakeParams();
  std::vector<at::Tensor> alone = {params[2].detach().clone().set_requires_grad(true)};
  auto all = Make(Kind::kSgdNesterov, params);
  auto late = Make(Kind::kSgdNesterov, alone);
  const void* buffer = nullptr;
  for (int step = 0; step < 5; ++step) {
    SetGrads(params, step);
    if (step < 2) params[2].mutable_grad().reset();
    all->step();
    if (step >= 2) {
      alone[0].mutable_grad() = params[2].grad().clone();
      late->step();
      const auto& s = static_cast<torch::optim::SGDParamState&>(
          *all->state().at(OptimizerStateKey(*all, params[2])));
      if (buffer == nullptr) buffer = s.momentum_buffer().data_ptr();
      EXPECT_EQ(s.momentum_buffer().data_ptr(), buffer) << "step " << step;
    }
    EXPECT_TRUE(at::equal(params[2], alone[0])) << "step " << step;
  }
  EXPECT_EQ(all->state().size(), params.size());
}

// torch::save and torch::load (ZeroRedundancyOptimizer's consolidation goes through
// them): the loaded values are written into the tensors a parameter's state already has.
TEST(FusedOptimizerTest, LoadWritesIntoTheStateAlreadyThere) {
  if (!kHasKernels) GTEST_SKIP() << "LibTorch " << TORCH_VERSION << " has no fused kernels";
  for (Kind kind : {Kind::kAdamW, Kind::kSgd}) {
    SCOPED_TRACE(NameOf(kind));
    std::vector<at::Tensor> params = MakeParams();
    auto opt = Make(kind, params);
    for (int step = 0; step < 2; ++step) {
      SetGrads(params, step);
      opt->step();
    }
    std::ostringstream saved;
    torch::save(*opt, saved);
    const c10::IValue want = OptimizerStateDict(OptimizerSpecOf(*opt).value(), *opt);
    std::vector<const void*> before;
    for (const auto& p : params) {
      const auto& s = *opt->state().at(OptimizerStateKey(*opt, p));
      before.push_back(kind == Kind::kAdamW
                           ? static_cast<const FusedAdamParamState&>(s).exp_avg().data_ptr()
                           : static_cast<const torch::optim::SGDParamState&>(s)
                                 .momentum_buffer().data_ptr());
    }
    SetGrads(params, 2);
    opt->step();
    std::istringstream in(saved.str());
    torch::load(*opt, in);
    for (size_t i = 0; i < params.size(); ++i) {
      const auto& s = *opt->state().at(OptimizerStateKey(*opt, params[i]));
      EXPECT_EQ(kind == Kind::kAdamW
                    ? static_cast<const FusedAdamParamState&>(s).exp_avg().data_ptr()
                    : static_cast<const torch::optim::SGDParamState&>(s)
                          .momentum_buffer().data_ptr(),
                before[i])
          << "parameter " << i;
    }
    const auto got = OptimizerStateDict(OptimizerSpecOf(*opt).value(), *opt)
                         .toGenericDict().at("state").toGenericDict();
    const auto old = want.toGenericDict().at("state").toGenericDict();
    ASSERT_EQ(got.size(), old.size());
    for (const auto& entry : old) {
      for (const auto& field : entry.value().toGenericDict()) {
        EXPECT_TRUE(at::equal(field.value().toTensor(),
                              got.at(entry.key()).toGenericDict().at(field.key()).toTensor()))
            << "parameter " << entry.key().toInt() << " " << field.key().toStringRef();
      }
    }
  }
}

// The engine's state dict of a fused optimizer is torch.optim's (the step count a float
// tensor, fused: true in its param group); it loads into LibTorch's Adam(W) and back into
// a fresh fused optimizer, value for value, and through the engine's loader in place.
TEST(FusedOptimizerTest, StateDictsMoveBetweenFusedAndLibTorchOptimizers) {
  if (!kHasKernels) GTEST_SKIP() << "LibTorch " << TORCH_VERSION << " has no fused kernels";
  for (OptimizerKind kind : {OptimizerKind::kAdamW, OptimizerKind::kAdam, OptimizerKind::kSgd}) {
    SCOPED_TRACE(kind == OptimizerKind::kAdamW ? "adamw"
                 : kind == OptimizerKind::kAdam ? "adam"
                                                : "sgd");
    OptimizerSpec spec;
    spec.kind = kind;
    spec.lr = 0.01;
    spec.momentum = kind == OptimizerKind::kSgd ? 0.9 : 0.0;
    spec.weight_decay = 0.01;
    spec.amsgrad = kind == OptimizerKind::kAdamW;
    spec.fused = FusedPolicy::kTrue;
    OptimizerSpec plain_spec = spec;
    plain_spec.fused = FusedPolicy::kFalse;
    std::vector<at::Tensor> params = MakeParams();
    std::unique_ptr<torch::optim::Optimizer> fused =
        MakeFusedOptimizer(spec, OptimizerParamGroups(spec, params));
    for (int step = 0; step < 3; ++step) {
      SetGrads(params, step);
      fused->step();
    }
    const c10::IValue sd = OptimizerStateDict(spec, *fused);
    const auto group = sd.toGenericDict().at("param_groups").toList().get(0).toGenericDict();
    EXPECT_TRUE(group.at("fused").toBool());
    auto same = [](const c10::IValue& a, const c10::IValue& b) {
      const auto sa = a.toGenericDict().at("state").toGenericDict();
      const auto sb = b.toGenericDict().at("state").toGenericDict();
      if (sa.size() != sb.size()) return false;
      for (const auto& entry : sa) {
        const auto other = sb.at(entry.key()).toGenericDict();
        for (const auto& field : entry.value().toGenericDict()) {
          const at::Tensor t = other.at(field.key()).toTensor();
          if (t.scalar_type() != field.value().toTensor().scalar_type() ||
              !at::equal(t, field.value().toTensor())) {
            return false;
          }
        }
      }
      return true;
    };
    if (kind != OptimizerKind::kSgd) {
      const auto first = sd.toGenericDict().at("state").toGenericDict().at(0).toGenericDict();
      EXPECT_EQ(first.at("step").toTensor().scalar_type(), at::kFloat);
      EXPECT_EQ(first.at("step").toTensor().item<double>(), 3.0);
    }
    // Into LibTorch's optimizer (the trainer's without fused) and back.
    std::vector<at::Tensor> q = MakeParams();
    auto plain = MakeOptimizer(plain_spec, q, /*multi_tensor=*/false);
    ASSERT_TRUE(LoadOptimizerStateDict(plain_spec, *plain, sd).ok());
    const c10::IValue through_plain = OptimizerStateDict(plain_spec, *plain);
    EXPECT_TRUE(same(sd, through_plain));
    std::vector<at::Tensor> r = MakeParams();
    auto again = MakeFusedOptimizer(spec, OptimizerParamGroups(spec, r));
    ASSERT_TRUE(LoadOptimizerStateDict(spec, *again, through_plain).ok());
    EXPECT_TRUE(same(sd, OptimizerStateDict(spec, *again)));
    // The fused loader wrote float32 step counts on the parameters' device; a step then
    // advances them from there.
    SetGrads(r, 3);
    again->step();
    if (kind != OptimizerKind::kSgd) {
      EXPECT_EQ(AdamStateOf(*again, r[0]).step().item<float>(), 4.0f);
      // Loading again writes into those tensors.
      const void* before = AdamStateOf(*again, r[0]).exp_avg().data_ptr();
      ASSERT_TRUE(LoadOptimizerStateDict(spec, *again, sd).ok());
      EXPECT_EQ(AdamStateOf(*again, r[0]).exp_avg().data_ptr(), before);
      EXPECT_EQ(AdamStateOf(*again, r[0]).step().item<float>(), 3.0f);
    }
  }
}

// train.optimizer.weight_decay_params: matrices (decision 172): nanoGPT's two groups,
// decay first, each in the parameters' order; the state dict numbers the parameters in
// that order, as torch.optim does; a state dict of other groups is refused by name.
TEST(FusedOptimizerTest, MatricesMakeNanoGptsTwoGroupsNumberedInGroupOrder) {
  OptimizerSpec spec;
  spec.kind = OptimizerKind::kAdamW;
  spec.weight_decay = 0.1;
  spec.weight_decay_params = WeightDecayParams::kMatrices;
  spec.fused = kHasKernels ? FusedPolicy::kTrue : FusedPolicy::kFalse;
  std::vector<at::Tensor> params = MakeParams();  // [6,5] [5] [4,6] [1] [2,3,4]
  auto groups = OptimizerParamGroups(spec, params);
  ASSERT_EQ(groups.size(), 2u);
  ASSERT_EQ(groups[0].params().size(), 3u);
  EXPECT_TRUE(groups[0].params()[0].is_same(params[0]));
  EXPECT_TRUE(groups[0].params()[1].is_same(params[2]));
  EXPECT_TRUE(groups[0].params()[2].is_same(params[4]));
  ASSERT_EQ(groups[1].params().size(), 2u);
  EXPECT_TRUE(groups[1].params()[0].is_same(params[1]));
  EXPECT_TRUE(groups[1].params()[1].is_same(params[3]));
  std::unique_ptr<torch::optim::Optimizer> opt =
      kHasKernels ? MakeFusedOptimizer(spec, groups) : MakeOptimizer(spec, groups);
  SetGrads(params, 0);
  opt->step();
  const c10::IValue sd = OptimizerStateDict(spec, *opt);
  const auto saved = sd.toGenericDict().at("param_groups").toList();
  ASSERT_EQ(saved.size(), 2u);
  EXPECT_EQ(saved.get(0).toGenericDict().at("weight_decay").toDouble(), 0.1);
  EXPECT_EQ(saved.get(1).toGenericDict().at("weight_decay").toDouble(), 0.0);
  EXPECT_EQ(saved.get(0).toGenericDict().at("params").toIntVector(),
            (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(saved.get(1).toGenericDict().at("params").toIntVector(),
            (std::vector<int64_t>{3, 4}));
  const auto state = sd.toGenericDict().at("state").toGenericDict();
  EXPECT_EQ(state.at(1).toGenericDict().at("exp_avg").toTensor().sizes(), params[2].sizes());
  EXPECT_EQ(state.at(4).toGenericDict().at("exp_avg").toTensor().sizes(), params[3].sizes());
  // A one-group optimizer cannot take it, and says why.
  OptimizerSpec all = spec;
  all.weight_decay_params = WeightDecayParams::kAll;
  std::vector<at::Tensor> q = MakeParams();
  auto one = MakeOptimizer(all, q);
  const absl::Status st = LoadOptimizerStateDict(all, *one, sd);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()),
              HasSubstr("2 param group(s) of [3, 2] parameters, this run's optimizer 1 of [5]"));
  EXPECT_THAT(std::string(st.message()), HasSubstr("weight_decay_params"));
}

// train.optimizer.fused, decided (decision 170): auto is fused where every parameter is
// on a GPU and the LibTorch has the kernels; true is refused by name where it has none.
TEST(FusedOptimizerTest, ResolveFusedDecidesAutoAndRefusesTrueWithoutKernels) {
  OptimizerSpec spec;
  const std::vector<at::Tensor> cpu = MakeParams();
  spec.fused = FusedPolicy::kAuto;
  EXPECT_EQ(ResolveFused(spec, cpu).value().fused, FusedPolicy::kFalse);
  spec.fused = FusedPolicy::kFalse;
  EXPECT_EQ(ResolveFused(spec, cpu).value().fused, FusedPolicy::kFalse);
  spec.fused = FusedPolicy::kTrue;
  const absl::StatusOr<OptimizerSpec> on = ResolveFused(spec, cpu);
  if (kHasKernels) {
    ASSERT_TRUE(on.ok()) << on.status();
    EXPECT_EQ(on->fused, FusedPolicy::kTrue);
  } else {
    EXPECT_EQ(on.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(on.status().message()),
                HasSubstr("train.optimizer.fused: true needs LibTorch 2.x"));
  }
}

// What the kernels cannot take is refused by name, as ddp::Error (kInvalidArgument);
// with LibTorch 1.13 every constructor is refused (kFailedPrecondition).
TEST(FusedOptimizerTest, RefusesWhatTheKernelsCannotTake) {
  auto error_of = [](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.code() == ErrorCode::kInvalidArgument ? "invalid: "
                         : e.code() == ErrorCode::kFailedPrecondition ? "precondition: "
                                                                       : "other: ") +
             e.what();
    }
    return "none";
  };
  if (!kHasKernels) {
    EXPECT_THAT(error_of([] { FusedAdamW opt(MakeParams()); }),
                HasSubstr("precondition: ddp::FusedAdamW needs LibTorch 2.x"));
    EXPECT_THAT(error_of([] { FusedAdam opt(MakeParams()); }),
                HasSubstr("precondition: ddp::FusedAdam needs LibTorch 2.x"));
    EXPECT_THAT(error_of([] { FusedSGD opt(MakeParams(), torch::optim::SGDOptions(0.1)); }),
                HasSubstr("precondition: ddp::FusedSGD needs LibTorch 2.x"));
    return;
  }
  EXPECT_THAT(error_of([] { FusedAdamW opt({at::ones({3}, at::kLong)}); }),
              HasSubstr("invalid: ddp::FusedAdamW: parameter 0 of param group 0 is Long"));
  EXPECT_THAT(error_of([] { FusedAdam opt(MakeParams(), torch::optim::AdamOptions(-1)); }),
              HasSubstr("invalid: ddp::FusedAdam: options lr -1"));
  EXPECT_THAT(error_of([] {
                FusedAdamW opt(MakeParams(), torch::optim::AdamWOptions(0.1).betas({0.9, 1.0}));
              }),
              HasSubstr("betas (0.9, 1) (each in [0, 1))"));
  EXPECT_THAT(error_of([] {
                FusedSGD opt(MakeParams(), torch::optim::SGDOptions(0.1).nesterov(true));
              }),
              HasSubstr("invalid: ddp::FusedSGD: nesterov needs momentum > 0 and dampening 0"));
  EXPECT_THAT(error_of([] {
                std::vector<at::Tensor> p = MakeParams();
                FusedSGD opt({torch::optim::OptimizerParamGroup(
                                 p, std::make_unique<torch::optim::AdamOptions>(0.1))},
                             torch::optim::SGDOptions(0.1));
              }),
              HasSubstr("a param group carries options of another optimizer's kind"));
  // The lr tensor: one floating-point element, on the parameters' device.
  std::vector<at::Tensor> params = MakeParams();
  FusedAdamW opt(params);
  EXPECT_THAT(error_of([&] { opt.set_lr_tensor(at::ones({2})); }),
              HasSubstr("set_lr_tensor takes a 0-dim floating-point tensor, got Float [2]"));
  EXPECT_THAT(error_of([&] { opt.set_lr_tensor(at::ones({}, at::kLong)); }),
              HasSubstr("set_lr_tensor takes a 0-dim floating-point tensor"));
  const at::Tensor meta = at::ones({}, at::TensorOptions().device(at::kMeta));
  EXPECT_THAT(error_of([&] { opt.set_lr_tensor(meta); }),
              HasSubstr("but the parameters are on cpu: give a tensor there"));
  EXPECT_EQ(error_of([&] { opt.set_lr_tensor(at::Tensor()); }), "none");  // Back to lr().
  // A sparse gradient, at the step.
  params[0].mutable_grad() = at::zeros({6, 5}).to_sparse();
  EXPECT_THAT(error_of([&] { opt.step(); }),
              HasSubstr("invalid: ddp::FusedAdamW: a parameter has a sparse gradient"));
}

// What takes an SGD takes FusedSGD; the engine's checkpoints know all three.
TEST(FusedOptimizerTest, CheckpointsKnowTheFusedOptimizers) {
  if (!kHasKernels) GTEST_SKIP() << "LibTorch " << TORCH_VERSION << " has no fused kernels";
  std::vector<at::Tensor> params = MakeParams();
  FusedSGD sgd(params, torch::optim::SGDOptions(0.1).momentum(0.9));
  EXPECT_NE(dynamic_cast<torch::optim::SGD*>(&sgd), nullptr);
  FusedAdamW adamw(params, torch::optim::AdamWOptions(0.1).weight_decay(0.2));
  FusedAdam adam(params, torch::optim::AdamOptions(0.1));
  using Case = std::pair<torch::optim::Optimizer*, OptimizerKind>;
  for (auto [opt, kind] : {Case{&sgd, OptimizerKind::kSgd}, Case{&adamw, OptimizerKind::kAdamW},
                           Case{&adam, OptimizerKind::kAdam}}) {
    const absl::StatusOr<OptimizerSpec> spec = OptimizerSpecOf(*opt);
    ASSERT_TRUE(spec.ok()) << spec.status();
    EXPECT_EQ(spec->kind, kind);
    EXPECT_EQ(spec->fused, FusedPolicy::kTrue);
  }
  EXPECT_EQ(OptimizerSpecOf(adamw)->weight_decay, 0.2);
  torch::optim::SGD plain(params, torch::optim::SGDOptions(0.1));
  EXPECT_EQ(OptimizerSpecOf(plain)->fused, FusedPolicy::kFalse);
}

}  // namespace
}  // namespace ddp
