#include "libddp/engine/sampler.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <numeric>

namespace ddp {

int64_t DistributedSamplerLength(int64_t n, const SamplerOptions& o) {
  if (o.drop_last && n % o.num_replicas != 0) {
    // math.ceil((n - world) / world) with Python's true division.
    int64_t num = n - o.num_replicas;
    return num <= 0 ? 0 : (num + o.num_replicas - 1) / o.num_replicas;
  }
  return (n + o.num_replicas - 1) / o.num_replicas;
}

std::vector<int64_t> DistributedSamplerIndices(int64_t size, const SamplerOptions& o, int64_t epoch,
                                               int64_t consumed) {
  consumed = std::clamp<int64_t>(consumed, 0, size);
  std::vector<int64_t> indices(static_cast<size_t>(size));
  if (o.shuffle) {
    at::Generator gen = at::detail::createCPUGenerator(static_cast<uint64_t>(o.seed + epoch));
    at::Tensor perm = at::randperm(size, gen, at::TensorOptions().dtype(at::kLong));
    const int64_t* p = perm.data_ptr<int64_t>();
    std::copy(p, p + size, indices.begin());
  } else {
    std::iota(indices.begin(), indices.end(), 0);
  }
  // What is left of the epoch is padded or cut and sharded as a whole epoch would be.
  indices.erase(indices.begin(), indices.begin() + consumed);
  const int64_t n = size - consumed;
  const int64_t num_samples = DistributedSamplerLength(n, o);
  const int64_t total_size = num_samples * o.num_replicas;
  if (!o.drop_last) {
    // indices += (indices * ceil(pad / n))[:pad]: repeat from the start.
    const int64_t pad = total_size - n;
    for (int64_t i = 0; i < pad && n > 0; ++i) indices.push_back(indices[i % n]);
  } else {
    indices.resize(static_cast<size_t>(total_size));
  }
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(num_samples));
  for (int64_t i = o.rank; i < total_size; i += o.num_replicas) mine.push_back(indices[i]);
  return mine;
}

}  // namespace ddp
