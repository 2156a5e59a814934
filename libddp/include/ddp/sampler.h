// ddp::DistributedSampler: torch.utils.data.DistributedSampler, index for index.
//
// As PyTorch (torch/utils/data/distributed.py) draws them:
//   shuffle: randperm(n) from a generator seeded with seed + epoch, else 0..n-1;
//   drop_last false: padded to ceil(n / world) * world by repeating from the start;
//   drop_last true:  cut to floor(n / world) * world;
//   this rank's share: indices[rank : total : world].
// Use it with index lists (indices()) or as a torch::data sampler:
//   ddp::DistributedSampler sampler(dataset.size().value(), *group);
//   auto loader = torch::data::make_data_loader(dataset, sampler, batch_size);
//   for (epoch ...) { sampler.set_epoch(epoch); for (auto& batch : *loader) ... }
// make_data_loader keeps its own copy of the sampler; copies share the epoch, so
// set_epoch on yours reaches the loader's (call it before iterating, as in Python; the
// loader resets its sampler at the start of each pass).
#ifndef DDP_SAMPLER_H_
#define DDP_SAMPLER_H_

#include <torch/data/samplers/base.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace ddp {

class ProcessGroup;

class DistributedSampler : public torch::data::samplers::Sampler<std::vector<size_t>> {
 public:
  // Throws ddp::Error (kInvalidArgument) for rank outside 0..num_replicas-1.
  DistributedSampler(int64_t dataset_size, int64_t num_replicas, int64_t rank, bool shuffle = true,
                     int64_t seed = 0, bool drop_last = false);
  // num_replicas and rank from the group.
  DistributedSampler(int64_t dataset_size, const ProcessGroup& group, bool shuffle = true,
                     int64_t seed = 0, bool drop_last = false);

  // Also for every copy of this sampler (a loader's).
  void set_epoch(int64_t epoch);
  // Going on with an epoch that a world of another size (or batch size) trained part
  // of: the first `samples_done` positions of the epoch's order are done, and this rank
  // takes its share of the rest, rest[rank::world] (padded or cut as a whole epoch).
  // Also for every copy; the next set_epoch(epoch) starts from 0 again. Throws
  // kInvalidArgument for a count outside 0..dataset_size.
  void set_epoch(int64_t epoch, int64_t samples_done);
  int64_t epoch() const { return *epoch_; }
  int64_t samples_done() const { return *done_; }
  // How many positions of the epoch's order the whole job has trained on after
  // `batches` full batches of `batch_size` on every rank of this world, counted from
  // samples_done() (at most dataset_size): what a checkpoint keeps to go on at
  // another world size with set_epoch(epoch, samples_done).
  int64_t samples_done_after(int64_t batches, int64_t batch_size) const;
  // This rank's indices for the current epoch (len(sampler) of them).
  std::vector<int64_t> indices() const;
  // len(sampler): how many indices this rank gets per epoch.
  int64_t size() const;

  // torch::data::samplers::Sampler: reset() starts the epoch set by set_epoch()
  // again (new_size: a new dataset size); next(n) hands out the next n indices.
  void reset(torch::optional<size_t> new_size = torch::nullopt) override;
  torch::optional<std::vector<size_t>> next(size_t batch_size) override;
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 private:
  int64_t dataset_size_;
  int64_t num_replicas_;
  int64_t rank_;
  bool shuffle_;
  int64_t seed_;
  bool drop_last_;
  std::shared_ptr<int64_t> epoch_ = std::make_shared<int64_t>(0);  // Shared by copies.
  std::shared_ptr<int64_t> done_ = std::make_shared<int64_t>(0);   // Shared by copies.
  std::vector<int64_t> current_;  // Drawn by reset().
  size_t cursor_ = 0;
};

}  // namespace ddp

#endif  // DDP_SAMPLER_H_
