// Our gradient reducer: PyTorch DDP's bucketed all-reduce, built on c10d collectives.
//
// Debian's libtorch-dev lacks the headers c10d::Reducer needs, so this is ours. It
// follows PyTorch's semantics:
//   - Parameters are grouped into buckets in reverse registration order (the order
//     backward produces their gradients); the first bucket closes at 1 MiB, later ones
//     at bucket_cap_mb (a bucket closes once it reaches its cap, as in
//     compute_bucket_assignment_by_size).
//   - A post-hook on every parameter's AccumulateGrad node (PyTorch's
//     grad_accumulators_ and autograd_hook) copies param.grad, accumulated, times
//     1/world, into the bucket's flat buffer. It runs also when the incoming gradient is
//     undefined (a tensor hook does not, under LibTorch 1.13). When a bucket's last gradient arrives, and every earlier bucket has
//     been launched, its async all-reduce (SUM) starts, so communication overlaps the
//     rest of backward. Buckets launch in index order on every rank, as collectives
//     must match across ranks. The all-reduce is Comm's: through shared memory on a
//     node (then among node leaders) or the backend's; later hooks let shared-memory
//     sums progress without waiting (Comm::Poll).
//   - FinishBackward() launches buckets whose parameters got no gradient (unused in
//     this forward; treated as zero), waits for every all-reduce with the collective
//     timeout, and copies the averages into param.grad. As PyTorch, a parameter that
//     got no gradient and that nothing marked unused (find_unused_parameters' graph
//     walk, static_graph's first iteration) leaves the reduction unfinished: the
//     gradients stay local and CheckPriorReduction() fails the next forward. A hook
//     called with an undefined gradient (a custom Function returned none) reduces
//     param.grad as it is, or zeros. With finish_in_backward (what
//     libddp's DistributedDataParallel uses), the first hook of a sync backward queues
//     it as the autograd engine's final callback, as PyTorch's reducer queues
//     finalize_backward, so backward() returns with the averages in place; a failure
//     there throws out of backward() and TakeCallbackError() says why.
//   - With a communication hook (SetCommHook, PyTorch's register_comm_hook) a bucket's
//     buffer holds the gradients as they are (not times 1/world: PyTorch's reducer
//     copies them so when a hook is registered), and when the bucket is ready the hook
//     runs instead of the all-reduce, in bucket order, on the thread that runs
//     backward's hooks, and returns the averaged bucket (its collectives are
//     synchronous). With a hook a world of 1 runs it too, as PyTorch does. As PyTorch's
//     reducer does, a bucket's parameters lie in registration order in the first sync
//     backward, and from the second on in the order the first one produced their
//     gradients (its rebuild_buckets): a hook sees the buffer PyTorch's sees (which
//     matters to PowerSGD's per-tensor work, and to how Gloo's ring orders each
//     element's sum over 3 or more ranks).
//   - A non-sync backward (PyTorch's no_sync, for gradient accumulation) leaves
//     gradients to accumulate locally; the next sync backward all-reduces the
//     accumulated sum, exactly as DDP reduces param.grad after accumulation.
//
// Lifecycle per optimizer step: PrepareForBackward(sync) -> loss.backward() ->
// FinishBackward() (sync steps only, unless finish_in_backward) -> optimizer.step(). Not thread-safe across
// steps; hooks may run on autograd's device threads, so per-step state is locked.
#ifndef DDP_LIBDDP_ENGINE_REDUCER_H_
#define DDP_LIBDDP_ENGINE_REDUCER_H_

#include <ATen/ATen.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "libddp/engine/comm.h"

namespace torch::autograd {
struct Node;
}  // namespace torch::autograd

namespace ddp {

// Records the reducer's timeline for one step (metrics.trace_buckets): which
// gradients became ready and when each bucket's all-reduce was launched and done.
class ReducerTrace {
 public:
  enum class Kind { kGradReady, kLaunch, kBackwardEnd, kWaitDone };
  struct Entry {
    Kind kind;
    int64_t index;    // Parameter index (kGradReady) or bucket index.
    double micros;    // Since Reset().
  };
  void Reset();
  void Record(Kind kind, int64_t index);
  std::vector<Entry> Take();
  static const char* KindName(Kind kind);

