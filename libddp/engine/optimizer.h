// Optimizers from train.optimizer, and their state in PyTorch's state_dict layout.
//
// The state dict matches torch.optim's, so a checkpoint's "optimizer" entry loads in
// Python with optimizer.load_state_dict():
//   {"state": {i: {"step": tensor, "exp_avg": ..., "exp_avg_sq": ...}},   # adam(w)
//              {i: {"momentum_buffer": tensor}}                             # sgd
//    "param_groups": [{"lr": ..., ..., "params": [0, 1, ...]}]}
#ifndef DDP_LIBDDP_ENGINE_OPTIMIZER_H_
#define DDP_LIBDDP_ENGINE_OPTIMIZER_H_

#include <ATen/core/ivalue.h>
#include <torch/optim/optimizer.h>

#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/jobspec/job_spec.h"

namespace ddp {

// The spec of a user's optimizer (libddp's checkpoints): SGD, Adam or AdamW with one
// param group; INVALID_ARGUMENT naming what is not supported otherwise.
absl::StatusOr<OptimizerSpec> OptimizerSpecOf(torch::optim::Optimizer& optimizer);

// `multi_tensor`: the update of all parameters in a few kernels (torch.optim's foreach
// path), the same values as the loop over parameters; unset: PyTorch's default, when
// every parameter is on a GPU. With LibTorch 2.x, Adam and AdamW compute as torch.optim
// 2.x does (its lerp_ of the first moment; LibTorch's own classes round differently);
// with 1.13 they are LibTorch's, which is 1.13's torch.optim, and loop either way.
std::unique_ptr<torch::optim::Optimizer> MakeOptimizer(
    const OptimizerSpec& spec, const std::vector<at::Tensor>& params,
    std::optional<bool> multi_tensor = std::nullopt);

// `params` must be the optimizer's parameters in the order it was made with.
c10::IValue OptimizerStateDict(const OptimizerSpec& spec, torch::optim::Optimizer& optimizer,
                               const std::vector<at::Tensor>& params);

// Restores a state dict made by OptimizerStateDict for the same parameters.
// INVALID_ARGUMENT when it does not fit (another optimizer, other parameter shapes).
absl::Status LoadOptimizerStateDict(const OptimizerSpec& spec, torch::optim::Optimizer& optimizer,
                                    const std::vector<at::Tensor>& params,
                                    const c10::IValue& state_dict);

}  // namespace ddp

#endif  // DDP_LIBDDP_ENGINE_OPTIMIZER_H_
