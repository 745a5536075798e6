// The training step on a GPU: float32 agrees with the CPU step, and AMP (autocast + gradient scaler) trains with
// finite losses in less memory. Skips where no CUDA device is present (every CPU machine, CI included); the GPU
// check (scripts/gpu_check.sh) runs it.
#include <gtest/gtest.h>

#include "trainer/auto_batch.h"
#include "trainer/memory_meter.h"
#include "trainer/profiler.h"
#include "trainer/train_step.h"

namespace yolo8 {
namespace {

bool have_cuda() {
#ifdef YOLO8_WITH_CUDA
  return torch::cuda::is_available();
#else
  return false;
#endif
}

TrainingCore make_core(const torch::Device& device, bool amp, int64_t batch) {
  const ModelConfig config = load_model_config("yolov8n.yaml", 3);
  TrainCoreConfig core_config;
  core_config.device = device;
  core_config.amp = amp;
  core_config.shape = RunShape{64, batch, 10, 3};
  core_config.batches_per_epoch = 8;
  core_config.optim.optimizer = "SGD";
  core_config.optim.warmup_epochs = 0;
  core_config.optim.nbs = batch;  // an optimizer step every iteration
  torch::manual_seed(0);
  DetectionModel model(config);
  return TrainingCore(model, DetectionModel(config), core_config);
}

TEST(TrainStepCuda, Float32StepAgreesWithTheCpuStep) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  TrainingCore cpu = make_core(torch::kCPU, false, 4);
  TrainingCore gpu = make_core(torch::Device(torch::kCUDA, 0), false, 4);
  for (int64_t ni = 0; ni < 2; ++ni) {
    const SyntheticBatch batch = synthetic_batch(4, 128, 3, 4, static_cast<uint64_t>(ni));
    const StepOutcome a = cpu.step(0, ni, batch.images, batch.labels);
    const StepOutcome b = gpu.step(0, ni, batch.images, batch.labels);
    // cuDNN may use TF32 convolutions: agreement to a few parts in a thousand, not bitwise.
    EXPECT_TRUE(torch::allclose(a.loss_items, b.loss_items.to(torch::kCPU), 5e-3, 1e-4))
        << a.loss_items << " vs " << b.loss_items;
  }
}

TEST(TrainStepCuda, AmpTrainsWithFiniteLossesInLessMemory) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  const torch::Device device(torch::kCUDA, 0);
  MemoryMeter meter(device);
  int64_t peaks[2] = {0, 0};
  for (bool amp : {false, true}) {
    TrainingCore core = make_core(device, amp, 16);
    EXPECT_EQ(core.autocast(), amp);
    EXPECT_EQ(core.grad_scaler().enabled(), amp);
    int stepped = 0;
    torch::Tensor first_loss, last_loss;
    for (int64_t ni = 0; ni < 6; ++ni) {
      const SyntheticBatch batch = synthetic_batch(16, 320, 3, 6, 7);  // one batch, so the loss must fall
      StepOutcome outcome;
      const int64_t peak = measure_peak_bytes(meter, [&] { outcome = core.step(0, ni, batch.images, batch.labels); });
      if (ni > 0) peaks[amp] = std::max(peaks[amp], peak);  // after the optimizer state exists
      ASSERT_TRUE(torch::isfinite(outcome.loss_items).all().item<bool>()) << "amp " << amp << " step " << ni;
      stepped += outcome.optimizer_stepped;
      if (ni == 0) first_loss = outcome.loss_items.sum().cpu();
      last_loss = outcome.loss_items.sum().cpu();
    }
    EXPECT_GE(stepped, 5) << "amp " << amp;  // a scaler may skip one early step on an overflow, not more
    EXPECT_LT(last_loss.item<double>(), first_loss.item<double>()) << "amp " << amp;
    for (const auto& p : core.model()->parameters()) ASSERT_TRUE(torch::isfinite(p).all().item<bool>());
  }
  std::printf("peak of a yolov8n step at batch 16, imgsz 320: float32 %.1f MiB, AMP %.1f MiB\n",
              peaks[0] / 1048576.0, peaks[1] / 1048576.0);
  EXPECT_LT(peaks[1], peaks[0]);
}

}  // namespace
}  // namespace yolo8
