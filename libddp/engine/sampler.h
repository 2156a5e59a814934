// torch.utils.data.DistributedSampler, index for index.
//
// PyTorch (torch/utils/data/distributed.py):
//   if shuffle: g = Generator(); g.manual_seed(seed + epoch); idx = randperm(n, g)
//   else:       idx = range(n)
//   if not drop_last: pad idx to total_size = ceil(n / world) * world by repeating
//                     it from the start
//   else:             truncate to total_size = ceil((n - world) / world) * world
//                     when n % world != 0, else n
//   return idx[rank:total_size:world]
#ifndef DDP_LIBDDP_ENGINE_SAMPLER_H_
#define DDP_LIBDDP_ENGINE_SAMPLER_H_

#include <cstdint>
#include <vector>

namespace ddp {

struct SamplerOptions {
  int64_t num_replicas = 1;
  int64_t rank = 0;
  bool shuffle = true;
  int64_t seed = 0;
  bool drop_last = false;
};

// Number of indices each rank gets (len(sampler)).
int64_t DistributedSamplerLength(int64_t dataset_size, const SamplerOptions& options);

// The indices rank `options.rank` visits in `epoch` (after set_epoch(epoch)).
//
// `consumed` > 0 (decision 191): the first `consumed` positions of the epoch's order
// were trained on already, by a world of another size, batch size or accumulation
// (an elastic restart). The rest, order[consumed:], is padded or cut for this world
// as above (padding repeats the rest from its own start) and sharded rest[rank::world],
// so every sample of the epoch is still visited once (padding aside). 0: the sampler.
std::vector<int64_t> DistributedSamplerIndices(int64_t dataset_size, const SamplerOptions& options,
                                               int64_t epoch, int64_t consumed = 0);

// How many positions of an epoch's order (the shuffled indices before padding) the
// whole job has trained on after `steps` optimizer steps of `accum` micro-batches of
// `batch_size` per rank, at `world` ranks, counted from position `first`: rank r's j-th
// sample is position first + r + world * j, so the steps consume a prefix. At most
// `dataset_size`.
inline int64_t EpochSamplesConsumed(int64_t dataset_size, int64_t first, int64_t steps,
                                    int64_t accum, int64_t batch_size, int64_t world) {
  const int64_t consumed = first + steps * accum * batch_size * world;
  return consumed < dataset_size ? consumed : dataset_size;
}

// Number of batches a DataLoader makes from `samples` indices.
inline int64_t NumBatches(int64_t samples, int64_t batch_size, bool drop_last) {
  return drop_last ? samples / batch_size : (samples + batch_size - 1) / batch_size;
}

}  // namespace ddp

#endif  // DDP_LIBDDP_ENGINE_SAMPLER_H_
