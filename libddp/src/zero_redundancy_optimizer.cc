// ZeroRedundancyOptimizer (zero_redundancy_optimizer.h): PyTorch 2.x's
// torch/distributed/optim/zero_redundancy_optimizer.py with parameters_as_bucket_view=False
// and overlap_with_ddp=False, on LibTorch's optimizers (decision 159).
#include "ddp/zero_redundancy_optimizer.h"

#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <sstream>
#include <string>
#include <typeinfo>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ddp/join.h"
#include "libddp/src/api_bridge.h"

namespace ddp {
namespace {

using torch::optim::OptimizerParamGroup;
using torch::optim::OptimizerParamState;

constexpr const char* kWhat = "ZeroRedundancyOptimizer";

[[noreturn]] void Invalid(const std::string& message) {
  ThrowIfError(absl::InvalidArgumentError(absl::StrCat(kWhat, ": ", message)));
  throw std::logic_error("unreachable");
}

template <typename Opt, typename Options>
OptimizerFactory::Fn MakeFn(const Options& options) {
  return [options](std::vector<OptimizerParamGroup> groups) {
    return std::make_unique<Opt>(std::move(groups), options);
  };
}

// The key of a parameter's entry in Optimizer::state(): the TensorImpl's address,
// printed (LibTorch 1.13) or as a pointer (2.x).
template <typename Map>
typename Map::key_type StateKey(const at::Tensor& param) {
  if constexpr (std::is_same_v<typename Map::key_type, std::string>) {
    std::ostringstream s;  // c10::guts::to_string's form.
    s << param.unsafeGetTensorImpl();
    return s.str();
  } else {
    return param.unsafeGetTensorImpl();
  }
}

std::vector<char> ToBytes(const torch::optim::Optimizer& optimizer) {
  torch::serialize::OutputArchive archive;
  optimizer.save(archive);
  std::vector<char> bytes;
  archive.save_to([&bytes](const void* data, size_t n) {
    const char* p = static_cast<const char*>(data);
    bytes.insert(bytes.end(), p, p + n);
    return n;
  });
  return bytes;
}

// "2 groups: [320, 32, 1024] [96, 3]": what every rank must agree on.
std::string Describe(const std::vector<OptimizerParamGroup>& groups) {
  std::vector<std::string> parts;
  for (const OptimizerParamGroup& g : groups) {
    std::vector<std::string> sizes;
    for (const at::Tensor& p : g.params()) sizes.push_back(absl::StrCat(p.numel()));
    parts.push_back(absl::StrCat("[", absl::StrJoin(sizes, ", "), "]"));
  }
  return absl::StrCat(groups.size(), " group", groups.size() == 1 ? "" : "s", ": ",
                      absl::StrJoin(parts, " "));
}

// The optimizer's kind, in errors.
std::string KindOf(const torch::optim::Optimizer& opt) {
  using namespace torch::optim;
  if (dynamic_cast<const SGD*>(&opt)) return "SGD";
  if (dynamic_cast<const Adam*>(&opt)) return "Adam";
  if (dynamic_cast<const AdamW*>(&opt)) return "AdamW";
  if (dynamic_cast<const RMSprop*>(&opt)) return "RMSprop";
  if (dynamic_cast<const Adagrad*>(&opt)) return "Adagrad";
  return typeid(opt).name();
}

[[noreturn]] void RefuseLbfgs() {
  Invalid(
      "LBFGS cannot be sharded: its step re-evaluates the closure over all parameters and "
      "keeps one history of updates for all of them. Use a plain torch::optim::LBFGS on every "
      "rank, or shard SGD, Adam, AdamW, RMSprop or Adagrad");
}

}  // namespace

OptimizerFactory::OptimizerFactory(const torch::optim::SGDOptions& o)
    : fn_(MakeFn<torch::optim::SGD>(o)) {}
OptimizerFactory::OptimizerFactory(const torch::optim::AdamOptions& o)
    : fn_(MakeFn<torch::optim::Adam>(o)) {}
OptimizerFactory::OptimizerFactory(const torch::optim::AdamWOptions& o)
    : fn_(MakeFn<torch::optim::AdamW>(o)) {}
OptimizerFactory::OptimizerFactory(const torch::optim::RMSpropOptions& o)
    : fn_(MakeFn<torch::optim::RMSprop>(o)) {}
OptimizerFactory::OptimizerFactory(const torch::optim::AdagradOptions& o)
    : fn_(MakeFn<torch::optim::Adagrad>(o)) {}
OptimizerFactory::OptimizerFactory(const torch::optim::LBFGSOptions&)
    : fn_([](std::vector<OptimizerParamGroup>) -> std::unique_ptr<torch::optim::Optimizer> {
        RefuseLbfgs();
      }) {}

struct ZeroRedundancyOptimizer::Probe {
  std::vector<OptimizerParamGroup> groups;  // With their options.
  std::unique_ptr<torch::optim::Optimizer> plain;
};

namespace {

std::unique_ptr<torch::optim::Optimizer> Make(const OptimizerFactory& factory,
                                              std::vector<OptimizerParamGroup> groups) {
  std::unique_ptr<torch::optim::Optimizer> opt;
  try {
    opt = factory(std::move(groups));
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    Invalid(absl::StrCat("the optimizer factory failed: ", e.what()));
  }
  if (opt == nullptr) Invalid("the optimizer factory returned no optimizer");
  return opt;
}

}  // namespace

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<OptimizerParamGroup> param_groups,
                                                 std::shared_ptr<ProcessGroup> group,
                                                 OptimizerFactory factory)
    : ZeroRedundancyOptimizer(
          [&] {
            int64_t n = 0;
            for (const OptimizerParamGroup& g : param_groups) {
              n += static_cast<int64_t>(g.params().size());
            }
            if (n == 0) {
              Invalid("got an empty parameter list: pass the model's parameters "
                      "(model->parameters())");
            }
            Probe probe;
            std::vector<size_t> counts;
            for (const OptimizerParamGroup& g : param_groups) counts.push_back(g.params().size());
            probe.plain = Make(factory, param_groups);
            if (dynamic_cast<torch::optim::LBFGS*>(probe.plain.get()) != nullptr) {
              RefuseLbfgs();
            }
            const auto& made = probe.plain->param_groups();
            bool same = made.size() == param_groups.size();
            for (size_t g = 0; same && g < made.size(); ++g) {
              same = made[g].params().size() == counts[g] && made[g].has_options();
              for (size_t i = 0; same && i < counts[g]; ++i) {
                same = made[g].params()[i].is_same(param_groups[g].params()[i]);
              }
            }
            if (!same) {
              Invalid(absl::StrCat("the optimizer factory made an optimizer over other param "
                                   "groups (", Describe(made), ") than it was given (",
                                   Describe(param_groups),
                                   "): build the optimizer over exactly the groups passed"));
            }
            // Adagrad makes its state when constructed; the plain optimizer holds none.
            probe.plain->state().clear();
            probe.groups = std::vector<OptimizerParamGroup>(made.begin(), made.end());
            return probe;
          }(),
          std::move(group), factory) {}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<at::Tensor> params,
                                                 std::shared_ptr<ProcessGroup> group,
                                                 OptimizerFactory factory)
    : ZeroRedundancyOptimizer(std::vector<OptimizerParamGroup>{OptimizerParamGroup(std::move(params))},
                              std::move(group), std::move(factory)) {}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(Probe probe, std::shared_ptr<ProcessGroup> group,
                                                 OptimizerFactory factory)
    : torch::optim::Optimizer(probe.groups, probe.plain->defaults().clone()),
      group_(std::move(group)),
      factory_(std::move(factory)),
      plain_(std::move(probe.plain)) {
  if (group_ == nullptr) {
    Invalid("no process group: pass the one ddp::init_process_group() returned");
  }
  CheckSameOnEveryRank("constructed", param_groups_);
  sizes_.assign(static_cast<size_t>(group_->world_size()), 0);
  shards_.assign(static_cast<size_t>(group_->world_size()), {});
  for (size_t g = 0; g < param_groups_.size(); ++g) PartitionGroup(g);
  std::vector<OptimizerParamGroup> mine;
  for (size_t g = 0; g < param_groups_.size(); ++g) mine.push_back(ShardOf(group_->rank(), g));
  local_ = Make(factory_, std::move(mine));
}

