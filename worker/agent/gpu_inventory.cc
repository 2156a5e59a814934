#include "worker/agent/gpu_inventory.h"

#include <dlfcn.h>

#include <set>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/logging.h"

namespace ddp {

// The part of NVML's C API we call, declared here (with the ABI of nvml.h) so that the
// agent builds without the driver's headers.
struct NvmlGpuInventory::Api {
  using Return = int;  // nvmlReturn_t; NVML_SUCCESS is 0.
  using Device = void*;  // nvmlDevice_t, an opaque pointer.
  struct Memory {        // nvmlMemory_t
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
  };
  struct Utilization {  // nvmlUtilization_t
    unsigned int gpu;
    unsigned int memory;
  };
  static constexpr unsigned kStringBuffer = 96;  // NVML_DEVICE_{NAME,UUID}_V2_BUFFER_SIZE

  Return (*init)() = nullptr;
  Return (*shutdown)() = nullptr;
  const char* (*error_string)(Return) = nullptr;
  Return (*count)(unsigned*) = nullptr;
  Return (*handle_by_index)(unsigned, Device*) = nullptr;
  Return (*name)(Device, char*, unsigned) = nullptr;
  Return (*uuid)(Device, char*, unsigned) = nullptr;
  Return (*memory)(Device, Memory*) = nullptr;
  Return (*utilization)(Device, Utilization*) = nullptr;

  std::string Error(const char* call, Return rc) const {
    const char* text = error_string ? error_string(rc) : nullptr;
    return absl::StrCat(call, " failed: ", text ? text : "error", " (", rc, ")");
  }
};

namespace {

template <typename Fn>
bool Resolve(void* handle, const char* symbol, Fn* fn) {
  *fn = reinterpret_cast<Fn>(dlsym(handle, symbol));
  return *fn != nullptr;
}

}  // namespace

absl::StatusOr<std::vector<GpuUsage>> StaticGpuInventory::Usage() {
  std::vector<GpuUsage> out;
  for (const GpuDevice& d : devices_) out.push_back({d.uuid, 0, 0});
  return out;
}

NvmlGpuInventory::NvmlGpuInventory(void* handle, std::unique_ptr<Api> api)
    : handle_(handle), api_(std::move(api)) {}

NvmlGpuInventory::~NvmlGpuInventory() {
  api_->shutdown();
  dlclose(handle_);
}

absl::StatusOr<std::unique_ptr<NvmlGpuInventory>> NvmlGpuInventory::Open(
    const std::string& library) {
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* err = dlerror();
    return absl::NotFoundError(
        absl::StrCat("cannot load ", library, ": ", err ? err : "not found"));
  }
  auto api = std::make_unique<Api>();
  const bool resolved =
      Resolve(handle, "nvmlInit_v2", &api->init) && Resolve(handle, "nvmlShutdown", &api->shutdown) &&
      Resolve(handle, "nvmlErrorString", &api->error_string) &&
      Resolve(handle, "nvmlDeviceGetCount_v2", &api->count) &&
      Resolve(handle, "nvmlDeviceGetHandleByIndex_v2", &api->handle_by_index) &&
      Resolve(handle, "nvmlDeviceGetName", &api->name) &&
      Resolve(handle, "nvmlDeviceGetUUID", &api->uuid) &&
      Resolve(handle, "nvmlDeviceGetMemoryInfo", &api->memory) &&
      Resolve(handle, "nvmlDeviceGetUtilizationRates", &api->utilization);
  if (!resolved) {
    dlclose(handle);
    return absl::UnavailableError(
        absl::StrCat(library, " lacks NVML symbols this agent needs (driver too old?)"));
  }
  if (Api::Return rc = api->init(); rc != 0) {
    std::string msg = api->Error("nvmlInit_v2", rc);
    dlclose(handle);
    return absl::UnavailableError(
        absl::StrCat(msg, ": is the NVIDIA driver loaded, and may this user open /dev/nvidia*?"));
  }
  std::unique_ptr<NvmlGpuInventory> inv(new NvmlGpuInventory(handle, std::move(api)));
  const Api& a = *inv->api_;
  unsigned count = 0;
  if (Api::Return rc = a.count(&count); rc != 0) {
    return absl::UnavailableError(a.Error("nvmlDeviceGetCount_v2", rc));
  }
  for (unsigned i = 0; i < count; ++i) {
    Api::Device dev = nullptr;
    if (Api::Return rc = a.handle_by_index(i, &dev); rc != 0) {
      return absl::UnavailableError(
          absl::StrCat("GPU ", i, ": ", a.Error("nvmlDeviceGetHandleByIndex_v2", rc)));
    }
    char name[Api::kStringBuffer] = {};
    char uuid[Api::kStringBuffer] = {};
    Api::Memory mem = {};
    if (Api::Return rc = a.uuid(dev, uuid, sizeof(uuid)); rc != 0) {
      return absl::UnavailableError(absl::StrCat("GPU ", i, ": ", a.Error("nvmlDeviceGetUUID", rc)));
    }
    GpuDevice d;
    d.index = static_cast<int>(i);
    d.uuid = uuid;
    // The model and memory are shown to users; a failure there is not fatal.
    if (a.name(dev, name, sizeof(name)) == 0) d.model = name;
    if (a.memory(dev, &mem) == 0) d.memory_bytes = static_cast<int64_t>(mem.total);
    inv->devices_.push_back(std::move(d));
  }
  return inv;
}

