// PyTorch's fused optimizers for LibTorch programs: torch.optim.AdamW, Adam and SGD with
// fused=True (decisions 170 and 171).
//
//   ddp::FusedAdamW opt(model->parameters(),
//                       torch::optim::AdamWOptions(6e-4).weight_decay(0.1));
//   ... loss.backward(); opt.step(); opt.zero_grad();
//
// step() updates the parameters of a param group that share a device and a dtype in one
// call of the kernel torch.optim calls with fused=True (at::_fused_adamw_,
// at::_fused_adam_, at::_fused_sgd_), after the same preparation, and keeps the state
// torch.optim keeps there: the values are torch.optim's with fused=True. The kernels run
// on CUDA GPUs and on the CPU, for floating-point parameters with dense gradients; they
// came with LibTorch 2.0, and built against 1.13 the constructors throw
// ErrorCode::kFailedPrecondition. The options are LibTorch's own (AdamWOptions,
// AdamOptions, SGDOptions), all of which the kernels take; what those cannot say keeps
// torch.optim's default (maximize=False, no gradient scaler).
//
// Made to be captured in a CUDA graph with the rest of a training step:
//   - step() reads nothing back from the device (no host synchronization);
//   - a parameter's step count is a float32 0-dim tensor on the parameter's device
//     (torch.optim's state["step"] with fused=True), incremented on the device inside
//     step(), so each replay of a captured step advances it;
//   - the learning rate can be a 0-dim tensor (set_lr_tensor), read by the kernel when
//     it runs, so a schedule writes it between replays (lr.fill_(value)); without one,
//     each param group's lr() is passed as a number (which a capture keeps as it was);
//   - a parameter's state (step count, moments, momentum buffer) is made at its first
//     step, which must run before the capture, and is never made again: load() and
//     ddp::Checkpointer write a loaded state into the tensors already there.
//
//   at::Tensor lr = torch::full({}, 6e-4, torch::dtype(torch::kFloat32).device(torch::kCUDA));
//   opt.set_lr_tensor(lr);
//   train_step();                               // eager: the state is made
//   at::cuda::CUDAGraph graph; ... graph.capture_begin(); train_step(); graph.capture_end();
//   for (...) { lr.fill_(schedule(step)); graph.replay(); }
//
// FusedSGD is a torch::optim::SGD with SGD's state (SGDParamState), so whatever takes an
// SGD takes it (torch::save and load, ddp::Checkpointer, ZeroRedundancyOptimizer's
// factory). FusedAdam and FusedAdamW keep FusedAdamParamState, Adam's state with the step
// count as a tensor; ddp::Checkpointer writes it in torch.optim's state_dict layout
// (step as a float tensor), the same as a LibTorch Adam's, so a checkpoint of either
// resumes the other.
#ifndef DDP_FUSED_OPTIMIZER_H_
#define DDP_FUSED_OPTIMIZER_H_

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/serialize.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/archive.h>

#include <utility>
#include <vector>

namespace ddp {

// What the fused optimizers share: the learning rate as a tensor. (An interface, so a
// program holding a torch::optim::Optimizer can ask: dynamic_cast<ddp::FusedOptimizer*>.)
class FusedOptimizer {
 public:
  virtual ~FusedOptimizer() = default;