ZeroRedundancyOptimizer::~ZeroRedundancyOptimizer() = default;

void ZeroRedundancyOptimizer::CheckSameOnEveryRank(
    const char* what, const std::vector<OptimizerParamGroup>& groups) const {
  if (group_->world_size() == 1) return;
  const std::string mine = absl::StrCat(KindOf(*plain_), " over ", Describe(groups));
  std::vector<char> bytes(mine.begin(), mine.end());
  Comm& comm = *group_->impl().comm;
  const std::vector<char> first =
      ValueOrThrow(comm.BroadcastBytesFrom(0, bytes, "comparing the ranks' param groups"));
  const std::string rank0(first.begin(), first.end());
  const bool differs = rank0 != mine;
  const std::vector<double> count = group_->sum({differs ? 1.0 : 0.0});
  if (count[0] == 0) return;
  const std::string fix =
      "every rank must pass the same parameters (the same model's, in the same order) in the "
      "same param groups and the same kind of optimizer";
  if (differs) {
    Invalid(absl::StrCat(what, " with param groups that differ across ranks: rank 0 has ",
                         rank0, ", rank ", group_->rank(), " has ", mine, ": ", fix));
  }
  Invalid(absl::StrCat(what, " with param groups that differ across ranks (", count[0],
                       " rank(s) differ from rank 0, which has ", rank0, "): ", fix));
}

