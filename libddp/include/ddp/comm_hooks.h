// Communication hooks: PyTorch's DDP register_comm_hook and its built-in hooks
// (torch.distributed.algorithms.ddp_comm_hooks) for libddp's DistributedDataParallel.
//
//   ddp::DistributedDataParallel model(net, group);
//   model.register_comm_hook(group, ddp::hooks::fp16_compress_hook);
//   // or PowerSGD:
//   ddp::hooks::PowerSGDOptions o;
//   o.matrix_approximation_rank = 1;
//   o.start_powerSGD_iter = 10;
//   auto state = std::make_shared<ddp::hooks::PowerSGDState>(group, o);
//   model.register_comm_hook(state, ddp::hooks::powerSGD_hook);
//
// With a hook registered, each gradient bucket is handed to the hook instead of being
// all-reduced: bucket.buffer() holds the bucket's gradients as this rank computed them
// (accumulated over no_sync() steps, NOT divided by the world size: the hook divides,
// as PyTorch's do), and the hook returns the averaged bucket, a tensor shaped like
// bucket.buffer() with its dtype and device (often the buffer itself, reduced in place);
// DDP copies it into param.grad(). Hooks run when their bucket is ready, in bucket
// order on every rank, so they may call collectives (ProcessGroup::all_reduce_sum);
// those are synchronous. PyTorch's hooks return a Future of that tensor; here the hook
// returns the tensor itself.
#ifndef DDP_COMM_HOOKS_H_
#define DDP_COMM_HOOKS_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ddp/process_group.h"

namespace ddp {

// PyTorch's torch.distributed.GradBucket: one bucket of gradients.
class GradBucket {
 public:
  GradBucket(int64_t index, bool is_last, at::Tensor buffer, std::vector<at::Tensor> gradients,
             std::vector<at::Tensor> parameters)
      : index_(index),
        is_last_(is_last),
        buffer_(std::move(buffer)),
        gradients_(std::move(gradients)),
        parameters_(std::move(parameters)) {}

  // The bucket's position: 0 is the first to be ready in backward.
  int64_t index() const { return index_; }
  // Whether it is the last bucket of this backward (the last to be ready).
  bool is_last() const { return is_last_; }
  // The flat 1-D buffer of the bucket's gradients, concatenated in parameters() order.
  const at::Tensor& buffer() const { return buffer_; }
  // Per parameter, a view into buffer() shaped like the parameter.
  const std::vector<at::Tensor>& gradients() const { return gradients_; }
  // The bucket's parameters (model parameters, not copies), in buffer() order.
  const std::vector<at::Tensor>& parameters() const { return parameters_; }

 private:
  int64_t index_;
  bool is_last_;
  at::Tensor buffer_;
  std::vector<at::Tensor> gradients_;
  std::vector<at::Tensor> parameters_;
};

// A hook: returns the bucket's averaged gradients (shaped like bucket.buffer()).
using CommHook = std::function<at::Tensor(GradBucket& bucket)>;

namespace hooks {

// default_hooks.allreduce_hook: divides the buffer by the world size and all-reduces it
// (what DDP does without a hook).
at::Tensor allreduce_hook(ProcessGroup& group, GradBucket& bucket);
// default_hooks.fp16_compress_hook: all-reduces buffer.to(float16) / world and copies
// the sum back into the buffer. Half the bytes of float32.
at::Tensor fp16_compress_hook(ProcessGroup& group, GradBucket& bucket);
// default_hooks.bf16_compress_hook: the same in bfloat16 (Gloo sums bfloat16 from
// PyTorch 2.x on; with LibTorch 1.13 the all-reduce throws).
at::Tensor bf16_compress_hook(ProcessGroup& group, GradBucket& bucket);

// powerSGD_hook.PowerSGDState's arguments, with PyTorch's names and defaults.
struct PowerSGDOptions {
  int64_t matrix_approximation_rank = 1;
  // Vanilla all-reduce (allreduce_hook) for the first start_powerSGD_iter iterations.
  int64_t start_powerSGD_iter = 1000;
  // A gradient is compressed only when (rows + cols) * rank * min_compression_rate <
  // rows * cols; the others (biases, small matrices) are all-reduced uncompressed.
  double min_compression_rate = 2;
  bool use_error_feedback = true;
  bool warm_start = true;
  double orthogonalization_epsilon = 0;
  // Seeds the generator of Q's initial values, as numpy.random.RandomState(random_seed)
  // does in PyTorch (same seed, same values on every rank).
  uint32_t random_seed = 0;
  bool batch_tensors_with_same_shape = false;
};

// powerSGD_hook.PowerSGDState: the options and what PowerSGD keeps between iterations.
// Throws ddp::Error (kInvalidArgument) as PyTorch raises ValueError:
// start_powerSGD_iter must be > 1 with use_error_feedback or warm_start.
class PowerSGDState {
 public:
  explicit PowerSGDState(std::shared_ptr<ProcessGroup> process_group,
                         PowerSGDOptions options = {});

  const PowerSGDOptions& options() const { return options_; }
  ProcessGroup& process_group() const { return *process_group_; }
  // Iterations (backwards whose last bucket went through the hook) so far.
  int64_t iter() const { return iter_; }
  // PyTorch's compression_stats(): (rate, numel before, numel after compression), over
  // every bucket PowerSGD compressed so far.
  std::tuple<double, int64_t, int64_t> compression_stats() const;

  // PowerSGDState.__getstate__/__setstate__: what a checkpoint must keep for a resumed
  // run to go on as if it had never stopped: the iteration count, the generator of Q's
  // initial values, and per bucket the error feedback ("error.<bucket>") and the warm
  // start's P and Q ("p_memory.<bucket>", "q_memory.<bucket>"), plus the options
  // ("option.<name>") and the compression statistics. The error feedback is this
  // rank's own (it differs between ranks): save each rank's state_dict(), as PyTorch
  // pickles each rank's state, and load it on the same rank of a group of the same
  // size. load_state_dict() throws ddp::Error (kInvalidArgument) naming the entry when
  // the state was saved with other options (matrix_approximation_rank, ...), is missing
  // an entry, or holds one it does not know; nothing changes then.
  std::vector<std::pair<std::string, at::Tensor>> state_dict() const;
  void load_state_dict(const std::vector<std::pair<std::string, at::Tensor>>& state);

 private:
  friend at::Tensor powerSGD_hook(PowerSGDState& state, GradBucket& bucket);
  void MaybeIncreaseIter(const GradBucket& bucket);

  std::shared_ptr<ProcessGroup> process_group_;
  PowerSGDOptions options_;
  std::mt19937 rng_;  // numpy's RandomState is this MT19937, seeded the same way.
  std::map<int64_t, at::Tensor> error_dict_, p_memory_dict_, q_memory_dict_;
  int64_t iter_ = 0;
  int64_t total_numel_before_compression_ = 0;
  int64_t total_numel_after_compression_ = 0;
};

// powerSGD_hook.powerSGD_hook (Vogels et al., NeurIPS 2019): each gradient matrix M
// (rows x the rest) of the bucket goes as two all-reduced low-rank factors P = M Q and
// Q = M^T P instead of M; tensors not worth compressing go uncompressed in one
// all-reduce. Bytes per compressed matrix: (rows + cols) * rank * element size.
at::Tensor powerSGD_hook(PowerSGDState& state, GradBucket& bucket);

}  // namespace hooks
}  // namespace ddp

#endif  // DDP_COMM_HOOKS_H_
