#pragma once
// VRAM / memory profile of full training steps on synthetic batches (`yolo8 profile`) and the auto-batch
// step used by `batch=auto`. No dataset and no OpenCV, so it runs on a bare GPU machine.

#include <torch/torch.h>

#include <string>
#include <vector>

#include "models/yolo.h"
#include "trainer/auto_batch.h"
#include "trainer/settings.h"

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
                      bool channels_last, bool amp = false);
  ~SyntheticStepRunner();
  void train_step(int batch);
  void validation_step(int batch);  // forward only, no gradients, eval mode

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// The device a profile runs on: device=N (or the first of a list) on CUDA, else the CPU.
torch::Device profile_device(const Settings& settings);

// Memory budget in bytes for the run: the lease's memory, else gpu_mem GiB, else the device's memory.
double memory_budget_bytes(const Settings& settings, const torch::Device& device, double lease_gib = 0.0);

// batch=auto / -1 / fraction: the largest batch whose full step and validation at twice the batch fit the budget.
AutoBatchResult auto_batch_for(const ModelConfig& config, const Settings& settings, const torch::Device& device,
                               double budget_bytes, int max_batch);

// `yolo8 profile model=... variants=n,s batch=1,2,4 imgsz=640`: table, JSON and the memory table.
int run_profile(const Settings& settings, const std::vector<std::string>& variants, const std::vector<int>& batches);

}  // namespace yolo8
