// A user's LibTorch program on libddp's public API only: zero_reference.py's setup
// (PyTorch's ZeroRedundancyOptimizer under DDP), which it must reproduce, plus the
// checks only the C++ side can make. Run one process per rank with torchrun's environment.
//
//   zero_program --optimizer sgd|adam|adamw|rmsprop|adagrad --dir DIR
//   zero_program --misuse          (1 rank)
//   zero_program --misuse-ranks    (2 ranks: rank 1 passes other param groups)
//
// Three copies of one model train under ddp::DistributedDataParallel: A with
// ddp::ZeroRedundancyOptimizer, B with the plain optimizer, for kSteps steps, then A
// continues kMore steps beside C (a plain optimizer that loaded A's consolidated
// checkpoint) and D (a ZeroRedundancyOptimizer that loaded B's plain checkpoint).
// Each rank prints one JSON object: A's per-step losses, A's final parameters, the
// partition, rank 0's consolidated state after kSteps (per parameter index, per state
// name, the values) and the bit-for-bit comparisons: A against B at every step and
// their states, C and D against A at every continued step.
#include <ddp/ddp.h>
#include <torch/torch.h>

#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <sstream>
#include <string>

namespace {

constexpr int64_t kN = 96, kFeatures = 10, kClasses = 3, kBatch = 8;
constexpr int64_t kSteps = 5, kMore = 4;
constexpr double kLr = 0.01, kHeadLr = 0.02;

torch::nn::Sequential MakeNet() {
  torch::nn::Sequential net(torch::nn::Linear(kFeatures, 32), torch::nn::ReLU(),
                            torch::nn::Linear(32, 16), torch::nn::ReLU(),
                            torch::nn::Linear(16, kClasses));
  // Deterministic values, the reference's: sin(0.37 k + i) * 0.3 for parameter i.
  torch::NoGradGuard no_grad;
  auto params = net->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    auto v = torch::sin(torch::arange(params[i].numel(), torch::kFloat) * 0.37 +
                        static_cast<double>(i)) * 0.3;
    params[i].copy_(v.view(params[i].sizes()));
  }
  return net;
}

// Two param groups: the body with the defaults, the head with its own learning rate.
std::vector<torch::optim::OptimizerParamGroup> Groups(torch::nn::Sequential& net,
                                                      const ddp::OptimizerFactory&,
                                                      const std::string& name) {
  auto p = net->parameters();
  std::vector<torch::Tensor> body(p.begin(), p.end() - 2), head(p.end() - 2, p.end());
  std::unique_ptr<torch::optim::OptimizerOptions> head_options;
  if (name == "sgd") head_options = std::make_unique<torch::optim::SGDOptions>(
      torch::optim::SGDOptions(kHeadLr).momentum(0.9));
  if (name == "adam") head_options = std::make_unique<torch::optim::AdamOptions>(kHeadLr);
  if (name == "adamw") head_options = std::make_unique<torch::optim::AdamWOptions>(kHeadLr);
  if (name == "rmsprop") head_options = std::make_unique<torch::optim::RMSpropOptions>(
      torch::optim::RMSpropOptions(kHeadLr).momentum(0.5));
  if (name == "adagrad") head_options = std::make_unique<torch::optim::AdagradOptions>(kHeadLr);
  return {torch::optim::OptimizerParamGroup(body),
          torch::optim::OptimizerParamGroup(head, std::move(head_options))};
}

ddp::OptimizerFactory FactoryFor(const std::string& name) {
  if (name == "sgd") return torch::optim::SGDOptions(kLr).momentum(0.9);
  if (name == "adam") return torch::optim::AdamOptions(kLr);
  if (name == "adamw") return torch::optim::AdamWOptions(kLr);
  if (name == "rmsprop") return torch::optim::RMSpropOptions(kLr).momentum(0.5);
  if (name == "adagrad") return torch::optim::AdagradOptions(kLr);
  throw std::runtime_error("unknown --optimizer " + name);
}

