// ddp::Join and DistributedDataParallel's join hook: PyTorch 2.x's
// torch/distributed/algorithms/join.py and DDP's _DDPJoinHook (nn/parallel/
// distributed.py), collective for collective, in the same order on both sides:
//
//   rank still training (DDP's forward)         joined rank (Join::finish, per iteration)
//   sum(1)          "not joined"                sum(0); 0: everyone joined, stop
//   [throw_on_early_termination: sum(0),        [sum(1), then throw]
//    throw if > 0]
//   [buffers due: max(rank), broadcast          [buffers due: max(-1), broadcast from it]
//    buffers from it]
//   sum(will this backward sync)                sum(0); 0: nothing more this iteration
//   backward: each bucket's sum, in order       each bucket's sum of zeros, in order
//
// and at the end, on every rank: max(rank if it joined last else -1), then a broadcast
// of the parameters (and buffers) from that rank. The sums go through Comm as the
// reducer's do (shared memory on a node, or the backend), the max and the broadcasts
// from any root through the backend, on both sides alike.
//
// A ZeroRedundancyOptimizer joinable (after the model) adds, to each iteration, the
// training ranks' ZeRO step (every shard broadcast from its owner) and, on the joined
// rank, its main hook: the same step on its own shard (PyTorch's _ZeROJoinHook).
#include "ddp/join.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstddef>
#include <exception>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "ddp/zero_redundancy_optimizer.h"
#include "libddp/src/api_bridge.h"

namespace ddp {
namespace {

// A one-element sum over the ranks (float, on the group's device), on Comm's path.
absl::StatusOr<double> SumOne(Comm& comm, double value) {
  at::Tensor t =
      at::full({1}, value, at::TensorOptions().dtype(at::kFloat).device(comm.device()));
  DDP_RETURN_IF_ERROR(comm.AllReduceSum(t));
  return t.cpu().item<double>();
}

// PyTorch's DDP._find_common_rank: the highest rank for which `cond` holds.
absl::StatusOr<int> CommonRank(Comm& comm, bool cond) {
  DDP_ASSIGN_OR_RETURN(std::vector<double> max,
                       comm.MaxOverRanks({cond ? static_cast<double>(comm.rank()) : -1.0}));
  if (max[0] < 0) {
    return absl::InternalError(
        "Join: no rank qualified as the source of the model's state (a bug in libddp's Join)");
  }
  return static_cast<int>(max[0]);
}

// Copies rank `root`'s values into `tensors` on every rank: one flat broadcast per
// dtype through the backend.
absl::Status BroadcastFrom(Comm& comm, int root, const std::vector<at::Tensor>& tensors) {
  std::vector<at::ScalarType> dtypes;
  for (const at::Tensor& t : tensors) {
    if (std::find(dtypes.begin(), dtypes.end(), t.scalar_type()) == dtypes.end()) {
      dtypes.push_back(t.scalar_type());
    }
  }
  for (at::ScalarType dtype : dtypes) {
    std::vector<at::Tensor> group, parts;
    for (const at::Tensor& t : tensors) {
      if (t.scalar_type() != dtype) continue;
      group.push_back(t);
      parts.push_back(t.detach().reshape({-1}));
    }
    std::vector<at::Tensor> buf = {at::cat(parts)};
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    opts.timeout = comm.timeout();
    const std::string what = absl::StrCat("Join: broadcasting the model's state from rank ", root);
    c10::intrusive_ptr<c10d::Work> work;
    try {
      work = comm.backend().broadcast(buf, opts);
    } catch (const std::exception& e) {
      return absl::UnavailableError(absl::StrCat(what, ": ", e.what()));
    }
    DDP_RETURN_IF_ERROR(comm.Wait(work, what.c_str()));
    int64_t offset = 0;
    for (const at::Tensor& t : group) {
      t.detach().copy_(buf[0].narrow(0, offset, t.numel()).view(t.sizes()));
      offset += t.numel();
    }
  }
  return absl::OkStatus();
}

// The DdpOptions flag whose extra all-reduce a joined rank cannot shadow, or null.
const char* UsageOption(const DdpOptions& o) {
  if (o.static_graph) return "static_graph";
  return o.find_unused_parameters ? "find_unused_parameters" : nullptr;
}

template <typename T>
T OrThrow(absl::StatusOr<T> v) {
  return ValueOrThrow(std::move(v));
}

class DdpJoinHook;

// DistributedDataParallel as a Joinable: while it lives, the model's prepare_forward
// runs PreForward instead of its plain buffer broadcast.
class DdpJoinable : public Joinable {
 public:
  explicit DdpJoinable(DataParallel& core) : core_(core) {
    DataParallel::Impl& impl = core_.impl();
    if (impl.join_pre_forward) {
      ThrowIfError(absl::InvalidArgumentError(
          "ddp::joinable: this model already has a live Joinable (in another Join): one "
          "Join at a time per model; let the first end before making another"));
    }
    impl.join_pre_forward = [this](DataParallel::Impl& i) { return PreForward(i); };
  }
  ~DdpJoinable() override {
    DataParallel::Impl& impl = core_.impl();
    impl.join_pre_forward = nullptr;
    ResetDivFactor();
  }

