#include "libddp/engine/gpu_memory.h"

#if DDP_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace ddp {

std::optional<GpuMemoryStats> GpuMemoryOf(int index) {
#if DDP_WITH_CUDA
  if (c10::cuda::device_count() == 0) return std::nullopt;
  // Without an allocation on it, the allocator has no state for the device yet (and
  // asking would initialize CUDA in a process that never meant to use it).
  if (!c10::cuda::CUDACachingAllocator::get()->initialized()) return std::nullopt;
  const auto device =
      static_cast<c10::DeviceIndex>(index >= 0 ? index : c10::cuda::current_device());
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device);
  constexpr double kMiB = 1024.0 * 1024.0;
  // [0] is StatType::AGGREGATE in every LibTorch: both pools, as torch.cuda's "all".
  GpuMemoryStats out;
  out.allocated_mib = static_cast<double>(stats.allocated_bytes[0].current) / kMiB;
  out.reserved_mib = static_cast<double>(stats.reserved_bytes[0].current) / kMiB;
  out.peak_mib = static_cast<double>(stats.allocated_bytes[0].peak) / kMiB;
  return out;
#else
  (void)index;
  return std::nullopt;
#endif
}

}  // namespace ddp