// A parameter's state as (name, tensor) pairs, in torch.optim's names.
std::map<std::string, torch::Tensor> StateOf(const torch::optim::OptimizerParamState& s) {
  using namespace torch::optim;
  auto step = [](int64_t v) { return torch::tensor(static_cast<double>(v)); };
  if (auto* a = dynamic_cast<const AdamParamState*>(&s)) {
    return {{"step", step(a->step())}, {"exp_avg", a->exp_avg()}, {"exp_avg_sq", a->exp_avg_sq()}};
  }
  if (auto* a = dynamic_cast<const AdamWParamState*>(&s)) {
    return {{"step", step(a->step())}, {"exp_avg", a->exp_avg()}, {"exp_avg_sq", a->exp_avg_sq()}};
  }
  if (auto* a = dynamic_cast<const SGDParamState*>(&s)) return {{"momentum_buffer", a->momentum_buffer()}};
  if (auto* a = dynamic_cast<const RMSpropParamState*>(&s)) {
    std::map<std::string, torch::Tensor> m = {{"step", step(a->step())}, {"square_avg", a->square_avg()}};
    if (a->momentum_buffer().defined()) m["momentum_buffer"] = a->momentum_buffer();
    return m;
  }
  if (auto* a = dynamic_cast<const AdagradParamState*>(&s)) {
    return {{"step", step(a->step())}, {"sum", a->sum()}};
  }
  throw std::runtime_error("unknown optimizer state");
}

template <typename Map>
const torch::optim::OptimizerParamState* Find(const Map& state, const torch::Tensor& p) {
  for (const auto& [key, value] : state) {
    std::ostringstream s;
    s << p.unsafeGetTensorImpl();
    if constexpr (std::is_same_v<std::decay_t<decltype(key)>, std::string>) {
      if (key == s.str()) return value.get();
    } else {
      if (key == p.unsafeGetTensorImpl()) return value.get();
    }
  }
  return nullptr;
}

bool SameStates(const torch::optim::Optimizer& a, const torch::optim::Optimizer& b,
                const std::vector<torch::Tensor>& pa, const std::vector<torch::Tensor>& pb) {
  for (size_t i = 0; i < pa.size(); ++i) {
    auto* sa = Find(a.state(), pa[i]);
    auto* sb = Find(b.state(), pb[i]);
    if ((sa == nullptr) != (sb == nullptr)) return false;
    if (sa == nullptr) continue;
    auto ma = StateOf(*sa), mb = StateOf(*sb);
    if (ma.size() != mb.size()) return false;
    for (const auto& [k, v] : ma) {
      if (!mb.count(k) || !torch::equal(v, mb[k])) return false;
    }
  }
  return true;
}

bool SameParams(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  for (size_t i = 0; i < a.size(); ++i) {
    if (!torch::equal(a[i], b[i])) return false;
  }
  return true;
}

void Json(std::ostream& out, const torch::Tensor& t) {
  auto flat = t.detach().to(torch::kDouble).reshape({-1}).contiguous();
  out << "[";
  for (int64_t i = 0; i < flat.numel(); ++i) out << (i ? ", " : "") << flat.data_ptr<double>()[i];
  out << "]";
}

template <typename M>
double TrainStep(M& model, torch::optim::Optimizer& opt, const torch::Tensor& x,
                 const torch::Tensor& y) {
  torch::Tensor loss = torch::nn::functional::cross_entropy(model(x), y);
  loss.backward();
  opt.step();
  opt.zero_grad();
  return loss.item<double>();
}

