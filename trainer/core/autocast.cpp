#include "trainer/core/autocast.h"

#ifdef YOLO8_WITH_CUDA
#include <ATen/autocast_mode.h>
#include <torch/version.h>

// 2.4 moved to per-device calls and deprecated the CUDA-only ones.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
#define YOLO8_AUTOCAST_PER_DEVICE 1
#endif
#endif

namespace yolo8 {

#ifdef YOLO8_WITH_CUDA
namespace {

bool cuda_autocast_enabled() {
#ifdef YOLO8_AUTOCAST_PER_DEVICE
  return at::autocast::is_autocast_enabled(at::kCUDA);
#else
  return at::autocast::is_enabled();
#endif
}

void set_cuda_autocast(bool enabled) {
#ifdef YOLO8_AUTOCAST_PER_DEVICE
  at::autocast::set_autocast_enabled(at::kCUDA, enabled);
#else
  at::autocast::set_enabled(enabled);
#endif
}

}  // namespace

CudaAutocastGuard::CudaAutocastGuard(bool enabled) : active_(enabled) {
  if (!active_) return;
  was_enabled_ = cuda_autocast_enabled();
  set_cuda_autocast(true);
  at::autocast::increment_nesting();
}

CudaAutocastGuard::~CudaAutocastGuard() {
  if (!active_) return;
  // The cache holds float16 copies of the weights; they are stale once the optimizer steps.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  set_cuda_autocast(was_enabled_);
}

#else

CudaAutocastGuard::CudaAutocastGuard(bool enabled) : active_(enabled) { (void)was_enabled_; }
CudaAutocastGuard::~CudaAutocastGuard() = default;

#endif

}  // namespace yolo8