void ZeroRedundancyOptimizer::PartitionGroup(size_t g) {
  const std::vector<at::Tensor>& params = param_groups_[g].params();
  const int64_t first = static_cast<int64_t>(params_.size());
  std::vector<int64_t> order(params.size());
  std::iota(order.begin(), order.end(), 0);
  // sorted(..., key=numel, reverse=True): stable, largest first.
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return params[static_cast<size_t>(a)].numel() > params[static_cast<size_t>(b)].numel();
  });
  for (const at::Tensor& p : params) {
    params_.push_back(p);
    owner_.push_back(-1);
  }
  for (auto& shard : shards_) shard.emplace_back();
  for (int64_t i : order) {
    // _get_min_index: the first rank with the smallest total.
    const size_t rank = static_cast<size_t>(
        std::min_element(sizes_.begin(), sizes_.end()) - sizes_.begin());
    shards_[rank][g].push_back(first + i);
    owner_[static_cast<size_t>(first + i)] = static_cast<int>(rank);
    sizes_[rank] += params[static_cast<size_t>(i)].numel();
  }
}

OptimizerParamGroup ZeroRedundancyOptimizer::ShardOf(int rank, size_t g) const {
  std::vector<at::Tensor> params;
  for (int64_t i : shards_[static_cast<size_t>(rank)][g]) {
    params.push_back(params_[static_cast<size_t>(i)]);
  }
  return OptimizerParamGroup(std::move(params), param_groups_[g].options().clone());
}

std::vector<std::vector<int64_t>> ZeroRedundancyOptimizer::partition() const {
  std::vector<std::vector<int64_t>> out(shards_.size());
  for (size_t r = 0; r < shards_.size(); ++r) {
    for (const auto& group : shards_[r]) out[r].insert(out[r].end(), group.begin(), group.end());
  }
  return out;
}

void ZeroRedundancyOptimizer::SyncOptionsToLocal() {
  auto& local = local_->param_groups();
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    local[g].set_options(param_groups_[g].options().clone());
  }
}