int Train(const std::map<std::string, std::string>& flags) {
  const std::string name = flags.at("--optimizer");
  const std::string dir = flags.at("--dir");
  auto group = ddp::init_process_group();
  const int rank = group->rank(), world = group->world_size();
  torch::manual_seed(1);
  const torch::Tensor x_all = torch::randn({kN, kFeatures});
  const torch::Tensor y_all = torch::randint(0, kClasses, {kN});
  auto batch = [&](int64_t step) {
    torch::Tensor idx = (torch::arange(kBatch) + (step * world + rank) * kBatch) % kN;
    return std::make_pair(x_all.index_select(0, idx), y_all.index_select(0, idx));
  };
  const ddp::OptimizerFactory factory = FactoryFor(name);

  ddp::DistributedDataParallel a(MakeNet(), group);
  ddp::DistributedDataParallel b(MakeNet(), group);
  ddp::ZeroRedundancyOptimizer zero_a(Groups(a.module(), factory, name), group, factory);
  std::unique_ptr<torch::optim::Optimizer> plain_b = factory(Groups(b.module(), factory, name));
  const auto pa = a.module()->parameters(), pb = b.module()->parameters();

  std::vector<double> losses;
  bool zero_equals_plain = true;
  for (int64_t step = 0; step < kSteps; ++step) {
    auto [x, y] = batch(step);
    losses.push_back(TrainStep(a, zero_a, x, y));
    TrainStep(b, *plain_b, x, y);
    zero_equals_plain = zero_equals_plain && SameParams(pa, pb);
  }
  // Checkpoints: A's consolidated state on rank 0 (a plain optimizer's file), B's plain one.
  zero_a.consolidate_state_dict(0);
  std::ostringstream state;
  state.precision(17);
  bool consolidated_equals_plain = true;
  if (rank == 0) {
    torch::save(zero_a, dir + "/zero.pt");
    torch::save(*plain_b, dir + "/plain.pt");
    consolidated_equals_plain = SameStates(zero_a, *plain_b, pa, pb);
    state << "{";
    for (size_t i = 0; i < pa.size(); ++i) {
      auto* s = Find(zero_a.state(), pa[i]);
      if (s == nullptr) continue;
      state << (i ? ", " : "") << "\"" << i << "\": {";
      bool first = true;
      for (const auto& [k, v] : StateOf(*s)) {
        state << (first ? "" : ", ") << "\"" << k << "\": ";
        Json(state, v);
        first = false;
      }
      state << "}";
    }
    state << "}";
  }
  const bool consolidated_elsewhere = zero_a.consolidated();
  group->barrier();

  // C: a plain run resumed from A's checkpoint; D: a ZeRO run resumed from B's.
  ddp::DistributedDataParallel c(MakeNet(), group);
  ddp::DistributedDataParallel d(MakeNet(), group);
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < pa.size(); ++i) {
      c.module()->parameters()[i].copy_(pa[i]);
      d.module()->parameters()[i].copy_(pb[i]);
    }
  }
  std::unique_ptr<torch::optim::Optimizer> plain_c = factory(Groups(c.module(), factory, name));
  torch::load(*plain_c, dir + "/zero.pt");
  ddp::ZeroRedundancyOptimizer zero_d(Groups(d.module(), factory, name), group, factory);
  torch::load(zero_d, dir + "/plain.pt");
  const auto pc = c.module()->parameters(), pd = d.module()->parameters();
  bool resumed_plain_equals_zero = true, resumed_zero_equals_zero = true;
  for (int64_t step = kSteps; step < kSteps + kMore; ++step) {
    auto [x, y] = batch(step);
    losses.push_back(TrainStep(a, zero_a, x, y));
    TrainStep(c, *plain_c, x, y);
    TrainStep(d, zero_d, x, y);
    resumed_plain_equals_zero = resumed_plain_equals_zero && SameParams(pa, pc);
    resumed_zero_equals_zero = resumed_zero_equals_zero && SameParams(pa, pd);
  }

  std::ostringstream out;
  out.precision(17);
  out << "{\"rank\": " << rank << ", \"losses\": [";
  for (size_t i = 0; i < losses.size(); ++i) out << (i ? ", " : "") << losses[i];
  out << "], \"params\": [";
  for (size_t i = 0; i < pa.size(); ++i) {
    out << (i ? ", " : "");
    Json(out, pa[i]);
  }
  out << "], \"partition\": [";
  const auto part = zero_a.partition();
  for (size_t r = 0; r < part.size(); ++r) {
    out << (r ? ", " : "") << "[";
    for (size_t i = 0; i < part[r].size(); ++i) out << (i ? ", " : "") << part[r][i];
    out << "]";
  }
  int64_t local_params = 0;
  for (const auto& g : zero_a.local_optimizer().param_groups()) local_params += g.params().size();
  out << "], \"local_params\": " << local_params
      << ", \"zero_equals_plain\": " << zero_equals_plain
      << ", \"consolidated_equals_plain\": " << consolidated_equals_plain
      << ", \"consolidated\": " << consolidated_elsewhere
      << ", \"resumed_plain_equals_zero\": " << resumed_plain_equals_zero
      << ", \"resumed_zero_equals_zero\": " << resumed_zero_equals_zero;
  if (rank == 0) out << ", \"state\": " << state.str();
  out << "}\n";
  std::cout << out.str();
  return 0;
}

