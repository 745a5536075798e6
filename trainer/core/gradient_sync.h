#pragma once
// How a data-parallel run combines its ranks' gradients around a training step (distributed.h's
// OverlappedGradReducer); TrainingCore calls it and knows nothing of the process group.
#include <torch/torch.h>

#include <vector>

namespace yolo8 {

class GradientSync {
 public:
  virtual ~GradientSync() = default;
  // The backward that completes an accumulation window is about to run: gradients may be reduced as they arrive.
  virtual void before_final_backward(const std::vector<torch::Tensor>& trainable) = 0;
  // That backward failed (out of memory); the window's gradients were put back and it runs again in more passes.
  virtual void abandon_final_backward() = 0;
  // Once per window, before unscaling and clipping: every rank ends with the combined (still scaled) gradients, so
  // an inf on any rank reaches every rank and all of them skip the same step.
  virtual void combine(const std::vector<torch::Tensor>& trainable) = 0;
};

}  // namespace yolo8
