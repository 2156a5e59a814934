// The node's GPUs, as the agent reports them to the coordinator.
//
// GpuInventory is the interface the agent uses; NvmlGpuInventory asks NVML, loaded at
// run time with dlopen("libnvidia-ml.so.1"), so ddp-worker has no build- or load-time
// dependency on the NVIDIA driver: on a CPU node the library is absent and the node
// simply has no GPUs. StaticGpuInventory holds a fixed list (tests, and nodes where
// GPUs are hidden on purpose).
//
// Lifecycle: Open() loads the library and calls nvmlInit_v2 once; Devices() is a
// snapshot taken at Open() (GPUs do not come and go under a running agent); Usage()
// asks NVML each time. The destructor calls nvmlShutdown and unloads the library.
#ifndef DDP_WORKER_AGENT_GPU_INVENTORY_H_
#define DDP_WORKER_AGENT_GPU_INVENTORY_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ddp {

struct GpuDevice {
  int index = 0;             // NVML's index on this node.
  std::string uuid;          // "GPU-8c5f...": what CUDA_VISIBLE_DEVICES names.
  std::string model;         // "NVIDIA H100 80GB HBM3".
  int64_t memory_bytes = 0;  // Total device memory.
};

struct GpuUsage {
  std::string uuid;
  int64_t memory_used_bytes = 0;
  int utilization_percent = 0;  // Of the last sample period (NVML's definition).
};

class GpuInventory {
 public:
  virtual ~GpuInventory() = default;
  // Every GPU of the node, in NVML index order; empty on a CPU node.
  virtual const std::vector<GpuDevice>& Devices() const = 0;
  // Current memory use and utilization of every GPU; UNAVAILABLE if NVML fails.
  virtual absl::StatusOr<std::vector<GpuUsage>> Usage() = 0;
};

class StaticGpuInventory final : public GpuInventory {
 public:
  explicit StaticGpuInventory(std::vector<GpuDevice> devices = {})
      : devices_(std::move(devices)) {}
  const std::vector<GpuDevice>& Devices() const override { return devices_; }
  absl::StatusOr<std::vector<GpuUsage>> Usage() override;

 private:
  std::vector<GpuDevice> devices_;
};

class NvmlGpuInventory final : public GpuInventory {
 public:
  // Loads `library` (default: the driver's libnvidia-ml.so.1) and lists the GPUs.
  // NOT_FOUND when the library is absent (a CPU node); UNAVAILABLE when it is present
  // but NVML fails (driver/library mismatch, no permission on /dev/nvidia*), with
  // NVML's own message.
  static absl::StatusOr<std::unique_ptr<NvmlGpuInventory>> Open(
      const std::string& library = "libnvidia-ml.so.1");
  ~NvmlGpuInventory() override;

  const std::vector<GpuDevice>& Devices() const override { return devices_; }
  absl::StatusOr<std::vector<GpuUsage>> Usage() override;

 private:
  struct Api;
  NvmlGpuInventory(void* handle, std::unique_ptr<Api> api);

  void* handle_;
  std::unique_ptr<Api> api_;
  std::vector<GpuDevice> devices_;
};

// The inventory ddp-worker uses: NVML's GPUs, or none on a node without NVML. An NVML
// that is present but fails is logged (the node then offers CPU slots only).
std::unique_ptr<GpuInventory> DiscoverGpus();

// The GPUs a worker offers out of its node's (ddp-worker --gpus): "all" or "" every
// one; "none" none; otherwise a comma-separated list of NVML indices and UUIDs (a
// UUID may be shortened to a unique prefix), the form of CUDA_VISIBLE_DEVICES and of
// Slurm's SLURM_STEP_GPUS, so that an agent started in a Slurm allocation offers the
// GPUs Slurm gave it and no other. The result keeps the node's (NVML index) order.
// INVALID_ARGUMENT naming an entry that is no GPU of the node, or one named twice.
absl::StatusOr<std::vector<GpuDevice>> SelectGpus(const std::vector<GpuDevice>& node,
                                                  const std::string& spec);

}  // namespace ddp

#endif  // DDP_WORKER_AGENT_GPU_INVENTORY_H_