absl::StatusOr<std::vector<GpuUsage>> NvmlGpuInventory::Usage() {
  std::vector<GpuUsage> out;
  for (const GpuDevice& d : devices_) {
    Api::Device dev = nullptr;
    if (Api::Return rc = api_->handle_by_index(static_cast<unsigned>(d.index), &dev); rc != 0) {
      return absl::UnavailableError(api_->Error("nvmlDeviceGetHandleByIndex_v2", rc));
    }
    GpuUsage u;
    u.uuid = d.uuid;
    Api::Memory mem = {};
    Api::Utilization util = {};
    if (Api::Return rc = api_->memory(dev, &mem); rc != 0) {
      return absl::UnavailableError(api_->Error("nvmlDeviceGetMemoryInfo", rc));
    }
    if (Api::Return rc = api_->utilization(dev, &util); rc != 0) {
      return absl::UnavailableError(api_->Error("nvmlDeviceGetUtilizationRates", rc));
    }
    u.memory_used_bytes = static_cast<int64_t>(mem.used);
    u.utilization_percent = static_cast<int>(util.gpu);
    out.push_back(std::move(u));
  }
  return out;
}

std::unique_ptr<GpuInventory> DiscoverGpus() {
  auto nvml = NvmlGpuInventory::Open();
  if (nvml.ok()) return *std::move(nvml);
  if (nvml.status().code() != absl::StatusCode::kNotFound) {
    DDP_LOG(WARNING) << "NVML: " << nvml.status().message()
                     << "; this node offers no GPUs until that is fixed";
  }
  return std::make_unique<StaticGpuInventory>();
}

absl::StatusOr<std::vector<GpuDevice>> SelectGpus(const std::vector<GpuDevice>& node,
                                                  const std::string& spec) {
  const absl::string_view list = absl::StripAsciiWhitespace(spec);
  if (list.empty() || list == "all") return node;
  if (list == "none") return std::vector<GpuDevice>{};
  std::set<size_t> chosen;  // Positions in `node`.
  for (absl::string_view entry : absl::StrSplit(list, ',')) {
    entry = absl::StripAsciiWhitespace(entry);
    std::vector<size_t> matches;
    int index = 0;
    if (absl::SimpleAtoi(entry, &index)) {
      for (size_t i = 0; i < node.size(); ++i) {
        if (node[i].index == index) matches.push_back(i);
      }
    } else if (!entry.empty()) {
      for (size_t i = 0; i < node.size(); ++i) {
        if (node[i].uuid == entry) {
          matches = {i};
          break;
        }
        if (absl::StartsWith(node[i].uuid, entry)) matches.push_back(i);
      }
    }
    if (matches.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "'", entry, "' is no GPU of this node, which has ", node.size(),
          " (NVML indices or UUIDs, as `nvidia-smi -L` lists them; or 'all', 'none')"));
    }
    if (matches.size() > 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", entry, "' begins the UUIDs of ", matches.size(), " GPUs"));
    }
    if (!chosen.insert(matches[0]).second) {
      return absl::InvalidArgumentError(absl::StrCat("GPU '", entry, "' is named twice"));
    }
  }
  std::vector<GpuDevice> out;
  for (size_t i : chosen) out.push_back(node[i]);
  return out;
}

}  // namespace ddp