 private:
  std::mutex mu_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::vector<Entry> entries_;
};

struct BucketLayout {
  std::vector<size_t> params;  // Parameter indices, in the order they fill the bucket.
  int64_t numel = 0;
  int64_t bytes = 0;
};

// Groups parameters into buckets as described above. `sizes_bytes[i]` is parameter
// i's gradient size; all parameters share one dtype and device here.
std::vector<BucketLayout> AssignBuckets(const std::vector<int64_t>& sizes_bytes,
                                        int64_t first_cap_bytes, int64_t cap_bytes);

// A communication hook as the reducer calls it: bucket `index` of `count`, its flat
// buffer, the per-parameter views into it and the parameters. Returns the averaged
// bucket, shaped like `buffer` (may be `buffer` itself).
using BucketHook = std::function<at::Tensor(size_t index, size_t count, const at::Tensor& buffer,
                                            const std::vector<at::Tensor>& views,
                                            const std::vector<at::Tensor>& params)>;

class GradientReducer {
 public:
  struct Options {
    int64_t bucket_cap_bytes = 25 * 1024 * 1024;
    int64_t first_bucket_cap_bytes = 1024 * 1024;
    // Run FinishBackward as autograd's final callback of every sync backward.
    bool finish_in_backward = false;
    // finish_in_backward: throws the exception backward() propagates when FinishBackward
    // fails (libddp throws its ddp::Error); null: std::runtime_error.
    std::function<void(const absl::Status&)> throw_failure;
    // PyTorch's find_unused_parameters: SetOutputs() walks the autograd graph from the
    // forward's outputs; parameters it does not reach are ready at the first hook, and
    // the all-reduced "locally used" map leaves the gradients of parameters no rank
    // used untouched (undefined stays undefined).
    bool find_unused_parameters = false;
    // PyTorch's static_graph: the first sync backward reduces everything at its end and
    // records how often each parameter's hook fired and which ones were used (the
    // all-reduced map); later backwards take the unused ones as ready at the first
    // hook and a parameter as ready once its hook fired as often (reentrant backward).
    bool static_graph = false;
    // Parameter names, for errors (may be empty: indices only).
    std::vector<std::string> names;
  };

  // Registers a post-hook on every parameter's AccumulateGrad node; they must all require grad and
  // share dtype and device. `comm` must outlive the reducer; `trace` may be null.
  GradientReducer(std::vector<at::Tensor> params, Comm* comm, Options options,
                  ReducerTrace* trace);
  ~GradientReducer();  // Removes the hooks.
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // Arms the hooks for the next backward. sync=false: accumulate locally only.
  void PrepareForBackward(bool sync);
  // find_unused_parameters: the forward's outputs, after PrepareForBackward(true)
  // (PyTorch's prepare_for_backward(outputs)). Parameters autograd cannot reach from
  // them are unused in this backward.
  // Also, with finish_in_backward, a pre-hook on each output's grad_fn queues the end
  // of the reduction in the backward that starts from them (PyTorch's _DDPSink), not in
  // the one where the first gradient hook runs (a reentrant backward's, with activation
  // checkpointing). Without outputs, the first hook queues it.
  void SetOutputs(const std::vector<at::Tensor>& outputs);
  // The outputs' pre-hook (SetOutputs).
  void QueueFinishFromOutputs();
  // Before a forward with grad enabled: FAILED_PRECONDITION with PyTorch's "Expected to
  // have finished reduction in the prior iteration" when the last sync backward left
  // parameters without a gradient that nothing marked unused (without
  // find_unused_parameters: parameters this forward did not use) or, with
  // static_graph, the graph changed.
  absl::Status CheckPriorReduction() const;
  // After a sync backward: waits for every bucket and writes averaged gradients.
  // Returns the time spent waiting (communication not hidden by backward).
  // UNAVAILABLE when an all-reduce fails or times out (a peer died or hung).
  absl::StatusOr<absl::Duration> FinishBackward();

  // Runs `hook` on each ready bucket instead of the all-reduce, from the next backward
  // on (null: back to the plain all-reduce).
  void SetCommHook(BucketHook hook);
  // Sync backwards that FinishBackward completed.
  int64_t finished_backwards() const;
  // Bytes this rank all-reduced in the last sync backward: the buckets, or what the
  // hook passed to Comm's sums.
  int64_t last_allreduce_bytes() const;