at::Tensor ZeroRedundancyOptimizer::step(LossClosure closure) {
  // PyTorch's step starts so; vacuous unless this optimizer is the first joinable of an
  // enabled Join, which Join refuses (decision 166).
  if (joinable_ != nullptr) Join::notify_join_context(*joinable_);
  SyncOptionsToLocal();
  at::Tensor loss = local_->step(std::move(closure));
  BroadcastShards();
  return loss;
}

void ZeroRedundancyOptimizer::BroadcastShards() {
  const int world = group_->world_size();
  if (world == 1) return;
  Comm& comm = *group_->impl().comm;
  at::NoGradGuard no_grad;
  // Per owner, one flat broadcast per dtype and device (PyTorch sends parameter by
  // parameter: the same values). All are started, then all are waited for.
  struct Flat {
    std::vector<at::Tensor> params;
    std::vector<at::Tensor> buffer;  // One tensor: what the backend broadcasts.
    c10::intrusive_ptr<c10d::Work> work;
    int root = 0;
  };
  std::vector<Flat> flats;
  for (int r = 0; r < world; ++r) {
    std::vector<Flat> mine;
    for (const auto& group : shards_[static_cast<size_t>(r)]) {
      for (int64_t i : group) {
        const at::Tensor& p = params_[static_cast<size_t>(i)];
        auto it = std::find_if(mine.begin(), mine.end(), [&](const Flat& f) {
          return f.params[0].scalar_type() == p.scalar_type() &&
                 f.params[0].device() == p.device();
        });
        if (it == mine.end()) {
          mine.push_back(Flat{{p}, {}, {}, r});
        } else {
          it->params.push_back(p);
        }
      }
    }
    for (Flat& f : mine) flats.push_back(std::move(f));
  }
  const std::string op = "broadcasting the updated parameters from their owners";
  try {
    for (Flat& f : flats) {
      std::vector<at::Tensor> parts;
      for (const at::Tensor& p : f.params) parts.push_back(p.detach().reshape({-1}));
      f.buffer = {at::cat(parts)};
      c10d::BroadcastOptions o;
      o.rootRank = f.root;
      o.timeout = comm.timeout();
      f.work = comm.backend().broadcast(f.buffer, o);
    }
  } catch (const std::exception& e) {
    std::string first = e.what();
    first = first.substr(0, first.find('\n'));
    ThrowIfError(absl::UnavailableError(absl::StrCat(kWhat, ": ", op, " failed to start: ", first)));
  }
  const std::string what = absl::StrCat(kWhat, ": ", op);
  for (Flat& f : flats) ThrowIfError(comm.Wait(f.work, what.c_str()));
  for (Flat& f : flats) {
    if (f.root == group_->rank()) continue;
    int64_t offset = 0;
    for (const at::Tensor& p : f.params) {
      p.detach().copy_(f.buffer[0].narrow(0, offset, p.numel()).view(p.sizes()));
      offset += p.numel();
    }
  }
}

void ZeroRedundancyOptimizer::consolidate_state_dict(int to) {
  const int world = group_->world_size();
  if (to < 0 || to >= world) {
    Invalid(absl::StrCat("consolidate_state_dict(", to, "): no such rank in a group of ", world,
                         ": pass a rank from 0 to ", world - 1));
  }
  SyncOptionsToLocal();
  const int me = group_->rank();
  Comm& comm = *group_->impl().comm;
  const std::vector<char> mine = ToBytes(*local_);
  state_.clear();
  consolidated_ = false;
  for (int r = 0; r < world; ++r) {
    std::vector<char> bytes;
    if (r != me) {
      bytes = ValueOrThrow(comm.BroadcastBytesFrom(r, {}, "consolidating the optimizer state"));
    } else if (world > 1) {
      ValueOrThrow(comm.BroadcastBytesFrom(r, mine, "consolidating the optimizer state"));
    }
    if (me != to) continue;
    if (r == me) {
      for (const auto& [key, value] : local_->state()) state_[key] = value->clone();
      continue;
    }
    // Rank r's local optimizer, remade over its shard here, reads what it sent.
    std::vector<OptimizerParamGroup> groups;
    for (size_t g = 0; g < param_groups_.size(); ++g) groups.push_back(ShardOf(r, g));
    std::unique_ptr<torch::optim::Optimizer> theirs = Make(factory_, std::move(groups));
    theirs->state().clear();
    torch::serialize::InputArchive archive;
    archive.load_from(bytes.data(), bytes.size());
    theirs->load(archive);
    for (auto& [key, value] : theirs->state()) state_[key] = std::move(value);
  }
  consolidated_ = me == to;
}