  std::unique_ptr<JoinHook> join_hook(const JoinOptions& options) override;
  at::Device join_device() const override { return core_.process_group().device(); }
  ProcessGroup& join_process_group() const override { return core_.process_group(); }

  // What a Join cannot shadow for this model (decision 158).
  absl::Status Shadowable() const {
    const DataParallel::Impl& impl = core_.impl();
    if (impl.comm_hook) {
      return absl::InvalidArgumentError(
          "Join: this model has a communication hook (register_comm_hook), and a joined rank "
          "cannot shadow a hook's collectives: train uneven inputs without the hook, or give "
          "every rank the same number of batches (ddp::DistributedSampler with drop_last)");
    }
    if (const char* option = UsageOption(impl.options)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Join: this model has DdpOptions::", option,
          ", whose \"locally used\" all-reduce a joined rank does not shadow in libddp: "
          "train uneven inputs without it, or give every rank the same number of batches"));
    }
    return absl::OkStatus();
  }

  // Back to dividing by the world size (the end of a Join, a disabled one).
  void ResetDivFactor() { SetDivFactor(core_.impl().group->world_size()); }

  DataParallel::Impl& impl() { return core_.impl(); }
  Comm& comm() { return *core_.impl().group->impl().comm; }
  bool divide_by_initial_world_size = true;

 private:
  // A rank still training, before its forward (PyTorch's DDP._pre_forward in a Join).
  absl::Status PreForward(DataParallel::Impl& impl) {
    Comm& c = comm();
    const bool buffers_due =
        impl.sync_buffers && impl.options.broadcast_buffers && !impl.buffers.empty();
    if (!join_config.enable) {
      ResetDivFactor();
      return buffers_due ? c.Broadcast(impl.buffers) : absl::OkStatus();
    }
    DDP_RETURN_IF_ERROR(Shadowable());
    const std::optional<int64_t> training = Join::notify_join_context(*this);
    // PyTorch's reducer takes its div factor from this all-reduce when
    // divide_by_initial_world_size is false (and this model is the first joinable).
    SetDivFactor(training && !divide_by_initial_world_size ? *training
                                                           : impl.group->world_size());
    if (buffers_due) {
      DDP_ASSIGN_OR_RETURN(const int root, CommonRank(c, true));
      DDP_RETURN_IF_ERROR(BroadcastFrom(c, root, impl.buffers));
    }
    // PyTorch sends require_backward_grad_sync; a forward without grad is no backward
    // either, so libddp sends 0 for it too (decision 158).
    const bool will_sync = at::GradMode::is_enabled() && impl.grad_sync;
    return SumOne(c, will_sync ? 1.0 : 0.0).status();
  }

  // The reducer's div factor (the reducer is gone while a live recovery reconnects; its
  // rebuild starts from 1/world). A 0-dim tensor a forward: nothing to track.
  void SetDivFactor(int64_t n) {
    DataParallel::Impl& impl = core_.impl();
    if (impl.reducer != nullptr) impl.reducer->SetDivFactor(n);
  }

  DataParallel& core_;
};

class DdpJoinHook : public JoinHook {
 public:
  explicit DdpJoinHook(DdpJoinable& owner) : owner_(owner) {}

