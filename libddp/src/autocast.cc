#include "ddp/autocast.h"

#include <ATen/autocast_mode.h>
#include <torch/version.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "libddp/src/api_bridge.h"

namespace ddp {
namespace {

// LibTorch 2.x keys autocast's state by device type; 1.13 has one call per device.
bool IsEnabled(c10::DeviceType t) {
#if TORCH_VERSION_MAJOR >= 2
  return at::autocast::is_autocast_enabled(t);
#else
  return t == c10::DeviceType::CPU ? at::autocast::is_cpu_enabled() : at::autocast::is_enabled();
#endif
}

void SetEnabled(c10::DeviceType t, bool on) {
#if TORCH_VERSION_MAJOR >= 2
  at::autocast::set_autocast_enabled(t, on);
#else
  if (t == c10::DeviceType::CPU) {
    at::autocast::set_cpu_enabled(on);
  } else {
    at::autocast::set_enabled(on);
  }
#endif
}

c10::ScalarType GetDtype(c10::DeviceType t) {
#if TORCH_VERSION_MAJOR >= 2
  return at::autocast::get_autocast_dtype(t);
#else
  return t == c10::DeviceType::CPU ? at::autocast::get_autocast_cpu_dtype()
                                   : at::autocast::get_autocast_gpu_dtype();
#endif
}

void SetDtype(c10::DeviceType t, c10::ScalarType dtype) {
#if TORCH_VERSION_MAJOR >= 2
  at::autocast::set_autocast_dtype(t, dtype);
#else
  if (t == c10::DeviceType::CPU) {
    at::autocast::set_autocast_cpu_dtype(dtype);
  } else {
    at::autocast::set_autocast_gpu_dtype(dtype);
  }
#endif
}

c10::DeviceType Checked(const c10::Device& device, c10::ScalarType dtype) {
  const c10::DeviceType t = device.type();
  if (t != c10::DeviceType::CPU && t != c10::DeviceType::CUDA) {
    ThrowIfError(absl::InvalidArgumentError(absl::StrCat(
        "Autocast: device ", device.str(), " is neither the CPU nor a CUDA GPU")));
  }
  if (dtype != c10::kBFloat16 && dtype != c10::kHalf) {
    ThrowIfError(absl::InvalidArgumentError(absl::StrCat(
        "Autocast: dtype ", c10::toString(dtype), " is not a lower precision (use bfloat16, "
        "or float16 on CUDA)")));
  }
  if (dtype == c10::kHalf && t == c10::DeviceType::CPU) {
    ThrowIfError(absl::InvalidArgumentError(
        "Autocast: float16 on the CPU is not offered (use bfloat16, which needs no loss "
        "scaling)"));
  }
  return t;
}

}  // namespace

// torch.autocast.__enter__ and __exit__ (torch/amp/autocast_mode.py), in that order.
Autocast::Autocast(const c10::Device& device, c10::ScalarType dtype)
    : device_type_(Checked(device, dtype)),
      prev_enabled_(IsEnabled(device_type_)),
      prev_dtype_(GetDtype(device_type_)),
      prev_cache_enabled_(at::autocast::is_autocast_cache_enabled()) {
  SetEnabled(device_type_, true);
  SetDtype(device_type_, dtype);
  at::autocast::increment_nesting();
  at::autocast::set_autocast_cache_enabled(true);
}

Autocast::~Autocast() {
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  SetEnabled(device_type_, prev_enabled_);
  SetDtype(device_type_, prev_dtype_);
  at::autocast::set_autocast_cache_enabled(prev_cache_enabled_);
}

}  // namespace ddp