void ZeroRedundancyOptimizer::save(torch::serialize::OutputArchive& archive) const {
  if (!consolidated_) {
    ThrowIfError(absl::FailedPreconditionError(absl::StrCat(
        kWhat, ": the optimizer state has not been consolidated on rank ", group_->rank(),
        ": call consolidate_state_dict(", group_->rank(),
        ") on every rank before saving it here")));
  }
  auto& groups = plain_->param_groups();
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    groups[g].set_options(param_groups_[g].options().clone());
  }
  for (const auto& [key, value] : state_) plain_->state()[key] = value->clone();
  try {
    plain_->save(archive);
  } catch (...) {
    plain_->state().clear();
    throw;
  }
  plain_->state().clear();
}

void ZeroRedundancyOptimizer::load(torch::serialize::InputArchive& archive) {
  auto& groups = plain_->param_groups();
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    groups[g].set_options(param_groups_[g].options().clone());
  }
  plain_->state().clear();
  try {
    plain_->load(archive);
  } catch (const std::exception& e) {
    plain_->state().clear();
    std::string first = e.what();
    first = first.substr(0, first.find('\n'));
    Invalid(absl::StrCat("load: the archive does not fit this optimizer (", Describe(param_groups_),
                         "): ", first,
                         ": load a state saved from the same optimizer over the same param groups"));
  }
  // What the plain optimizer's load did to the options, the param groups take too.
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    param_groups_[g].set_options(groups[g].options().clone());
  }
  using Map = std::remove_reference_t<decltype(plain_->state())>;
  local_->state().clear();
  for (size_t i = 0; i < params_.size(); ++i) {
    if (owner_[i] != group_->rank()) continue;
    const auto key = StateKey<Map>(params_[i]);
    auto it = plain_->state().find(key);
    if (it != plain_->state().end()) local_->state()[key] = std::move(it->second);
  }
  plain_->state().clear();
  state_.clear();
  consolidated_ = false;
  SyncOptionsToLocal();
}

void ZeroRedundancyOptimizer::add_param_group(const OptimizerParamGroup& param_group) {
  OptimizerParamGroup group(param_group.params());
  group.set_options(param_group.has_options() ? param_group.options().clone()
                                              : defaults_->clone());
  for (const at::Tensor& p : group.params()) {
    for (const at::Tensor& q : params_) {
      if (p.is_same(q)) {
        Invalid("add_param_group: some parameters appear in more than one parameter group: "
                "pass only parameters the optimizer does not hold yet");
      }
    }
  }
  std::vector<OptimizerParamGroup> after = param_groups_;
  after.push_back(group);
  CheckSameOnEveryRank("add_param_group called", after);
  try {
    Optimizer::add_param_group(group);
  } catch (const c10::Error& e) {
    Invalid(absl::StrCat("add_param_group: ", e.what_without_backtrace()));
  }
  plain_->add_param_group(group);
  plain_->state().clear();
  const size_t g = param_groups_.size() - 1;
  PartitionGroup(g);
  local_->add_param_group(ShardOf(group_->rank(), g));
}

}  // namespace ddp
