// ddp::DistributedSampler inside LibTorch's data loaders, on libddp's public API only.
//
//   data_loader_program batches [N WORLD SHUFFLE SEED SAMPLER_DROP_LAST BATCH LOADER_DROP_LAST
//                                WORKERS MAX_JOBS EPOCHS ORDERED]...
//     For each case (11 numbers), one line: for every rank of WORLD, a DistributedSampler
//     over 0..N-1, handed by copy to torch::data::make_data_loader (DataLoaderOptions:
//     batch_size BATCH, drop_last LOADER_DROP_LAST, workers WORKERS, max_jobs MAX_JOBS
//     (0: the default), enforce_ordering ORDERED), then EPOCHS passes, set_epoch(e)
//     called on the caller's sampler before pass e. Prints {"ranks": [[[batch of
//     indices, ...] per epoch] per rank], "indices": [[sampler.indices() per epoch] per
//     rank]}. Each sample's data is its index times 2 (checked here: exit 3 if a batch
//     pairs the wrong data).
//   data_loader_program stateful [N WORLD SHUFFLE SEED SAMPLER_DROP_LAST BATCH WORKERS EPOCHS]...
//     For each case (8 numbers), the same through a stateful dataset that draws its
//     batches from a sampler it holds (make_data_loader takes no sampler for those);
//     one {"ranks": ...} line per case.
//   data_loader_program train loader WORKERS | train index
//     One rank of a real 2-rank DDP training run (torchrun's environment): an MLP on 999
//     synthetic rows, batch 32, 3 epochs, shuffled by a DistributedSampler; fed by
//     make_data_loader with WORKERS threads, or by index arithmetic on
//     sampler.indices(). Prints {"losses": [...]} with every step's loss.
#include <ddp/ddp.h>
#include <torch/torch.h>

#include <cstdio>
#include <iostream>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

