// ddp::Join: PyTorch's torch.distributed.algorithms.join.Join (uneven inputs) for
// LibTorch programs, with ddp::DistributedDataParallel and ddp::ZeroRedundancyOptimizer
// as Joinables (ddp::joinable(model), ddp::joinable(optimizer)).
//
// When ranks have different numbers of batches, a rank that runs out first would leave
// the others waiting forever in their next gradient all-reduce. Inside a Join, a rank
// that has run out ("joined") shadows the collectives of the ranks still training:
//
//   auto group = ddp::init_process_group();
//   ddp::DistributedDataParallel model(net, group);
//   torch::optim::SGD opt(model.module()->parameters(), 0.1);
//   ddp::join({ddp::joinable(model)}, [&] {       // with Join([model]):
//     for (auto& [x, y] : my_batches) {           //   (a different count per rank)
//       auto loss = loss_fn(model(x), y);
//       loss.backward();
//       opt.step();
//       opt.zero_grad();
//     }
//   });                                           // every rank leaves with the same model
//
// With ZeRO (PyTorch's Join([ddp_model, zero_optim])), the optimizer joins too, after
// the model:
//   ddp::ZeroRedundancyOptimizer zero(net->parameters(), group,
//                                     torch::optim::AdamOptions(1e-3));
//   ddp::join({ddp::joinable(model), ddp::joinable(zero)}, [&] { ... zero.step(); ... });
//
// What happens, as in PyTorch 2.x:
//   - every forward of a model in an enabled Join first all-reduces a 1 ("not joined")
//     on the Join's first joinable (Join::notify_join_context); a joined rank, in
//     Join::finish() (the end of ddp::join's body), all-reduces a 0 in the same place:
//     the sum is how many ranks still train; 0 ends the shadowing;
//   - for each iteration the others run, the joined rank calls every joinable's
//     JoinHook::main_hook(); DistributedDataParallel's:
//       * the buffer broadcast (broadcast_buffers), from the highest rank that has not
//         joined (rank 0 may have joined, its buffers stale), found by an all-reduce MAX;
//       * the "will this backward sync" all-reduce (0 from joined ranks; no_sync() or
//         a forward without grad on every training rank: no gradient all-reduce
//         follows, so none is shadowed);
//       * one all-reduce of zeros per gradient bucket, in bucket order, matching the
//         training ranks' backward;
//     ZeroRedundancyOptimizer's (PyTorch's _ZeROJoinHook), after the model's: its
//     step(), which updates this rank's shard with the gradients the joined rank holds
//     (DDP's shadow all-reduces zeros of its own, not into them: undefined gradients
//     after zero_grad() leave the shard as it is, zeros after zero_grad(false) still
//     move it by momentum or Adam's moments), then broadcasts every shard, matching the
//     training ranks' step;
//   - when all have joined, every joinable's post_hook(is_last_joiner):
//     DistributedDataParallel's broadcasts the parameters (and buffers, with
//     broadcast_buffers) from the highest of the last ranks to join, so every rank
//     leaves with the same model;
//   - divide_by_initial_world_size (default true, as PyTorch): a joined rank's zeros
//     count in the average (gradients are divided by the world size); false divides by
//     the number of ranks still training that iteration (the "not joined" count);
//   - throw_on_early_termination: instead of shadowing, the first rank to run out
//     throws ddp::Error ("Rank R exhausted all inputs") out of finish(), and every other
//     rank throws ddp::Error ("Detected at least one rank that exhausted inputs") from
//     its next forward, as PyTorch's RuntimeErrors;
//   - enable false: Join does nothing (every forward as without it).
//
// Limitations (ddp::Error when met; decision 158):
//   - the training ranks' collectives are only DistributedDataParallel's: a collective
//     of your own inside the body (an all-reduce of a metric, a barrier,
//     a ZeroRedundancyOptimizer's step without ddp::joinable(optimizer) in the Join,
//     SyncBatchNorm's statistics) has no shadow on a
//     joined rank and hangs or mismatches, as in PyTorch ("the joined rank does not
//     participate"): keep those outside the Join, or write a Joinable whose main_hook
//     issues the matching collective. libddp cannot detect this one;
//   - a model with a communication hook (register_comm_hook) cannot be joined: its
//     hook may talk more than one all-reduce per bucket (PowerSGD) and holds state a
//     joined rank cannot replay; PyTorch runs the hook on zeros;
//   - find_unused_parameters and static_graph cannot be joined yet (their extra
//     "locally used" all-reduce is not shadowed);
//   - a ZeroRedundancyOptimizer cannot be the first joinable of an enabled Join (list
//     the model first, as PyTorch's documentation does): the first joinable sends each
//     iteration's "not joined" before the others' collectives, and a joined rank's ZeRO
//     step would send a second one (PyTorch's does, and the ranks' collectives go out of
//     step) (decision 166).
#ifndef DDP_JOIN_H_
#define DDP_JOIN_H_

