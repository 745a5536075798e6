#include "trainer/core/autocast.h"

#include <ATen/autocast_mode.h>
#include <torch/version.h>
#ifdef YOLO8_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

#include <stdexcept>

// 2.4 moved to per-device calls (and deprecated the CUDA-only ones); CPU bfloat16 autocast is used from there on.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
#define YOLO8_AUTOCAST_PER_DEVICE 1
#endif

namespace yolo8 {

bool cpu_has_native_bfloat16() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool native = __builtin_cpu_supports("avx512bf16") || __builtin_cpu_supports("amx-bf16");
  return native;
#else
  return false;
#endif
}

bool autocast_applies(bool amp, c10::DeviceType device, bool cpu_native_bfloat16) {
  if (!amp) return false;
#ifdef YOLO8_WITH_CUDA
  if (device == c10::DeviceType::CUDA) return true;
#endif
#ifdef YOLO8_AUTOCAST_PER_DEVICE
  if (device == c10::DeviceType::CPU) return cpu_native_bfloat16;
#endif
  (void)cpu_native_bfloat16;
  return false;
}

c10::ScalarType cuda_autocast_dtype(const std::string& name) {
  if (name == "float16") return c10::ScalarType::Half;
  if (name == "bfloat16") return c10::ScalarType::BFloat16;
  throw std::invalid_argument("amp_dtype must be float16 or bfloat16, got '" + name + "'");
}

bool cuda_device_has_bfloat16(int index) {
#ifdef YOLO8_WITH_CUDA
  return at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(index))->major >= 8;
#else
  (void)index;
  return false;
#endif
}

#ifdef YOLO8_AUTOCAST_PER_DEVICE

AutocastGuard::AutocastGuard(c10::DeviceType device, bool enabled, c10::ScalarType cuda_dtype)
    : device_(device), active_(enabled) {
  if (!active_) return;
  was_enabled_ = at::autocast::is_autocast_enabled(device_);
  // Set every time: another scope may have changed the CPU default (bfloat16) or CUDA's.
  at::autocast::set_autocast_dtype(device_, device_ == c10::DeviceType::CPU ? at::kBFloat16 : cuda_dtype);
  at::autocast::set_autocast_enabled(device_, true);
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  if (!active_) return;
  // The cache holds low-precision copies of the weights; they are stale once the optimizer steps.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(device_, was_enabled_);
}

#else

// LibTorch before 2.4 (Debian's 1.13): CUDA-only calls, float16 only.
AutocastGuard::AutocastGuard(c10::DeviceType device, bool enabled, c10::ScalarType /*cuda_dtype*/)
    : device_(device), active_(enabled && device == c10::DeviceType::CUDA) {
#ifdef YOLO8_WITH_CUDA
  if (!active_) return;
  was_enabled_ = at::autocast::is_enabled();
  at::autocast::set_enabled(true);
  at::autocast::increment_nesting();
#endif
}

AutocastGuard::~AutocastGuard() {
#ifdef YOLO8_WITH_CUDA
  if (!active_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_enabled(was_enabled_);
#endif
}

#endif

}  // namespace yolo8