namespace {

// Sample i: data 2 * i (a [1] double tensor), target i.
struct IndexDataset : torch::data::datasets::Dataset<IndexDataset> {
  explicit IndexDataset(int64_t n) : n(n) {}
  torch::data::Example<> get(size_t i) override {
    return {torch::full({1}, 2.0 * static_cast<double>(i), torch::kFloat64),
            torch::tensor(static_cast<int64_t>(i))};
  }
  torch::optional<size_t> size() const override { return static_cast<size_t>(n); }
  int64_t n;
};

// A stateful dataset: its batches come from the sampler it holds (a copy: the epoch is
// shared with the caller's), under a lock, since the loader's workers share it.
struct IndexStream
    : torch::data::datasets::StatefulDataset<IndexStream, std::vector<size_t>, size_t> {
  explicit IndexStream(ddp::DistributedSampler sampler) : sampler(std::move(sampler)) {}
  torch::optional<std::vector<size_t>> get_batch(size_t batch_size) override {
    std::lock_guard<std::mutex> lock(*mu);
    return sampler.next(batch_size);
  }
  torch::optional<size_t> size() const override { return torch::nullopt; }
  void reset() override {
    std::lock_guard<std::mutex> lock(*mu);
    sampler.reset();
  }
  void save(torch::serialize::OutputArchive& archive) const override { sampler.save(archive); }
  void load(torch::serialize::InputArchive& archive) override { sampler.load(archive); }
  ddp::DistributedSampler sampler;
  std::shared_ptr<std::mutex> mu = std::make_shared<std::mutex>();
};

std::string Json(const std::vector<size_t>& v) {
  std::ostringstream s;
  s << "[";
  for (size_t i = 0; i < v.size(); ++i) s << (i ? "," : "") << v[i];
  s << "]";
  return s.str();
}

std::string Json(const std::vector<int64_t>& v) {
  return Json(std::vector<size_t>(v.begin(), v.end()));
}

bool Flag(const char* s) { return std::string(s) == "1" || std::string(s) == "true"; }

int Batches(char** a) {
  const int64_t n = std::stoll(a[0]), world = std::stoll(a[1]);
  const bool shuffle = Flag(a[2]);
  const int64_t seed = std::stoll(a[3]);
  const bool sampler_drop_last = Flag(a[4]);
  const size_t batch = std::stoul(a[5]);
  const bool loader_drop_last = Flag(a[6]);
  const size_t workers = std::stoul(a[7]), max_jobs = std::stoul(a[8]);
  const int64_t epochs = std::stoll(a[9]);
  const bool ordered = Flag(a[10]);
  std::ostringstream ranks, indices;
  for (int64_t rank = 0; rank < world; ++rank) {
    ddp::DistributedSampler sampler(n, world, rank, shuffle, seed, sampler_drop_last);
    auto options = torch::data::DataLoaderOptions()
                       .batch_size(batch)
                       .drop_last(loader_drop_last)
                       .workers(workers)
                       .enforce_ordering(ordered);
    if (max_jobs > 0) options.max_jobs(max_jobs);
    auto loader = torch::data::make_data_loader(
        IndexDataset(n).map(torch::data::transforms::Stack<>()), sampler, options);
    ranks << (rank ? "," : "") << "[";
    indices << (rank ? "," : "") << "[";
    for (int64_t epoch = 0; epoch < epochs; ++epoch) {
      sampler.set_epoch(epoch);  // The caller's copy; the loader holds another.
      ranks << (epoch ? "," : "") << "[";
      bool first = true;
      for (auto& b : *loader) {
        const torch::Tensor target = b.target.contiguous();
        if (!b.data.view({-1}).equal(target.to(torch::kFloat64) * 2)) {
          std::cerr << "rank " << rank << " epoch " << epoch << ": data not its index's\n";
          return 3;
        }
        const int64_t* p = target.data_ptr<int64_t>();
        ranks << (first ? "" : ",") << Json(std::vector<size_t>(p, p + target.numel()));
        first = false;
      }
      ranks << "]";
      indices << (epoch ? "," : "") << Json(sampler.indices());
    }
    ranks << "]";
    indices << "]";
  }
  std::cout << "{\"ranks\": [" << ranks.str() << "], \"indices\": [" << indices.str() << "]}"
            << std::endl;
  return 0;
}

int Stateful(char** a) {
  const int64_t n = std::stoll(a[0]), world = std::stoll(a[1]);
  const bool shuffle = Flag(a[2]);
  const int64_t seed = std::stoll(a[3]);
  const bool sampler_drop_last = Flag(a[4]);
  const size_t batch = std::stoul(a[5]), workers = std::stoul(a[6]);
  const int64_t epochs = std::stoll(a[7]);
  std::ostringstream ranks;
  for (int64_t rank = 0; rank < world; ++rank) {
    ddp::DistributedSampler sampler(n, world, rank, shuffle, seed, sampler_drop_last);
    auto loader = torch::data::make_data_loader(
        IndexStream(sampler), torch::data::DataLoaderOptions().batch_size(batch).workers(workers));
    ranks << (rank ? "," : "") << "[";
    for (int64_t epoch = 0; epoch < epochs; ++epoch) {
      sampler.set_epoch(epoch);
      ranks << (epoch ? "," : "") << "[";
      bool first = true;
      for (auto& b : *loader) {
        ranks << (first ? "" : ",") << Json(b);
        first = false;
      }
      ranks << "]";
    }
    ranks << "]";
  }
  std::cout << "{\"ranks\": [" << ranks.str() << "]}" << std::endl;
  return 0;
}

// The training rows: sample i is (x[i], y[i]); one index_select per batch.
struct Rows
    : torch::data::datasets::BatchDataset<Rows, torch::data::Example<>, std::vector<size_t>> {
  Rows(torch::Tensor x, torch::Tensor y) : x(std::move(x)), y(std::move(y)) {}
  torch::data::Example<> get_batch(std::vector<size_t> indices) override {
    torch::Tensor idx =
        torch::tensor(std::vector<int64_t>(indices.begin(), indices.end()), torch::kInt64);
    return {x.index_select(0, idx), y.index_select(0, idx)};
  }
  torch::optional<size_t> size() const override { return static_cast<size_t>(x.size(0)); }
  torch::Tensor x, y;
};

int Train(int argc, char** argv) {
  const bool use_loader = std::string(argv[2]) == "loader";
  const size_t workers = use_loader && argc > 3 ? std::stoul(argv[3]) : 0;
  torch::set_num_threads(1);
  auto group = ddp::init_process_group();
  torch::manual_seed(0);
  const int64_t n = 999, batch = 32, epochs = 3;
  torch::Tensor x = torch::randn({n, 16});
  torch::Tensor y = x.slice(1, 0, 4).argmax(1);
  torch::nn::Sequential net(torch::nn::Linear(16, 32), torch::nn::ReLU(),
                            torch::nn::Linear(32, 4));
  ddp::DistributedDataParallel model(net, group);
  torch::optim::SGD opt(model.module()->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  ddp::DistributedSampler sampler(n, *group, /*shuffle=*/true, /*seed=*/7);
  auto loader = torch::data::make_data_loader(
      Rows(x, y), sampler, torch::data::DataLoaderOptions().batch_size(batch).workers(workers));
  std::vector<double> losses;
  auto step = [&](const torch::Tensor& xb, const torch::Tensor& yb) {
    torch::Tensor loss = torch::nn::functional::cross_entropy(model(xb), yb);
    opt.zero_grad();
    loss.backward();
    opt.step();
    losses.push_back(loss.item<double>());
  };
  for (int64_t epoch = 0; epoch < epochs; ++epoch) {
    sampler.set_epoch(epoch);
    if (use_loader) {
      for (auto& b : *loader) step(b.data, b.target);
    } else {
      const std::vector<int64_t> order = sampler.indices();
      for (size_t begin = 0; begin < order.size(); begin += batch) {
        const size_t end = std::min(order.size(), begin + static_cast<size_t>(batch));
        torch::Tensor idx =
            torch::tensor(std::vector<int64_t>(order.begin() + begin, order.begin() + end));
        step(x.index_select(0, idx), y.index_select(0, idx));
      }
    }
  }
  std::ostringstream out;
  out.precision(17);
  out << "{\"losses\": [";
  for (size_t i = 0; i < losses.size(); ++i) out << (i ? "," : "") << losses[i];
  out << "]}";
  std::cout << out.str() << std::endl;
  group->barrier();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "batches" && argc > 2 && (argc - 2) % 11 == 0) {
      for (int i = 2; i < argc; i += 11) {
        if (int rc = Batches(argv + i); rc != 0) return rc;
      }
      return 0;
    }
    if (mode == "stateful" && argc > 2 && (argc - 2) % 8 == 0) {
      for (int i = 2; i < argc; i += 8) {
        if (int rc = Stateful(argv + i); rc != 0) return rc;
      }
      return 0;
    }
    if (mode == "train" && argc >= 3) return Train(argc, argv);
    std::cerr << "usage: see the comment at the top of data_loader_program.cc\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "data_loader_program: " << e.what() << std::endl;
    return 1;
  }
}
