// A stand-in for the driver's libnvidia-ml.so.1, so that NvmlGpuInventory's real
// dlopen/dlsym/NVML-call path runs in tests on machines without a GPU. It implements
// the NVML calls the agent makes, with NVML's C ABI, over devices described by the
// environment (read at nvmlInit_v2):
//   FAKE_NVML_GPUS        "uuid|model|MiB|used MiB|util%;..." (default: none)
//   FAKE_NVML_INIT_ERROR  an nvmlReturn_t code for nvmlInit_v2 to fail with
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct FakeGpu {
  std::string uuid, model;
  unsigned long long mib = 0, used_mib = 0;
  unsigned util = 0;
};
std::vector<FakeGpu> gpus;
bool initialized = false;

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string part;
  while (std::getline(in, part, sep)) out.push_back(part);
  return out;
}

int Copy(const std::string& s, char* buf, unsigned len) {
  if (s.size() + 1 > len) return 7;  // NVML_ERROR_INSUFFICIENT_SIZE
  std::memcpy(buf, s.c_str(), s.size() + 1);
  return 0;
}

}  // namespace

extern "C" {

int nvmlInit_v2() {
  if (const char* err = std::getenv("FAKE_NVML_INIT_ERROR")) return std::atoi(err);
  gpus.clear();
  const char* spec = std::getenv("FAKE_NVML_GPUS");
  for (const std::string& g : Split(spec ? spec : "", ';')) {
    std::vector<std::string> f = Split(g, '|');
    if (f.size() < 5) continue;
    gpus.push_back({f[0], f[1], std::stoull(f[2]), std::stoull(f[3]),
                    static_cast<unsigned>(std::stoul(f[4]))});
  }
  initialized = true;
  return 0;
}

int nvmlShutdown() {
  initialized = false;
  return 0;
}

const char* nvmlErrorString(int rc) {
  return rc == 9 ? "Driver Not Loaded" : rc == 4 ? "Insufficient Permissions" : "Unknown Error";
}

int nvmlDeviceGetCount_v2(unsigned* count) {
  if (!initialized) return 1;  // NVML_ERROR_UNINITIALIZED
  *count = static_cast<unsigned>(gpus.size());
  return 0;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned index, void** device) {
  if (index >= gpus.size()) return 2;  // NVML_ERROR_INVALID_ARGUMENT
  *device = &gpus[index];
  return 0;
}

int nvmlDeviceGetName(void* device, char* name, unsigned len) {
  return Copy(static_cast<FakeGpu*>(device)->model, name, len);
}

int nvmlDeviceGetUUID(void* device, char* uuid, unsigned len) {
  return Copy(static_cast<FakeGpu*>(device)->uuid, uuid, len);
}

struct Memory {
  unsigned long long total, free, used;
};
int nvmlDeviceGetMemoryInfo(void* device, Memory* m) {
  const FakeGpu& g = *static_cast<FakeGpu*>(device);
  m->total = g.mib << 20;
  m->used = g.used_mib << 20;
  m->free = m->total - m->used;
  return 0;
}

struct Utilization {
  unsigned gpu, memory;
};
int nvmlDeviceGetUtilizationRates(void* device, Utilization* u) {
  u->gpu = static_cast<FakeGpu*>(device)->util;
  u->memory = 0;
  return 0;
}

}  // extern "C"
