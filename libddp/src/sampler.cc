#include "ddp/sampler.h"

#include <torch/serialize/archive.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "ddp/process_group.h"
#include "libddp/engine/sampler.h"
#include "libddp/src/api_bridge.h"

namespace ddp {

DistributedSampler::DistributedSampler(int64_t dataset_size, int64_t num_replicas, int64_t rank,
                                       bool shuffle, int64_t seed, bool drop_last)
    : dataset_size_(dataset_size),
      num_replicas_(num_replicas),
      rank_(rank),
      shuffle_(shuffle),
      seed_(seed),
      drop_last_(drop_last) {
  if (num_replicas < 1 || rank < 0 || rank >= num_replicas) {
    ThrowIfError(absl::InvalidArgumentError(absl::StrCat(
        "DistributedSampler: rank ", rank, " is not in [0, ", num_replicas, ")")));
  }
  if (dataset_size < 0) {
    ThrowIfError(absl::InvalidArgumentError(
        absl::StrCat("DistributedSampler: dataset size ", dataset_size, " is negative")));
  }
  reset();
}

DistributedSampler::DistributedSampler(int64_t dataset_size, const ProcessGroup& group,
                                       bool shuffle, int64_t seed, bool drop_last)
    : DistributedSampler(dataset_size, group.world_size(), group.rank(), shuffle, seed,
                         drop_last) {}

void DistributedSampler::set_epoch(int64_t epoch) {
  *epoch_ = epoch;
  *done_ = 0;
}

void DistributedSampler::set_epoch(int64_t epoch, int64_t samples_done) {
  if (samples_done < 0 || samples_done > dataset_size_) {
    ThrowIfError(absl::InvalidArgumentError(
        absl::StrCat("DistributedSampler: samples_done ", samples_done, " is not in [0, ",
                     dataset_size_, "] (the dataset's size)")));
  }
  *epoch_ = epoch;
  *done_ = samples_done;
}

int64_t DistributedSampler::samples_done_after(int64_t batches, int64_t batch_size) const {
  return EpochSamplesConsumed(dataset_size_, *done_, batches, /*accum=*/1, batch_size,
                              num_replicas_);
}

std::vector<int64_t> DistributedSampler::indices() const {
  SamplerOptions o{num_replicas_, rank_, shuffle_, seed_, drop_last_};
  return DistributedSamplerIndices(dataset_size_, o, *epoch_, *done_);
}

int64_t DistributedSampler::size() const {
  SamplerOptions o{num_replicas_, rank_, shuffle_, seed_, drop_last_};
  return DistributedSamplerLength(dataset_size_ - std::min(*done_, dataset_size_), o);
}

void DistributedSampler::reset(torch::optional<size_t> new_size) {
  if (new_size.has_value()) dataset_size_ = static_cast<int64_t>(*new_size);
  current_ = indices();
  cursor_ = 0;
}

torch::optional<std::vector<size_t>> DistributedSampler::next(size_t batch_size) {
  if (cursor_ >= current_.size()) return torch::nullopt;
  const size_t n = std::min(batch_size, current_.size() - cursor_);
  std::vector<size_t> batch(current_.begin() + static_cast<std::ptrdiff_t>(cursor_),
                            current_.begin() + static_cast<std::ptrdiff_t>(cursor_ + n));
  cursor_ += n;
  return batch;
}

void DistributedSampler::save(torch::serialize::OutputArchive& archive) const {
  archive.write("epoch", at::tensor(*epoch_), /*is_buffer=*/true);
  archive.write("cursor", at::tensor(static_cast<int64_t>(cursor_)), /*is_buffer=*/true);
  archive.write("samples_done", at::tensor(*done_), /*is_buffer=*/true);
}

void DistributedSampler::load(torch::serialize::InputArchive& archive) {
  at::Tensor epoch = at::empty({}, at::kLong);
  at::Tensor cursor = at::empty({}, at::kLong);
  archive.read("epoch", epoch, /*is_buffer=*/true);
  archive.read("cursor", cursor, /*is_buffer=*/true);
  *epoch_ = epoch.item<int64_t>();
  // Archives before samples_done lack it: the epoch from its start.
  at::Tensor done = at::zeros({}, at::kLong);
  archive.try_read("samples_done", done, /*is_buffer=*/true);
  *done_ = std::clamp<int64_t>(done.item<int64_t>(), 0, dataset_size_);
  reset();
  cursor_ = std::min(static_cast<size_t>(cursor.item<int64_t>()), current_.size());
}

}  // namespace ddp
