// Optimizers from an OptimizerSpec (job.yaml's train.optimizer, or read from a user's
// optimizer), and their state in PyTorch's state_dict layout.
//
// The state dict matches torch.optim's, so a checkpoint's "optimizer" entry loads in
// Python with optimizer.load_state_dict():
//   {"state": {i: {"step": tensor, "exp_avg": ..., "exp_avg_sq": ...}},   # adam(w)
//              {i: {"momentum_buffer": tensor}}                             # sgd
//    "param_groups": [{"lr": ..., ..., "params": [0, 1, ...]},
//                     {"lr": ..., ..., "params": [n, ...]}]}   # weight_decay_params: matrices
#ifndef DDP_LIBDDP_ENGINE_OPTIMIZER_H_
#define DDP_LIBDDP_ENGINE_OPTIMIZER_H_

#include <ATen/core/ivalue.h>
#include <torch/optim/optimizer.h>

#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/contract/optimizer_spec.h"

namespace ddp {

// The spec of a user's optimizer (libddp's checkpoints): SGD, Adam or AdamW (LibTorch's,
// or libddp's fused ones: `fused` kTrue) with one param group; INVALID_ARGUMENT naming
// what is not supported otherwise.
absl::StatusOr<OptimizerSpec> OptimizerSpecOf(torch::optim::Optimizer& optimizer);

// train.optimizer.fused decided for `params` (decision 170): the spec with `fused` kTrue
// (PyTorch's fused kernels: ddp::FusedSGD, FusedAdam, FusedAdamW) or kFalse. auto: true
// when this LibTorch has the kernels (2.x) and every parameter is on a GPU; true:
// FAILED_PRECONDITION, naming what to do, where it has none (1.13).
absl::StatusOr<OptimizerSpec> ResolveFused(OptimizerSpec spec,
                                           const std::vector<at::Tensor>& params);

// train.optimizer.weight_decay_params over `params`, each group with its options (the
// spec's, its own weight decay): all, one group; matrices, nanoGPT's two (decision 172):
// the parameters of 2 or more dimensions with weight_decay, then the others with 0, each
// in the order of `params`.
std::vector<torch::optim::OptimizerParamGroup> OptimizerParamGroups(
    const OptimizerSpec& spec, const std::vector<at::Tensor>& params);

// The engine's optimizer (not fused; ddp::MakeFusedOptimizer makes the fused ones) over
// `groups`, which carry their options. `multi_tensor`: the update of all parameters in a
// few kernels (torch.optim's foreach path), the same values as the loop over parameters;
// unset: PyTorch's default, when every parameter is on a GPU. With LibTorch 2.x, Adam
// and AdamW compute as torch.optim 2.x does (its lerp_ of the first moment; LibTorch's
// own classes round differently); with 1.13 they are LibTorch's, which is 1.13's
// torch.optim, and loop either way.
std::unique_ptr<torch::optim::Optimizer> MakeOptimizer(
    const OptimizerSpec& spec, std::vector<torch::optim::OptimizerParamGroup> groups,
    std::optional<bool> multi_tensor = std::nullopt);
// Over OptimizerParamGroups(spec, params).
std::unique_ptr<torch::optim::Optimizer> MakeOptimizer(
    const OptimizerSpec& spec, const std::vector<at::Tensor>& params,
    std::optional<bool> multi_tensor = std::nullopt);

// torch.optim's state_dict() of `optimizer`, made from `spec` (`fused` resolved): the
// parameters numbered across its param groups in their order, as torch.optim numbers
// them; each group's hyperparameters from its options; the state on the CPU, Adam's step
// count as a float tensor (fused or not).
c10::IValue OptimizerStateDict(const OptimizerSpec& spec, torch::optim::Optimizer& optimizer);

// Restores a state dict made by OptimizerStateDict (fused or not) into `optimizer`, made
// from `spec` over the same param groups. A parameter that has a state already gets the
// values written into its tensors (a captured CUDA graph goes on reading them); others
// get a new one (fused: the step count a float32 tensor on the parameter's device).
// INVALID_ARGUMENT when it does not fit (another optimizer, other param groups or
// parameter shapes).
absl::Status LoadOptimizerStateDict(const OptimizerSpec& spec, torch::optim::Optimizer& optimizer,
                                    const c10::IValue& state_dict);

}  // namespace ddp

#endif  // DDP_LIBDDP_ENGINE_OPTIMIZER_H_
