#include "trainer/core/autocast.h"

#include <ATen/autocast_mode.h>
#include <torch/version.h>

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

#ifdef YOLO8_AUTOCAST_PER_DEVICE

AutocastGuard::AutocastGuard(c10::DeviceType device, bool enabled) : device_(device), active_(enabled) {
  if (!active_) return;
  was_enabled_ = at::autocast::is_autocast_enabled(device_);
  // Set every time: another scope may have changed the CPU default (bfloat16) or CUDA's (float16).
  at::autocast::set_autocast_dtype(device_, device_ == c10::DeviceType::CPU ? at::kBFloat16 : at::kHalf);
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

// LibTorch before 2.4 (Debian's 1.13): CUDA-only calls.
AutocastGuard::AutocastGuard(c10::DeviceType device, bool enabled)
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
