// SyncBatchNorm: batch norm whose training statistics span every rank of the group
// (torch.nn.SyncBatchNorm), and convert_sync_batchnorm, which swaps a model's
// BatchNorm1d/2d/3d modules for it (torch.nn.SyncBatchNorm.convert_sync_batchnorm).
//
//   auto group = ddp::init_process_group();
//   torch::nn::Sequential net(torch::nn::Linear(10, 16), torch::nn::BatchNorm1d(16),
//                             torch::nn::ReLU(), torch::nn::Linear(16, 3));
//   ddp::convert_sync_batchnorm(net.ptr(), group);   // before wrapping, as in PyTorch
//   ddp::DistributedDataParallel model(net, group);
//
// PyTorch's definition, step for step: in training with more than one rank, each rank's
// per-channel mean and inverse std and its row count are gathered from every rank, the
// global mean and variance are combined from them (ranks may hold different batch
// sizes, or none), the running statistics take the unbiased global variance, and
// backward sums the gradient's two per-channel reductions over the ranks. With one rank
// or in eval mode it is plain batch norm (PyTorch falls back the same way). Unlike PyTorch, which accepts only GPU inputs, it
// also runs on the CPU (Gloo): the same arithmetic in plain tensor ops (decision 156).
//
// Misuse throws ddp::Error (kInvalidArgument): an input with fewer than 2 dimensions,
// a channel count (dim 1) other than num_features, no group.
#ifndef DDP_SYNC_BATCH_NORM_H_
#define DDP_SYNC_BATCH_NORM_H_

#include <torch/nn/cloneable.h>
#include <torch/nn/module.h>
#include <torch/nn/options/batchnorm.h>
#include <torch/nn/pimpl.h>

#include <memory>

#include "ddp/process_group.h"

namespace ddp {

// torch.nn.SyncBatchNorm(num_features, eps, momentum, affine, track_running_stats,
// process_group). The options are LibTorch's BatchNormOptions (momentum nullopt: the
// cumulative average, as momentum=None). Parameters weight, bias; buffers running_mean,
// running_var, num_batches_tracked: the names and state dict of BatchNorm's.
class SyncBatchNormImpl : public torch::nn::Cloneable<SyncBatchNormImpl> {
 public:
  SyncBatchNormImpl(const torch::nn::BatchNormOptions& options,
                    std::shared_ptr<ProcessGroup> group);
  SyncBatchNormImpl(int64_t num_features, std::shared_ptr<ProcessGroup> group)
      : SyncBatchNormImpl(torch::nn::BatchNormOptions(num_features), std::move(group)) {}
  // The replacement convert_sync_batchnorm makes for one torch::nn::BatchNorm1d/2d/3d:
  // its options and training flag, and its very parameters and buffers (the same tensors,
  // as PyTorch's conversion keeps the same Parameters). kInvalidArgument for another module.
  SyncBatchNormImpl(const torch::nn::Module& batch_norm, std::shared_ptr<ProcessGroup> group);

  // Any input of shape (N, C, ...) with C = num_features.
  torch::Tensor forward(const torch::Tensor& input);

  void reset() override;
  void reset_parameters();
  void reset_running_stats();
  void pretty_print(std::ostream& stream) const override;

  const std::shared_ptr<ProcessGroup>& group() const { return group_; }

  torch::nn::BatchNormOptions options;
  torch::Tensor weight, bias;
  torch::Tensor running_mean, running_var, num_batches_tracked;

 private:
  std::shared_ptr<ProcessGroup> group_;
};
TORCH_MODULE(SyncBatchNorm);

// torch.nn.SyncBatchNorm.convert_sync_batchnorm(module, process_group): every
// torch::nn::BatchNorm1d/2d/3d in `module`'s tree becomes a SyncBatchNorm with its options,
// training flag, and its very parameters and buffers. Returns the converted module:
// `module` itself, or the new SyncBatchNorm when `module` is a BatchNorm.
//
// LibTorch modules call their children through typed members, which no conversion can
// re-point (replace_module only renames the registration). So a BatchNorm is replaced
// where the call goes through the tree: a child of torch::nn::Sequential or ModuleList (in
// place, so members holding those stay valid) or a child registered and held nowhere
// else. A BatchNorm that a member of your module also holds throws ddp::Error
// (kInvalidArgument) naming it, before anything is changed: declare that member as
// ddp::SyncBatchNorm, or build that part as a torch::nn::Sequential.
std::shared_ptr<torch::nn::Module> convert_sync_batchnorm(
    std::shared_ptr<torch::nn::Module> module, std::shared_ptr<ProcessGroup> group);

}  // namespace ddp

#endif  // DDP_SYNC_BATCH_NORM_H_
