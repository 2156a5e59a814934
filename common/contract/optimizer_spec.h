// ddp::OptimizerSpec: an optimizer as torch.optim defines it (SGD, Adam, AdamW, one set of
// hyperparameters), with how its parameters are grouped and updated.
//
// A contract type: torch-free, defined here once (decision 103). job.yaml's
// train.optimizer is this struct (common/jobspec parses it); the engine makes optimizers
// and their state dicts from it (libddp/engine/optimizer.h), and libddp reads one back
// from a user's optimizer (OptimizerSpecOf) to checkpoint its state.
#ifndef DDP_CONTRACT_OPTIMIZER_SPEC_H_
#define DDP_CONTRACT_OPTIMIZER_SPEC_H_

namespace ddp {

enum class OptimizerKind { kSgd, kAdam, kAdamW };
// train.optimizer.fused: PyTorch's fused optimizer kernels (torch.optim's fused=True):
// auto (when every parameter is on a GPU and the LibTorch has them), true, false.
enum class FusedPolicy { kAuto, kTrue, kFalse };
// train.optimizer.weight_decay_params: which parameters weight_decay applies to: all, or
// matrices (nanoGPT's two param groups: 2 or more dimensions decay, the rest do not).
enum class WeightDecayParams { kAll, kMatrices };

struct OptimizerSpec {
  OptimizerKind kind = OptimizerKind::kAdam;
  double lr = 1e-3;
  double momentum = 0.0;  // sgd
  bool nesterov = false;  // sgd
  double weight_decay = 0.0;  // adamw default 1e-2
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  bool amsgrad = false;
  FusedPolicy fused = FusedPolicy::kAuto;
  WeightDecayParams weight_decay_params = WeightDecayParams::kAll;
  // ZeRO stage 1 (ddp::ZeroRedundancyOptimizer): each rank keeps the optimizer state of
  // its share of the parameters only; checkpoints hold the whole state (decision 163).
  bool zero_redundancy = false;
};

}  // namespace ddp

#endif  // DDP_CONTRACT_OPTIMIZER_SPEC_H_