  // PyTorch's _DDPJoinHook.main_hook.
  void main_hook() override {
    DataParallel::Impl& impl = owner_.impl();
    Comm& c = owner_.comm();
    if (impl.sync_buffers && impl.options.broadcast_buffers && !impl.buffers.empty()) {
      const int root = OrThrow(CommonRank(c, false));
      ThrowIfError(BroadcastFrom(c, root, impl.buffers));
    }
    const bool should_sync = OrThrow(SumOne(c, 0.0)) != 0;
    impl.sync_buffers = should_sync;  // PyTorch's require_forward_param_sync.
    if (!should_sync) return;
    ThrowIfError(owner_.Shadowable());
    if (impl.reducer == nullptr) {
      // Dropped by a live recovery (DropReducer) that has not rebuilt it.
      ThrowIfError(absl::FailedPreconditionError(
          "Join: this rank has joined and must shadow the others' gradient all-reduce, but "
          "its model has no reducer (a live recovery dropped it and has not rebuilt it, or "
          "failed): it cannot tell the buckets to shadow. Let the recovery finish (or "
          "restart the job) before the Join ends"));
    }
    // _match_all_reduce_for_bwd_pass: zeros in each bucket's place, in bucket order.
    const at::TensorOptions opts = impl.trainable[0].options().requires_grad(false);
    std::vector<at::Tensor> zeros;
    std::vector<std::unique_ptr<PendingSum>> work;
    for (const BucketLayout& bucket : impl.reducer->buckets()) {
      zeros.push_back(at::zeros({bucket.numel}, opts));
      work.push_back(c.StartSum(zeros.back()));
    }
    for (auto& w : work) ThrowIfError(w->Wait());
  }

  // PyTorch's _DDPJoinHook.post_hook (DDP._sync_final_model).
  void post_hook(bool is_last_joiner) override {
    DataParallel::Impl& impl = owner_.impl();
    Comm& c = owner_.comm();
    const int root = OrThrow(CommonRank(c, is_last_joiner));
    // state: the parameters, then the buffers.
    std::vector<at::Tensor> tensors(impl.state.begin(),
                                    impl.state.end() - static_cast<ptrdiff_t>(impl.buffers.size()));
    if (impl.options.broadcast_buffers) {
      tensors.insert(tensors.end(), impl.buffers.begin(), impl.buffers.end());
    }
    ThrowIfError(BroadcastFrom(c, root, tensors));
  }

 private:
  DdpJoinable& owner_;
};

std::unique_ptr<JoinHook> DdpJoinable::join_hook(const JoinOptions& options) {
  divide_by_initial_world_size = options.divide_by_initial_world_size;
  return std::make_unique<DdpJoinHook>(*this);
}

// ZeroRedundancyOptimizer as a Joinable (PyTorch's Joinable side of
// ZeroRedundancyOptimizer): while it lives, the optimizer's step() notifies it.
class ZeroJoinable : public Joinable {
 public:
  ZeroJoinable(ZeroRedundancyOptimizer& zero, Joinable*& slot) : zero_(zero), slot_(slot) {
    if (slot_ != nullptr) {
      ThrowIfError(absl::InvalidArgumentError(
          "ddp::joinable: this ZeroRedundancyOptimizer already has a live Joinable (in "
          "another Join): one Join at a time per optimizer; let the first end before making "
          "another"));
    }
    slot_ = this;
  }
  ~ZeroJoinable() override { slot_ = nullptr; }

  // PyTorch's _ZeROJoinHook: no options; main_hook is the optimizer's step, which
  // updates this rank's shard with the gradients it holds and broadcasts every shard.
  std::unique_ptr<JoinHook> join_hook(const JoinOptions&) override {
    struct Hook : JoinHook {
      explicit Hook(ZeroRedundancyOptimizer& z) : zero(z) {}
      void main_hook() override { zero.step(); }
      ZeroRedundancyOptimizer& zero;
    };
    return std::make_unique<Hook>(zero_);
  }
  at::Device join_device() const override { return zero_.group()->device(); }
  ProcessGroup& join_process_group() const override { return *zero_.group(); }

 private:
  ZeroRedundancyOptimizer& zero_;
  Joinable*& slot_;
};

Comm& JoinComm(Joinable& joinable) { return *joinable.join_process_group().impl().comm; }

}  // namespace

