#pragma once
// Full training steps on synthetic batches: what `yolo8 profile` and `batch=auto` measure. No dataset and no
// OpenCV, so it runs on a bare GPU machine.

#include <torch/torch.h>

#include <string>
#include <vector>

#include "models/yolo.h"

namespace yolo8 {

// B×3×S×S uint8 images and N×6 labels (`labels_per_image` boxes of assorted sizes and classes per image).
struct SyntheticBatch {
  torch::Tensor images;
  torch::Tensor labels;
};
SyntheticBatch synthetic_batch(int64_t batch, int64_t imgsz, int64_t nc, int64_t labels_per_image, uint64_t seed);

// Runs full training steps (forward, loss, backward, optimizer, EMA) of a scratch copy of `config` at any
// batch; the optimizer state is created by the first step and kept, as in a real run.
class SyntheticStepRunner {
 public:
  // `amp` as the real run uses it (mixed precision on CUDA changes the memory a step needs).
  SyntheticStepRunner(const ModelConfig& config, int64_t imgsz, int64_t labels_per_image, const torch::Device& device,
                      bool channels_last, bool amp = false, c10::ScalarType cuda_amp_dtype = c10::ScalarType::Half);
  ~SyntheticStepRunner();
  // The images and labels of a step at `batch` (labels_per_image < 0: the runner's), on the runner's device. Made
  // once and reused until another size is asked for, so timed steps hold no data making and no host copy.
  const SyntheticBatch& batch(int batch, int64_t labels_per_image = -1);
  void train_step(int batch);
  void validation_step(int batch);  // forward only, no gradients, eval mode

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace yolo8
