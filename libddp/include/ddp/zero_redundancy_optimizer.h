// ZeroRedundancyOptimizer: ZeRO stage 1, the optimizer state sharded over the ranks
// (torch.distributed.optim.ZeroRedundancyOptimizer, parameters_as_bucket_view=False).
//
//   auto group = ddp::init_process_group();
//   ddp::DistributedDataParallel model(net, group);
//   ddp::ZeroRedundancyOptimizer opt(model.module()->parameters(), group,
//                                    torch::optim::AdamOptions(1e-3));
//   ... loss.backward(); opt.step(); opt.zero_grad();
//   opt.consolidate_state_dict(0);             // collective
//   if (group->rank() == 0) torch::save(opt, "optimizer.pt");   // a plain Adam's file
//
// Every parameter is owned by one rank, chosen as PyTorch does: per param group, the
// parameters sorted by numel, largest first (ties keep their order), each to the rank
// with the smallest total numel so far (lowest rank on ties), totals carried across
// groups. Each rank holds a local optimizer of the kind named (made by the factory) over
// its own parameters only, so it keeps the optimizer state (Adam's two moments, say)
// of about 1/world of the model. step() runs the local optimizer, then every rank's
// updated parameters are broadcast from their owner, so all ranks hold the same model
// again. The arithmetic of each parameter's update is the plain optimizer's, so a run
// with ZeRO gives the same bits as the same run with the plain optimizer.
//
// It is a torch::optim::Optimizer: param_groups() are all the parameters with their
// options (an LrScheduler sets the learning rate there; step() hands the options to the
// local optimizer), zero_grad() clears every parameter's gradient, and save/load
// (torch::save, torch::load) read and write the *unsharded* state in the plain
// optimizer's own archive layout:
//   - consolidate_state_dict(to) (collective) gathers every rank's shard on rank `to`,
//     after which state() there holds every parameter's state, keyed by the parameter
//     as a plain optimizer's is, and save() writes exactly what the plain optimizer over
//     the same param groups would (PyTorch's state_dict() after consolidate_state_dict);
//     save() anywhere else, or before consolidating, throws kFailedPrecondition.
//   - load() (PyTorch's load_state_dict) takes such an archive, from a ZeRO run or a
//     plain one, on every rank and keeps the state of the parameters this rank owns.
//
// Misuse throws ddp::Error (kInvalidArgument): no parameters, no group, LBFGS (its step
// re-evaluates a closure over all parameters and keeps one history for all of them),
// a factory that returns nothing or other param groups, param groups that differ across
// ranks (every rank must pass the same parameters in the same groups and order).
// With one rank it is the plain optimizer.
//
// Uneven inputs: ddp::joinable(opt) (ddp/join.h) is the optimizer as a Joinable,
// PyTorch's ZeroRedundancyOptimizer in Join([model, opt]):
//   ddp::join({ddp::joinable(model), ddp::joinable(opt)}, [&] { ...training loop... });
// a rank that has run out still runs step() for every iteration the others run (its
// shard's update with the gradients it holds: none after zero_grad(), zeros after
// zero_grad(false)), so its parameters are still broadcast to them (decision 166).
#ifndef DDP_ZERO_REDUNDANCY_OPTIMIZER_H_
#define DDP_ZERO_REDUNDANCY_OPTIMIZER_H_

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/lbfgs.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <functional>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "ddp/process_group.h"

namespace ddp {

class Joinable;  // ddp/join.h

// What makes the optimizer of one rank's shard (PyTorch's optimizer_class and
// **defaults): the options of a LibTorch optimizer (torch::optim::SGDOptions,
// AdamOptions, AdamWOptions, RMSpropOptions, AdagradOptions), or any callable that
// builds a torch::optim::Optimizer over the param groups it is given (each group comes
// with its options) -- an optimizer of your own, say.
class OptimizerFactory {
 public:
  using Fn = std::function<std::unique_ptr<torch::optim::Optimizer>(
      std::vector<torch::optim::OptimizerParamGroup>)>;

  OptimizerFactory(const torch::optim::SGDOptions& options);       // NOLINT: implicit
  OptimizerFactory(const torch::optim::AdamOptions& options);      // NOLINT
  OptimizerFactory(const torch::optim::AdamWOptions& options);     // NOLINT
  OptimizerFactory(const torch::optim::RMSpropOptions& options);   // NOLINT
  OptimizerFactory(const torch::optim::AdagradOptions& options);   // NOLINT
  OptimizerFactory(const torch::optim::LBFGSOptions& options);     // NOLINT: refused later
  template <typename F, typename = std::enable_if_t<std::is_invocable_r_v<
                            std::unique_ptr<torch::optim::Optimizer>, F&,
                            std::vector<torch::optim::OptimizerParamGroup>>>>
  OptimizerFactory(F fn) : fn_(std::move(fn)) {}  // NOLINT

