#pragma once
// Mixed precision for a forward pass on CUDA: the autocast switch as a scope, across LibTorch versions.

namespace yolo8 {

// While alive and `enabled`, CUDA ops run under autocast (float16 where safe). Leaving the outermost scope
// clears the cast-weight cache, as the Python context manager does. A no-op when disabled, and in builds
// without CUDA (autocast only affects CUDA tensors anyway).
class CudaAutocastGuard {
 public:
  explicit CudaAutocastGuard(bool enabled);
  // Not defaulted: it restores autocast state in CUDA builds (empty only where CUDA is compiled out).
  ~CudaAutocastGuard();  // NOLINT(performance-trivially-destructible)
  CudaAutocastGuard(const CudaAutocastGuard&) = delete;
  CudaAutocastGuard& operator=(const CudaAutocastGuard&) = delete;

 private:
  bool active_ = false;
  bool was_enabled_ = false;
};

}  // namespace yolo8