// Each misuse on its own line: "NAME: CODE EXIT MESSAGE" (no error: "NAME: none").
template <typename F>
void Misuse(const std::string& name, F&& f) {
  try {
    f();
    std::cout << name << ": none\n";
  } catch (const ddp::Error& e) {
    std::string what = e.what();
    for (char& ch : what) ch = ch == '\n' ? ' ' : ch;
    std::cout << name << ": " << static_cast<int>(e.code()) << " " << e.exit_code() << " " << what
              << "\n";
  }
}

int MisuseOneRank() {
  auto group = ddp::init_process_group();
  torch::nn::Sequential net = MakeNet();
  Misuse("lbfgs", [&] {
    ddp::ZeroRedundancyOptimizer z(net->parameters(), group, torch::optim::LBFGSOptions(1));
  });
  Misuse("lbfgs_factory", [&] {
    ddp::ZeroRedundancyOptimizer z(net->parameters(), group,
                                   [](std::vector<torch::optim::OptimizerParamGroup> g) {
                                     return std::make_unique<torch::optim::LBFGS>(
                                         g[0].params(), torch::optim::LBFGSOptions(1));
                                   });
  });
  Misuse("empty", [&] {
    ddp::ZeroRedundancyOptimizer z(std::vector<torch::Tensor>{}, group,
                                   torch::optim::AdamOptions(1e-3));
  });
  Misuse("no_group", [&] {
    ddp::ZeroRedundancyOptimizer z(net->parameters(), nullptr, torch::optim::AdamOptions(1e-3));
  });
  Misuse("null_factory", [&] {
    ddp::ZeroRedundancyOptimizer z(net->parameters(), group,
                                   [](std::vector<torch::optim::OptimizerParamGroup>) {
                                     return std::unique_ptr<torch::optim::Optimizer>();
                                   });
  });
  ddp::ZeroRedundancyOptimizer z(net->parameters(), group, torch::optim::AdamOptions(1e-3));
  Misuse("bad_rank", [&] { z.consolidate_state_dict(3); });
  Misuse("save_unconsolidated", [&] {
    std::ostringstream sink;
    torch::save(z, sink);
  });
  Misuse("duplicate_group", [&] {
    z.add_param_group(torch::optim::OptimizerParamGroup({net->parameters()[0]}));
  });
  // An archive of another layout (SGD over two of the parameters).
  std::stringstream other;
  {
    torch::optim::SGD sgd({net->parameters()[0], net->parameters()[1]}, torch::optim::SGDOptions(0.1));
    torch::save(sgd, other);
  }
  Misuse("load_other", [&] { torch::load(z, other); });
  // World 1: the plain optimizer, whose consolidated state saves.
  torch::Tensor loss = net->forward(torch::ones({2, kFeatures})).sum();
  loss.backward();
  z.step();
  z.consolidate_state_dict(0);
  Misuse("world1_save", [&] {
    std::ostringstream sink;
    torch::save(z, sink);
  });
  std::cout << "world1_local_params: " << z.local_optimizer().parameters().size() << "\n";
  return 0;
}

