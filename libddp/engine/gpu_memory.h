// A GPU's memory as this process's CUDA caching allocator sees it: what
// torch.cuda.memory_allocated, memory_reserved and max_memory_allocated return.
#ifndef DDP_LIBDDP_ENGINE_GPU_MEMORY_H_
#define DDP_LIBDDP_ENGINE_GPU_MEMORY_H_

#include <optional>

namespace ddp {

struct GpuMemoryStats {
  double allocated_mib = 0;  // Held by tensors now.
  double reserved_mib = 0;   // Held by the allocator (tensors and its cache).
  double peak_mib = 0;       // The most held by tensors since the process began.
};

// Of GPU `index` of this process (-1: the current one); nullopt for a build without
// CUDA, or where no GPU is visible or the allocator has not touched the GPU yet.
std::optional<GpuMemoryStats> GpuMemoryOf(int index);

}  // namespace ddp

#endif  // DDP_LIBDDP_ENGINE_GPU_MEMORY_H_