Join::Join(std::vector<std::shared_ptr<Joinable>> joinables, JoinOptions options)
    : joinables_(std::move(joinables)), options_(options) {
  if (joinables_.empty()) {
    ThrowIfError(absl::InvalidArgumentError(
        "Join: no joinables: pass the objects whose collectives a joined rank must shadow, "
        "e.g. {ddp::joinable(model)} (PyTorch: \"The join context manager requires at least "
        "one joinable\")"));
  }
  for (size_t i = 0; i < joinables_.size(); ++i) {
    Joinable* j = joinables_[i].get();
    if (j == nullptr) {
      ThrowIfError(absl::InvalidArgumentError(absl::StrCat("Join: joinable ", i, " is null")));
    }
    if (&j->join_process_group() != &joinables_[0]->join_process_group()) {
      ThrowIfError(absl::InvalidArgumentError(
          "Join: the joinables use different process groups: one Join per process group "
          "(PyTorch: \"Using join context manager with multiple process groups\")"));
    }
    if (j->join_config.enable) {
      ThrowIfError(absl::InvalidArgumentError(
          absl::StrCat("Join: joinable ", i, " is already in an enabled Join: nest none")));
    }
    if (auto* ddp = dynamic_cast<DdpJoinable*>(j); ddp != nullptr && options_.enable) {
      ThrowIfError(ddp->Shadowable());
    }
    if (i == 0 && options_.enable && dynamic_cast<ZeroJoinable*>(j) != nullptr) {
      ThrowIfError(absl::InvalidArgumentError(
          "Join: a ZeroRedundancyOptimizer cannot be the first joinable: list the model "
          "first, ddp::join({ddp::joinable(model), ddp::joinable(optimizer)}, ...) "
          "(PyTorch's order). The first joinable sends each iteration's \"not joined\" "
          "before the others' collectives, and a joined rank's optimizer step would send a "
          "second one, putting the ranks' collectives out of step"));
    }
  }
  for (auto& j : joinables_) hooks_.push_back(j->join_hook(options_));
  bool first = true;
  for (auto& j : joinables_) {
    j->join_config = {options_.enable, options_.throw_on_early_termination, first};
    first = false;
  }
}

Join::~Join() {
  for (auto& j : joinables_) {
    j->join_config = JoinConfig();
    if (auto* ddp = dynamic_cast<DdpJoinable*>(j.get())) ddp->ResetDivFactor();
  }
}

void Join::finish() {
  if (finished_) {
    ThrowIfError(absl::FailedPreconditionError("Join::finish: called twice"));
  }
  finished_ = true;
  if (!options_.enable) return;
  Comm& comm = JoinComm(*joinables_[0]);
  bool is_last_joiner = true;
  for (;;) {
    const double training = OrThrow(SumOne(comm, 0.0));
    if (training == 0) break;
    if (options_.throw_on_early_termination) {
      OrThrow(SumOne(comm, 1.0));
      ThrowIfError(absl::FailedPreconditionError(
          absl::StrCat("Rank ", comm.rank(), " exhausted all inputs. (Join with "
                       "throw_on_early_termination: every rank throws)")));
    }
    for (auto& hook : hooks_) hook->main_hook();
    is_last_joiner = false;
  }
  for (auto& hook : hooks_) hook->post_hook(is_last_joiner);
}

std::optional<int64_t> Join::notify_join_context(Joinable& joinable) {
  const JoinConfig& config = joinable.join_config;
  if (!config.is_first_joinable || !config.enable) return std::nullopt;
  Comm& comm = JoinComm(joinable);
  const double training = OrThrow(SumOne(comm, 1.0));
  if (config.throw_on_early_termination && OrThrow(SumOne(comm, 0.0)) != 0) {
    ThrowIfError(absl::FailedPreconditionError(
        "Detected at least one rank that exhausted inputs. Throwing across all ranks. (Join "
        "with throw_on_early_termination)"));
  }
  return static_cast<int64_t>(training);
}

void join(std::vector<std::shared_ptr<Joinable>> joinables, const std::function<void()>& body,
          JoinOptions options) {
  Join scope(std::move(joinables), options);
  body();  // An exception leaves without joining, as PyTorch's __exit__ with one.
  scope.finish();
}

std::shared_ptr<Joinable> joinable(DataParallel& core) {
  return std::make_shared<DdpJoinable>(core);
}

std::shared_ptr<Joinable> joinable(ZeroRedundancyOptimizer& optimizer) {
  return std::make_shared<ZeroJoinable>(optimizer, optimizer.joinable_);
}

}  // namespace ddp