int MisuseTwoRanks() {
  auto group = ddp::init_process_group();
  torch::nn::Sequential net = MakeNet();
  auto params = net->parameters();
  if (group->rank() == 1) params.pop_back();  // Rank 1 forgets the head's bias.
  Misuse("differ", [&] {
    ddp::ZeroRedundancyOptimizer z(params, group, torch::optim::AdamOptions(1e-3));
  });
  // The same parameters but another optimizer on rank 1.
  Misuse("differ_kind", [&] {
    ddp::OptimizerFactory f = group->rank() == 1 ? ddp::OptimizerFactory(torch::optim::SGDOptions(0.1))
                                                 : ddp::OptimizerFactory(torch::optim::AdamOptions(0.1));
    ddp::ZeroRedundancyOptimizer z(net->parameters(), group, f);
  });
  // add_param_group as the plain optimizer's: the body first, the head added after 2
  // steps; the same bits as a plain Adam given the same groups the same way.
  {
    torch::manual_seed(1);
    const torch::Tensor x = torch::randn({8, kFeatures});
    const torch::Tensor y = torch::randint(0, kClasses, {8});
    ddp::DistributedDataParallel za(MakeNet(), group);
    ddp::DistributedDataParallel pb(MakeNet(), group);
    auto zp = za.module()->parameters(), pp = pb.module()->parameters();
    ddp::ZeroRedundancyOptimizer z(std::vector<torch::Tensor>(zp.begin(), zp.end() - 2), group,
                                   torch::optim::AdamOptions(1e-2));
    torch::optim::Adam plain(std::vector<torch::Tensor>(pp.begin(), pp.end() - 2),
                             torch::optim::AdamOptions(1e-2));
    bool same = true;
    for (int step = 0; step < 5; ++step) {
      if (step == 2) {
        z.add_param_group(torch::optim::OptimizerParamGroup(
            {zp[4], zp[5]}, std::make_unique<torch::optim::AdamOptions>(2e-2)));
        plain.add_param_group(torch::optim::OptimizerParamGroup(
            {pp[4], pp[5]}, std::make_unique<torch::optim::AdamOptions>(2e-2)));
      }
      TrainStep(za, z, x, y);
      TrainStep(pb, plain, x, y);
      same = same && SameParams(zp, pp);
    }
    std::cout << "add_group_equals_plain: " << same << "\n";
    std::cout << "add_group_partition:";
    for (const auto& r : z.partition()) {
      std::cout << " [";
      for (size_t i = 0; i < r.size(); ++i) std::cout << (i ? "," : "") << r[i];
      std::cout << "]";
    }
    std::cout << "\n";
  }
  // add_param_group on every rank with other parameters on rank 1.
  torch::nn::Linear extra(4, 2);
  Misuse("add_differ", [&] {
    auto body = net->parameters();
    body.pop_back();
    body.pop_back();
    ddp::ZeroRedundancyOptimizer z(body, group, torch::optim::AdamOptions(1e-3));
    std::vector<torch::Tensor> more = {net->parameters()[4], net->parameters()[5]};
    if (group->rank() == 1) more.pop_back();
    z.add_param_group(torch::optim::OptimizerParamGroup(more));
  });
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> flags;
  for (int i = 1; i < argc; ++i) {
    const std::string key = argv[i];
    flags[key] = i + 1 < argc && std::strncmp(argv[i + 1], "--", 2) != 0 ? argv[++i] : "";
  }
  torch::set_num_threads(1);
  try {
    if (flags.count("--misuse")) return MisuseOneRank();
    if (flags.count("--misuse-ranks")) return MisuseTwoRanks();
    return Train(flags);
  } catch (const ddp::Error& e) {
    std::cerr << "zero_program: " << e.what() << "\n";
    return e.exit_code();
  }
}