  // The learning rate of every param group, read by the kernels at each step from this
  // 0-dim (or one-element) floating-point tensor, in place of the groups' lr(); an
  // undefined tensor goes back to lr(). Its dtype and device (decision 171):
  //   - parameters on a GPU: float32 on that GPU (the CUDA kernels read a float there).
  //     For AdamW and Adam the step then has the bits of the same lr given as a number
  //     (the kernels round that to float32 too); SGD's kernel multiplies by a number in
  //     double, so a float32 lr that differs from it can move a parameter by one ulp;
  //   - parameters on the CPU: on the CPU, float64 for the bits of the same lr as a
  //     number (the CPU kernels read it as a double; float32 rounds it first).
  // kInvalidArgument otherwise, naming what was given and what to give.
  virtual void set_lr_tensor(at::Tensor lr) = 0;
  virtual const at::Tensor& lr_tensor() const = 0;
};

// A parameter's state in FusedAdam and FusedAdamW: torch.optim Adam's with fused=True.
// `step` is a float32 0-dim tensor on the parameter's device; the moments have the
// parameter's shape, dtype and device; max_exp_avg_sq is there with amsgrad only.
struct FusedAdamParamState
    : public torch::optim::OptimizerCloneableParamState<FusedAdamParamState> {
  TORCH_ARG(at::Tensor, step);
  TORCH_ARG(at::Tensor, exp_avg);
  TORCH_ARG(at::Tensor, exp_avg_sq);
  TORCH_ARG(at::Tensor, max_exp_avg_sq);

 public:
  // torch::save and torch::load (and ZeroRedundancyOptimizer's consolidation).
  void serialize(torch::serialize::OutputArchive& archive) const override {
    for (const auto& [name, t] : {std::pair<const char*, const at::Tensor&>{"step", step_},
                                  {"exp_avg", exp_avg_},
                                  {"exp_avg_sq", exp_avg_sq_},
                                  {"max_exp_avg_sq", max_exp_avg_sq_}}) {
      if (t.defined()) archive.write(name, t, /*is_buffer=*/true);
    }
  }
  void serialize(torch::serialize::InputArchive& archive) override {
    for (auto& [name, t] : {std::pair<const char*, at::Tensor&>{"step", step_},
                            {"exp_avg", exp_avg_},
                            {"exp_avg_sq", exp_avg_sq_},
                            {"max_exp_avg_sq", max_exp_avg_sq_}}) {
      c10::IValue v;
      if (archive.try_read(name, v) && v.isTensor()) t = v.toTensor();
    }
  }
};

// torch.optim.AdamW(..., fused=True).
class FusedAdamW : public torch::optim::Optimizer, public FusedOptimizer {
 public:
  explicit FusedAdamW(const std::vector<torch::optim::OptimizerParamGroup>& param_groups,
                      torch::optim::AdamWOptions defaults = {});
  explicit FusedAdamW(std::vector<at::Tensor> params, torch::optim::AdamWOptions defaults = {});

  at::Tensor step(LossClosure closure = nullptr) override;
  void save(torch::serialize::OutputArchive& archive) const override;
  // Loads a FusedAdamW's archive; a parameter that has a state already gets the loaded
  // values written into its tensors.
  void load(torch::serialize::InputArchive& archive) override;
  void set_lr_tensor(at::Tensor lr) override;
  const at::Tensor& lr_tensor() const override { return lr_; }

 private:
  at::Tensor lr_;
};

// torch.optim.Adam(..., fused=True).
class FusedAdam : public torch::optim::Optimizer, public FusedOptimizer {
 public:
  explicit FusedAdam(const std::vector<torch::optim::OptimizerParamGroup>& param_groups,
                     torch::optim::AdamOptions defaults = {});
  explicit FusedAdam(std::vector<at::Tensor> params, torch::optim::AdamOptions defaults = {});

  at::Tensor step(LossClosure closure = nullptr) override;
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;
  void set_lr_tensor(at::Tensor lr) override;
  const at::Tensor& lr_tensor() const override { return lr_; }

 private:
  at::Tensor lr_;
};

// torch.optim.SGD(..., fused=True). A parameter's first step with momentum takes its
// gradient as the buffer (is_first_step), as torch.optim's does.
class FusedSGD : public torch::optim::SGD, public FusedOptimizer {
 public:
  explicit FusedSGD(const std::vector<torch::optim::OptimizerParamGroup>& param_groups,
                    torch::optim::SGDOptions defaults);
  explicit FusedSGD(std::vector<at::Tensor> params, torch::optim::SGDOptions defaults);

  at::Tensor step(LossClosure closure = nullptr) override;
  void load(torch::serialize::InputArchive& archive) override;
  void set_lr_tensor(at::Tensor lr) override;
  const at::Tensor& lr_tensor() const override { return lr_; }

 private:
  at::Tensor lr_;
};

}  // namespace ddp

#endif  // DDP_FUSED_OPTIMIZER_H_