  std::unique_ptr<torch::optim::Optimizer> operator()(
      std::vector<torch::optim::OptimizerParamGroup> groups) const {
    return fn_(std::move(groups));
  }

 private:
  Fn fn_;
};

class ZeroRedundancyOptimizer : public torch::optim::Optimizer {
 public:
  // Collective: every rank passes the same parameters (the same model's, in the same
  // order and groups). Groups without options take the factory's defaults.
  ZeroRedundancyOptimizer(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                          std::shared_ptr<ProcessGroup> group, OptimizerFactory factory);
  ZeroRedundancyOptimizer(std::vector<at::Tensor> params, std::shared_ptr<ProcessGroup> group,
                          OptimizerFactory factory);
  ~ZeroRedundancyOptimizer() override;

  // Collective: the local optimizer's step on this rank's parameters (with the param
  // groups' current options), then each rank's parameters broadcast from it. Returns
  // what the local optimizer's step returned (the closure's loss, if any). In a Join
  // (ddp::joinable(*this)) it first calls Join::notify_join_context, as PyTorch's.
  at::Tensor step(LossClosure closure = nullptr) override;

  // Collective: every rank's optimizer state sent to rank `to` (kInvalidArgument for a
  // rank outside the group), where state() and save() then give the whole state. The
  // state is a snapshot: consolidate again after more steps.
  void consolidate_state_dict(int to = 0);
  // Whether this rank holds a consolidated state (consolidate_state_dict(this rank)).
  bool consolidated() const { return consolidated_; }

  // PyTorch's state_dict(): the consolidated state, in the plain optimizer's layout.
  void save(torch::serialize::OutputArchive& archive) const override;
  // PyTorch's load_state_dict(): every rank loads the whole state (a plain optimizer's
  // archive over the same param groups, or this one's) and keeps its own shard.
  // kInvalidArgument when the archive does not fit the param groups.
  void load(torch::serialize::InputArchive& archive) override;

  // Collective: a new param group (parameters not yet in any group), partitioned as
  // PyTorch does: the earlier groups keep their owners, the new group's parameters go
  // to the ranks with the smallest totals. (Hides Optimizer::add_param_group: call it
  // on the ZeroRedundancyOptimizer itself.) Not for Adagrad, which, like LibTorch's
  // own, makes its state only when constructed.
  void add_param_group(const torch::optim::OptimizerParamGroup& param_group);

  // The rank that owns parameter `index` (the parameters of all groups, in order).
  int owner(int64_t index) const { return owner_.at(static_cast<size_t>(index)); }
  // Per rank, the indices of the parameters it owns, per group in PyTorch's order
  // (largest first).
  std::vector<std::vector<int64_t>> partition() const;
  // This rank's optimizer, over the parameters it owns (one group per param group,
  // possibly empty).
  torch::optim::Optimizer& local_optimizer() { return *local_; }
  const std::shared_ptr<ProcessGroup>& group() const { return group_; }

 private:
  struct Probe;
  ZeroRedundancyOptimizer(Probe probe, std::shared_ptr<ProcessGroup> group,
                          OptimizerFactory factory);
  // Assigns the parameters of group `g` (appended) to ranks, PyTorch's greedy rule.
  void PartitionGroup(size_t g);
  // This rank's share of group `g`, with the group's current options.
  torch::optim::OptimizerParamGroup ShardOf(int rank, size_t g) const;
  // The param groups' options into the local optimizer (PyTorch's _sync_param_groups).
  void SyncOptionsToLocal();
  // Throws on every rank when any rank's param groups differ from rank 0's.
  void CheckSameOnEveryRank(const char* what,
                            const std::vector<torch::optim::OptimizerParamGroup>& groups) const;
  // Collective: each rank's parameters broadcast from it.
  void BroadcastShards();

  std::shared_ptr<ProcessGroup> group_;
  OptimizerFactory factory_;
  // The plain optimizer over every param group, holding no state except while it
  // writes or reads an archive: the layout of save() and load().
  std::unique_ptr<torch::optim::Optimizer> plain_;
  std::unique_ptr<torch::optim::Optimizer> local_;
  std::vector<at::Tensor> params_;          // Every group's parameters, in order.
  std::vector<int> owner_;                  // Per parameter, its rank.
  // [rank][group]: the indices (into params_) each rank owns, PyTorch's order.
  std::vector<std::vector<std::vector<int64_t>>> shards_;
  std::vector<int64_t> sizes_;              // Per rank, the numel it owns.
  bool consolidated_ = false;
  // The live ddp::joinable(*this), if any (join.cc sets and clears it).
  friend std::shared_ptr<Joinable> joinable(ZeroRedundancyOptimizer& optimizer);
  Joinable* joinable_ = nullptr;
};

}  // namespace ddp

#endif  // DDP_ZERO_REDUNDANCY_OPTIMIZER_H_