  // ddp::Join with divide_by_initial_world_size false: the next backwards divide the
  // gradients by `n` (the ranks still training) instead of the world size.
  // (DDP's div factor from Join's "not joined" count). Call it between backwards.
  void SetDivFactor(int64_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    scale_ = at::scalar_tensor(1.0 / static_cast<double>(n),
                               at::TensorOptions().dtype(at::kDouble));
  }
  const std::vector<BucketLayout>& buckets() const { return buckets_; }
  // finish_in_backward: the wait of the last sync backward's FinishBackward.
  absl::Duration last_wait() const;
  // finish_in_backward: why the last backward threw, if FinishBackward failed in it
  // (cleared by the call).
  std::optional<absl::Status> TakeCallbackError();

 private:
  struct Bucket {
    BucketLayout layout;
    at::Tensor flat;                 // The all-reduce buffer.
    std::vector<at::Tensor> views;   // Per parameter, shaped like it, into `flat`.
    size_t pending = 0;              // Gradients still to arrive this step.
    std::vector<at::Tensor> params;  // The bucket's parameters, in `views` order.
    std::unique_ptr<PendingSum> work;
  };

  void OnGradient(size_t param_index);  // The AccumulateGrad post-hook.
  // Writes parameter i's bucket view from param.grad as it is (zeros when undefined)
  // and marks it ready. Caller holds mu_.
  void MarkFromGradLocked(size_t i);
  // Marks the parameters known unused this backward ready. Caller holds mu_.
  void MarkUnusedLocked();
  // finish_in_backward: queues FinishBackward as autograd's final callback, once per
  // backward. Caller holds mu_.
  void QueueFinishLocked();
  // find_unused_parameters or static_graph's first sync backward.
  bool TracksUsageLocked() const {
    return (options_.find_unused_parameters && !options_.static_graph) ||
           (options_.static_graph && finished_ == 0);
  }
  std::string ParamName(size_t i) const;
  void LaunchReadyLocked();  // Caller holds mu_.
  void FinishFromCallback();
  void Launch(Bucket& bucket, size_t index);
  void RegisterHooks();
  // Bucket b's per-parameter views into its flat buffer, in its layout's order.
  void ViewBucket(size_t b);
  // Lays each bucket's parameters out in the order of `position` (param -> rank).
  void LayOutLocked(const std::vector<size_t>& position);

  std::vector<at::Tensor> params_;
  Comm* comm_;
  // World 1: nothing to reduce; backward's own accumulation is the result, so the
  // hooks copy nothing and FinishBackward only zeroes unused parameters' gradients.
  bool alone_ = false;
  at::Tensor scale_;  // 0-dim 1/world, as DDP's div factor.
  Options options_;
  ReducerTrace* trace_;
  std::vector<BucketLayout> buckets_;
  std::vector<Bucket> state_;
  std::vector<std::pair<size_t, size_t>> locate_;  // param -> (bucket, slot)
  std::vector<uintptr_t> hook_keys_;  // Our post-hook on accumulators_[i].
  BucketHook comm_hook_;
  bool relayout_pending_ = false;     // Registration order until the first sync backward.
  std::vector<size_t> ready_order_;   // Parameters in the order that backward readied them.

  mutable std::mutex mu_;
  bool sync_ = false;
  std::vector<bool> ready_;   // Per parameter, this step.
  size_t next_launch_ = 0;    // Buckets [0, next_launch_) have been launched.
  bool callback_queued_ = false;
  absl::Duration last_wait_;
  int64_t step_bytes_ = 0;   // This backward's all-reduced bytes so far.
  int64_t last_bytes_ = 0;
  int64_t finished_ = 0;
  std::optional<absl::Status> callback_error_;

  // find_unused_parameters / static_graph.
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;  // AccumulateGrad nodes.
  bool outputs_given_ = false;         // SetOutputs since PrepareForBackward.
  bool finish_from_outputs_ = false;   // The outputs' grad_fn queue the finish.
  bool hooks_fired_ = false;           // A hook ran in this sync backward.
  std::shared_ptr<GradientReducer*> self_;  // Null once destroyed (outputs' pre-hooks).
  std::vector<size_t> unused_;         // Known unused this backward.
  bool marked_unused_ = false;         // unused_ marked ready this backward.
  std::vector<float> local_used_;      // Per parameter: a defined gradient this backward.
  std::vector<bool> global_used_;      // The all-reduced map (static_graph: the first's).
  std::vector<int> expected_fires_;    // static_graph: hook calls per backward.
  std::vector<int> fires_;             // This backward's hook calls.
  std::vector<size_t> unmarked_;       // Left without a gradient by the last sync backward.
  bool graph_changed_ = false;         // static_graph: more hook calls than recorded.
};

}  // namespace ddp

#endif  // DDP_LIBDDP_ENGINE_REDUCER_H_
