#pragma once
// The training step of the Ultralytics recipe on ready tensors: forward, loss, backward and, every `accumulate`
// iterations, gradient clipping, the optimizer step and the EMA update. No OpenCV, so it builds on a bare GPU
// machine; the trainer feeds it loader batches and the VRAM profiler feeds it synthetic ones.

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "models/yolo.h"
#include "trainer/core/auto_batch.h"
#include "trainer/core/ema.h"
#include "trainer/core/grad_scaler.h"
#include "trainer/core/gradient_sync.h"
#include "trainer/core/optimizer.h"
#include "trainer/core/schedule.h"
#include "trainer/detect/loss.h"

namespace yolo8 {

// Whether the loss is scaled (GradScaler): kAuto exactly when the forward runs under float16 autocast (amp on CUDA;
// bfloat16 on CPU has float32's range and needs none);
// kOn on any device (a float32 run then takes the mixed-precision step, inf/NaN skips included); kOff never.
enum class LossScaling { kAuto, kOn, kOff };

struct TrainCoreConfig {
  OptimSettings optim;
  // A resumed run's resolved optimizer (build_optimizer_with); unset: resolve optim.optimizer for `shape`.
  std::optional<OptimizerChoice> optimizer_choice;
  RunShape shape;  // dataset size, batch, epochs, nc (for optimizer=auto)
  int64_t batches_per_epoch = 1;
  int64_t start_epoch = 0;
  LossGains gains;
  double clip_norm = 10.0;
  bool channels_last = true;
  std::vector<int64_t> freeze_layers;  // indices of model.N whose parameters stay fixed
  torch::Device device = torch::kCPU;
  // Mixed precision: forward under autocast, float16 on CUDA, bfloat16 on a CPU with native bfloat16 (autocast.h);
  // ignored elsewhere.
  bool amp = false;
  // CUDA's autocast type: float16 (scaled losses, as Ultralytics) or bfloat16 (float32's range: no scaling).
  c10::ScalarType cuda_amp_dtype = c10::ScalarType::Half;
  LossScaling loss_scaling = LossScaling::kAuto;
  GradScalerConfig grad_scaler;  // `enabled` follows loss_scaling
  // Data-parallel runs: combines the ranks' gradients (told before the backward that completes each accumulation
  // window, and once per window before unscaling and clipping). Null: one process.
  std::shared_ptr<GradientSync> gradient_sync;
};

// Whether LossScaling::kAuto scales the loss: AMP in float16 on CUDA only.
bool loss_scaling_applies(const TrainCoreConfig& config);

struct StepOutcome {
  torch::Tensor loss_items;         // (3) box, cls, dfl (detached)
  bool optimizer_stepped = false;   // the optimizer and the EMA moved
  bool skipped_non_finite = false;  // an accumulation window ended but the scaler found inf/NaN gradients
};

class TrainingCore {
 public:
  // `ema_model` is a second instance of the same architecture; it receives a copy of `model`.
  TrainingCore(DetectionModel model, DetectionModel ema_model, const TrainCoreConfig& config);

  // images: B×3×H×W uint8 (0..255) or float (0..1); labels: N×6 (image index, class, cx, cy, w, h normalised).
  // `chunks` > 1 runs forward/backward on that many equal slices of the batch before the one optimizer step:
  // the out-of-memory fallback, which keeps the batch (and so the recipe) while halving the memory.
  StepOutcome step(int64_t epoch, int64_t ni, const torch::Tensor& images, const torch::Tensor& labels,
                   int64_t chunks = 1);
  // step() under the trainer's out-of-memory fallback: on out of memory the window's gradients are put back and
  // the batch runs in the guard's larger number of passes (kept for later calls).
  StepOutcome guarded_step(int64_t epoch, int64_t ni, const torch::Tensor& images, const torch::Tensor& labels,
                           OomGuard& guard);
  // Once per finished epoch: the LR scheduler step.
  void end_epoch();

  // uint8 or float images to the model's device, dtype and memory format.
  torch::Tensor prepare_images(const torch::Tensor& images) const;

  DetectionModel& model() { return model_; }
  DetectionModel& ema_model() { return ema_model_; }
  ModelEma& ema() { return *ema_; }
  GradScaler& grad_scaler() { return scaler_; }
  // True when the forward runs under autocast (CUDA float16 or CPU bfloat16).
  bool autocast() const { return autocast_; }
  torch::optim::Optimizer& optimizer() { return *built_.optimizer; }
  TrainSchedule& schedule() { return *schedule_; }
  const BuiltOptimizer& built_optimizer() const { return built_; }
  const DetectionLoss& loss() const { return *loss_; }
  const TrainCoreConfig& config() const { return config_; }
  // Current lr of the three parameter groups.
  std::vector<double> learning_rates() const;

 private:
  // Returns false when the scaler skipped the step.
  bool optimizer_step();

  TrainCoreConfig config_;
  DetectionModel model_;
  DetectionModel ema_model_;
  std::unique_ptr<ModelEma> ema_;
  BuiltOptimizer built_;
  std::unique_ptr<TrainSchedule> schedule_;
  std::unique_ptr<DetectionLoss> loss_;
  std::vector<torch::Tensor> trainable_;
  GradScaler scaler_;
  bool autocast_ = false;
};

// Moves every 4-D parameter and buffer to channels-last (faster convolutions on CPU and GPU).
void to_channels_last(torch::nn::Module& module);

// Parses `freeze` (N = the first N layers, or a list 0,3,5) into layer indices.
std::vector<int64_t> freeze_layer_indices(const std::string& freeze);

}  // namespace yolo8
