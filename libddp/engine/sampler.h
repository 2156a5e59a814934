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
std::vector<int64_t> DistributedSamplerIndices(int64_t dataset_size, const SamplerOptions& options,
                                               int64_t epoch);

// Number of batches a DataLoader makes from `samples` indices.
inline int64_t NumBatches(int64_t samples, int64_t batch_size, bool drop_last) {
  return drop_last ? samples / batch_size : (samples + batch_size - 1) / batch_size;
}

}  // namespace ddp

#endif  // DDP_LIBDDP_ENGINE_SAMPLER_H_
