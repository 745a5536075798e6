#pragma once
// Mixed precision for a forward pass (amp=true): float16 on CUDA; bfloat16 on a CPU with native bfloat16 arithmetic
// (AVX512-BF16 or AMX-BF16), where oneDNN's bfloat16 convolutions make the training step about 1.5x faster than
// float32 (yolov8n, 160 px, batch 16). Weights, gradients and the optimizer stay float32, as under CUDA AMP.

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include <string>

namespace yolo8 {

// Whether this CPU computes in bfloat16 natively (cpuid: AVX512-BF16 or AMX-BF16). Elsewhere bfloat16 is emulated
// and slower than float32, so amp leaves the CPU step in float32.
bool cpu_has_native_bfloat16();

// Whether amp runs the forward under autocast on `device`: always on CUDA, on a CPU only with native bfloat16.
bool autocast_applies(bool amp, c10::DeviceType device, bool cpu_native_bfloat16);

// "float16" or "bfloat16" (the amp_dtype setting) as the CUDA autocast type; throws std::invalid_argument otherwise.
c10::ScalarType cuda_autocast_dtype(const std::string& name);
// Whether CUDA device `index` computes in bfloat16 (compute capability 8.0 and newer: A100, H100, L4, ...).
bool cuda_device_has_bfloat16(int index);
inline bool autocast_applies(bool amp, c10::DeviceType device) {
  return autocast_applies(amp, device, cpu_has_native_bfloat16());
}

// While alive and `enabled`, ops on `device` run under autocast (on CUDA in `cuda_dtype`, float16 or bfloat16; on
// CPU in bfloat16), where safe. Leaving the outermost scope clears the cast-weight cache, as the Python context
// manager does. A no-op when disabled, and for CUDA in builds without it.
class AutocastGuard {
 public:
  AutocastGuard(c10::DeviceType device, bool enabled, c10::ScalarType cuda_dtype = c10::ScalarType::Half);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  c10::DeviceType device_;
  bool active_ = false;
  bool was_enabled_ = false;
};

}  // namespace yolo8