#include <c10/core/Device.h>

#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "ddp/distributed_data_parallel.h"
#include "ddp/process_group.h"

namespace ddp {

class ZeroRedundancyOptimizer;  // ddp/zero_redundancy_optimizer.h

// Join's settings (PyTorch: Join(joinables, enable, throw_on_early_termination,
// **kwargs); divide_by_initial_world_size is DDP's kwarg, given to every join_hook).
struct JoinOptions {
  bool enable = true;
  bool throw_on_early_termination = false;
  bool divide_by_initial_world_size = true;
};

// What a Join sets on each of its joinables (PyTorch's _JoinConfig).
struct JoinConfig {
  bool enable = false;
  bool throw_on_early_termination = false;
  bool is_first_joinable = false;
};

// PyTorch's JoinHook: what a joined rank runs for each of its joinables.
class JoinHook {
 public:
  virtual ~JoinHook() = default;
  // Once per iteration the other ranks still run (their collectives' shadows).
  virtual void main_hook() {}
  // Once, when every rank has joined; is_last_joiner: this rank ran out last.
  virtual void post_hook(bool /*is_last_joiner*/) {}
};

// PyTorch's Joinable. A Joinable calls Join::notify_join_context(*this) in each
// iteration before its collectives.
class Joinable {
 public:
  virtual ~Joinable() = default;
  virtual std::unique_ptr<JoinHook> join_hook(const JoinOptions& options) = 0;
  virtual at::Device join_device() const = 0;
  virtual ProcessGroup& join_process_group() const = 0;
  // Set by Join for its lifetime; disabled otherwise.
  JoinConfig join_config;
};

class Join {
 public:
  // Throws ddp::Error (kInvalidArgument) for no joinables, a null one, joinables on
  // different process groups, one already in another Join, a model this Join cannot
  // shadow, or a ZeroRedundancyOptimizer first (see the limitations above). Runs no
  // collective.
  explicit Join(std::vector<std::shared_ptr<Joinable>> joinables, JoinOptions options = {});
  // Disables the joinables' configs. It does not shadow: call finish() when this rank's
  // inputs are exhausted (ddp::join does), or the others wait in their next forward.
  ~Join();
  Join(const Join&) = delete;
  Join& operator=(const Join&) = delete;

  // PyTorch's __exit__ without an exception: shadows the others' iterations until every
  // rank has joined, then runs the post hooks. With throw_on_early_termination and a
  // rank still training, throws ddp::Error after notifying them. Once.
  void finish();

  // Called by a joinable in each of its iterations, before its collectives: the first
  // joinable of an enabled Join all-reduces "not joined" and returns how many ranks
  // have not joined (this one included); nullopt for the others or outside a Join.
  // throw_on_early_termination: throws ddp::Error when some rank has joined.
  static std::optional<int64_t> notify_join_context(Joinable& joinable);

 private:
  std::vector<std::shared_ptr<Joinable>> joinables_;
  std::vector<std::unique_ptr<JoinHook>> hooks_;
  JoinOptions options_;
  bool finished_ = false;
};

// Runs `body` (this rank's training loop) inside a Join over `joinables`, then
// finish(); an exception out of `body` leaves without joining (PyTorch's __exit__
// with an exception: the others are not shadowed).
void join(std::vector<std::shared_ptr<Joinable>> joinables, const std::function<void()>& body,
          JoinOptions options = {});

// DistributedDataParallel (its engine) as a Joinable; the model must outlive it. A
// model is in one Join at a time.
std::shared_ptr<Joinable> joinable(DataParallel& core);
template <typename M>
std::shared_ptr<Joinable> joinable(DistributedDataParallel<M>& model) {
  return joinable(model.core());
}

// ZeroRedundancyOptimizer as a Joinable (PyTorch's ZeroRedundancyOptimizer.join_hook:
// a joined rank runs the optimizer's step() for each iteration the others run); the
// optimizer must outlive it; one at a time per optimizer; list it after the model.
std::shared_ptr<Joinable> joinable(ZeroRedundancyOptimizer& optimizer);

}  // namespace ddp

#endif  // DDP_JOIN_H_
