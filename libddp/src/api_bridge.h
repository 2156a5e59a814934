// libddp's inside: how the public classes hold the engine (its Comm, GradientReducer,
// CheckpointKeeper), and the bridge between the engine's absl::Status and the public
// ddp::Error, declared beside the public API's implementation that defines them. Part
// of the object library ddp_api, not installed. ddp-trainer, the library's first
// client, includes it (the one header of libddp/src/ included from outside libddp/) to
// reach the engine behind the public objects it makes (decision 139).
#ifndef DDP_LIBDDP_SRC_API_BRIDGE_H_
#define DDP_LIBDDP_SRC_API_BRIDGE_H_

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include <torch/optim/optimizer.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/contract/optimizer_spec.h"
#include "ddp/distributed_data_parallel.h"
#include "ddp/error.h"
#include "ddp/process_group.h"
#include "libddp/engine/comm.h"
#include "libddp/engine/environment.h"
#include "libddp/engine/reducer.h"

namespace ddp {

// The public error for an engine status (its code, message and exit code).
Error ErrorFromStatus(const absl::Status& status);
// Throws ErrorFromStatus(status) unless it is OK.
void ThrowIfError(const absl::Status& status);
template <typename T>
T ValueOrThrow(absl::StatusOr<T> v) {
  ThrowIfError(v.status());
  return *std::move(v);
}
// The engine status for a public error (ddp-trainer is written in statuses).
absl::Status StatusFromError(const Error& error);

// train.optimizer's optimizer through PyTorch's fused kernels (decision 170):
// ddp::FusedSGD, FusedAdam or FusedAdamW over `groups`, which carry their options
// (OptimizerParamGroups). Throws ddp::Error as their constructors do (LibTorch 1.13:
// kFailedPrecondition; ResolveFused never picks them there).
std::unique_ptr<torch::optim::Optimizer> MakeFusedOptimizer(
    const OptimizerSpec& spec, const std::vector<torch::optim::OptimizerParamGroup>& groups);

struct ProcessGroup::Impl {
  Environment env;
  DeviceChoice device;
  CommOptions options;
  std::optional<Comm> comm;

  // Live recovery: the old group is torn down (its peers see it go), then `next`'s
  // (a new generation's store) is formed in its place.
  absl::Status Reconnect(const Environment& next);

  // ProcessGroup::sum in statuses: `values` summed over all ranks (one double
  // all-reduce on the group's device).
  absl::StatusOr<std::vector<double>> Sum(const std::vector<double>& values);

  // What ProcessGroup::create does, in statuses.
  static absl::StatusOr<std::shared_ptr<ProcessGroup>> Create(const Environment& env,
                                                              const DeviceChoice& device,
                                                              const CommOptions& options);
};

struct DataParallel::Impl {
  std::shared_ptr<ProcessGroup> group;
  DdpOptions options;
  std::vector<at::Tensor> buffers;
  std::unique_ptr<GradientReducer> reducer;
  std::vector<at::Tensor> state;      // Parameters and buffers, broadcast at the start.
  std::vector<at::Tensor> trainable;  // What the reducer reduces.
  GradientReducer::Options reducer_options;
  ReducerTrace* trace = nullptr;
  BucketHook comm_hook;          // register_comm_hook's, kept across Rebuild().
  bool sync_buffers = true;      // Broadcast buffers before the next forward.
  bool grad_sync = true;         // false inside no_sync().
  // Set by ddp::Join (src/join.cc) while the model is in an enabled Join: runs in
  // prepare_forward instead of the buffer broadcast (the join's collectives and the
  // buffers' broadcast from a rank that has not joined).
  std::function<absl::Status(Impl&)> join_pre_forward;

  // What the public constructor does, in statuses. `trace` (may be null) records the
  // reducer's timeline.
  static absl::StatusOr<std::unique_ptr<DataParallel>> Create(NamedTensors parameters,
                                                              NamedTensors buffers,
                                                              std::shared_ptr<ProcessGroup> group,
                                                              DdpOptions options,
                                                              ReducerTrace* trace);
  // prepare_forward in statuses.
  absl::Status PrepareForward();
  // Live recovery: the reducer is dropped (its hooks with it) before the group
  // reconnects (DropReducer), then made again on the new group, after the same
  // broadcast of rank 0's state as the constructor's (Rebuild).
  void DropReducer() { reducer.reset(); }
  absl::Status Rebuild();
  // After backward() threw: the engine's status of the all-reduce that failed inside
  // it (and clears it), or nullopt when backward failed for another reason.
  std::optional<absl::Status> TakeBackwardError() { return reducer->TakeCallbackError(); }
};

}  // namespace ddp

#endif  // DDP_LIBDDP_SRC_API_BRIDGE_H_
